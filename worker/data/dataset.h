// A dataset in memory: `size` examples of `dim` float features, optionally
// `id_fields` categorical ids, and one integer label each. Filled once by a
// reader (idx_reader.h, csv_reader.h, criteo_reader.h) and immutable
// afterwards, so any number of threads may read it.
#ifndef PSTRAIN_WORKER_DATA_DATASET_H_
#define PSTRAIN_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <vector>

namespace pstrain {

struct Dataset {
  int64_t size = 0;
  int dim = 0;
  std::vector<float> x;    // [size, dim], row-major
  std::vector<int32_t> y;  // [size]
  // Categorical features (click-through data): `id_fields` 64-bit ids per
  // example, one per field, or max_values for a multi-hot field (FeatureId in
  // common/base/embedding_ids.h; kNoId in the places a cell left); none for
  // image and CSV data.
  int id_fields = 0;
  std::vector<uint64_t> ids;  // [size, id_fields]
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_DATASET_H_
