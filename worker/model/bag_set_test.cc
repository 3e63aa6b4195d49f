#include "worker/model/bag_set.h"

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/base/embedding_ids.h"
#include "common/cluster/config.h"
#include "worker/model/deferred_backend.h"
#include "worker/model/embedding_bag.h"
#include "worker/model/test_util.h"

namespace pstrain {
namespace {

// Two numeric columns; fields 0 and 2 on table "a" (dim 3), fields 1 (up
// to 3 values) and 3 on table "b" (dim 2).
TrainingConfig TwoTables(bool mean) {
  auto c = ParseTrainingConfig(absl::StrCat(R"(
model { click_through { table: "a" hidden_units: 4 mean_bags: )", mean ? "true" : "false", R"( } }
embedding_tables { name: "a" dim: 3 }
embedding_tables { name: "b" dim: 2 }
data { format: CRITEO train_tsv: "x" batch_size: 8 schema { columns { kind: LABEL }
  columns { kind: NUMERIC count: 2 } columns { kind: CATEGORICAL }
  columns { kind: CATEGORICAL table: "b" max_values: 3 } columns { kind: CATEGORICAL }
  columns { kind: CATEGORICAL table: "b" } } }
optimizer { learning_rate: 0.1 sgd {} }
max_steps: 1
)"),
                               "x.pbtxt");
  INFO(c.status());
  REQUIRE(c.ok());
  return *c;
}

// A batch's ids: 5 places an example (1, 3, 1, 1), ids drawn from a few so
// that they repeat; some of field 1's places kNoId.
std::vector<uint64_t> RandomIds(int batch, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint64_t> ids;
  for (int b = 0; b < batch; ++b) {
    ids.push_back(rng() % 5);
    const int n = static_cast<int>(rng() % 4);
    for (int j = 0; j < 3; ++j) ids.push_back(j < n ? 10 + rng() % 4 : kNoId);
    ids.push_back(rng() % 5);
    ids.push_back(10 + rng() % 4);
  }
  return ids;
}

float RowValue(size_t table, uint64_t id, int j) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(id) + j + 7.0 * table));
}

void FillRows(BagSet* set) {
  for (size_t t = 0; t < set->tables(); ++t) {
    const int dim = set->table(t).dim;
    for (size_t i = 0; i < set->ids(t).size(); ++i) {
      for (int j = 0; j < dim; ++j) set->rows(t)[i * dim + j] = RowValue(t, set->ids(t)[i], j);
    }
  }
}

TEST_CASE("the bags of fields on two tables: each table's fields together, after the dense",
          "[embedding][bags]") {
  for (const bool mean : {false, true}) {
    const TrainingConfig config = TwoTables(mean);
    const std::vector<BagTable> tables = BagTablesOf(config);
    REQUIRE(tables.size() == 2);
    CHECK(tables[0].name == "a");
    CHECK(tables[0].dim == 3);
    CHECK(tables[0].fields == std::vector<int>{0, 2});
    CHECK(tables[1].name == "b");
    CHECK(tables[1].fields == std::vector<int>{1, 3});
    auto set = BagSet::ForConfig(config, 2, nullptr);
    REQUIRE(set->output_dim() == 2 + 2 * 3 + 2 * 2);
    CHECK(set->output_dim() == ExpandModelConfig(config.model())->input_dim());
    constexpr int kBatch = 6;
    const std::vector<uint64_t> ids = RandomIds(kBatch, 1);
    set->Index(ids.data(), kBatch);
    FillRows(set.get());
    const std::vector<float> dense = testing::Random(kBatch * 2, 2);
    std::vector<float> x(kBatch * set->output_dim());
    set->Forward(dense.data(), x.data());
    // The reference, example by example: the bag of each field in its
    // table's columns, its ids' rows added in order.
    const int width = set->output_dim();
    const int table_of[4] = {0, 1, 0, 1}, column_of[4] = {2, 8, 5, 10};
    const int start_of[4] = {0, 1, 4, 5}, places_of[4] = {1, 3, 1, 1};
    std::vector<float> dx = testing::Random(x.size(), 3);
    std::map<std::pair<size_t, uint64_t>, std::vector<float>> want_grads;
    for (int b = 0; b < kBatch; ++b) {
      for (int d = 0; d < 2; ++d) CHECK(x[b * width + d] == dense[b * 2 + d]);
      for (int f = 0; f < 4; ++f) {
        const size_t t = static_cast<size_t>(table_of[f]);
        const int dim = tables[t].dim;
        std::vector<float> bag(dim, 0.0f);
        int n = 0;
        for (int k = 0; k < places_of[f]; ++k) {
          const uint64_t id = ids[b * 6 + start_of[f] + k];
          if (id == kNoId) continue;
          ++n;
          for (int j = 0; j < dim; ++j) bag[j] += RowValue(t, id, j);
        }
        if (mean && n > 1) {
          for (float& v : bag) v *= 1.0f / static_cast<float>(n);
        }
        for (int j = 0; j < dim; ++j) {
          INFO("example " << b << " field " << f << " element " << j);
          CHECK(x[b * width + column_of[f] + j] == bag[j]);
        }
        for (int k = 0; k < places_of[f]; ++k) {
          const uint64_t id = ids[b * 6 + start_of[f] + k];
          if (id == kNoId) continue;
          std::vector<float>& g = want_grads[{t, id}];
          g.resize(dim, 0.0f);
          const float scale = mean && n > 1 ? 1.0f / static_cast<float>(n) : 1.0f;
          for (int j = 0; j < dim; ++j) g[j] += scale * dx[b * width + column_of[f] + j];
        }
      }
    }
    set->Backward(dx.data());
    size_t rows = 0;
    for (size_t t = 0; t < set->tables(); ++t) {
      const int dim = tables[t].dim;
      rows += set->ids(t).size();
      for (size_t i = 0; i < set->ids(t).size(); ++i) {
        const std::vector<float>& g = want_grads.at({t, set->ids(t)[i]});
        for (int j = 0; j < dim; ++j) CHECK(set->row_grads(t)[i * dim + j] == g[j]);
      }
    }
    CHECK(rows == want_grads.size());
    // Ids 0..4 are table a's and 10..13 table b's: each pulled from its own.
    for (uint64_t id : set->ids(0)) CHECK(id < 5);
    for (uint64_t id : set->ids(1)) CHECK(id >= 10);
  }
}

TEST_CASE("bags on a device equal the host's bit for bit, with one table or two",
          "[embedding][bags]") {
  for (const bool two : {false, true}) {
    TrainingConfig config = TwoTables(/*mean=*/true);
    if (!two) {
      for (auto& c : *config.mutable_data()->mutable_schema()->mutable_columns()) c.clear_table();
      config.mutable_model()->mutable_click_through()->set_bag_inputs(0);
    }
    testing::DeferredBackend backend;
    auto host = BagSet::ForConfig(config, 2, nullptr);
    auto device = BagSet::ForConfig(config, 2, &backend);
    REQUIRE(host->tables() == (two ? 2u : 1u));
    REQUIRE(device->output_dim() == host->output_dim());
    for (uint32_t seed : {1u, 2u, 3u}) {
      const int batch = 3 + static_cast<int>(seed) * 2;
      const std::vector<uint64_t> ids = RandomIds(batch, seed);
      const std::vector<float> dense = testing::Random(batch * 2, seed + 10);
      const size_t n = static_cast<size_t>(batch) * host->output_dim();
      const std::vector<float> dx = testing::Random(n, seed + 20);
      host->Index(ids.data(), batch);
      device->Index(ids.data(), batch);
      FillRows(host.get());
      FillRows(device.get());
      std::vector<float> want_x(n), got_x(n);
      host->Forward(dense.data(), want_x.data());
      host->Backward(dx.data());
      DeviceArray<float> x(&backend), dx_device(&backend);
      REQUIRE(x.Reserve(n).ok());
      REQUIRE(dx_device.Reserve(n).ok());
      REQUIRE(device->DeviceForward(dense.data(), x.data()).ok());
      REQUIRE(backend.CopyToDevice(dx_device.data(), dx.data(), n * sizeof(float)).ok());
      REQUIRE(device->DeviceBackward(dx_device.data()).ok());
      REQUIRE(backend.CopyToHost(got_x.data(), x.data(), n * sizeof(float)).ok());
      REQUIRE(backend.Synchronize().ok());
      device->TakeDeviceGradients();
      CHECK(got_x == want_x);
      for (size_t t = 0; t < host->tables(); ++t) {
        REQUIRE(device->ids(t) == host->ids(t));
        const size_t floats = host->ids(t).size() * host->table(t).dim;
        CHECK(std::vector<float>(device->row_grads(t), device->row_grads(t) + floats) ==
              std::vector<float>(host->row_grads(t), host->row_grads(t) + floats));
      }
      CHECK(device->SquaredGradientNorm() == host->SquaredGradientNorm());
    }
  }
}

TEST_CASE("one table's BagSet is EmbeddingBags over every field, as before tables were several",
          "[embedding][bags]") {
  TrainingConfig config = TwoTables(/*mean=*/false);
  for (auto& c : *config.mutable_data()->mutable_schema()->mutable_columns()) c.clear_table();
  config.mutable_model()->mutable_click_through()->set_bag_inputs(0);
  auto set = BagSet::ForConfig(config, 2, nullptr);
  const EmbeddingBags bags(2, 4, 3, Combiner::kSum);
  REQUIRE(set->output_dim() == bags.output_dim());
  constexpr int kBatch = 5;
  const std::vector<uint64_t> ids = RandomIds(kBatch, 4);
  set->Index(ids.data(), kBatch);
  const SparseBatch sparse = SparseBatch::FromSlots(ids.data(), kBatch, {1, 3, 1, 1});
  const UniqueRows unique = UniqueRows::Of(sparse.ids);
  REQUIRE(set->ids(0) == unique.ids);
  FillRows(set.get());
  const std::vector<float> dense = testing::Random(kBatch * 2, 5);
  std::vector<float> want(kBatch * bags.output_dim()), got(want.size());
  bags.Forward(sparse, unique, set->rows(0), dense.data(), want.data());
  set->Forward(dense.data(), got.data());
  CHECK(got == want);
  std::vector<float> grads(unique.ids.size() * 3);
  bags.Backward(sparse, unique, want.data(), grads.data());
  set->Backward(want.data());
  CHECK(std::vector<float>(set->row_grads(0), set->row_grads(0) + grads.size()) == grads);
  set->ScaleGradients(0.5f);
  CHECK(set->row_grads(0)[0] == 0.5f * grads[0]);
}

}  // namespace
}  // namespace pstrain
