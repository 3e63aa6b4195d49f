#include "ps_server/sync_step.h"

#include <algorithm>
#include <utility>

namespace pstrain {

void SyncStep::Reset(int partitions, int workers, int replicas) {
  replicas_ = replicas;
  Slot fresh;
  fresh.arrived.assign(static_cast<size_t>(workers), 0);
  fresh.in_flight.assign(static_cast<size_t>(workers), 0);
  slots_.assign(static_cast<size_t>(partitions), fresh);
  open_ = partitions;
  empty_.assign(static_cast<size_t>(workers), 0);
  first_gradient_ = absl::InfiniteFuture();
  deadline_ = absl::InfiniteFuture();
  failure_ = absl::OkStatus();
  cursors_.assign(static_cast<size_t>(workers), StepCursor());
  completed_cursors_.assign(static_cast<size_t>(workers), StepCursor());
}

bool SyncStep::Begin(int i, int w) {
  Slot& s = slots_[i];
  s.in_flight[w] = 1;
  // Nothing lowers `count` within a step, and only the gradient that
  // completes the quorum raises it to `replicas` (closing the partition),
  // so this one still completes it when it arrives unless the partition
  // closed or the step ended meanwhile.
  return s.count == replicas_ - 1;
}

bool SyncStep::Arrive(int i, int w) {
  Slot& s = slots_[i];
  s.arrived[w] = 1;
  return ++s.count >= replicas_;
}

std::vector<int> SyncStep::Close(int i) {
  Slot& s = slots_[i];
  s.closed = true;
  s.closed_count = s.count;
  std::vector<int> workers;
  for (size_t w = 0; w < s.arrived.size(); ++w) {
    if (s.arrived[w]) workers.push_back(static_cast<int>(w));
  }
  return workers;
}

bool SyncStep::Applied(int n) {
  open_ -= n;
  return open_ == 0;
}

int SyncStep::NextStep() {
  int contributors = replicas_;
  for (Slot& s : slots_) {
    contributors = std::min(contributors, s.closed_count);
    s.closed = false;
    s.count = 0;
    std::fill(s.arrived.begin(), s.arrived.end(), 0);
  }
  open_ = static_cast<int>(slots_.size());
  return contributors;
}

int SyncStep::FewestOpen() const {
  int fewest = replicas_;
  for (const Slot& s : slots_) {
    if (!s.closed) fewest = std::min(fewest, s.count);
  }
  return fewest;
}

std::vector<int> SyncStep::Missing() const {
  std::vector<int> missing;
  for (size_t w = 0; w < empty_.size(); ++w) {
    for (const Slot& s : slots_) {
      if (!s.closed && !s.arrived[w]) {
        missing.push_back(static_cast<int>(w));
        break;
      }
    }
  }
  return missing;
}

std::vector<bool> SyncStep::WaitingOn() const {
  std::vector<bool> out(empty_.size(), false);
  for (size_t w = 0; w < out.size(); ++w) {
    if (slots_.empty()) {
      out[w] = empty_[w] == 0;
      continue;
    }
    for (const Slot& s : slots_) {
      if (!s.closed && !s.arrived[w] && !s.in_flight[w]) {
        out[w] = true;
        break;
      }
    }
  }
  return out;
}

int SyncStep::PushEmpty(int w) {
  empty_[w] = 1;
  return EmptyCount();
}

int SyncStep::EmptyCount() const {
  return static_cast<int>(std::count(empty_.begin(), empty_.end(), 1));
}

void SyncStep::ClearEmpty() { std::fill(empty_.begin(), empty_.end(), 0); }

bool SyncStep::Started(absl::Time now, absl::Duration deadline) {
  if (first_gradient_ == absl::InfiniteFuture()) first_gradient_ = now;
  if (deadline > absl::ZeroDuration() && deadline_ == absl::InfiniteFuture()) {
    deadline_ = now + deadline;
    return true;
  }
  return false;
}

std::optional<absl::Duration> SyncStep::Completed(absl::Time now) {
  std::optional<absl::Duration> wait;
  if (first_gradient_ != absl::InfiniteFuture()) wait = now - first_gradient_;
  first_gradient_ = absl::InfiniteFuture();
  deadline_ = absl::InfiniteFuture();  // the next step's starts with its first gradient
  return wait;
}

void SyncStep::CommitCursors() {
  for (size_t w = 0; w < cursors_.size(); ++w) {
    if (cursors_[w].set) completed_cursors_[w] = cursors_[w];
  }
  cursors_.assign(cursors_.size(), StepCursor());
}

}  // namespace pstrain
