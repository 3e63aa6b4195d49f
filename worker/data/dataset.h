// A dataset in memory: `size` examples of `dim` float features and one
// integer label each. Filled once by a reader (idx_reader.h, csv_reader.h)
// and immutable afterwards, so any number of threads may read it.
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
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_DATASET_H_
