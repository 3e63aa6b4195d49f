// The parameter server's data model: what one Initialize installs. A
// ServerModel holds the run's settings (sync or async, quorum, deadlines,
// optimizer, schedule, checkpoints), this server's partitions of the dense
// variables (PartitionState) and its embedding tables (ServerModel::Table).
// NewServerModel and NewPartition build them from an InitializeRequest and
// check every field first, so a refused request installs nothing.
//
// Who holds it: ParameterServer keeps the current model by shared_ptr, and
// every request that works outside the server's lock holds a reference, so a
// re-Initialize never frees memory under it.
//
// A partition's values live in reference-counted version buffers: a pull
// takes a reference to `current` (no copy), an update writes the next
// version into a spare buffer (TakeSpareLocked) and publishes it
// (PublishLocked), and a spare is reused only when nothing else references
// it, so no pull ever reads a half-applied tensor.
//
// Locks: `apply_mu` serialises a partition's updates (held while computing
// one, and guards its optimizer slots); `mu` guards which buffer is current,
// the spares and the bfloat16 cache (held for pointer swaps only). A
// partition's `next` (a sync step's applied values) and a table's staged
// rows are guarded by the server's lock (ParameterServer::mu_), which this
// file cannot name; they are marked so. The open sync step's bookkeeping is
// the server's SyncStep (sync_step.h).
#ifndef PSTRAIN_PS_SERVER_SERVER_MODEL_H_
#define PSTRAIN_PS_SERVER_SERVER_MODEL_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/storage/env.h"
#include "proto/ps_service.pb.h"
#include "ps_server/embedding_table.h"
#include "ps_server/optimizer.h"

namespace pstrain {

// Where a worker's data stood at a step (its push said so).
struct StepCursor {
  bool set = false;
  int64_t epoch = 0;
  int64_t position = 0;
};

// (variable, partition)
using PartitionKey = std::pair<std::string, int>;
// "variable/partN", for messages.
std::string PartitionKeyString(const PartitionKey& key);

// Whether `buffer` holds the only reference to its contents, so that they
// may be overwritten (see the definition for why a fence and a probe copy).
bool OnlyReference(const std::shared_ptr<std::vector<float>>& buffer);
bool OnlyReference(const std::shared_ptr<std::vector<uint16_t>>& buffer);

struct PartitionState {
  using Buffer = std::shared_ptr<std::vector<float>>;

  PartitionKey key;
  std::vector<int64_t> shape;
  int64_t size = 0;  // elements

  // Serialises updates of this partition; held while computing one.
  absl::Mutex apply_mu;
  OptimizerSlots slots ABSL_GUARDED_BY(apply_mu);
  // Updates applied to this partition (Adam's bias correction counts them).
  int64_t updates ABSL_GUARDED_BY(apply_mu) = 0;

  // Guards which buffer is current and the spares.
  absl::Mutex mu;
  Buffer current ABSL_GUARDED_BY(mu);
  std::vector<Buffer> spares ABSL_GUARDED_BY(mu);
  // The bfloat16 rounding of `bf16_of` (a version buffer), for pulls that
  // ask for it, and its recycled predecessors.
  std::shared_ptr<std::vector<uint16_t>> bf16 ABSL_GUARDED_BY(mu);
  const std::vector<float>* bf16_of ABSL_GUARDED_BY(mu) = nullptr;
  std::vector<std::shared_ptr<std::vector<uint16_t>>> bf16_spares ABSL_GUARDED_BY(mu);

  // A spare buffer no pull or checkpoint references (or a new one), to
  // write the next version into; its contents are unspecified.
  Buffer TakeSpareLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Makes `next` the current version; the one before becomes a spare.
  void PublishLocked(Buffer next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The bfloat16 rounding of `values` (a version buffer of this partition),
  // converted once per version and shared by every pull that asks for it:
  // cached while `values` is current. Takes `mu`; converts outside it.
  std::shared_ptr<const std::vector<uint16_t>> Bfloat16Of(
      const std::shared_ptr<const std::vector<float>>& values) ABSL_LOCKS_EXCLUDED(mu);

  // Its place in the model's partition order (the server's SyncStep names
  // partitions by it); set when the model is installed.
  int index = 0;
  // Sync: worker w's gradient for the open step. Written only by w's push
  // while it is on its way (SyncStep::Begin), read only by this partition's
  // apply.
  std::vector<std::vector<float>> staging;
  // Sync, guarded by the server's lock: the applied values waiting to be
  // published with the step (served early to pulls of the next version).
  Buffer next;

  // For the server's partition_stats(): counted without a lock.
  std::atomic<int64_t> pushes{0}, pulls{0}, push_bytes{0}, pull_bytes{0}, apply_nanos{0};
};

struct ServerModel {
  bool sync = true;
  int num_workers = 0;
  int replicas_to_aggregate = 0;
  // Sync with a step deadline: the fewest gradients a step may go on with.
  int min_replicas = 0;
  absl::Duration step_deadline = absl::ZeroDuration();  // zero: none
  // Async: how long a push's parts are held for its missing ones: a
  // worker's push deadline (rpc.step_timeout_ms + rpc.rpc_timeout_ms),
  // past which no part of it can still come.
  absl::Duration held_push_ttl = absl::InfiniteDuration();
  int staleness_bound = 0;
  bool staleness_scaled_lr = false;
  int64_t max_steps = 0;
  std::unique_ptr<Optimizer> optimizer;
  LearningRate learning_rate;
  float clip_value = 0;  // 0: off
  // A push's gradient for a partition whose L2 norm is above
  // max_gradient_norm + max_relative_gradient_norm * the partition's values'
  // is refused (GradientOverBound). Both 0: off.
  double max_gradient_norm = 0;
  double max_relative_gradient_norm = 0;
  std::map<PartitionKey, std::unique_ptr<PartitionState>> partitions;

  struct Table {
    std::unique_ptr<Optimizer> optimizer;  // the table's own, or the model's kind
    std::string optimizer_kind;            // its name, for checkpoints
    LearningRate learning_rate;
    float clip_value = 0;
    std::unique_ptr<EmbeddingTable> rows;
    // Sync: each worker's row gradients for the open step (guarded by the
    // server's lock).
    std::vector<std::vector<uint64_t>> staged_ids;
    std::vector<std::vector<float>> staged_grads;
  };
  std::map<std::string, std::unique_ptr<Table>> tables;

  // Checkpoints: where, how often (0: never), and which shard this is.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int checkpoint_full_every = 0;  // rows in full every this many saves (0, 1: every save)
  int shard = 0;
  int num_shards = 1;
};

// Where tables with a memory budget keep the rows past it: files of their
// own in `dir` (empty: $TMPDIR, else /tmp), unlinked once open, through
// `env` (null: Env::Default()).
struct TierSettings {
  std::string dir;
  Env* env = nullptr;
};

// The run's settings and embedding tables from an Initialize request and its
// config (checked), with no partitions yet.
absl::StatusOr<std::shared_ptr<ServerModel>> NewServerModel(const InitializeRequest& request,
                                                            const TierSettings& tier = {});

// One partition of an Initialize request: its values and (from a checkpoint)
// its optimizer slots and update count, checked against `model`'s optimizer
// and sized for its workers.
absl::StatusOr<std::unique_ptr<PartitionState>> NewPartition(const NamedTensor& nt,
                                                             const ServerModel& model);

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_SERVER_MODEL_H_
