// The simulated memory policies of the tables bench: each keeps what it
// should on streams whose answers are known.
#include "tools/bench/row_policies.h"

#include <cstdint>
#include <vector>

#include "catch2/catch.hpp"

namespace pstrain::bench {
namespace {

TEST_CASE("row policies keep what they should", "[bench][tier]") {
  // A loop over 11 ids with room for 10: LRU always misses, and so does
  // CLOCK (its hand clears every mark before it takes one).
  std::vector<uint64_t> loop;
  for (int r = 0; r < 100; ++r) {
    for (uint64_t id = 0; id < 11; ++id) loop.push_back(id);
  }
  CHECK(SimulateHitRate(RowPolicy::kLru, loop, 10, 110) == 0);
  CHECK(SimulateHitRate(RowPolicy::kClock, loop, 10, 110) == 0);
  // Five ids used once a round, then ten of fifty others, with room for
  // six: LFU keeps the five (a third of the lookups), LRU and CLOCK lose
  // them to the others.
  std::vector<uint64_t> rounds;
  for (uint64_t r = 0; r < 400; ++r) {
    for (uint64_t id = 0; id < 5; ++id) rounds.push_back(id);
    for (uint64_t j = 0; j < 10; ++j) rounds.push_back(5 + (r * 10 + j) % 50);
  }
  CHECK(SimulateHitRate(RowPolicy::kLfu, rounds, 6, 1500) == Approx(1.0 / 3).margin(0.01));
  CHECK(SimulateHitRate(RowPolicy::kLru, rounds, 6, 1500) == 0);
  CHECK(SimulateHitRate(RowPolicy::kClock, rounds, 6, 1500) < 0.1);
  // Everything fits: every lookup after the first pass hits.
  for (RowPolicy p : {RowPolicy::kClock, RowPolicy::kLru, RowPolicy::kLfu}) {
    INFO(RowPolicyName(p));
    CHECK(SimulateHitRate(p, loop, 11, 11) == 1.0);
    CHECK(SimulateHitRate(p, loop, 0, 0) == 0);
  }
  // One hot id among a scan of cold ones: all three keep it.
  std::vector<uint64_t> hot;
  for (uint64_t i = 0; i < 10000; ++i) {
    hot.push_back(0);
    hot.push_back(1000 + i);
  }
  for (RowPolicy p : {RowPolicy::kClock, RowPolicy::kLru, RowPolicy::kLfu}) {
    INFO(RowPolicyName(p));
    CHECK(SimulateHitRate(p, hot, 4, 100) == Approx(0.5).margin(0.001));
  }
  // The hot id changes halfway: LFU's count of the old one ages out, and
  // the new one is kept in the end.
  std::vector<uint64_t> shift;
  for (uint64_t i = 0; i < 20000; ++i) {
    shift.push_back(i < 10000 ? 0 : 1);
    shift.push_back(1000 + i);
  }
  CHECK(SimulateHitRate(RowPolicy::kLfu, shift, 4, 30000) == Approx(0.5).margin(0.001));
  CHECK(SimulateHitRate(RowPolicy::kLru, shift, 4, 30000) == Approx(0.5).margin(0.001));
}

}  // namespace
}  // namespace pstrain::bench
