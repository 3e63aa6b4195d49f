#include "common/rpc/call_window.h"

#include <algorithm>
#include <utility>

#include "common/base/logging.h"

namespace pstrain {

void CallWindow::Start(absl::AnyInvocable<void() &&> begin) {
  {
    absl::MutexLock lock(&mu_);
    if (limit_ > 0 && in_flight_ >= limit_) {
      waiting_.push_back(std::move(begin));
      ++waited_;
      return;
    }
    ++in_flight_;
    peak_ = std::max(peak_, in_flight_);
  }
  std::move(begin)();
}

namespace {
// The window whose Release runs a waiting call's begin on this thread, and
// the Releases that begin made meanwhile (a call that ended at once): they
// are taken in Release's loop, not by recursing, so a long queue of calls
// that end at once cannot exhaust the stack.
thread_local const CallWindow* releasing = nullptr;
thread_local int deferred = 0;
}  // namespace

void CallWindow::Release() {
  if (releasing == this) {
    ++deferred;
    return;
  }
  // Restores the outer window's state however this returns (a begin that
  // throws included).
  struct Scope {
    const CallWindow* outer = releasing;
    int outer_deferred = deferred;
    ~Scope() {
      releasing = outer;
      deferred = outer_deferred;
    }
  } scope;
  releasing = this;
  deferred = 0;
  for (int releases = 1; releases > 0;) {
    --releases;
    absl::AnyInvocable<void() &&> next;
    {
      absl::MutexLock lock(&mu_);
      if (waiting_.empty()) {
        if (in_flight_ <= 0) {
          LOG_ERROR("CallWindow::Release without a call in flight");
          continue;
        }
        --in_flight_;
        continue;
      }
      // The ended call's place passes to the next waiting one.
      next = std::move(waiting_.front());
      waiting_.pop_front();
    }
    std::move(next)();
    releases += deferred;
    deferred = 0;
  }
}

CallWindow::Stats CallWindow::stats() const {
  absl::MutexLock lock(&mu_);
  return {in_flight_, static_cast<int>(waiting_.size()), peak_, waited_};
}

}  // namespace pstrain
