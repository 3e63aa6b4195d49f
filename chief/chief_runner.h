// The chief's driver: initialises the variables on the parameter servers from
// the seed or a checkpoint, watches the global step, commits the servers'
// checkpoint shards with a manifest every checkpoint.every_steps, evaluates on the held-out set every
// `eval_every_steps`, stops the workers at max_steps, writes the final model
// (model_final.pst) and a summary (summary.json) to output_dir, and shuts the
// parameter servers down. Every wait is bounded: no progress for longer than
// the step timeout fails the run with a clear error.
//
// RunChief reads as the sequence of its phases, each a part of its own:
// the start point or resume (chief/start_point.h), then the loop that
// confirms the step, evaluates (chief/evaluation.h), commits checkpoints
// (chief/checkpoint_schedule.h), rolls back after a lost server or an
// operator's restore (chief/rollback.h) and writes training events
// (chief/training_events.h); then the summary (chief/summary.h).
#ifndef PSTRAIN_CHIEF_CHIEF_RUNNER_H_
#define PSTRAIN_CHIEF_CHIEF_RUNNER_H_

#include "absl/status/status.h"
#include "chief/chief_state.h"
#include "chief/start_point.h"
#include "common/base/shutdown.h"
#include "common/cluster/cluster_spec.h"
#include "proto/config.pb.h"

namespace pstrain {

absl::Status RunChief(const TrainingConfig& config, const ClusterSpec& cluster, uint64_t incarnation,
                      Chief* chief, StopSignal* stop, const ChiefStart& start = {});

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_CHIEF_RUNNER_H_
