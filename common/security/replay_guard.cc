#include "common/security/replay_guard.h"

#include <algorithm>
#include <utility>

namespace pstrain {

void ReplayGuard::ForgetExpiredLocked(absl::Time now) {
  // A session whose newest call was signed more than max_age ago can only
  // send calls older still, which the age check refuses first; twice that
  // leaves room for a caller that read the clock a while before it got
  // here. Swept at most once a second.
  last_sweep_ = now;
  // (The lambda runs under mu_ too; the analysis does not follow it in.)
  absl::flat_hash_map<std::string, size_t>* sessions_of = &sessions_of_;
  absl::erase_if(sessions_, [&](const auto& entry) {
    if (now - entry.second.newest <= 2 * max_age_) return false;
    auto of = sessions_of->find(entry.first.first);
    if (--of->second == 0) sessions_of->erase(of);
    return true;
  });
}

ReplayGuard::Verdict ReplayGuard::Admit(absl::string_view identity, uint64_t session,
                                        uint64_t seq, absl::Time signed_at, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (now - last_sweep_ >= absl::Seconds(1)) ForgetExpiredLocked(now);
  auto key = std::make_pair(std::string(identity), session);  // one copy per call
  auto it = sessions_.find(key);
  if (it == sessions_.end()) {
    auto of = sessions_of_.find(key.first);
    const size_t mine = of == sessions_of_.end() ? 0 : of->second;
    if (sessions_.size() >= max_sessions_ || mine >= per_identity_) {
      return Verdict::kTooManySessions;
    }
    ++sessions_of_[key.first];
    it = sessions_.try_emplace(std::move(key)).first;
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
