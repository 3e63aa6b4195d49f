#include "common/shutdown.h"

#include <signal.h>
#include <string.h>

#include <thread>

#include "absl/strings/str_cat.h"

namespace pstrain {

void StopSignal::Stop(const std::string& reason, int exit_code) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return;
  stopped_ = true;
  reason_ = reason;
  exit_code_ = exit_code;
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

void StopOnTerminationSignals(StopSignal* stop) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([stop, set]() {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      // 128 + signal, as a shell reports a process killed by it.
      stop->Stop(absl::StrCat("received ", strsignal(sig)), 128 + sig);
    }
  }).detach();
}

}  // namespace pstrain
