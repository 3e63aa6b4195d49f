// The chief's driver: initialises the variables on the parameter servers from
// the seed, watches the global step, evaluates on the held-out set every
// `eval_every_steps`, stops the workers at max_steps, writes the final model
// (model_final.pst) and a summary (summary.json) to output_dir, and shuts the
// parameter servers down. Every wait is bounded: no progress for longer than
// the step timeout fails the run with a clear error.
#ifndef PSTRAIN_CHIEF_CHIEF_RUNNER_H_
#define PSTRAIN_CHIEF_CHIEF_RUNNER_H_

#include "absl/status/status.h"
#include "chief/chief_state.h"
#include "common/cluster_spec.h"
#include "common/shutdown.h"
#include "proto/config.pb.h"

namespace pstrain {

absl::Status RunChief(const TrainingConfig& config, const ClusterSpec& cluster, uint64_t incarnation,
                      Chief* chief, StopSignal* stop);

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_CHIEF_RUNNER_H_
