#include "common/security/replay_guard.h"

#include <algorithm>

namespace pstrain {

void ReplayGuard::ForgetExpiredLocked(absl::Time now) {
  // A session whose newest call was signed more than max_age ago can only
  // send calls older still, which the age check refuses first. Past the
  // next max_age they would be refused too, so a sweep a second is enough.
  last_sweep_ = now;
  absl::erase_if(sessions_, [&](const auto& entry) { return now - entry.second.newest > max_age_; });
}

ReplayGuard::Verdict ReplayGuard::Admit(absl::string_view identity, uint64_t session,
                                        uint64_t seq, absl::Time signed_at, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (now - last_sweep_ >= absl::Seconds(1)) ForgetExpiredLocked(now);
  auto it = sessions_.find(std::make_pair(std::string(identity), session));
  if (it == sessions_.end()) {
    if (sessions_.size() >= max_sessions_) {
      ForgetExpiredLocked(now);
      if (sessions_.size() >= max_sessions_) return Verdict::kTooManySessions;
    }
    it = sessions_.try_emplace(std::make_pair(std::string(identity), session)).first;
  }
  Session& s = it->second;
  if (seq > s.highest) {
    // Slide the window up: the numbers between leave it unseen.
    const uint64_t gap = seq - s.highest;
    if (gap >= kWindow) {
      s.seen.reset();
    } else {
      for (uint64_t n = s.highest + 1; n < seq; ++n) s.seen.reset(n % kWindow);
    }
    s.highest = seq;
  } else if (s.highest - seq >= kWindow) {
    return Verdict::kBelowWindow;
  } else if (s.seen.test(seq % kWindow)) {
    return Verdict::kReplayed;
  }
  s.seen.set(seq % kWindow);
  s.newest = std::max(s.newest, signed_at);
  return Verdict::kNew;
}

size_t ReplayGuard::sessions() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace pstrain
