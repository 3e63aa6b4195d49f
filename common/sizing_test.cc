#include "common/sizing.h"

#include <string>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

TEST_CASE("a server's share beyond one message is refused, naming the variable", "[sizing]") {
  // hidden_units 65536 x 65536: the model a user tried, 16 GiB in one kernel.
  std::vector<VariableSpec> vars = {{"dense1/kernel", {65536, 65536}}, {"dense1/bias", {65536}}};
  auto placement = Placement::Compute(vars, 2, 1 << 20, 64 << 20);
  REQUIRE(placement.ok());
  absl::Status st = CheckSharesFitMessages(vars, *placement, 256 << 20);
  CHECK(absl::IsResourceExhausted(st));
  const std::string m(st.message());
  CHECK(m.find("dense1/kernel, is 16.0 GiB") != std::string::npos);
  CHECK(m.find("at most 256.0 MiB") != std::string::npos);
  CHECK(m.find("use at least 65 parameter servers") != std::string::npos);

  std::vector<VariableSpec> small = {{"w", {784, 64}}, {"b", {64}}};
  auto fits = Placement::Compute(small, 2, 1 << 20, 64 << 20);
  REQUIRE(fits.ok());
  CHECK(CheckSharesFitMessages(small, *fits, 256 << 20).ok());
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
