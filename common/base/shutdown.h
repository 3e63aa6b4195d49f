// How a daemon learns it should stop: a one-shot, thread-safe stop signal that
// an RPC handler, a fatal error or SIGINT/SIGTERM can raise (the first reason
// wins), and which main() waits on. A thread of its own takes the signals
// with sigwait and turns them into Stop(); a thread started before they were
// blocked (libraries such as OpenBLAS start threads before main() could block
// them) forwards one it receives to that thread (async-signal-safe).
#ifndef PSTRAIN_COMMON_BASE_SHUTDOWN_H_
#define PSTRAIN_COMMON_BASE_SHUTDOWN_H_

#include <signal.h>

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pstrain {

class StopSignal {
 public:
  // Idempotent; the first reason is kept.
  void Stop(const std::string& reason, int exit_code = 0);
  bool stopped();
  // How many times Stop was called (each signal calls it once): a second
  // Ctrl-C means "now", where the first began an orderly stop.
  int times();
  void Wait();
  // True once stopped; false if `timeout` passed first.
  bool WaitFor(absl::Duration timeout);
  std::string reason();
  int exit_code();

 private:
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  int exit_code_ ABSL_GUARDED_BY(mu_) = 0;
  int times_ ABSL_GUARDED_BY(mu_) = 0;
};

// Call early in main(), before starting threads: the process's stop signal,
// which SIGINT and SIGTERM raise as Stop("received ...", 128 + signal). The
// calling thread, and so every thread it starts afterwards, blocks both; one
// thread of its own takes them with sigwait (a process-directed signal, as
// kill(pid) sends, reaches it; raise() in a blocking thread would not).
// Subprocess unblocks them in its children. It is never destroyed: the
// thread that raises it may still be inside Stop() while main() returns (a
// stop signal on main's stack was, found by ThreadSanitizer). Later calls
// return the same one.
StopSignal& StopOnTerminationSignals();

// The signals that stop a process: SIGINT and SIGTERM. Threads started
// outside StopOnTerminationSignals' reach (gRPC's, common/rpc/grpc_lifetime.h)
// block this set too.
sigset_t TerminationSignals();

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_BASE_SHUTDOWN_H_
