// One worker's partition of a dataset, in batches. Worker w of N owns the
// examples whose index i satisfies i % N == w; each epoch its order is
// shuffled from (seed, worker, epoch), so every worker, and a single-process
// reference that replays the same partitions, draws the same batches. A
// cursor (epoch, position) says where a partition is; restoring it on a
// fresh partition resumes the exact sequence (checkpoints save it). A batch
// that reaches the end of an epoch wraps into the next one.
// The Dataset must outlive the partition; a partition belongs to one thread.
#ifndef PSTRAIN_WORKER_DATA_PARTITION_H_
#define PSTRAIN_WORKER_DATA_PARTITION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/data/batch_source.h"
#include "worker/data/dataset.h"

namespace pstrain {

class DataPartition : public BatchSource {
 public:
  DataPartition(const Dataset* data, int worker, int num_workers, int batch_size, bool shuffle,
                uint64_t seed);

  int64_t size() const { return static_cast<int64_t>(indices_.size()); }
  int batch_size() const override { return batch_size_; }
  int dim() const override { return data_->dim; }
  int id_fields() const override { return data_->id_fields; }

  // Writes the next batch_size() examples: x [batch_size, dim], y [batch_size],
  // and, when `ids` is given, their categorical ids [batch_size, id_fields].
  // The partition must not be empty.
  void NextBatch(float* x, int32_t* y, uint64_t* ids = nullptr);
  void NextBatch(std::vector<float>* x, std::vector<int32_t>* y);
  // NextBatch, as a BatchSource (never fails).
  absl::Status Next(float* x, int32_t* y, uint64_t* ids) override;

  // The epoch, and the examples of it already handed out.
  DataCursor cursor() const override { return {epoch_, position_}; }
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }
  // Continues from `cursor`, as the partition that produced it would.
  absl::Status Restore(const DataCursor& cursor) override;

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

#endif  // PSTRAIN_WORKER_DATA_PARTITION_H_
