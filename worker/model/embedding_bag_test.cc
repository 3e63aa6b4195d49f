// Embedding bags by hand (sum, mean, duplicates, empty bags) and the whole
// click-through front end (rows -> bags -> concat -> MLP -> sigmoid
// cross-entropy) against finite differences of the loss in the rows.
#include "worker/model/embedding_bag.h"

#include <cmath>
#include <random>

#include "catch2/catch.hpp"
#include "common/base/embedding_ids.h"
#include "worker/model/bags_test_util.h"
#include "worker/model/deferred_backend.h"
#include "worker/model/model.h"
#include "worker/model/test_util.h"

namespace pstrain {
namespace {

using testing::CheckDeviceBagsMatchHost;
using testing::DeferredBackend;
using testing::ParseModel;
using testing::Random;
using testing::RandomBags;

TEST_CASE("unique ids keep the order of first appearance", "[embedding_bag]") {
  const UniqueRows u = UniqueRows::Of({7, 3, 7, 9, 3});
  CHECK(u.ids == std::vector<uint64_t>{7, 3, 9});
  CHECK(u.row_of == std::vector<uint32_t>{0, 1, 0, 2, 1});
}

TEST_CASE("an example's ids in places make bags of each field's values, kNoId left out",
          "[embedding_bag]") {
  // Two examples; field 0 one id, field 1 up to three.
  const std::vector<uint64_t> ids = {5, 1, 2, kNoId,  //
                                     6, kNoId, kNoId, kNoId};
  const SparseBatch s = SparseBatch::FromSlots(ids.data(), 2, {1, 3});
  CHECK(s.batch == 2);
  CHECK(s.fields == 2);
  CHECK(s.ids == std::vector<uint64_t>{5, 1, 2, 6});
  CHECK(s.offsets == std::vector<int64_t>{0, 1, 3, 4, 4});
  // One place a field: as OnePerField.
  const SparseBatch one = SparseBatch::FromSlots(ids.data(), 4, {1, 1});
  CHECK(one.ids == ids);
  CHECK(one.offsets == SparseBatch::OnePerField(ids.data(), 4, 2).offsets);
}

TEST_CASE("bags sum or average their rows after the dense features; gradients scatter back",
          "[embedding_bag]") {
  // 2 examples, 2 fields, dim 2, 1 dense feature. Bags: (0,0) = {a, b},
  // (0,1) = {}, (1,0) = {a}, (1,1) = {a, a} (a duplicate within a bag).
  SparseBatch s;
  s.batch = 2;
  s.fields = 2;
  s.ids = {10, 20, 10, 10, 10};
  s.offsets = {0, 2, 2, 3, 5};
  const UniqueRows u = UniqueRows::Of(s.ids);
  REQUIRE(u.ids == std::vector<uint64_t>{10, 20});
  const std::vector<float> rows = {1, 2, 10, 20};  // a = [1, 2], b = [10, 20]
  const std::vector<float> dense = {0.5f, -0.5f};
  std::vector<float> x(2 * 5);
  EmbeddingBags sum(1, 2, 2, Combiner::kSum);
  REQUIRE(sum.output_dim() == 5);
  sum.Forward(s, u, rows.data(), dense.data(), x.data());
  CHECK(x == std::vector<float>{0.5f, 11, 22, 0, 0, -0.5f, 1, 2, 2, 4});
  EmbeddingBags mean(1, 2, 2, Combiner::kMean);
  mean.Forward(s, u, rows.data(), dense.data(), x.data());
  CHECK(x == std::vector<float>{0.5f, 5.5f, 11, 0, 0, -0.5f, 1, 2, 1, 2});

  // dL/dx: every bag element gets 1, except (1,1) gets 3.
  const std::vector<float> dx = {9, 1, 1, 1, 1, 9, 1, 1, 3, 3};
  std::vector<float> g(2 * 2);
  sum.Backward(s, u, dx.data(), g.data());
  // a: bag (0,0) once + bag (1,0) once + bag (1,1) twice x 3 = 8; b: 1.
  CHECK(g == std::vector<float>{8, 8, 1, 1});
  mean.Backward(s, u, dx.data(), g.data());
  // a: 1/2 + 1 + 2 x 3/2 = 4.5; b: 1/2.
  CHECK(g == std::vector<float>{4.5f, 4.5f, 0.5f, 0.5f});
}

TEST_CASE("the click-through front end's row gradients match finite differences",
          "[embedding_bag]") {
  // 3 dense features, 4 fields of one id each, dim 3; an MLP on top.
  constexpr int kBatch = 6, kDense = 3, kFields = 4, kDim = 3;
  EmbeddingBags bags(kDense, kFields, kDim, Combiner::kMean);
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  auto m = Model::Create(
      ParseModel("sequential { input_dim: 15 layer { dense { units: 8 } } layer { gelu {} } "
                 "layer { dense { units: 1 } } layer { sigmoid_cross_entropy {} } }"),
      cpu.get());
  REQUIRE(m.ok());
  Model& model = **m;
  REQUIRE(model.SetParameters(model.Initialize(3)).ok());
  model.set_input_gradient(true);
  std::vector<uint64_t> raw(kBatch * kFields);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = (i * 7) % 9;  // repeats across examples
  const SparseBatch s = SparseBatch::OnePerField(raw.data(), kBatch, kFields);
  const UniqueRows u = UniqueRows::Of(s.ids);
  std::vector<float> rows = Random(u.ids.size() * kDim, 5);
  const std::vector<float> dense = Random(kBatch * kDense, 6);
  const std::vector<int32_t> labels = {0, 1, 1, 0, 1, 0};
  std::vector<float> x(kBatch * bags.output_dim());
  auto loss_at = [&](const std::vector<float>& r) {
    bags.Forward(s, u, r.data(), dense.data(), x.data());
    float loss = 0;
    REQUIRE(model.ComputeGradients(x.data(), labels.data(), kBatch, 1, &loss).ok());
    return static_cast<double>(loss);
  };
  loss_at(rows);
  std::vector<float> grads(rows.size());
  bags.Backward(s, u, model.host_input_gradient(), grads.data());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<float> plus = rows, minus = rows;
    const float h = 1e-2f;
    plus[i] += h;
    minus[i] -= h;
    const double numeric = (loss_at(plus) - loss_at(minus)) / (2.0 * h);
    INFO("row element " << i);
    CHECK(grads[i] == Approx(numeric).margin(2e-4).epsilon(2e-2));
  }
}

TEST_CASE(
    "bags in a backend's memory give the host's numbers bit for bit, on the CPU and on a "
    "deferring device",
    "[embedding_bag]") {
  constexpr int kBatch = 9, kDense = 2, kFields = 3, kDim = 5;
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  DeferredBackend deferred;
  for (Backend* backend : {cpu.get(), static_cast<Backend*>(&deferred)}) {
    for (Combiner combiner : {Combiner::kSum, Combiner::kMean}) {
      INFO(backend->Describe() << (combiner == Combiner::kMean ? ", mean" : ", sum"));
      EmbeddingBags host(kDense, kFields, kDim, combiner);
      DeviceEmbeddingBags device(backend, kDense, kFields, kDim, combiner);
      for (uint32_t step = 0; step < 3; ++step) {  // buffers reused, index rebuilt
        INFO("step " << step);
        CheckDeviceBagsMatchHost(backend, &device, host, RandomBags(kBatch, kFields, 40 + step),
                                 50 + 10 * step);
      }
    }
  }
}

TEST_CASE("bags refuse a batch whose index does not fit", "[embedding_bag]") {
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  DeviceEmbeddingBags device(cpu.get(), 1, 2, 2, Combiner::kSum);
  DeviceArray<float> x(cpu.get());
  REQUIRE(x.Reserve(2 * 5).ok());
  SparseBatch s = RandomBags(2, 2, 1);
  const UniqueRows u = UniqueRows::Of(s.ids);
  const std::vector<float> rows(u.ids.size() * 2, 1.0f), dense(2, 0.0f);
  REQUIRE(device.Forward(s, u, rows.data(), dense.data(), x.data()).ok());
  SparseBatch bad = s;
  bad.offsets[1] = bad.offsets[2] + 1;  // goes down
  CHECK(device.Forward(bad, u, rows.data(), dense.data(), x.data()).code() ==
        absl::StatusCode::kInvalidArgument);
  bad = s;
  bad.offsets.back() += 1;  // past the ids
  CHECK_FALSE(device.Forward(bad, u, rows.data(), dense.data(), x.data()).ok());
  UniqueRows wrong = u;
  REQUIRE(!wrong.row_of.empty());  // (this seed's bags hold ids)
  wrong.row_of[0] = static_cast<uint32_t>(wrong.ids.size());
  CHECK_FALSE(device.Forward(s, wrong, rows.data(), dense.data(), x.data()).ok());
  bad = s;
  bad.fields = 3;
  CHECK_FALSE(device.Forward(bad, u, rows.data(), dense.data(), x.data()).ok());
}

TEST_CASE("a click-through step with the bags on a deferring device equals the host's",
          "[embedding_bag]") {
  constexpr int kBatch = 7, kDense = 3, kFields = 4, kDim = 3;
  const char* config =
      "sequential { input_dim: 15 layer { dense { units: 8 } } layer { gelu {} } "
      "layer { dense { units: 1 } } layer { sigmoid_cross_entropy {} } }";
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  DeferredBackend deferred;
  auto mh = Model::Create(ParseModel(config), cpu.get());
  auto md = Model::Create(ParseModel(config), &deferred);
  REQUIRE(mh.ok());
  REQUIRE(md.ok());
  Model& host_model = **mh;
  Model& device_model = **md;
  const std::vector<Tensor> params = host_model.Initialize(8);
  REQUIRE(host_model.SetParameters(params).ok());
  REQUIRE(device_model.SetParameters(params).ok());
  host_model.set_input_gradient(true);
  device_model.set_input_gradient(true, /*to_host=*/false);
  EmbeddingBags host_bags(kDense, kFields, kDim, Combiner::kMean);
  DeviceEmbeddingBags device_bags(&deferred, kDense, kFields, kDim, Combiner::kMean);
  const std::vector<int32_t> labels = {0, 1, 1, 0, 1, 0, 1};
  for (uint32_t step = 0; step < 2; ++step) {
    INFO("step " << step);
    const SparseBatch s = RandomBags(kBatch, kFields, 80 + step);
    const UniqueRows u = UniqueRows::Of(s.ids);
    const std::vector<float> rows = Random(u.ids.size() * kDim, 90 + step);
    const std::vector<float> dense = Random(kBatch * kDense, 95 + step);

    std::vector<float> x(kBatch * host_bags.output_dim()), want(rows.size());
    host_bags.Forward(s, u, rows.data(), dense.data(), x.data());
    float host_loss = 0, device_loss = 0;
    REQUIRE(host_model.ComputeGradients(x.data(), labels.data(), kBatch, step, &host_loss).ok());
    host_bags.Backward(s, u, host_model.host_input_gradient(), want.data());

    REQUIRE(device_model
                .StageBatchWith(labels.data(), kBatch,
                                [&](float* xd) {
                                  return device_bags.Forward(s, u, rows.data(), dense.data(), xd);
                                })
                .ok());
    REQUIRE(device_model.ForwardBackward(step).ok());
    REQUIRE(device_bags.Backward(device_model.device_input_gradient()).ok());
    CHECK(deferred.queued() > 0);  // nothing ran yet: FinishStep's wait runs it all
    REQUIRE(device_model.FinishStep(&device_loss).ok());
    CHECK(device_loss == host_loss);
    const float* g = device_bags.host_row_gradients();
    CHECK(std::vector<float>(g, g + want.size()) == want);
    std::vector<Tensor> hg, dg;
    host_model.CopyGradients(&hg);
    device_model.CopyGradients(&dg);
    for (size_t v = 0; v < hg.size(); ++v) CHECK(hg[v].values() == dg[v].values());
  }
}

}  // namespace
}  // namespace pstrain
