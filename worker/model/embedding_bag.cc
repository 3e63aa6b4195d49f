#include "worker/model/embedding_bag.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "common/base/embedding_ids.h"
#include "common/base/status_macros.h"

namespace pstrain {

SparseBatch SparseBatch::OnePerField(const uint64_t* ids, int batch, int fields) {
  SparseBatch s;
  s.batch = batch;
  s.fields = fields;
  const size_t n = static_cast<size_t>(batch) * fields;
  s.ids.assign(ids, ids + n);
  s.offsets.resize(n + 1);
  for (size_t i = 0; i <= n; ++i) s.offsets[i] = static_cast<int64_t>(i);
  return s;
}

SparseBatch SparseBatch::FromSlots(const uint64_t* ids, int batch,
                                   const std::vector<int>& slots) {
  const int fields = static_cast<int>(slots.size());
  int per_example = 0;
  for (int n : slots) per_example += n;
  if (per_example == fields) return OnePerField(ids, batch, fields);
  SparseBatch s;
  s.batch = batch;
  s.fields = fields;
  s.offsets.reserve(static_cast<size_t>(batch) * fields + 1);
  s.offsets.push_back(0);
  for (int b = 0; b < batch; ++b) {
    const uint64_t* at = ids + static_cast<size_t>(b) * per_example;
    for (int n : slots) {
      for (int j = 0; j < n; ++j) {
        if (at[j] != kNoId) s.ids.push_back(at[j]);
      }
      at += n;
      s.offsets.push_back(static_cast<int64_t>(s.ids.size()));
    }
  }
  return s;
}

UniqueRows UniqueRows::Of(const std::vector<uint64_t>& ids) {
  UniqueRows u;
  absl::flat_hash_map<uint64_t, uint32_t> row;
  row.reserve(ids.size());
  u.row_of.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [it, fresh] = row.emplace(ids[i], static_cast<uint32_t>(u.ids.size()));
    if (fresh) u.ids.push_back(ids[i]);
    u.row_of[i] = it->second;
  }
  return u;
}

void EmbeddingBags::Forward(const SparseBatch& batch, const UniqueRows& unique, const float* rows,
                            const float* dense, float* x) const {
  const int width = output_dim();
  for (int b = 0; b < batch.batch; ++b) {
    float* out = x + static_cast<size_t>(b) * width;
    // (No numeric inputs: `dense` may be null.)
    if (dense_dim_ > 0) {
      std::memcpy(out, dense + static_cast<size_t>(b) * dense_dim_, sizeof(float) * dense_dim_);
    }
    for (int f = 0; f < fields_; ++f) {
      float* bag = out + dense_dim_ + static_cast<size_t>(f) * dim_;
      std::fill(bag, bag + dim_, 0.0f);
      const int64_t begin = batch.offsets[static_cast<size_t>(b) * fields_ + f];
      const int64_t end = batch.offsets[static_cast<size_t>(b) * fields_ + f + 1];
      for (int64_t k = begin; k < end; ++k) {
        const float* row = rows + static_cast<size_t>(unique.row_of[k]) * dim_;
        for (int j = 0; j < dim_; ++j) bag[j] += row[j];
      }
      if (combiner_ == Combiner::kMean && end - begin > 1) {
        const float inv = 1.0f / static_cast<float>(end - begin);
        for (int j = 0; j < dim_; ++j) bag[j] *= inv;
      }
    }
  }
}

void EmbeddingBags::Backward(const SparseBatch& batch, const UniqueRows& unique, const float* dx,
                             float* row_grads) const {
  const int width = output_dim();
  std::fill(row_grads, row_grads + unique.ids.size() * dim_, 0.0f);
  for (int b = 0; b < batch.batch; ++b) {
    for (int f = 0; f < fields_; ++f) {
      const float* g =
          dx + static_cast<size_t>(b) * width + dense_dim_ + static_cast<size_t>(f) * dim_;
      const int64_t begin = batch.offsets[static_cast<size_t>(b) * fields_ + f];
      const int64_t end = batch.offsets[static_cast<size_t>(b) * fields_ + f + 1];
      const float scale =
          combiner_ == Combiner::kMean && end - begin > 1 ? 1.0f / static_cast<float>(end - begin)
                                                          : 1.0f;
      for (int64_t k = begin; k < end; ++k) {
        float* acc = row_grads + static_cast<size_t>(unique.row_of[k]) * dim_;
        for (int j = 0; j < dim_; ++j) acc[j] += scale * g[j];
      }
    }
  }
}

DeviceEmbeddingBags::DeviceEmbeddingBags(Backend* backend, int dense_dim, int fields, int dim,
                                         Combiner combiner)
    : backend_(backend),
      dense_dim_(dense_dim),
      fields_(fields),
      dim_(dim),
      mean_(combiner == Combiner::kMean),
      host_index_(backend, /*host=*/true),
      index_(backend),
      host_rows_(backend, /*host=*/true),
      rows_(backend),
      host_dense_(backend, /*host=*/true),
      dense_(backend),
      grads_(backend),
      host_grads_(backend, /*host=*/true) {}

absl::Status DeviceEmbeddingBags::Forward(const SparseBatch& batch, const UniqueRows& unique,
                                          const float* rows, const float* dense, float* x) {
  const size_t n = batch.ids.size(), bags = static_cast<size_t>(batch.batch) * fields_;
  if (batch.fields != fields_ || batch.offsets.size() != bags + 1 || unique.row_of.size() != n ||
      n > static_cast<size_t>(INT32_MAX) || batch.offsets[0] != 0 ||
      batch.offsets[bags] != static_cast<int64_t>(n)) {
    return absl::InvalidArgumentError("embedding bags: the batch's index does not fit the bags");
  }
  for (size_t bag = 0; bag < bags; ++bag) {
    if (batch.offsets[bag + 1] < batch.offsets[bag]) {
      return absl::InvalidArgumentError("embedding bags: offsets go down");
    }
  }
  for (uint32_t r : unique.row_of) {
    if (r >= unique.ids.size()) {
      return absl::InvalidArgumentError("embedding bags: an id's row is not among the unique rows");
    }
  }
  unique_ = static_cast<int>(unique.ids.size());
  // The index in one block: row_of [n], offsets [bags + 1], and each unique
  // row's occurrences (a counting sort by row, k ascending within a row):
  // occ_start [unique + 1], occ_bag [n].
  row_of_at_ = 0;
  offsets_at_ = n;
  occ_start_at_ = offsets_at_ + bags + 1;
  occ_bag_at_ = occ_start_at_ + unique_ + 1;
  const size_t index_size = occ_bag_at_ + n;
  RETURN_IF_ERROR(host_index_.Reserve(index_size));
  RETURN_IF_ERROR(index_.Reserve(index_size));
  int32_t* h = host_index_.data();
  int32_t* occ_start = h + occ_start_at_;
  std::fill(occ_start, occ_start + unique_ + 1, 0);
  for (size_t k = 0; k < n; ++k) {
    h[row_of_at_ + k] = static_cast<int32_t>(unique.row_of[k]);
    ++occ_start[unique.row_of[k] + 1];
  }
  for (int u = 0; u < unique_; ++u) occ_start[u + 1] += occ_start[u];
  next_.assign(occ_start, occ_start + unique_);
  for (size_t bag = 0; bag < bags; ++bag) {
    h[offsets_at_ + bag] = static_cast<int32_t>(batch.offsets[bag]);
    for (int64_t k = batch.offsets[bag]; k < batch.offsets[bag + 1]; ++k) {
      h[occ_bag_at_ + next_[unique.row_of[k]]++] = static_cast<int32_t>(bag);
    }
  }
  h[offsets_at_ + bags] = static_cast<int32_t>(batch.offsets[bags]);
  const size_t row_floats = static_cast<size_t>(unique_) * dim_;
  const size_t dense_floats = static_cast<size_t>(batch.batch) * dense_dim_;
  RETURN_IF_ERROR(host_rows_.Reserve(row_floats));
  RETURN_IF_ERROR(rows_.Reserve(row_floats));
  RETURN_IF_ERROR(host_dense_.Reserve(dense_floats));
  RETURN_IF_ERROR(dense_.Reserve(dense_floats));
  RETURN_IF_ERROR(grads_.Reserve(row_floats));
  RETURN_IF_ERROR(host_grads_.Reserve(row_floats));
  std::copy(rows, rows + row_floats, host_rows_.data());
  std::copy(dense, dense + dense_floats, host_dense_.data());
  RETURN_IF_ERROR(backend_->CopyToDevice(index_.data(), h, index_size * sizeof(int32_t)));
  RETURN_IF_ERROR(backend_->CopyToDevice(rows_.data(), host_rows_.data(), row_floats * 4));
  if (dense_floats > 0) {  // none without numeric inputs
    RETURN_IF_ERROR(backend_->CopyToDevice(dense_.data(), host_dense_.data(), dense_floats * 4));
  }
  return backend_->BagsForward(rows_.data(), index_.data() + row_of_at_,
                               index_.data() + offsets_at_, dense_.data(), batch.batch, fields_,
                               dim_, dense_dim_, mean_, x);
}

absl::Status DeviceEmbeddingBags::Backward(const float* dx) {
  RETURN_IF_ERROR(backend_->BagsBackward(dx, index_.data() + offsets_at_,
                                         index_.data() + occ_start_at_, index_.data() + occ_bag_at_,
                                         unique_, fields_, dim_, dense_dim_, mean_, grads_.data()));
  return backend_->CopyToHost(host_grads_.data(), grads_.data(),
                              static_cast<size_t>(unique_) * dim_ * sizeof(float));
}

}  // namespace pstrain
