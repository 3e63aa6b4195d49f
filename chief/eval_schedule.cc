#include "chief/eval_schedule.h"

#include <algorithm>

namespace pstrain {

EvalSchedule::EvalSchedule(int64_t every, int64_t max_steps, int64_t step)
    : every_(every > 0 ? every : max_steps), max_steps_(max_steps), next_(0) {
  Restart(step);
}

void EvalSchedule::Restart(int64_t step) {
  int64_t next = std::min(every_, max_steps_);
  while (next <= step && next < max_steps_) next += every_;
  next_ = std::min(next, max_steps_);
}

int64_t EvalSchedule::Ran(int64_t step) {
  int64_t passed = 0;
  while (next_ <= step) {
    next_ += every_;
    ++passed;
  }
  next_ = std::min(next_, max_steps_);
  return passed;
}

}  // namespace pstrain
