// The chief's last phase: the final model (model_final.pst, the variables
// as the final evaluation pulled them) and the run's summary
// (summary.json: evaluation, training progress, where a worker's step went,
// the servers' counters, embedding tables' sizes) in output_dir. No state;
// called from the driver's thread.
#ifndef PSTRAIN_CHIEF_SUMMARY_H_
#define PSTRAIN_CHIEF_SUMMARY_H_

#include <vector>

#include "absl/status/status.h"
#include "chief/chief_state.h"
#include "chief/evaluation.h"
#include "chief/run_context.h"
#include "common/base/tensor.h"
#include "common/client/ps_client.h"

namespace pstrain {

// Writes both files: `values[v]` is variable v's (placement order) full
// tensor, written from there; `train_seconds` the time from the start of
// training to the final evaluation.
absl::Status WriteRunOutputs(const RunContext& run, PsClient* ps, Chief* chief,
                             const Evaluation& final_eval, const std::vector<const float*>& values,
                             double train_seconds);

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_SUMMARY_H_
