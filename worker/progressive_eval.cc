#include "worker/progressive_eval.h"

#include "worker/model/binary_metrics.h"

namespace pstrain {

namespace {

// The first multiple of `every` after `step`.
int64_t NextMultiple(int64_t step, int64_t every) { return (step / every + 1) * every; }

}  // namespace

ProgressiveEval::ProgressiveEval(int64_t every, int64_t start)
    : every_(every), next_(NextMultiple(start, every)) {}

void ProgressiveEval::Add(const float* probabilities, const int32_t* labels, int rows,
                          int64_t step) {
  last_step_ = step;
  scores_.insert(scores_.end(), probabilities, probabilities + rows);
  labels_.insert(labels_.end(), labels, labels + rows);
}

std::optional<WorkerEvaluation> ProgressiveEval::Take(int64_t step) {
  if (step < next_) return std::nullopt;
  next_ = NextMultiple(step, every_);  // also past a multiple with nothing scored
  if (scores_.empty()) return std::nullopt;
  return Evaluate(step);
}

std::optional<WorkerEvaluation> ProgressiveEval::TakeRest() {
  if (scores_.empty()) return std::nullopt;
  return Evaluate(last_step_);
}

WorkerEvaluation ProgressiveEval::Evaluate(int64_t step) {
  WorkerEvaluation e;
  e.step = step;
  e.examples = static_cast<int64_t>(scores_.size());
  int64_t correct = 0;
  // Positive above 0.5, as the chief's evaluation predicts (logit > 0).
  for (size_t i = 0; i < scores_.size(); ++i) correct += (scores_[i] > 0.5f) == (labels_[i] != 0);
  const double log_loss = LogLoss(scores_, labels_);
  e.metrics = {{"accuracy", static_cast<double>(correct) / e.examples},
               {"loss", log_loss},
               {"log_loss", log_loss}};
  if (absl::StatusOr<double> auc = RocAuc(scores_, labels_); auc.ok()) {
    e.metrics.emplace_back("auc", *auc);
  }
  scores_.clear();
  labels_.clear();
  return e;
}

void ProgressiveEval::Restart(int64_t step) {
  scores_.clear();
  labels_.clear();
  next_ = NextMultiple(step, every_);
}

}  // namespace pstrain
