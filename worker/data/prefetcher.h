// Assembles a source's batches ahead of the consumer on a background
// thread, into a bounded ring of `depth` slots, so the compute never waits
// for data: the thread fills free slots in order; Next() hands out the
// oldest filled one, which stays the consumer's until Release(). The slot
// memory comes from an allocator (pinned host memory on CUDA, so that the
// batch's copy to the device runs at full speed).
//
// A source's error (a stream that failed) ends the batches: Next returns it
// once the batches before it are handed out.
//
// Thread-safety: Next, Release and consumed_cursor are called from one
// consumer thread; the source belongs to the prefetch thread from Create
// until destruction. Destruction stops the thread promptly, even while it
// waits for a free slot or for the source's data (it cancels the source:
// Restore it before a new prefetcher draws from it).
#ifndef PSTRAIN_WORKER_DATA_PREFETCHER_H_
#define PSTRAIN_WORKER_DATA_PREFETCHER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/data/batch_source.h"

namespace pstrain {

class Prefetcher {
 public:
  struct Allocator {
    std::function<absl::StatusOr<void*>(size_t bytes)> alloc;  // empty: aligned new
    std::function<void(void*)> free;
  };
  struct Batch {
    const float* x = nullptr;    // [rows, dim]
    const int32_t* y = nullptr;  // [rows]
    int rows = 0;
    int dim = 0;
    const uint64_t* ids = nullptr;  // [rows, id_fields] for click-through data
    int id_fields = 0;
    DataCursor start;  // the source's cursor before this batch
    DataCursor end;    // and after it
  };

  // Allocates every slot up front and starts the thread. `depth` >= 1.
  static absl::StatusOr<std::unique_ptr<Prefetcher>> Create(BatchSource* source, int depth,
                                                            Allocator allocator = {});
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next batch in order, waiting up to `timeout` for it (DEADLINE_EXCEEDED
  // then), or the source's error once the batches before it are out.
  // FAILED_PRECONDITION while the previous batch is not released.
  absl::Status Next(absl::Duration timeout, Batch* batch);
  // Gives the batch of the last Next back to the ring.
  void Release();
  // The cursor after the last batch handed out (the source's cursor at
  // Create before any): what a checkpoint saves to resume the same sequence.
  DataCursor consumed_cursor() const;

 private:
  struct Slot {
    float* x = nullptr;
    int32_t* y = nullptr;
    std::vector<uint64_t> ids;  // plain memory: ids never go to a device
    DataCursor start, end;
  };
  Prefetcher(BatchSource* source, Allocator allocator);
  void FreeSlots();
  void Produce();

  // Constant after Create.
  BatchSource* const source_;
  const Allocator allocator_;
  std::vector<Slot> slots_;  // contents: the producer's while free, the consumer's once filled
  std::thread thread_;

  mutable absl::Mutex mu_;
  int next_in_ ABSL_GUARDED_BY(mu_) = 0;   // slot the producer fills next
  int next_out_ ABSL_GUARDED_BY(mu_) = 0;  // oldest filled slot
  int ready_ ABSL_GUARDED_BY(mu_) = 0;     // filled and not yet handed out
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  DataCursor consumed_ ABSL_GUARDED_BY(mu_);
  absl::Status failed_ ABSL_GUARDED_BY(mu_);  // the source's error: no batch after it
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_PREFETCHER_H_
