#include "common/shutdown.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cstring>

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

namespace {

int g_signal_pipe[2] = {-1, -1};

void OnTerminationSignal(int sig) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe[1], &byte, 1);  // async-signal-safe
  errno = saved_errno;
}

}  // namespace

StopSignal& StopOnTerminationSignals() {
  static StopSignal* const stop = [] {
    auto* s = new StopSignal;  // never deleted (see the header)
    if (::pipe2(g_signal_pipe, O_CLOEXEC) != 0) return s;
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_handler = OnTerminationSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &action, nullptr);
    ::sigaction(SIGTERM, &action, nullptr);
    std::thread([s]() {
      for (;;) {
        unsigned char byte = 0;
        ssize_t n = ::read(g_signal_pipe[0], &byte, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        // 128 + signal, as a shell reports a process killed by it.
        s->Stop(absl::StrCat("received ", strsignal(byte)), 128 + byte);
      }
    }).detach();
    return s;
  }();
  return *stop;
}

}  // namespace pstrain
