#include "worker/model/binary_metrics.h"

#include <cmath>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

TEST_CASE("AUC from ranks: perfect, reversed, ties and a hand-counted case", "[metrics]") {
  CHECK(*RocAuc({0.1f, 0.2f, 0.8f, 0.9f}, {0, 0, 1, 1}) == 1.0);
  CHECK(*RocAuc({0.9f, 0.8f, 0.2f, 0.1f}, {0, 0, 1, 1}) == 0.0);
  CHECK(*RocAuc({0.5f, 0.5f, 0.5f, 0.5f}, {0, 1, 0, 1}) == 0.5);
  // Positives 0.4, 0.7, 0.6; negatives 0.1, 0.6: 0.4 beats 0.1 (1); 0.7 beats
  // both (2); 0.6 beats 0.1 and ties 0.6 (1.5): 4.5 of 6.
  CHECK(*RocAuc({0.4f, 0.1f, 0.7f, 0.6f, 0.6f}, {1, 0, 1, 1, 0}) == Approx(0.75));
  CHECK_FALSE(RocAuc({0.1f, 0.2f}, {1, 1}).ok());
  CHECK_FALSE(RocAuc({0.1f}, {1, 0}).ok());
}

TEST_CASE("log loss is the mean negative log-likelihood, clamped", "[metrics]") {
  CHECK(LogLoss({0.5f, 0.5f}, {0, 1}) == Approx(std::log(2.0)));
  CHECK(LogLoss({0.9f, 0.2f}, {1, 0}) == Approx(-(std::log(0.9) + std::log(0.8)) / 2));
  CHECK(std::isfinite(LogLoss({0.0f, 1.0f}, {1, 0})));
}

}  // namespace
}  // namespace pstrain
