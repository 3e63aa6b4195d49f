#include "tools/datagen.h"

#include <array>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

TEST_CASE("digits are deterministic, balanced and seed-dependent", "[datagen]") {
  IdxArray a, la, b, lb, c, lc;
  RenderDigits(200, 5, 1.0, &a, &la);
  RenderDigits(200, 5, 1.0, &b, &lb);
  RenderDigits(200, 6, 1.0, &c, &lc);
  CHECK(a.data == b.data);
  CHECK(la.data == lb.data);
  CHECK(a.data != c.data);
  CHECK(a.dims == std::vector<int64_t>{200, 28, 28});
  std::array<int, 10> counts{};
  for (uint8_t l : la.data) {
    REQUIRE(l < 10);
    ++counts[l];
  }
  for (int n : counts) CHECK(n == 20);
}

TEST_CASE("digits carry their class in the pixels", "[datagen]") {
  // Nearest-class-mean on clean renders must separate the classes far above
  // chance: the data is learnable, not noise.
  IdxArray train, ltrain, test, ltest;
  RenderDigits(1000, 1, 0.3, &train, &ltrain);
  RenderDigits(300, 2, 0.3, &test, &ltest);
  std::vector<std::vector<double>> mean(10, std::vector<double>(784, 0));
  std::array<int, 10> n{};
  for (int i = 0; i < 1000; ++i) {
    ++n[ltrain.data[i]];
    for (int p = 0; p < 784; ++p) mean[ltrain.data[i]][p] += train.data[i * 784 + p];
  }
  for (int k = 0; k < 10; ++k) {
    for (double& v : mean[k]) v /= n[k];
  }
  int correct = 0;
  for (int i = 0; i < 300; ++i) {
    int best = -1;
    double best_d = 1e300;
    for (int k = 0; k < 10; ++k) {
      double d = 0;
      for (int p = 0; p < 784; ++p) {
        const double e = test.data[i * 784 + p] - mean[k][p];
        d += e * e;
      }
      if (d < best_d) {
        best_d = d;
        best = k;
      }
    }
    correct += best == ltest.data[i];
  }
  CHECK(correct > 150);  // chance is 30
}

}  // namespace
}  // namespace pstrain
