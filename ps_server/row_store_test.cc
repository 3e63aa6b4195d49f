// The row store on its own: what a row request's ids and gradients must be,
// pooled lookups, a sync step's staged rows (bounded, averaged over the
// step's contributors, dropped for a restarted worker), async applies that
// change nothing when refused, and rows loaded from a checkpoint.
#include "ps_server/row_store.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/base/embedding_ids.h"
#include "common/cluster/config.h"

namespace pstrain {
namespace {

// Sync SGD at rate 0.5 over `workers` workers, one table "t" of width 2
// (fixed-size, 10 rows), this server `shard` of `shards`.
std::shared_ptr<ServerModel> Model(int workers, int shard = 0, int shards = 1) {
  auto config = ParseTrainingConfig(R"(
model { mlp { input_dim: 2 num_classes: 2 } }
data { train_images: "x" train_labels: "y" batch_size: 1 }
optimizer { learning_rate: 0.5 }
max_steps: 10
sync {}
embedding_tables { name: "t" dim: 2 num_rows: 10 }
)",
                                    "test");
  REQUIRE(config.ok());
  InitializeRequest req;
  req.set_incarnation(1);
  *req.mutable_config() = *config;
  req.set_num_workers(workers);
  req.set_num_servers(shards);
  req.set_server_index(shard);
  auto model = NewServerModel(req);
  REQUIRE(model.ok());
  return *model;
}

std::string PackedIds(const std::vector<uint64_t>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 8);
}
std::string PackedFloats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

std::vector<float> Row(const ServerModel& model, uint64_t id) {
  std::vector<float> values;
  REQUIRE(model.tables.at("t")->rows->ReadRow(id, &values));
  return values;
}

TEST_CASE("row store: ids are whole uint64s, and no more than one request may carry",
          "[ps][rows]") {
  std::vector<uint64_t> ids;
  REQUIRE(RowStore::DecodeIds(PackedIds(std::vector<uint64_t>{3, 9}), &ids).ok());
  CHECK(ids == std::vector<uint64_t>{3, 9});
  CHECK(absl::StrContains(RowStore::DecodeIds("1234567", &ids).message(),
                          "7 bytes is not a whole number of uint64"));
  REQUIRE(RowStore::DecodeIds("", &ids).ok());
  CHECK(ids.empty());
}

TEST_CASE("row store: a row push's ids and gradients are read from its frame and checked",
          "[ps][rows]") {
  auto model = Model(1);
  const ServerModel::Table& table = *model->tables.at("t");
  const std::string bytes = PackedIds(std::vector<uint64_t>{1, 4}) + PackedFloats({1, 2, 3, 4});
  const SegmentedBytes payload(bytes);
  PushRowsRequest header;
  header.set_table("t");
  header.set_num_ids(2);
  std::vector<uint64_t> ids;
  std::vector<float> grads;
  bool oversize = true;
  REQUIRE(RowStore::DecodePushIds(header, payload, &ids, &oversize).ok());
  CHECK_FALSE(oversize);
  CHECK(ids == std::vector<uint64_t>{1, 4});
  REQUIRE(RowStore::DecodePushGradients(header, payload, table, ids, &grads).ok());
  CHECK(grads == std::vector<float>{1, 2, 3, 4});

  // Width: 3 floats for 2 ids of width 2.
  const std::string short_bytes = PackedIds(std::vector<uint64_t>{1, 4}) + PackedFloats({1, 2, 3});
  const SegmentedBytes short_payload(short_bytes);
  CHECK(absl::StrContains(
      RowStore::DecodePushGradients(header, short_payload, table, ids, &grads).message(),
      "12 bytes of gradients for 2 ids of table t (2 floats each)"));

  PushRowsRequest in_header = header;
  in_header.set_ids("12345678");
  CHECK_FALSE(RowStore::DecodePushIds(in_header, payload, &ids, &oversize).ok());
  CHECK_FALSE(oversize);
  PushRowsRequest too_many = header;
  too_many.set_num_ids(static_cast<int64_t>(RowStore::kMaxRowsPerRequest) + 1);
  CHECK_FALSE(RowStore::DecodePushIds(too_many, payload, &ids, &oversize).ok());
  CHECK(oversize);
  PushRowsRequest beyond = header;
  beyond.set_num_ids(5);
  CHECK(absl::StrContains(RowStore::DecodePushIds(beyond, payload, &ids, &oversize).message(),
                          "32 bytes of payload for 5 ids"));
}

TEST_CASE("row store: lookups fill a pooled buffer, reused once the reply is sent", "[ps][rows]") {
  auto model = Model(1);
  RowStore store;
  auto first = store.Lookup(*model->tables.at("t"), {2, 7, 2}, 3);
  REQUIRE(first.ok());
  CHECK(first->version == 3);
  CHECK(first->dim == 2);
  CHECK(first->floats == 6);
  CHECK((*first->values)[0] == (*first->values)[4]);  // the same row twice
  const std::vector<float>* buffer = first->values.get();
  first->values.reset();  // gRPC released the slice
  auto second = store.Lookup(*model->tables.at("t"), {1}, 4);
  REQUIRE(second.ok());
  CHECK(second->values.get() == buffer);
  CHECK(second->values->size() == 2);
  CHECK_FALSE(store.Lookup(*model->tables.at("t"), {10}, 4).ok());  // a fixed table's range
}

TEST_CASE("row store: a sync step's staged rows average over its contributors, in worker order",
          "[ps][rows]") {
  auto model = Model(2);
  ServerModel::Table* table = model->tables.at("t").get();
  RowStore store;
  REQUIRE(store.Lookup(*table, {5, 6}, 0).ok());  // the rows exist
  const std::vector<float> r5 = Row(*model, 5), r6 = Row(*model, 6);
  REQUIRE(RowStore::Stage(table, 0, 0, {5}, {1, 2}).ok());
  REQUIRE(RowStore::Stage(table, 1, 0, {5, 6}, {3, 4, 8, 8}).ok());
  RowStore::ApplyStaged(model.get(), 0, /*contributors=*/2);
  // SGD at 0.5 of (sum / 2): row 5 gets (1+3, 2+4) / 2, row 6 (8, 8) / 2.
  CHECK(Row(*model, 5) == std::vector<float>{r5[0] - 0.5f * 2.0f, r5[1] - 0.5f * 3.0f});
  CHECK(Row(*model, 6) == std::vector<float>{r6[0] - 0.5f * 4.0f, r6[1] - 0.5f * 4.0f});
  CHECK(table->staged_ids[0].empty());
  CHECK(table->staged_ids[1].empty());

  // A restarted worker's staged rows are dropped; the others' stay.
  REQUIRE(RowStore::Stage(table, 0, 1, {5}, {1, 1}).ok());
  REQUIRE(RowStore::Stage(table, 1, 1, {6}, {1, 1}).ok());
  RowStore::DropStaged(model.get(), 0);
  CHECK(table->staged_ids[0].empty());
  CHECK(table->staged_ids[1].size() == 1);
}

TEST_CASE("row store: one worker's rows for a step are bounded", "[ps][rows]") {
  auto model = Model(1);
  ServerModel::Table* table = model->tables.at("t").get();
  table->staged_ids[0].assign(RowStore::kMaxRowsPerRequest, 1);
  table->staged_grads[0].assign(2 * RowStore::kMaxRowsPerRequest, 0.0f);
  absl::Status full = RowStore::Stage(table, 0, 7, {2}, {1, 1});
  CHECK(absl::IsResourceExhausted(full));
  CHECK(absl::StrContains(full.message(), "rows of table t for step 7"));
  CHECK(table->staged_ids[0].size() == RowStore::kMaxRowsPerRequest);
}

TEST_CASE("row store: an async row push that is refused changes nothing", "[ps][rows]") {
  auto model = Model(1);
  ServerModel::Table* table = model->tables.at("t").get();
  RowStore store;
  REQUIRE(store.Lookup(*table, {3}, 0).ok());
  const std::vector<float> before = Row(*model, 3);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK_FALSE(RowStore::ApplyNow(table, {3, 4}, {1, 1, nan, 0}, 0.5f, 1).ok());
  CHECK(absl::IsOutOfRange(RowStore::ApplyNow(table, {3, 12}, {1, 1, 1, 1}, 0.5f, 1)));
  CHECK(Row(*model, 3) == before);
  REQUIRE(RowStore::ApplyNow(table, {3}, {2, 2}, 0.5f, 1).ok());
  CHECK(Row(*model, 3) == std::vector<float>{before[0] - 1.0f, before[1] - 1.0f});
}

TEST_CASE("row store: rows load from a checkpoint only onto the server that owns them",
          "[ps][rows]") {
  // Server 1 of 2: find an id it owns and one it does not.
  auto model = Model(1, /*shard=*/1, /*shards=*/2);
  uint64_t mine = 0, theirs = 0;
  for (uint64_t id = 0; id < 10; ++id) {
    (ServerForId(id, 2) == 1 ? mine : theirs) = id;
  }
  REQUIRE(ServerForId(mine, 2) == 1);
  REQUIRE(ServerForId(theirs, 2) == 0);
  ServerModel::Table* table = model->tables.at("t").get();
  LoadRowsRequest request;
  request.set_table("t");
  request.set_values(PackedFloats({7, 8}));
  auto loaded = RowStore::Load(*model, table, {mine}, request);
  REQUIRE(loaded.ok());
  CHECK(*loaded == 1);
  CHECK(Row(*model, mine) == std::vector<float>{7, 8});

  auto elsewhere = RowStore::Load(*model, table, {theirs}, request);
  CHECK(absl::StrContains(elsewhere.status().message(), "belongs to server 0"));
  LoadRowsRequest wrong = request;
  wrong.set_values(PackedFloats({7, 8, 9}));
  CHECK(absl::StrContains(RowStore::Load(*model, table, {mine}, wrong).status().message(),
                          "sizes do not fit 1 rows of table t"));
}

}  // namespace
}  // namespace pstrain
