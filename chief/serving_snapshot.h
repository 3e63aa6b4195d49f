// Serving snapshots (checkpoint.serving_dir): after each checkpoint the
// chief commits, the model as a reader outside pstrain loads it, in
// safetensors files (common/storage/tensor_export.h), with the embedding
// tables as deltas where the checkpoint's rows are (checkpoint.full_every):
//
//   SERVING/step-<N>/model.safetensors          every dense variable whole
//                                               (float32, named as trained)
//   SERVING/step-<N>/table-<name>.safetensors   "ids" (U64 [n]), "values"
//                                               (F32 [n, dim]), "deleted"
//                                               (U64 [m]); __metadata__:
//                                               "kind" "full" or "delta",
//                                               "base" "step-<M>" (a delta's),
//                                               "step", "table"
//   SERVING/latest                              "latest: step-<N>" and the
//                                               checkpoint's time; replaced
//                                               once step-<N> is whole
//
// A full table holds every row; a delta holds the rows changed since its
// base snapshot (whole, as they stand) and the ids dropped since (some may
// never have been in a snapshot): a reader takes the newest full snapshot
// of a table and applies the deltas after it in order (docs/checkpoints.md
// has a reader in Python). A table is a delta when the previous snapshot
// is of a checkpoint its rows' chain rests on (the same checkpoint, by step
// and time: a rollback's new timeline never rests on the old one's
// snapshots); otherwise, and for the first, full. A full snapshot removes
// the snapshots before it, and any after it (an abandoned timeline).
#ifndef PSTRAIN_CHIEF_SERVING_SNAPSHOT_H_
#define PSTRAIN_CHIEF_SERVING_SNAPSHOT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/storage/env.h"

namespace pstrain {

// Writes the snapshot of the committed checkpoint `ckpt_dir` (of `step`)
// under `serving_dir`. On a failure nothing is replaced: `latest` names the
// snapshot before.
absl::Status WriteServingSnapshot(Env* env, const std::string& serving_dir,
                                  const std::string& ckpt_dir, int64_t step);

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_SERVING_SNAPSHOT_H_
