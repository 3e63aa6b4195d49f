// Helpers shared by the model library's tests: reproducible random inputs
// and model configs from text. Test-only.
#ifndef PSTRAIN_WORKER_MODEL_TEST_UTIL_H_
#define PSTRAIN_WORKER_MODEL_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "google/protobuf/text_format.h"
#include "proto/config.pb.h"

namespace pstrain::testing {

// n values uniform in [lo, hi) from `seed`.
inline std::vector<float> Random(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

inline ModelConfig ParseModel(const std::string& text) {
  ModelConfig m;
  REQUIRE(google::protobuf::TextFormat::ParseFromString(text, &m));
  return m;
}

}  // namespace pstrain::testing

#endif  // PSTRAIN_WORKER_MODEL_TEST_UTIL_H_
