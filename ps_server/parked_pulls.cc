#include "ps_server/parked_pulls.h"

#include <algorithm>
#include <utility>

namespace pstrain {

uint64_t ParkedPulls::Park(PullRequest request, absl::Time deadline, bool rows, PullCallback done) {
  const uint64_t id = next_id_++;
  waiters_.emplace(id, Parked{Waiter{std::move(request), deadline, rows}, std::move(done)});
  return id;
}

bool ParkedPulls::Cancel(uint64_t id, absl::Status why, std::vector<PullCompletion>* out) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return false;
  out->push_back({std::move(it->second.done), std::move(why), PullReply()});
  waiters_.erase(it);
  return true;
}

void ParkedPulls::TakeReady(const ServeFn& serve, std::vector<PullCompletion>* out) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    absl::Status status;
    PullReply reply;
    if (!serve(it->second.waiter, &status, &reply)) {
      ++it;
      continue;
    }
    out->push_back({std::move(it->second.done), std::move(status), std::move(reply)});
    it = waiters_.erase(it);
  }
}

void ParkedPulls::TakeExpired(absl::Time now, const std::function<absl::Status(const Waiter&)>& why,
                              std::vector<PullCompletion>* out) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.waiter.deadline > now) {
      ++it;
      continue;
    }
    out->push_back({std::move(it->second.done), why(it->second.waiter), PullReply()});
    it = waiters_.erase(it);
  }
}

void ParkedPulls::TakeAll(const absl::Status& why, std::vector<PullCompletion>* out) {
  for (auto& [id, parked] : waiters_) {
    out->push_back({std::move(parked.done), why, PullReply()});
  }
  waiters_.clear();
}

absl::Time ParkedPulls::EarliestDeadline() const {
  absl::Time earliest = absl::InfiniteFuture();
  for (const auto& [id, parked] : waiters_) earliest = std::min(earliest, parked.waiter.deadline);
  return earliest;
}

}  // namespace pstrain
