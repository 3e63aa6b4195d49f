// The chief's evaluation phase: the servers' variables pulled (the step is
// the oldest version pulled) and scored on the held-out set, on the CPU; a
// click-through model's bags built from the rows of its ids as the servers
// hold them now. No state; called from the driver's thread.
#ifndef PSTRAIN_CHIEF_EVALUATION_H_
#define PSTRAIN_CHIEF_EVALUATION_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/tensor.h"
#include "common/client/ps_client.h"
#include "proto/config.pb.h"
#include "worker/data/dataset.h"
#include "worker/model/model.h"

namespace pstrain {

struct Evaluation {
  int64_t step = 0;
  EvalResult result;
  // Click-through models: AUC and log loss of the held-out clicks.
  std::optional<double> auc;
  double log_loss = 0;
};

// Pulls every variable (the model as the servers hold it) and, with a test
// set, evaluates it: into `model`'s own parameters when there is a test set
// (`params` left empty: a second copy of a large model is what would not
// fit), else into `params`. ParameterValues says where they are.
absl::StatusOr<Evaluation> Evaluate(PsClient* ps, Model* model, const TrainingConfig& config,
                                    const Dataset* test, std::vector<Tensor>* params);
// Each variable's values after Evaluate, in placement order.
std::vector<const float*> ParameterValues(Model* model, const std::vector<Tensor>& params);

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_EVALUATION_H_
