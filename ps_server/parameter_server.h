// The parameter server's core: one shard of the model's variables (as row
// partitions) in CPU memory, the gradient aggregation for sync and async
// training, and the optimizer applied on the server. No gRPC here: the
// service adapter (ps_service.h) unpacks RPCs and calls these methods, which
// return absl::Status. Every input is validated before anything changes, so a
// rejected request leaves the model bit-identical.
//
// Sync mode (SyncReplicasOptimizer semantics): gradients for step == version
// are held per worker; once `replicas_to_aggregate` have arrived, they are
// summed in worker-index order, averaged and applied, and version advances.
// Gradients for an older step are dropped and counted; a step from the future
// is refused. Async mode: each push is applied on arrival; with a staleness
// bound s, a worker's Pull waits while it is more than s pushes ahead of the
// slowest worker. Every wait has a deadline.
//
// Thread-safe: all state is guarded by mu_; Pull waits on it with a timeout.
#ifndef PSTRAIN_PS_SERVER_PARAMETER_SERVER_H_
#define PSTRAIN_PS_SERVER_PARAMETER_SERVER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tensor.h"
#include "proto/ps_service.pb.h"
#include "ps_server/optimizer.h"

namespace pstrain {

class ParameterServer {
 public:
  struct Counters {
    int64_t pushes_applied = 0;  // pushes whose gradients reached the model
    int64_t gradients_dropped_stale = 0;
    int64_t pushes_rejected = 0;
    int64_t pulls = 0;
  };

  // `max_wait` caps any wait a request asks for.
  explicit ParameterServer(absl::Duration max_wait = absl::Minutes(10));

  absl::Status Initialize(const InitializeRequest& request);
  absl::Status Pull(const PullRequest& request, PullResponse* response);
  absl::Status Push(const PushRequest& request, PushResponse* response);
  void GetStatus(PsStatusResponse* response);
  // Wakes every waiter with UNAVAILABLE and refuses further requests.
  void Shutdown();

  Counters counters();

 private:
  using Key = std::pair<std::string, int>;  // (variable, partition)
  struct PartitionState {
    Tensor value;
    OptimizerSlots slots;
  };

  static std::string KeyString(const Key& key);
  absl::Status CheckIncarnationLocked(uint64_t incarnation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Validates decoded gradients against the partitions (known, shape, finite, unique).
  absl::Status ValidateGradientsLocked(const std::vector<std::pair<Key, Tensor>>& grads) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplySyncStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FinishedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t MinWorkerClockLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string WaitingOnLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const absl::Duration max_wait_;

  mutable absl::Mutex mu_;
  bool initialized_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  bool sync_ ABSL_GUARDED_BY(mu_) = true;
  int num_workers_ ABSL_GUARDED_BY(mu_) = 0;
  int replicas_to_aggregate_ ABSL_GUARDED_BY(mu_) = 0;
  int staleness_bound_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_steps_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  std::map<Key, PartitionState> partitions_ ABSL_GUARDED_BY(mu_);
  // Number of applied updates (sync: steps; async: pushes).
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  // Sync: per worker, its gradients for step version_ (decoded, validated).
  std::map<int, std::vector<std::pair<Key, Tensor>>> pending_ ABSL_GUARDED_BY(mu_);
  // Async: pushes applied per worker (the SSP clock).
  std::vector<int64_t> worker_clock_ ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_PARAMETER_SERVER_H_
