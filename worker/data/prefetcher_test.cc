#include "worker/data/prefetcher.h"

#include <atomic>

#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "worker/data/partition.h"

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

// Two batches, then an error; or, `waits`, a wait until cancelled.
class FailingSource : public BatchSource {
 public:
  explicit FailingSource(bool waits) : waits_(waits) {}
  int batch_size() const override { return 1; }
  int dim() const override { return 1; }
  int id_fields() const override { return 0; }
  absl::Status Next(float* x, int32_t* y, uint64_t*) override {
    if (waits_) {
      while (!cancelled_) absl::SleepFor(absl::Milliseconds(1));
      return absl::CancelledError("cancelled");
    }
    if (n_ == 2) return absl::DataLossError("the source broke");
    *x = static_cast<float>(n_++);
    *y = 0;
    return absl::OkStatus();
  }
  DataCursor cursor() const override { return {0, n_}; }
  absl::Status Restore(const DataCursor&) override { return absl::OkStatus(); }
  void Cancel() override { cancelled_ = true; }

 private:
  const bool waits_;
  int64_t n_ = 0;
  std::atomic<bool> cancelled_{false};
};

TEST_CASE("a source's error comes after its batches; destruction cancels a waiting source",
          "[data][prefetch]") {
  FailingSource failing(false);
  auto p = Prefetcher::Create(&failing, 4);
  REQUIRE(p.ok());
  Prefetcher::Batch batch;
  for (float want : {0.0f, 1.0f}) {
    REQUIRE((*p)->Next(absl::Seconds(10), &batch).ok());
    CHECK(batch.x[0] == want);
    (*p)->Release();
  }
  const absl::Status st = (*p)->Next(absl::Seconds(10), &batch);
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK((*p)->consumed_cursor() == DataCursor{0, 2});

  FailingSource waiting(true);
  auto q = Prefetcher::Create(&waiting, 2);
  REQUIRE(q.ok());
  CHECK((*q)->Next(absl::Milliseconds(20), &batch).code() ==
        absl::StatusCode::kDeadlineExceeded);
  q->reset();  // returns: the source was cancelled
}

}  // namespace
}  // namespace pstrain
