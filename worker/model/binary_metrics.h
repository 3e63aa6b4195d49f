// Metrics of a binary classifier's scores: ROC AUC (the probability that a
// random positive scores above a random negative, ties counting half, from
// the rank sum) and mean log loss. Used by `pstrain datagen --format=criteo`
// to score its ground-truth model and by evaluation of click-through models.
#ifndef PSTRAIN_WORKER_MODEL_BINARY_METRICS_H_
#define PSTRAIN_WORKER_MODEL_BINARY_METRICS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace pstrain {

// labels 0/1; scores any real numbers (only their order matters). Needs at
// least one positive and one negative.
absl::StatusOr<double> RocAuc(const std::vector<float>& scores, const std::vector<int32_t>& labels);

// Mean of -log p(label), probabilities clamped to [1e-7, 1 - 1e-7].
double LogLoss(const std::vector<float>& probabilities, const std::vector<int32_t>& labels);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_MODEL_BINARY_METRICS_H_
