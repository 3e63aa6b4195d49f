// Which signed calls a server has admitted, so that a call captured on the
// wire cannot be made again (common/security/auth.h signs each call).
//
// Every client channel signs its calls under a session (64 random bits) with
// a sequence number counting up from 1. A session is remembered as the
// highest number admitted and a window of the kWindow numbers below it, one
// bit each (IPsec's anti-replay window, RFC 4303 section 3.4.3): a number
// seen before, or below the window, is refused. Calls are signed just before
// they are sent, so they arrive out of order only by the few in flight at
// once. A session is forgotten once its newest call is older than twice the
// signature's validity (`max_age`): every call of it is then refused for its
// age before the guard is asked (the margin covers a caller that read the
// clock a while before it reached the guard). Thread-safe.
//
// The memory is the process's: a server restarted within max_age of a
// captured call admits it again (docs/security.md says so).
#ifndef PSTRAIN_COMMON_SECURITY_REPLAY_GUARD_H_
#define PSTRAIN_COMMON_SECURITY_REPLAY_GUARD_H_

#include <bitset>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pstrain {

class ReplayGuard {
 public:
  static constexpr uint64_t kWindow = 4096;

  enum class Verdict {
    kNew,              // admitted, and remembered
    kReplayed,         // this session's call with this number was admitted before
    kBelowWindow,      // older than the session's last kWindow numbers
    kTooManySessions,  // this identity's, or all, sessions are live: retry later
  };

  // `max_age`: how long a signature is valid (signed_at within max_age of
  // the server's clock, either way). Only callers that signed correctly
  // reach the guard, so sessions grow only with legitimate channels; the
  // bounds keep a misbehaving key holder from growing it without end, and
  // from taking other identities' room (`per_identity` of `max_sessions`).
  explicit ReplayGuard(absl::Duration max_age, size_t max_sessions = size_t{1} << 16,
                       size_t per_identity = 4096)
      : max_age_(max_age), max_sessions_(max_sessions), per_identity_(per_identity) {}

  // Call `seq` (from 1) of `identity`'s session `session`, signed at
  // `signed_at` (already checked to be within max_age of `now`).
  Verdict Admit(absl::string_view identity, uint64_t session, uint64_t seq, absl::Time signed_at,
                absl::Time now);

  size_t sessions() const;

 private:
  struct Session {
    uint64_t highest = 0;         // the highest number admitted
    std::bitset<kWindow> seen;    // bit (n % kWindow) for n in (highest - kWindow, highest]
    absl::Time newest;            // the latest signing time admitted
  };
  void ForgetExpiredLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration max_age_;
  const size_t max_sessions_;
  const size_t per_identity_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::pair<std::string, uint64_t>, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, size_t> sessions_of_ ABSL_GUARDED_BY(mu_);  // by identity
  absl::Time last_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_SECURITY_REPLAY_GUARD_H_
