// Helpers for the embedding bags' tests, shared by the CPU tests and the
// CUDA ones: random bags, and a device's bags checked against the host's.
// Test-only.
#ifndef PSTRAIN_WORKER_MODEL_BAGS_TEST_UTIL_H_
#define PSTRAIN_WORKER_MODEL_BAGS_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "catch2/catch.hpp"
#include "worker/model/backend.h"
#include "worker/model/embedding_bag.h"
#include "worker/model/test_util.h"

namespace pstrain::testing {

// A batch of bags of 0..max_ids ids each, drawn from `id_range` ids so that
// they repeat within and across bags.
inline SparseBatch RandomBags(int batch, int fields, uint32_t seed, int max_ids = 3,
                              int id_range = 7) {
  std::mt19937 rng(seed);
  SparseBatch s;
  s.batch = batch;
  s.fields = fields;
  s.offsets.push_back(0);
  for (int bag = 0; bag < batch * fields; ++bag) {
    const int n = static_cast<int>(rng() % (max_ids + 1));
    for (int k = 0; k < n; ++k) s.ids.push_back(100 + rng() % id_range);
    s.offsets.push_back(static_cast<int64_t>(s.ids.size()));
  }
  return s;
}

// One forward and backward of `device` (on `backend`) for the bags `s`,
// with rows, dense features and an input gradient drawn from `seed`, must
// equal the host's EmbeddingBags bit for bit. The caller's rows and dense
// features are overwritten with NaN right after Forward: the device must
// have staged them.
inline void CheckDeviceBagsMatchHost(Backend* backend, DeviceEmbeddingBags* device,
                                     const EmbeddingBags& host, const SparseBatch& s,
                                     uint32_t seed) {
  const UniqueRows u = UniqueRows::Of(s.ids);
  const size_t width = host.output_dim();
  const int dense_dim = host.output_dim() - s.fields * host.dim();
  std::vector<float> rows = Random(u.ids.size() * host.dim(), seed);
  std::vector<float> dense = Random(static_cast<size_t>(s.batch) * dense_dim, seed + 1);
  const std::vector<float> grad_x = Random(s.batch * width, seed + 2);
  std::vector<float> want_x(s.batch * width), want_grads(rows.size()), got_x(s.batch * width);
  host.Forward(s, u, rows.data(), dense.data(), want_x.data());
  host.Backward(s, u, grad_x.data(), want_grads.data());

  DeviceArray<float> x(backend), dx(backend);
  REQUIRE(x.Reserve(got_x.size()).ok());
  REQUIRE(dx.Reserve(grad_x.size()).ok());
  REQUIRE(device->Forward(s, u, rows.data(), dense.data(), x.data()).ok());
  std::fill(rows.begin(), rows.end(), std::nanf(""));
  std::fill(dense.begin(), dense.end(), std::nanf(""));
  REQUIRE(backend->CopyToDevice(dx.data(), grad_x.data(), grad_x.size() * sizeof(float)).ok());
  REQUIRE(device->Backward(dx.data()).ok());
  REQUIRE(backend->CopyToHost(got_x.data(), x.data(), got_x.size() * sizeof(float)).ok());
  REQUIRE(backend->Synchronize().ok());
  CHECK(got_x == want_x);
  const float* g = device->host_row_gradients();
  CHECK(std::vector<float>(g, g + want_grads.size()) == want_grads);
}

}  // namespace pstrain::testing

#endif  // PSTRAIN_WORKER_MODEL_BAGS_TEST_UTIL_H_
