#include "common/base/segmented_bytes.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

// `values` as bytes behind a 3-byte prefix, cut into pieces of random length
// (1..17 bytes), so floats straddle pieces and start at every alignment.
struct Cut {
  std::string bytes;
  SegmentedBytes view;
};
Cut Split(const std::vector<float>& values, uint32_t seed) {
  Cut c;
  c.bytes = "abc";
  c.bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  std::mt19937 rng(seed);
  size_t at = 0;
  while (at < c.bytes.size()) {
    size_t n = std::min<size_t>(1 + rng() % 17, c.bytes.size() - at);
    c.view.Append(absl::string_view(c.bytes).substr(at, n));
    at += n;
  }
  return c;
}

TEST_CASE("float runs over arbitrary pieces give back every float in order") {
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i) - 7.0f;
  for (uint32_t seed : {1u, 2u, 3u}) {
    Cut c = Split(values, seed);
    REQUIRE(c.view.size() == 3 + 4000);
    std::vector<float> got;
    c.view.ForEachFloatRun(3 + 4 * 10, 990, [&](const char* p, int64_t n) {
      for (int64_t i = 0; i < n; ++i) got.push_back(LoadFloat(p, i));
    });
    REQUIRE(got == std::vector<float>(values.begin() + 10, values.end()));
    std::vector<float> copy(500);
    c.view.CopyTo(3 + 4 * 100, 2000, copy.data());
    REQUIRE(copy == std::vector<float>(values.begin() + 100, values.begin() + 600));
  }
}

TEST_CASE("the finite check finds NaN and Inf at any position, aligned or not") {
  std::vector<float> values(3000, 1.5f);
  std::string buf(1 + values.size() * 4, '\0');
  // Every NaN and Inf bit pattern kind: quiet and signalling NaNs of either
  // sign and payload, and both infinities.
  for (uint32_t bad : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffffffffu, 0x7fbfffffu,
                       0x7f800000u, 0xff800000u}) {
    for (size_t at : {size_t{0}, size_t{255}, size_t{256}, size_t{1023}, size_t{1024},
                      size_t{2047}, size_t{2999}}) {
      std::vector<float> v = values;
      std::memcpy(&v[at], &bad, 4);
      std::memcpy(buf.data() + 1, v.data(), v.size() * 4);
      INFO(std::hex << bad << std::dec << " at " << at);
      CHECK_FALSE(AllFiniteUnaligned(buf.data() + 1, static_cast<int64_t>(v.size())));
      CHECK_FALSE(AllFiniteUnaligned(buf.data() + 1 + 4 * at, 1));
    }
  }
  std::memcpy(buf.data() + 1, values.data(), values.size() * 4);
  CHECK(AllFiniteUnaligned(buf.data() + 1, static_cast<int64_t>(values.size())));
  // Every finite kind is finite: the largest and smallest normals of either
  // sign, subnormals and both zeros.
  const float finite[] = {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::min(), -std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(), 0.0f, -0.0f};
  for (size_t i = 0; i < std::size(finite); ++i) values[1020 + i] = finite[i];
  std::memcpy(buf.data() + 1, values.data(), values.size() * 4);
  CHECK(AllFiniteUnaligned(buf.data() + 1, static_cast<int64_t>(values.size())));
  CHECK(AllFiniteUnaligned(buf.data() + 1, 0));
}

}  // namespace
}  // namespace pstrain
