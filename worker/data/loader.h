// Loads the training or held-out split that a training config names, in
// its format (IDX or CSV), checked against the model's input width and
// label range. Used by the worker (training split) and the chief (held-out
// split). Stateless; thread-safe.
#ifndef PSTRAIN_WORKER_DATA_LOADER_H_
#define PSTRAIN_WORKER_DATA_LOADER_H_

#include "absl/status/statusor.h"
#include "common/storage/env.h"
#include "proto/config.pb.h"
#include "worker/data/dataset.h"

namespace pstrain {

enum class DataSplit { kTrain, kTest };

// True when the config names a held-out split.
bool HasTestSplit(const DataConfig& config);

absl::StatusOr<Dataset> LoadDataset(Env* env, const DataConfig& config, DataSplit split,
                                    int input_dim, int num_labels);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_LOADER_H_
