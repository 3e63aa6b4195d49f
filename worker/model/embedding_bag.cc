#include "worker/model/embedding_bag.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"

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
    std::memcpy(out, dense + static_cast<size_t>(b) * dense_dim_, sizeof(float) * dense_dim_);
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

}  // namespace pstrain
