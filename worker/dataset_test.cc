#include "worker/dataset.h"

#include <cstdlib>
#include <set>

#include "catch2/catch.hpp"
#include "common/idx.h"

namespace pstrain {
namespace {

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

TEST_CASE("partitions cover every example exactly once per epoch", "[dataset]") {
  Dataset d = Counting(103);
  std::multiset<int> seen;
  for (int w = 0; w < 3; ++w) {
    DataPartition p(&d, w, 3, 1, /*shuffle=*/true, 42);
    std::vector<float> x;
    std::vector<int32_t> y;
    for (int64_t i = 0; i < p.size(); ++i) {
      p.NextBatch(&x, &y);
      CHECK(static_cast<int>(x[0]) % 3 == w);
      seen.insert(static_cast<int>(x[0]));
    }
    CHECK(p.epoch() == 0);
  }
  CHECK(seen.size() == 103);
  CHECK(std::set<int>(seen.begin(), seen.end()).size() == 103);
}

TEST_CASE("shuffling is deterministic per seed and changes per epoch", "[dataset]") {
  Dataset d = Counting(50);
  auto draw = [&d](uint64_t seed, int batches) {
    DataPartition p(&d, 0, 1, 10, true, seed);
    std::vector<float> all, x;
    std::vector<int32_t> y;
    for (int i = 0; i < batches; ++i) {
      p.NextBatch(&x, &y);
      all.insert(all.end(), x.begin(), x.end());
    }
    return all;
  };
  CHECK(draw(1, 10) == draw(1, 10));
  CHECK(draw(1, 5) != draw(2, 5));
  std::vector<float> two_epochs = draw(1, 10);
  CHECK(std::vector<float>(two_epochs.begin(), two_epochs.begin() + 50) !=
        std::vector<float>(two_epochs.begin() + 50, two_epochs.end()));
}

TEST_CASE("IDX datasets load and are validated against the model", "[dataset]") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = tmp ? tmp : "/tmp";
  IdxArray images{{3, 2, 2}, {0, 255, 0, 255, 1, 2, 3, 4, 9, 9, 9, 9}};
  IdxArray labels{{3}, {1, 0, 2}};
  REQUIRE(WriteIdxFile(Env::Default(), dir + "/img", images).ok());
  REQUIRE(WriteIdxFile(Env::Default(), dir + "/lbl", labels).ok());
  auto d = LoadIdxDataset(Env::Default(), dir + "/img", dir + "/lbl", 4, 3, true);
  REQUIRE(d.ok());
  CHECK(d->size == 3);
  CHECK(d->x[1] == 1.0f);
  CHECK(d->y[2] == 2);
  CHECK_FALSE(LoadIdxDataset(Env::Default(), dir + "/img", dir + "/lbl", 5, 3, true).ok());
  CHECK_FALSE(LoadIdxDataset(Env::Default(), dir + "/img", dir + "/lbl", 4, 2, true).ok());
  IdxArray short_labels{{2}, {1, 0}};
  REQUIRE(WriteIdxFile(Env::Default(), dir + "/lbl2", short_labels).ok());
  CHECK_FALSE(LoadIdxDataset(Env::Default(), dir + "/img", dir + "/lbl2", 4, 3, true).ok());
}

}  // namespace
}  // namespace pstrain
