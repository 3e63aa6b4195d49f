#include "common/cluster/placement.h"

#include <algorithm>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

std::vector<VariableSpec> MlpVariables() {
  return {{"dense0/kernel", {784, 128}}, {"dense0/bias", {128}},
          {"dense1/kernel", {128, 10}},  {"dense1/bias", {10}}};
}

TEST_CASE("placement is deterministic", "[placement]") {
  auto a = Placement::Compute(MlpVariables(), 2, 256 * 1024);
  auto b = Placement::Compute(MlpVariables(), 2, 256 * 1024);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->DebugString() == b->DebugString());
}

TEST_CASE("large variables are split into row partitions on distinct servers", "[placement]") {
  auto p = Placement::Compute(MlpVariables(), 2, 256 * 1024);
  REQUIRE(p.ok());
  const VariablePlacement* k = p->Find("dense0/kernel");
  REQUIRE(k != nullptr);
  REQUIRE(k->partitions.size() == 2);
  CHECK(k->partitions[0].row_begin == 0);
  CHECK(k->partitions[0].row_end == k->partitions[1].row_begin);
  CHECK(k->partitions[1].row_end == 784);
  CHECK(k->partitions[0].server != k->partitions[1].server);
  // Small ones are not split.
  CHECK(p->Find("dense1/bias")->partitions.size() == 1);
  int64_t total = 0;
  for (int64_t b : p->server_bytes()) total += b;
  CHECK(total == (784 * 128 + 128 + 128 * 10 + 10) * 4);
}

TEST_CASE("small variables are balanced by bytes, not round-robin", "[placement]") {
  // Round-robin would put both big ones on server 0.
  std::vector<VariableSpec> vars = {
      {"a", {1000}}, {"b", {10}}, {"c", {1000}}, {"d", {10}}};
  auto p = Placement::Compute(vars, 2, 0);
  REQUIRE(p.ok());
  CHECK(p->Find("a")->partitions[0].server != p->Find("c")->partitions[0].server);
  CHECK(p->server_bytes()[0] == p->server_bytes()[1]);
}

TEST_CASE("no partition is larger than partition_max_bytes; they go round the servers",
          "[placement]") {
  // 2048 x 2048 floats = 16 MiB of 8 KiB rows; 4 MiB cap: 512 rows a part.
  std::vector<VariableSpec> vars = {{"big", {2048, 2048}}, {"odd", {1000, 1025}}, {"b", {10}}};
  for (int servers : {1, 2, 3}) {
    auto p = Placement::Compute(vars, servers, 256 << 10, 4 << 20);
    REQUIRE(p.ok());
    const VariablePlacement* big = p->Find("big");
    CHECK(big->partitions.size() == 4);
    for (const VariablePlacement& vp : p->variables()) {
      int64_t rows = 0;
      std::vector<int> per_server(servers, 0);
      for (const Partition& part : vp.partitions) {
        CHECK(part.num_rows() * vp.spec.row_elements() * 4 <= (4 << 20));
        CHECK(part.row_begin == rows);
        rows = part.row_end;
        ++per_server[part.server];
      }
      CHECK(rows == vp.spec.shape[0]);
      // Spread evenly: no server holds two more parts of a variable than another.
      CHECK(*std::max_element(per_server.begin(), per_server.end()) -
                *std::min_element(per_server.begin(), per_server.end()) <=
            1);
    }
  }
  // A row larger than the cap stays whole: one row per partition.
  auto wide = Placement::Compute({{"wide", {3, 2 << 20}}}, 2, 256 << 10, 4 << 20);
  REQUIRE(wide.ok());
  CHECK(wide->Find("wide")->partitions.size() == 3);
}

TEST_CASE("one server holds everything unsplit", "[placement]") {
  auto p = Placement::Compute(MlpVariables(), 1, 1024);
  REQUIRE(p.ok());
  for (const auto& v : p->variables()) CHECK(v.partitions.size() == 1);
}

TEST_CASE("bad variable lists are refused", "[placement]") {
  CHECK_FALSE(Placement::Compute({{"a", {2}}, {"a", {3}}}, 2, 0).ok());
  CHECK_FALSE(Placement::Compute({{"a", {0}}}, 2, 0).ok());
  CHECK_FALSE(Placement::Compute({{"a", {2}}}, 0, 0).ok());
}

}  // namespace
}  // namespace pstrain
