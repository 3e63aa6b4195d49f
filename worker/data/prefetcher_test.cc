#include "worker/data/prefetcher.h"

#include "absl/time/clock.h"
#include "catch2/catch.hpp"

namespace pstrain {
namespace {

Dataset Counting(int n) {
  Dataset d;
  d.size = n;
  d.dim = 2;
  for (int i = 0; i < n; ++i) {
    d.x.push_back(static_cast<float>(i));
    d.x.push_back(static_cast<float>(-i));
    d.y.push_back(i % 10);
  }
  return d;
}

TEST_CASE("prefetched batches equal the partition's own sequence", "[prefetcher]") {
  Dataset d = Counting(29);
  for (int depth : {1, 4}) {
    DataPartition reference(&d, 1, 2, 3, true, 5);
    DataPartition source(&d, 1, 2, 3, true, 5);
    auto p = Prefetcher::Create(&source, depth);
    REQUIRE(p.ok());
    CHECK((*p)->consumed_cursor() == DataCursor{0, 0});
    std::vector<float> x;
    std::vector<int32_t> y;
    for (int b = 0; b < 20; ++b) {  // 20 batches of 3 over 14 examples: 4+ epochs
      const DataCursor before = reference.cursor();
      reference.NextBatch(&x, &y);
      Prefetcher::Batch batch;
      REQUIRE((*p)->Next(absl::Seconds(10), &batch).ok());
      CHECK(batch.rows == 3);
      CHECK(batch.dim == 2);
      CHECK(std::vector<float>(batch.x, batch.x + 6) == x);
      CHECK(std::vector<int32_t>(batch.y, batch.y + 3) == y);
      CHECK(batch.start == before);
      CHECK(batch.end == reference.cursor());
      CHECK((*p)->consumed_cursor() == reference.cursor());
      (*p)->Release();
    }
  }
}

TEST_CASE("misuse and shutdown", "[prefetcher]") {
  Dataset d = Counting(10);
  DataPartition source(&d, 0, 1, 2, false, 1);
  auto p = Prefetcher::Create(&source, 2);
  REQUIRE(p.ok());
  Prefetcher::Batch batch;
  REQUIRE((*p)->Next(absl::Seconds(10), &batch).ok());
  CHECK(absl::IsFailedPrecondition((*p)->Next(absl::Seconds(1), &batch)));
  // The ring is full and one batch is held: the producer waits; destruction
  // must still return promptly.
  const absl::Time start = absl::Now();
  p->reset();
  CHECK(absl::Now() - start < absl::Seconds(5));

  CHECK(absl::IsInvalidArgument(Prefetcher::Create(&source, 0).status()));
  Prefetcher::Allocator failing;
  failing.alloc = [](size_t) -> absl::StatusOr<void*> {
    return absl::ResourceExhaustedError("no pinned memory");
  };
  failing.free = [](void*) {};
  auto f = Prefetcher::Create(&source, 2, failing);
  CHECK(absl::IsResourceExhausted(f.status()));
  CHECK(f.status().message() == "prefetch buffers: no pinned memory");
}

TEST_CASE("the allocator's memory is used and given back", "[prefetcher]") {
  Dataset d = Counting(10);
  DataPartition source(&d, 0, 1, 2, false, 1);
  int live = 0, total = 0;
  Prefetcher::Allocator counting;
  counting.alloc = [&](size_t bytes) -> absl::StatusOr<void*> {
    ++live;
    ++total;
    return ::operator new(bytes);
  };
  counting.free = [&](void* q) {
    --live;
    ::operator delete(q);
  };
  {
    auto p = Prefetcher::Create(&source, 3, counting);
    REQUIRE(p.ok());
    Prefetcher::Batch batch;
    REQUIRE((*p)->Next(absl::Seconds(10), &batch).ok());
    CHECK(batch.x[0] == 0.0f);
    (*p)->Release();
  }
  CHECK(total == 6);  // x and y for each of 3 slots
  CHECK(live == 0);
}

}  // namespace
}  // namespace pstrain
