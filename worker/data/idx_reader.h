// MNIST's IDX files as a Dataset: an image file [n, rows, cols] (or [n, dim])
// and a label file [n]. Stateless; thread-safe.
#ifndef PSTRAIN_WORKER_DATA_IDX_READER_H_
#define PSTRAIN_WORKER_DATA_IDX_READER_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/storage/env.h"
#include "worker/data/dataset.h"

namespace pstrain {

// Checks that the counts agree, that rows*cols == `input_dim` and every
// label < `num_labels`. Pixels become byte/255 when `normalize`, else the raw
// byte value.
absl::StatusOr<Dataset> LoadIdxDataset(Env* env, const std::string& images_path,
                                       const std::string& labels_path, int input_dim,
                                       int num_labels, bool normalize);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_IDX_READER_H_
