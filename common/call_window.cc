#include "common/call_window.h"

#include <algorithm>
#include <utility>

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

void CallWindow::Release() {
  absl::AnyInvocable<void() &&> next;
  {
    absl::MutexLock lock(&mu_);
    if (waiting_.empty()) {
      --in_flight_;
      return;
    }
    // The ended call's place passes to the next waiting one.
    next = std::move(waiting_.front());
    waiting_.pop_front();
  }
  std::move(next)();
}

CallWindow::Stats CallWindow::stats() const {
  absl::MutexLock lock(&mu_);
  return {in_flight_, static_cast<int>(waiting_.size()), peak_, waited_};
}

}  // namespace pstrain
