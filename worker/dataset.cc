#include "worker/dataset.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "common/idx.h"
#include "common/status_macros.h"

namespace pstrain {

absl::StatusOr<Dataset> LoadIdxDataset(Env* env, const std::string& images_path,
                                       const std::string& labels_path, int input_dim,
                                       int num_classes, bool normalize) {
  ASSIGN_OR_RETURN(IdxArray images, ReadIdxFile(env, images_path));
  ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(env, labels_path));
  if (images.dims.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": expected images of rank >= 2"));
  }
  if (labels.dims.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, ": expected labels of rank 1"));
  }
  if (images.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, " has ", images.dims[0],
                                                   " images but ", labels_path, " has ",
                                                   labels.dims[0], " labels"));
  }
  int64_t dim = 1;
  for (size_t i = 1; i < images.dims.size(); ++i) dim *= images.dims[i];
  if (dim != input_dim) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": images have ", dim,
                                                   " values each, the model's input_dim is ",
                                                   input_dim));
  }
  Dataset d;
  d.size = images.dims[0];
  d.dim = input_dim;
  d.x.resize(images.data.size());
  const float scale = normalize ? 1.0f / 255.0f : 1.0f;
  for (size_t i = 0; i < images.data.size(); ++i) d.x[i] = images.data[i] * scale;
  d.y.resize(d.size);
  for (int64_t i = 0; i < d.size; ++i) {
    if (labels.data[i] >= num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", int{labels.data[i]},
                                                     " at index ", i, " >= num_classes ",
                                                     num_classes));
    }
    d.y[i] = labels.data[i];
  }
  return d;
}

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

void DataPartition::NextBatch(std::vector<float>* x, std::vector<int32_t>* y) {
  x->resize(static_cast<size_t>(batch_size_) * data_->dim);
  y->resize(batch_size_);
  for (int r = 0; r < batch_size_; ++r) {
    if (position_ >= static_cast<int64_t>(order_.size())) {
      ++epoch_;
      position_ = 0;
      Reshuffle();
    }
    const int64_t i = order_[position_++];
    std::copy(data_->x.begin() + i * data_->dim, data_->x.begin() + (i + 1) * data_->dim,
              x->begin() + static_cast<int64_t>(r) * data_->dim);
    (*y)[r] = data_->y[i];
  }
}

}  // namespace pstrain
