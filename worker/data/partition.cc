#include "worker/data/partition.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"

namespace pstrain {

DataPartition::DataPartition(const Dataset* data, int worker, int num_workers, int batch_size,
                             bool shuffle, uint64_t seed)
    : data_(data), worker_(worker), batch_size_(batch_size), shuffle_(shuffle), seed_(seed) {
  for (int64_t i = worker; i < data->size; i += num_workers) indices_.push_back(i);
  Reshuffle();
}

void DataPartition::Reshuffle() {
  order_ = indices_;
  if (!shuffle_) return;
  std::mt19937_64 rng(seed_ ^ (0x9E3779B97F4A7C15ULL * (static_cast<uint64_t>(worker_) + 1)) ^
                      (0xC2B2AE3D27D4EB4FULL * (static_cast<uint64_t>(epoch_) + 1)));
  // Fisher-Yates with plain modulo: portable across standard libraries.
  for (size_t i = order_.size(); i > 1; --i) {
    size_t j = rng() % i;
    std::swap(order_[i - 1], order_[j]);
  }
}

absl::Status DataPartition::Next(float* x, int32_t* y, uint64_t* ids) {
  NextBatch(x, y, ids);
  return absl::OkStatus();
}

void DataPartition::NextBatch(float* x, int32_t* y, uint64_t* ids) {
  const int dim = data_->dim;
  const int fields = data_->id_fields;
  for (int r = 0; r < batch_size_; ++r) {
    if (position_ >= static_cast<int64_t>(order_.size())) {
      ++epoch_;
      position_ = 0;
      Reshuffle();
    }
    const int64_t i = order_[position_++];
    std::copy(data_->x.begin() + i * dim, data_->x.begin() + (i + 1) * dim,
              x + static_cast<int64_t>(r) * dim);
    y[r] = data_->y[i];
    if (ids != nullptr && fields > 0) {
      std::copy(data_->ids.begin() + i * fields, data_->ids.begin() + (i + 1) * fields,
                ids + static_cast<int64_t>(r) * fields);
    }
  }
}

void DataPartition::NextBatch(std::vector<float>* x, std::vector<int32_t>* y) {
  x->resize(static_cast<size_t>(batch_size_) * data_->dim);
  y->resize(batch_size_);
  NextBatch(x->data(), y->data());
}

absl::Status DataPartition::Restore(const DataCursor& cursor) {
  if (cursor.epoch < 0 || cursor.position < 0 || cursor.position > size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data cursor (epoch ", cursor.epoch, ", position ", cursor.position,
                     ") does not fit a partition of ", size(), " examples"));
  }
  epoch_ = cursor.epoch;
  position_ = cursor.position;
  Reshuffle();
  return absl::OkStatus();
}

}  // namespace pstrain
