// When the chief evaluates on the held-out set: every `every` steps of a run
// of `max_steps` (the last evaluation, at max_steps, is the run's end's).
// The chief evaluates the newest parameters when it gets to them, so an
// evaluation due at step N runs at the first step >= N it sees, and any
// others due by then are skipped (the chief logs how many).
//
// What it owns: the next due step. Who calls it: the chief's driver, on its
// one thread; thread-compatible.
#ifndef PSTRAIN_CHIEF_EVAL_SCHEDULE_H_
#define PSTRAIN_CHIEF_EVAL_SCHEDULE_H_

#include <cstdint>

namespace pstrain {

class EvalSchedule {
 public:
  // `every` <= 0: only at the end. Starts after `step` (a resumed run's).
  EvalSchedule(int64_t every, int64_t max_steps, int64_t step);

  // The next due step (max_steps when none is due before the end).
  int64_t next() const { return next_; }
  // Whether an evaluation is due at `step` (and it is not the end's).
  bool Due(int64_t step) const { return step >= next_ && step < max_steps_; }
  // An evaluation ran at `step` (Due): the schedule moves past it. Returns
  // how many due evaluations it stood for (1, or more when the chief reached
  // `step` late: all but one of them skipped).
  int64_t Ran(int64_t step);
  // After a rollback to `step`: the next due after it.
  void Restart(int64_t step);

 private:
  const int64_t every_;
  const int64_t max_steps_;
  int64_t next_;
};

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_EVAL_SCHEDULE_H_
