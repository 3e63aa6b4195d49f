// Progressive validation (data.progressive_eval): a worker scores each batch
// in the pass that trains on it, with the parameters of before, so every
// score is a prediction of examples the model has not trained on: the
// held-out figures of a stream that has no held-out file (McMahan et al.,
// "Ad Click Prediction: a View from the Trenches", 2013, section 5.1).
// This gathers the scores between reports and turns them into one
// evaluation every `every` steps.
#ifndef PSTRAIN_WORKER_PROGRESSIVE_EVAL_H_
#define PSTRAIN_WORKER_PROGRESSIVE_EVAL_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "worker/progress.h"

namespace pstrain {

class ProgressiveEval {
 public:
  // `every` > 0: the steps between evaluations; `start` the step the run
  // (or this process) starts from.
  ProgressiveEval(int64_t every, int64_t start);

  // One batch, computed from version `step`: its probabilities and 0/1
  // labels, `rows` of each.
  void Add(const float* probabilities, const int32_t* labels, int rows, int64_t step);

  // After the batch computed from version `step`: once `step` reached the
  // next multiple of `every`, the evaluation of the examples added since
  // the last one (accuracy: positive above 0.5, loss and log_loss: the mean cross-entropy,
  // auc where both labels occur) at `step`, and the window starts over.
  std::optional<WorkerEvaluation> Take(int64_t step);
  // The end of the run: the examples not evaluated yet, at the last step
  // added (none: nullopt).
  std::optional<WorkerEvaluation> TakeRest();

  // A rollback: the scores gathered since are of steps that no longer count.
  void Restart(int64_t step);

 private:
  // The window's figures at `step`; the window starts over.
  WorkerEvaluation Evaluate(int64_t step);

  const int64_t every_;
  int64_t next_;
  int64_t last_step_ = 0;
  std::vector<float> scores_;
  std::vector<int32_t> labels_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_PROGRESSIVE_EVAL_H_
