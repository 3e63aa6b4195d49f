// The embedding rows a parameter server serves, from the row requests'
// side: their ids and gradients decoded and checked, rows looked up into
// pooled reply buffers, a sync step's row gradients staged per worker and
// applied at the step's end, async row gradients applied on arrival, and
// rows loaded from a checkpoint. The tables themselves are the model's
// (ServerModel::Table, each an EmbeddingTable with its own locks).
//
// What it owns: the pool of reply buffers (under its own lock; a buffer
// may outlive the server inside gRPC, so the pool is shared with the
// buffers it hands out). Who calls it: ParameterServer. The staged rows it
// reads and writes are guarded by the server's lock (ParameterServer::mu_):
// Stage, DropStaged and ApplyStaged are called under it; the rest are not.
#ifndef PSTRAIN_PS_SERVER_ROW_STORE_H_
#define PSTRAIN_PS_SERVER_ROW_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/segmented_bytes.h"
#include "proto/ps_service.pb.h"
#include "ps_server/server_model.h"

namespace pstrain {

// Rows pulled for a frame: gathered into a buffer of the server's pool,
// which the frame then sends as it is; dropping the last reference (gRPC
// releasing the slice) returns it to the pool, so steady pulls neither
// allocate nor fault in fresh pages.
struct PulledRows {
  int64_t version = 0;
  int dim = 0;
  int64_t floats = 0;  // ids x dim
  std::shared_ptr<std::vector<float>> values;
};

class RowStore {
 public:
  // The most ids one rows request may carry (4M ids: 32 MiB of ids, and the
  // rows within gRPC's message cap for widths up to 16), and the most bytes
  // of rows one pull may return.
  static constexpr size_t kMaxRowsPerRequest = size_t{1} << 22;
  static constexpr int64_t kMaxRowsBytes = int64_t{200} << 20;

  // Ids packed as little-endian uint64 (a request's `ids` field).
  static absl::Status DecodeIds(const std::string& bytes, std::vector<uint64_t>* ids);

  // A row push's ids, copied out of its frame `payload` (request.num_ids()
  // of them, then the gradients). `*oversize` says a refusal was for
  // carrying more ids than one request may.
  static absl::Status DecodePushIds(const PushRowsRequest& request, const SegmentedBytes& payload,
                                    std::vector<uint64_t>* ids, bool* oversize);
  // The gradients after the ids, checked to be `table`'s width per id.
  static absl::Status DecodePushGradients(const PushRowsRequest& request,
                                          const SegmentedBytes& payload,
                                          const ServerModel::Table& table,
                                          const std::vector<uint64_t>& ids,
                                          std::vector<float>* grads);

  // `ids`' rows of `table` at `version`, in a pooled buffer. `peek`: for a
  // reader outside training (the chief), the table unchanged
  // (EmbeddingTable::Peek).
  absl::StatusOr<PulledRows> Lookup(const ServerModel::Table& table,
                                    const std::vector<uint64_t>& ids, int64_t version,
                                    bool peek = false);

  // Sync (the server's lock held): stages worker `w`'s row gradients for
  // the open step `step`; RESOURCE_EXHAUSTED past kMaxRowsPerRequest rows a
  // step, staging nothing.
  static absl::Status Stage(ServerModel::Table* table, int w, int64_t step,
                            const std::vector<uint64_t>& ids, const std::vector<float>& grads);
  // Sync (the server's lock held): drops what worker `w` staged for the
  // open step (its restarted process pushes them again).
  static void DropStaged(ServerModel* model, int w);
  // Sync (the server's lock held): applies every table's staged rows for
  // `step`, in worker-index order (duplicates summed), divided by the
  // `contributors` the step aggregated, and expires rows past their age.
  static void ApplyStaged(ServerModel* model, int64_t step, int contributors);

  // Async: applies row gradients on arrival at `learning_rate`, as of
  // `version`; nothing changes when they are refused (an id out of range:
  // OUT_OF_RANGE; NaN or Inf: INVALID_ARGUMENT).
  static absl::Status ApplyNow(ServerModel::Table* table, const std::vector<uint64_t>& ids,
                               const std::vector<float>& grads, float learning_rate,
                               int64_t version);

  // Sets rows of `table` from a checkpoint's LoadRows request: every id must
  // be this server's (`model`'s shard) and every size must fit; nothing
  // changes on a refusal. Returns the rows loaded.
  // `ids` are the request's, decoded (DecodeIds).
  static absl::StatusOr<int64_t> Load(const ServerModel& model, ServerModel::Table* table,
                                      const std::vector<uint64_t>& ids,
                                      const LoadRowsRequest& request);

 private:
  // Reply buffers kept for reuse (at most kKeep).
  class BufferPool : public std::enable_shared_from_this<BufferPool> {
   public:
    // A buffer of `floats` elements, contents unspecified.
    std::shared_ptr<std::vector<float>> Take(int64_t floats);

   private:
    static constexpr size_t kKeep = 16;
    absl::Mutex mu_;
    std::vector<std::unique_ptr<std::vector<float>>> free_ ABSL_GUARDED_BY(mu_);
  };
  const std::shared_ptr<BufferPool> buffers_ = std::make_shared<BufferPool>();
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_ROW_STORE_H_
