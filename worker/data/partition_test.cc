#include "worker/data/partition.h"

#include <map>
#include <set>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

// x encodes each example's index.
Dataset Counting(int n) {
  Dataset d;
  d.size = n;
  d.dim = 1;
  for (int i = 0; i < n; ++i) {
    d.x.push_back(static_cast<float>(i));
    d.y.push_back(i % 10);
  }
  return d;
}

std::vector<int> Draw(DataPartition* p, int batches) {
  std::vector<int> out;
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int b = 0; b < batches; ++b) {
    p->NextBatch(&x, &y);
    for (float v : x) out.push_back(static_cast<int>(v));
  }
  return out;
}

TEST_CASE("across all workers every record is read exactly once per epoch", "[partition]") {
  for (int size : {1, 7, 103}) {
    for (int workers = 1; workers <= 4; ++workers) {
      for (bool shuffle : {false, true}) {
        Dataset d = Counting(size);
        std::map<int, int> seen;
        for (int w = 0; w < workers; ++w) {
          DataPartition p(&d, w, workers, 1, shuffle, 42);
          for (int v : Draw(&p, static_cast<int>(p.size()))) {
            CHECK(v % workers == w);
            ++seen[v];
          }
          CHECK(p.epoch() == 0);
          CHECK(p.position() == p.size());
        }
        INFO(size << " records, " << workers << " workers, shuffle " << shuffle);
        CHECK(static_cast<int>(seen.size()) == size);
        for (auto& [v, count] : seen) CHECK(count == 1);
      }
    }
  }
}

TEST_CASE("shuffling is deterministic per seed and changes per epoch", "[partition]") {
  Dataset d = Counting(50);
  auto draw = [&d](uint64_t seed, int batches) {
    DataPartition p(&d, 0, 1, 10, true, seed);
    return Draw(&p, batches);
  };
  CHECK(draw(1, 10) == draw(1, 10));
  CHECK(draw(1, 5) != draw(2, 5));
  std::vector<int> two = draw(1, 10);
  std::vector<int> first(two.begin(), two.begin() + 50), second(two.begin() + 50, two.end());
  CHECK(first != second);
  CHECK(std::set<int>(first.begin(), first.end()) == std::set<int>(second.begin(), second.end()));
  DataPartition plain(&d, 0, 1, 10, false, 1);
  std::vector<int> in_order = Draw(&plain, 5);
  for (int i = 0; i < 50; ++i) CHECK(in_order[i] == i);
}

TEST_CASE("a restored cursor resumes the exact sequence", "[partition]") {
  Dataset d = Counting(37);
  // Batches of 5 over 12 examples (worker 1 of 3): epochs end mid-batch.
  for (int cut : {0, 1, 2, 3, 7, 12}) {
    DataPartition original(&d, 1, 3, 4, true, 9);
    Draw(&original, cut);
    const DataCursor saved = original.cursor();
    const std::vector<int> expected = Draw(&original, 10);
    DataPartition resumed(&d, 1, 3, 4, true, 9);
    REQUIRE(resumed.Restore(saved).ok());
    CHECK(resumed.cursor() == saved);
    INFO("cut after " << cut << " batches: cursor epoch " << saved.epoch << " position "
                      << saved.position);
    CHECK(Draw(&resumed, 10) == expected);
  }
  // Exactly at an epoch's end: position == size.
  DataPartition p(&d, 0, 1, 37, true, 3);
  Draw(&p, 1);
  CHECK(p.cursor() == DataCursor{0, 37});
  const std::vector<int> next = Draw(&p, 2);
  DataPartition q(&d, 0, 1, 37, true, 3);
  REQUIRE(q.Restore({0, 37}).ok());
  CHECK(Draw(&q, 2) == next);
}

TEST_CASE("a cursor that does not fit is refused", "[partition]") {
  Dataset d = Counting(10);
  DataPartition p(&d, 0, 2, 2, true, 1);
  CHECK(absl::IsInvalidArgument(p.Restore({-1, 0})));
  CHECK(absl::IsInvalidArgument(p.Restore({0, 6})));
  CHECK(absl::IsInvalidArgument(p.Restore({0, -1})));
  CHECK(p.Restore({3, 5}).ok());
}

}  // namespace
}  // namespace pstrain
