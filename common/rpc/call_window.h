// A window on the calls a client keeps in flight to one server: at most
// `limit` at once; the rest wait in the client, in the order they were
// started, and each begins the moment an earlier one ends. A worker's pull
// or push of a large share is many calls of whole partitions (a 1 GiB share
// in 4 MiB calls: 256); sent all at once they would take as many of the
// server's call places (--max_concurrent_calls) and as much of its message
// memory, and one worker could crowd out the others.
#ifndef PSTRAIN_COMMON_RPC_CALL_WINDOW_H_
#define PSTRAIN_COMMON_RPC_CALL_WINDOW_H_

#include <cstdint>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace pstrain {

class CallWindow {
 public:
  // limit <= 0: no limit.
  explicit CallWindow(int limit) : limit_(limit) {}
  CallWindow(const CallWindow&) = delete;
  CallWindow& operator=(const CallWindow&) = delete;

  // Runs `begin` now, on this thread, when fewer than `limit` calls are in
  // flight; else later, on the thread whose Release makes room. `begin`
  // starts one call (or gives up on it), and Release must be called exactly
  // once when that call has ended, before anything it refers to is freed:
  // Release may run the next waiting `begin` (and those after it, when they
  // end at once), on its own thread, in a loop, and it uses the window after
  // each: the caller must keep the window alive until Release returns
  // (GrpcPsClient's calls, through fan_out.h, release before they count
  // themselves ended).
  void Start(absl::AnyInvocable<void() &&> begin) ABSL_LOCKS_EXCLUDED(mu_);
  void Release() ABSL_LOCKS_EXCLUDED(mu_);

  struct Stats {
    int in_flight = 0;
    int waiting = 0;
    int peak_in_flight = 0;  // the most in flight at once so far
    int64_t waited = 0;      // calls that waited for room so far
  };
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int limit_;
  mutable absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int peak_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waited_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<absl::AnyInvocable<void() &&>> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_RPC_CALL_WINDOW_H_
