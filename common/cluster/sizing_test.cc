#include "common/cluster/sizing.h"

#include <limits>
#include <string>
#include <vector>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

TEST_CASE("a partition beyond one message is refused, naming it and the fix; a share is not",
          "[sizing]") {
  // hidden_units 65536 x 65536: the model a user tried, 16 GiB in one
  // kernel, spread over 2 servers in partitions of at most 64 MiB: 8 GiB a
  // server, and every call fits one message.
  std::vector<VariableSpec> vars = {{"dense1/kernel", {65536, 65536}}, {"dense1/bias", {65536}}};
  auto placement = Placement::Compute(vars, 2, 1 << 20, 64 << 20);
  REQUIRE(placement.ok());
  CHECK(placement->server_bytes()[0] > (int64_t{4} << 30));
  CHECK(CheckPartitionsFitMessages(*placement, 256 << 20).ok());
  // Partitions of up to 1 GiB do not fit.
  auto big = Placement::Compute(vars, 2, 1 << 20, int64_t{1} << 30);
  REQUIRE(big.ok());
  absl::Status st = CheckPartitionsFitMessages(*big, 256 << 20);
  CHECK(absl::IsResourceExhausted(st));
  std::string m(st.message());
  CHECK(m.find("partition 0 of dense1/kernel is 1.0 GiB (4096 rows of 256.0 KiB)") !=
        std::string::npos);
  CHECK(m.find("at most 256.0 MiB") != std::string::npos);
  CHECK(m.find("placement.partition_max_bytes to at most 255.0 MiB") != std::string::npos);
  // A single row over the cap cannot be split.
  std::vector<VariableSpec> wide = {{"w", {2, 80 << 20}}};
  auto rows = Placement::Compute(wide, 1, 1 << 20, 64 << 20);
  REQUIRE(rows.ok());
  st = CheckPartitionsFitMessages(*rows, 256 << 20);
  CHECK(absl::IsResourceExhausted(st));
  m = std::string(st.message());
  CHECK(m.find("a single row is larger than that") != std::string::npos);
  // With Adam's two slots a 128 MiB partition no longer fits (a resume sends
  // them together).
  auto adam = Placement::Compute(vars, 2, 1 << 20, 128 << 20);
  REQUIRE(adam.ok());
  CHECK(CheckPartitionsFitMessages(*adam, 256 << 20).ok());
  st = CheckPartitionsFitMessages(*adam, 256 << 20, 3);
  CHECK(absl::IsResourceExhausted(st));
  m = std::string(st.message());
  CHECK(m.find("(512 rows of 256.0 KiB) x 3 with its optimizer slots") != std::string::npos);
  CHECK(m.find("partition_max_bytes to at most 85.0 MiB") != std::string::npos);
}

TEST_CASE("a job's message memory at a server: every caller's calls in flight, at most its share",
          "[sizing]") {
  // 784-128-10 on one server: each direction of each caller carries the
  // whole share at once (16 calls of 4 MiB are more than it).
  std::vector<VariableSpec> small = {{"k1", {784, 128}}, {"b1", {128}}, {"k2", {128, 10}},
                                     {"b2", {10}}};
  auto one = Placement::Compute(small, 1, 256 << 10, 4 << 20);
  REQUIRE(one.ok());
  const int64_t share = (784 * 128 + 128 + 128 * 10 + 10) * 4;
  CHECK(one->server_bytes()[0] == share);
  // Two workers' pulls and pushes and the chief's pulls: 5 directions.
  CHECK(JobInflightBytes(*one, 2, 16, 4 << 20, 64 << 20, 4) == 5 * share);
  CHECK(JobInflightBytes(*one, 2, 16, 4 << 20, 64 << 20, 2) == 5 * share / 2);
  // 16 GiB over 2 servers in 64 MiB partitions: a call is one partition, 16
  // of them in flight are 1 GiB a direction, less than the 8 GiB share (the
  // chief's calls of 64 MiB too).
  std::vector<VariableSpec> big = {{"w", {65536, 65536}}};
  auto two = Placement::Compute(big, 2, 1 << 20, 64 << 20);
  REQUIRE(two.ok());
  CHECK(JobInflightBytes(*two, 16, 16, 4 << 20, 64 << 20, 4) == 33 * (int64_t{1} << 30));
  // bfloat16: the workers' calls are 32 MiB partitions, the chief's 64 MiB.
  CHECK(JobInflightBytes(*two, 16, 16, 4 << 20, 64 << 20, 2) ==
        32 * (int64_t{512} << 20) + (int64_t{1} << 30));
  CHECK(JobInflightBytes(*two, 16, 1, 4 << 20, 64 << 20, 4) == 33 * (int64_t{64} << 20));
  // Calls larger than the partitions: 4 calls of 256 MiB.
  CHECK(JobInflightBytes(*two, 1, 4, 256 << 20, 64 << 20, 4) ==
        2 * (int64_t{1} << 30) + (int64_t{256} << 20));
  // Past int64: saturates, never wraps to something small.
  CHECK(JobInflightBytes(*two, 1 << 30, 1 << 30, int64_t{1} << 40, 64 << 20, 4) ==
        std::numeric_limits<int64_t>::max());
  CHECK(JobInflightBytes(*two, 0, 16, 4 << 20, 64 << 20, 4) == int64_t{1} << 30);
}

TEST_CASE("a process's memory is checked against the machine's", "[sizing]") {
  std::vector<VariableSpec> vars = {{"w", {65536, 65536}}};
  CHECK(ModelProcessBytes(vars) == int64_t{65536} * 65536 * 4 * 2);
  absl::Status st = CheckMemory("the chief", ModelProcessBytes(vars), int64_t{24} << 30);
  CHECK(absl::IsResourceExhausted(st));
  CHECK(std::string(st.message()) ==
        "the chief needs at least 32.0 GiB of memory; this machine has 24.0 GiB");
  CHECK(CheckMemory("x", 1 << 20, 1 << 30).ok());
  CHECK(PhysicalMemoryBytes() > (int64_t{1} << 28));
  // Shapes whose product overflows are never "small".
  std::vector<VariableSpec> absurd = {{"a", {int64_t{1} << 40}}, {"b", {int64_t{1} << 40}},
                                      {"c", {int64_t{1} << 62}}};
  CHECK(ModelProcessBytes(absurd) > (int64_t{1} << 50));
  CHECK(FormatBytes(512) == "512 B");
  CHECK(FormatBytes(205824) == "201.0 KiB");
}

}  // namespace
}  // namespace pstrain
