// Where a worker's batches come from: a partition of a dataset in memory
// (partition.h) or a directory of part files that keeps growing
// (part_stream.h). The prefetcher (prefetcher.h) draws from one on a thread
// of its own; a cursor says where a source stands, and restoring it on a
// fresh source of the same data goes on with the same batches (checkpoints
// save it). A source belongs to one thread at a time; Cancel alone may be
// called from another.
#ifndef PSTRAIN_WORKER_DATA_BATCH_SOURCE_H_
#define PSTRAIN_WORKER_DATA_BATCH_SOURCE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace pstrain {

// A dataset in memory: the epoch, and the examples of it handed out. A
// stream of parts: the part's number, and the lines of it passed.
struct DataCursor {
  int64_t epoch = 0;
  int64_t position = 0;
  bool operator==(const DataCursor& o) const { return epoch == o.epoch && position == o.position; }
  bool operator!=(const DataCursor& o) const { return !(*this == o); }
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;

  virtual int batch_size() const = 0;
  virtual int dim() const = 0;
  virtual int id_fields() const = 0;

  // Writes the next batch_size() examples: x [batch_size, dim], y
  // [batch_size] and, when `ids` is given, their categorical ids
  // [batch_size, id_fields]. May wait for data (a stream); an error (a
  // failed read, too many malformed lines, CANCELLED) leaves the cursor
  // anywhere until the next Restore.
  virtual absl::Status Next(float* x, int32_t* y, uint64_t* ids) = 0;

  virtual DataCursor cursor() const = 0;
  // Continues from `cursor`, as the source that produced it would. Also
  // ends a Cancel: Next waits again.
  virtual absl::Status Restore(const DataCursor& cursor) = 0;

  // Ends a Next waiting for data, and any later one, with CANCELLED (until
  // Restore). Any thread. Data in memory never waits: a no-op there.
  virtual void Cancel() {}

  // How the source describes its position in logs ("epoch 3, position 120",
  // "part-00017, line 4000").
  virtual const char* epoch_name() const { return "epoch"; }
  virtual const char* position_name() const { return "position"; }
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_BATCH_SOURCE_H_
