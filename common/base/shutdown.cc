#include "common/base/shutdown.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include <cstring>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"

namespace pstrain {

void StopSignal::Stop(const std::string& reason, int exit_code) {
  absl::MutexLock lock(&mu_);
  ++times_;
  if (stopped_) return;
  stopped_ = true;
  reason_ = reason;
  exit_code_ = exit_code;
}

int StopSignal::times() {
  absl::MutexLock lock(&mu_);
  return times_;
}

bool StopSignal::stopped() {
  absl::MutexLock lock(&mu_);
  return stopped_;
}

void StopSignal::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&stopped_));
}

bool StopSignal::WaitFor(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&stopped_), timeout);
}

std::string StopSignal::reason() {
  absl::MutexLock lock(&mu_);
  return reason_;
}

int StopSignal::exit_code() {
  absl::MutexLock lock(&mu_);
  return exit_code_;
}

namespace {

pthread_t g_signal_thread;
std::atomic<bool> g_signal_thread_started{false};

// Runs only in a thread that does not block the signals, one started before
// StopOnTerminationSignals (a library's thread pool, made as it loaded):
// hands the signal to the signal thread, which takes it with sigwait.
void ForwardTerminationSignal(int sig) {
  const int saved_errno = errno;
  if (g_signal_thread_started.load(std::memory_order_acquire)) {
    ::pthread_kill(g_signal_thread, sig);  // async-signal-safe
  }
  errno = saved_errno;
}

}  // namespace

sigset_t TerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

StopSignal& StopOnTerminationSignals() {
  static StopSignal* const stop = [] {
    auto* s = new StopSignal;  // never deleted (see the header)
    const sigset_t signals = TerminationSignals();
    // Blocked in this thread, so in every thread it starts from here on: the
    // signals wait, pending, for the thread below to take them synchronously
    // with sigwait. (A handler that runs wherever the kernel delivers the
    // signal is not enough under ThreadSanitizer, which defers a handler to
    // the thread's next intercepted call: an idle daemon, its threads all
    // waiting inside uninstrumented gRPC, never took SIGTERM.)
    ::pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    std::thread waiter([s, signals]() {
      for (;;) {
        int sig = 0;
        if (::sigwait(&signals, &sig) != 0) continue;
        // 128 + signal, as a shell reports a process killed by it.
        s->Stop(absl::StrCat("received ", strsignal(sig)), 128 + sig);
      }
    });
    g_signal_thread = waiter.native_handle();
    g_signal_thread_started.store(true, std::memory_order_release);
    waiter.detach();
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_handler = ForwardTerminationSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sigismember(&signals, sig) == 1) ::sigaction(sig, &action, nullptr);
    }
    return s;
  }();
  return *stop;
}

}  // namespace pstrain
