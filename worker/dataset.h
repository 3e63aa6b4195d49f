// Training data for the MLP: an IDX image/label pair loaded into memory, and
// one worker's partition of it. Worker w of N owns the examples whose index
// i satisfies i % N == w; each epoch its order is shuffled from (seed, worker,
// epoch), so every worker, and the single-process reference that replays the
// same partitions, draws the same batches. A cursor (epoch, position) says
// where a partition is. Dataset is immutable after loading (thread-safe);
// a DataPartition belongs to one thread.
#ifndef PSTRAIN_WORKER_DATASET_H_
#define PSTRAIN_WORKER_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"

namespace pstrain {

struct Dataset {
  int64_t size = 0;
  int dim = 0;
  std::vector<float> x;       // [size, dim]
  std::vector<int32_t> y;     // [size]
};

// Loads images [n, rows, cols] (or [n, dim]) and labels [n]; checks that the
// counts agree, that rows*cols == `input_dim` and every label < `num_classes`.
// Pixels become byte/255 when `normalize`, else the raw byte value.
absl::StatusOr<Dataset> LoadIdxDataset(Env* env, const std::string& images_path,
                                       const std::string& labels_path, int input_dim,
                                       int num_classes, bool normalize);

class DataPartition {
 public:
  DataPartition(const Dataset* data, int worker, int num_workers, int batch_size, bool shuffle,
                uint64_t seed);

  int64_t size() const { return static_cast<int64_t>(indices_.size()); }
  // Copies the next batch, wrapping into the next epoch as needed.
  void NextBatch(std::vector<float>* x, std::vector<int32_t>* y);
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }

 private:
  void Reshuffle();

  const Dataset* const data_;
  const int worker_;
  const int batch_size_;
  const bool shuffle_;
  const uint64_t seed_;
  std::vector<int64_t> indices_;  // this worker's examples, in the base order
  std::vector<int64_t> order_;    // this epoch's order
  int64_t epoch_ = 0;
  int64_t position_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATASET_H_
