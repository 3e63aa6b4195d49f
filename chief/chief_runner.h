// The chief's driver: initialises the variables on the parameter servers from
// the seed or a checkpoint, watches the global step, commits the servers'
// checkpoint shards with a manifest every checkpoint.every_steps, evaluates on the held-out set every
// `eval_every_steps`, stops the workers at max_steps, writes the final model
// (model_final.pst) and a summary (summary.json) to output_dir, and shuts the
// parameter servers down. Every wait is bounded: no progress for longer than
// the step timeout fails the run with a clear error.
#ifndef PSTRAIN_CHIEF_CHIEF_RUNNER_H_
#define PSTRAIN_CHIEF_CHIEF_RUNNER_H_

#include "absl/status/status.h"
#include "chief/chief_state.h"
#include "common/cluster/cluster_spec.h"
#include "common/base/shutdown.h"
#include "proto/config.pb.h"

namespace pstrain {

struct ChiefStart {
  // Start from the latest complete, intact checkpoint in checkpoint.dir
  // (values, optimizer slots, global step, each worker's data cursor), under
  // this cluster's placement (any number of servers); a newer damaged or
  // incomplete one is skipped with a log line saying why; with none, from
  // the seed at step 0.
  bool resume = false;
  // A new run whose variables start as this checkpoint's values (verified;
  // its optimizer slots, step and cursors are not taken): step 0, fresh
  // optimizer state. Ignored when `resume` finds a checkpoint of its own, so
  // a resumed run goes on from where it was, not from here again.
  std::string init_from;
};

absl::Status RunChief(const TrainingConfig& config, const ClusterSpec& cluster, uint64_t incarnation,
                      Chief* chief, StopSignal* stop, const ChiefStart& start = {});

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_CHIEF_RUNNER_H_
