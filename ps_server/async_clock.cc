#include "ps_server/async_clock.h"

#include <algorithm>

namespace pstrain {

void AsyncClock::Reset(int num_workers) {
  in_flight_ = 0;
  applied_.assign(num_workers, 0);
  cursors_.assign(num_workers, StepCursor());
}

int64_t AsyncClock::Admit(int w, int64_t version, int64_t max_steps, const StepCursor& cursor) {
  if (max_steps > 0 && version + in_flight_ >= max_steps) return 0;
  ++in_flight_;
  cursors_[w] = cursor;
  return version + in_flight_;
}

int64_t AsyncClock::Applied(int w) {
  --in_flight_;
  return ++applied_[w];
}

int64_t AsyncClock::pushes(int w) const {
  return w >= 0 && w < num_workers() ? applied_[w] : 0;
}

int64_t AsyncClock::Slowest() const {
  return applied_.empty() ? 0 : *std::min_element(applied_.begin(), applied_.end());
}

std::vector<int> AsyncClock::SlowestWorkers() const {
  std::vector<int> slowest;
  const int64_t min = Slowest();
  for (int w = 0; w < num_workers(); ++w) {
    if (applied_[w] == min) slowest.push_back(w);
  }
  return slowest;
}

bool AsyncClock::WithinBound(int w, int64_t bound) const {
  return bound <= 0 || pushes(w) - Slowest() <= bound;
}

UpdateInfo AsyncClock::Update(const ServerModel& model, int64_t ticket, int64_t step) {
  UpdateInfo update;
  update.learning_rate = model.learning_rate.At(ticket - 1);
  if (model.staleness_scaled_lr) {
    const int64_t staleness = ticket - 1 - step;
    if (staleness > 1) update.learning_rate /= static_cast<float>(staleness);
  }
  return update;
}

}  // namespace pstrain
