// The parameter server's core: one shard of the model's variables (as row
// partitions) in CPU memory, the gradient aggregation for sync and async
// training, and the optimizer applied on the server. No gRPC here: the
// service adapter (ps_service.h) unpacks RPCs and calls these methods, which
// return absl::Status. Every input is validated before anything changes, so a
// rejected request leaves the model bit-identical (a request: an async push
// in several calls is applied call by call, and a refused call leaves the
// calls before it applied).
//
// Sync mode (SyncReplicasOptimizer semantics, per partition as TensorFlow's
// per-variable accumulators do): gradients for step == version are held per
// worker and partition; once `replicas_to_aggregate` workers' gradients for a
// partition have arrived, they are summed in worker-index order, averaged and
// applied to it, and when every partition of the server has been applied the
// new values are published together and version advances. A worker may send
// its gradients for a step in several pushes (any grouping of partitions),
// and pushes to different partitions never wait on each other.
// Gradients for an older step are dropped and counted; a step from the future
// is refused. With a step deadline (sync.step_deadline_ms, counted from the
// step's first gradient on this server), a step whose quorum is late goes on
// with the gradients it has where every open partition has min_replicas of
// them, and otherwise fails: pulls waiting for it end with an error naming
// the missing workers, and so does every later push or pull of the run
// (the run is over; a worker cannot go on without that step). Async mode:
// each push is applied on arrival; with a staleness bound s, a worker's Pull
// waits while it is more than s pushes ahead of the slowest worker. Every
// wait has a deadline.
//
// The data path: gradients are read where the transport left them (a
// SegmentedBytes view of the received slices); sync copies a worker's
// gradient once, into that worker's staging buffer, when it arrives before
// its partition's quorum is complete, and reads the gradient that completes
// it (with one worker, every gradient) straight from the view; async applies
// straight from the view too, both in cache-sized chunks (apply.h). A pull
// takes references to the current version buffers, no copy (a sync pull of
// the next version, to partitions already applied for it: EarlyReadyLocked),
// and an update writes the next version into a spare buffer beside them
// (server_model.h). A waiting Pull holds no thread: it is parked with a
// callback that runs when it is ready, cancelled or out of time.
//
// The parts this server holds, each with its own state and tests:
//   server_model.h  what Initialize installs: settings, partitions, tables
//   apply.h         gradients located in a push; the sync mean, async applies
//   sync_step.h     the open sync step: per-partition quorums, clock, cursors
//   async_clock.h   async updates admitted and applied, the workers' clocks
//   held_pushes.h   async pushes in parts, per worker
//   init_parts.h    an Initialize in parts, gathered until the last is in
//   parked_pulls.h  pulls waiting for their version
//   row_store.h     embedding row requests: lookups, staging, loads
//   snapshotter.h   checkpoint cuts, their writer thread and outcomes
// What stays here is admission and the step: incarnations and sessions,
// the version and when a step completes, the counters, and the timer that
// ends waits at their deadlines. The class is defined in four files:
// parameter_server.cc (Initialize, sessions, the step's end, checkpoints,
// status), parameter_server_pull.cc (serving, parking, the timer),
// parameter_server_push.cc (admission, sync aggregation, async applies) and
// parameter_server_rows.cc (row requests).
//
// Locking: `mu_` guards the small shared state (version, who pushed, the
// parked pulls, the held pushes, counters) and is never held while tensors
// are copied or applied. Each partition has `apply_mu` (serialises updates
// of that partition, held while computing) and `mu` (guards which buffer is
// current, held for pointer swaps only). Lock order: mu_ before a
// partition's mu and before the snapshotter's own lock; apply_mu is never
// held while taking mu_. The one place apply_mu is taken under mu_ is a
// checkpoint's cut at a sync step boundary, when no apply can be running
// (the step's are done and the next step's pushes need pulls served after
// it).
#ifndef PSTRAIN_PS_SERVER_PARAMETER_SERVER_H_
#define PSTRAIN_PS_SERVER_PARAMETER_SERVER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/histogram.h"
#include "common/base/segmented_bytes.h"
#include "common/base/tensor.h"
#include "proto/ps_service.pb.h"
#include "ps_server/apply.h"
#include "ps_server/async_clock.h"
#include "ps_server/embedding_table.h"
#include "ps_server/held_pushes.h"
#include "ps_server/init_parts.h"
#include "ps_server/optimizer.h"
#include "ps_server/parked_pulls.h"
#include "ps_server/row_store.h"
#include "ps_server/server_model.h"
#include "ps_server/snapshotter.h"
#include "ps_server/sync_step.h"

namespace pstrain {

class ParameterServer {
 public:
  // Why a push (dense or rows) was refused: the `reason` label of
  // pstrain_ps_pushes_rejected_total.
  enum class Rejection {
    kIncarnation,  // from another run of the cluster
    kWorker,       // worker index out of range
    kShape,        // unknown variable or table; wrong shape, dtype or length
    kNonFinite,    // NaN or Inf in a gradient
    kAhead,        // a step this server has not reached
    kDuplicate,    // a second gradient from one worker for one step
    kOutOfRange,   // an id outside a fixed-size table
    kSize,         // more ids than one request or one step may carry
    kMalformed,    // bytes that are not what the request's fields say
    kSuperseded,   // from a worker process that was since restarted
    kOverBound,    // a gradient's norm over the optimizer's bound (FirstOverBound)
  };
  static constexpr int kNumRejections = 11;
  static const char* RejectionName(Rejection r);
  // Counts a push refused before it reached the server (a frame that does
  // not decode: kMalformed).
  void RecordRejection(Rejection reason);
  // Whether `st` refused a request of the incarnation this server was
  // initialized again from (a rollback, a restore): from a worker that has
  // not yet followed it, or in flight while it happened; an expected
  // refusal rather than a fault.
  static bool FromReplacedIncarnation(const absl::Status& st);
  // The refusal of a call that was under way when the server was
  // initialized again (FromReplacedIncarnation says true of it).
  static absl::Status ReinitializedError();

  struct Counters {
    int64_t pushes_applied = 0;  // pushes whose gradients reached the model
    int64_t gradients_dropped_stale = 0;
    int64_t pushes_rejected = 0;  // the sum of rejected
    std::array<int64_t, kNumRejections> rejected{};
    int64_t pulls = 0;
    // Tensor payload bytes received in pushes and sent in pulls, and how many
    // bytes this server copied in user space to get them there.
    int64_t push_payload_bytes = 0;
    int64_t push_copied_bytes = 0;
    // Sync: the part of push_copied_bytes copied into staging buffers (the
    // gradients that arrived before their partition's quorum was complete).
    int64_t push_staged_bytes = 0;
    int64_t pull_payload_bytes = 0;
    int64_t pull_copied_bytes = 0;
    int64_t held_pushes_expired = 0;  // async pushes dropped with parts missing
  };

  // A pull's outcome (parked_pulls.h).
  using PulledTensor = ::pstrain::PulledTensor;
  using PullReply = ::pstrain::PullReply;
  using PullCallback = ::pstrain::PullCallback;

  // `max_wait` caps any wait a request asks for.
  explicit ParameterServer(absl::Duration max_wait = absl::Minutes(10));
  ~ParameterServer();

  // Where tables with a memory budget keep their rows past it (the next
  // Initialize on): server_model.h's TierSettings.
  void SetTier(TierSettings tier) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status Initialize(const InitializeRequest& request);

  // Starts a pull. `done` runs exactly once, on this thread when the pull is
  // ready now (or refused), else on the thread that makes it ready, times it
  // out, cancels it or shuts the server down. Returns an id for CancelPull.
  uint64_t StartPull(const PullRequest& request, PullCallback done);
  // Ends a waiting pull with CANCELLED; no-op when it already ended.
  void CancelPull(uint64_t id);
  // Blocking pull into a response with content (tests and tools; copies).
  absl::Status Pull(const PullRequest& request, PullResponse* response);

  // A push whose tensors carry dtype and shape only; their contents are
  // `payload`, concatenated in order (a frame's payload). A part of an async
  // push in several calls (PushRequest.num_parts > 1) is applied to its
  // partitions as it arrives and answered HELD, until the part that
  // completes the push, which counts it (one update: the version moves
  // once) and is answered APPLIED.
  absl::Status Push(const PushRequest& header, const SegmentedBytes& payload,
                    PushResponse* response);
  // A push with the contents inside the protos (tests and tools).
  absl::Status Push(const PushRequest& request, PushResponse* response);

  // Embedding rows (see EmbeddingTable). Async: a push is applied on
  // arrival, at the learning rate of the current version (it is part of a
  // worker's step, not an update of its own: version counts dense pushes).
  // Sync: a worker's row gradients for step == version are staged, and when
  // the step completes every table applies the staged rows of the step, in
  // worker-index order (duplicates summed), divided by the number of
  // gradients the step aggregated, so rows average over workers as dense
  // variables do. A worker sends its rows before its dense push to the
  // same server; rows for a step already done are dropped as stale.
  // `payload` holds request.num_ids() ids and then their gradients (a
  // frame's payload, common/rpc/wire_frame.h); both are copied out once, the
  // ids to be checked and the gradients to be checked and applied or staged.
  absl::Status PushRows(const PushRowsRequest& request, const SegmentedBytes& payload,
                        PushRowsResponse* response);
  // A row push with its ids and gradients inside the proto (tests and tools).
  absl::Status PushRows(const PushRowsRequest& request, PushRowsResponse* response);
  // Blocking row pull into a response with content (tests and tools; copies).
  absl::Status PullRows(const PullRowsRequest& request, PullRowsResponse* response);
  // Rows pulled for a frame (row_store.h).
  using PulledRows = ::pstrain::PulledRows;
  using PullRowsCallback = std::function<void(absl::Status, PulledRows)>;
  // Starts a row pull. `done` runs exactly once, as StartPull's does: a pull
  // whose version is not there yet waits parked (no thread), ended by its
  // version, its deadline, CancelPull (the id returned) or a shutdown.
  uint64_t StartPullRows(const PullRowsRequest& request, PullRowsCallback done);
  // Sets rows of a table from a checkpoint (the chief, before training
  // starts): every id must be this server's under the current placement;
  // no slots means fresh optimizer state. Nothing changes on a refusal.
  absl::Status LoadRows(const LoadRowsRequest& request, LoadRowsResponse* response);

  void GetStatus(PsStatusResponse* response);
  // The same after `worker` claims `session` (a restarted worker's first
  // read): its earlier sessions' pushes are refused from now on, and every
  // push admitted before is in the status. Fails for a session older than
  // the newest, a worker out of range, or before Initialize.
  absl::Status GetStatus(int worker, int32_t session, PsStatusResponse* response);
  // Checkpoints (sync mode, `checkpoint.dir` set): when a step completes at
  // a multiple of `checkpoint.every_steps` or at max_steps, this server takes
  // its partitions at that version (the buffers themselves, and a copy of
  // their slots, taken under the lock at the step boundary) and a thread of
  // its own writes them to ckpt-<step>/shard-<i>-of-<n> while training goes
  // on. GetShard waits (up to the request's timeout) until that shard is
  // durable and describes it, with each worker's data cursor at the step.
  absl::Status GetShard(const GetShardRequest& request, GetShardResponse* response);
  // Sync mode: schedules a cut at the boundary of `step` (ahead of this
  // server's version; OUT_OF_RANGE otherwise), taken as every_steps' are.
  // Async mode: the chief's cut for checkpoint `step`. New pushes are held
  // while the ones in flight finish (up to the request's timeout), the
  // partitions are taken as in sync mode with each worker's cursor as of
  // its last push, and pushes are released; the shard is then written in
  // the background and GetShard waits for it. Reports this server's version
  // and how long pushes were held.
  absl::Status Snapshot(const SnapshotRequest& request, SnapshotResponse* response);
  // Wakes every waiter with UNAVAILABLE and refuses further requests.
  void Shutdown();

  Counters counters();

  // Checkpoint shards this server wrote (or failed to), for its metrics.
  using CheckpointStats = Snapshotter::Stats;
  CheckpointStats checkpoint_stats();

  // Per variable partition, for metrics: what crossed the wire for it and
  // the time its optimizer took.
  struct PartitionStats {
    std::string variable;
    int partition = 0;
    int64_t pushes = 0;  // gradients applied or staged
    int64_t pulls = 0;
    int64_t push_bytes = 0;
    int64_t pull_bytes = 0;
    double apply_seconds = 0;
  };
  std::vector<PartitionStats> partition_stats();
  // Seconds per apply of one partition's update (sync: of a step's mean).
  const Histogram& apply_seconds() const { return apply_seconds_; }
  // Sync: seconds from a step's first gradient on this server to the step's
  // completion (how long the quorum kept the earliest worker waiting).
  const Histogram& quorum_wait_seconds() const { return quorum_wait_seconds_; }
  // Async: each admitted push's staleness (updates applied since the version
  // its gradient was computed from; taken before its values are checked).
  const Histogram& staleness() const { return staleness_; }
  static std::vector<double> StalenessBounds();

  // Sync: for each worker, whether the open step still waits for its
  // gradient on this server (some partition of the step lacks it). Empty in
  // async mode, before Initialize and after the last step.
  std::vector<bool> SyncWaitingOn();

 private:
  using Key = PartitionKey;
  using Buffer = PartitionState::Buffer;
  using Model = ServerModel;

  // Embedding rows: lookups into pooled buffers, staging, applies, loads.
  RowStore rows_;

  using Completion = PullCompletion;
  // Attaches the bfloat16 rounding of each pulled version (outside mu_).
  static void AttachBfloat16(PullReply* reply);
  static std::string KeyString(const Key& key) { return PartitionKeyString(key); }
  // Makes `model` the run's, from the request's step: pulls parked for the
  // run before end (into `completions`), and every per-run state restarts.
  void InstallLocked(const InitializeRequest& request, std::shared_ptr<Model> model,
                     std::vector<Completion>* completions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckIncarnationLocked(uint64_t incarnation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PushImpl(const PushRequest& header, const SegmentedBytes* frame,
                        const std::vector<SegmentedBytes>* contents, PushResponse* response);
  // Async: one part of a multi-part push, applied from the request's bytes
  // as it arrives (nothing is held: no copy, and none of gRPC's buffers
  // pinned past the call). The push is admitted (its update number, rate
  // and staleness fixed, the staleness bound and max_steps checked) by the
  // first of its parts to arrive, and counted by the one that completes it.
  absl::Status PushAsyncPart(const std::shared_ptr<Model>& model, const PushRequest& header,
                             const std::vector<GradientRef>& grads, PushResponse* response);
  // Sync: a push in three steps, under mu_, outside it and under it again
  // (then its partitions applied outside it): AdmitSyncPushLocked,
  // StageSyncPush, ArriveSyncPushLocked.
  absl::Status PushSync(const std::shared_ptr<Model>& model, const PushRequest& header,
                        const std::vector<GradientRef>& grads, PushResponse* response);
  // A sync push on its way: the gradients accepted, whether each completes
  // its partition's quorum (read from the received bytes, never staged),
  // and what staging found.
  struct SyncPush {
    std::vector<const GradientRef*> accepted;
    std::vector<char> direct;  // per accepted
    int64_t payload = 0;       // bytes received
    int64_t staged = 0;        // bytes copied into staging buffers
    const PartitionState* non_finite = nullptr;  // the first with NaN or Inf
    OverBound over_bound;  // the first over the gradient bound (partition null: none)
  };
  // A partition whose quorum a push completed, with its workers, and the
  // push's gradient when it is to be read from the received bytes.
  struct ToApply {
    PartitionState* partition;
    std::vector<int> workers;
    const GradientRef* direct;
  };
  absl::StatusOr<bool> AdmitSyncPushLocked(const std::shared_ptr<Model>& model,
                                           const PushRequest& header,
                                           const std::vector<GradientRef>& grads, SyncPush* push,
                                           std::vector<Completion>* completions,
                                           PushResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void StageSyncPush(const ServerModel& model, int w, SyncPush* push);
  absl::StatusOr<bool> ArriveSyncPushLocked(const std::shared_ptr<Model>& model, int w,
                                            int64_t step, SyncPush* push,
                                            std::vector<ToApply>* to_apply,
                                            PushResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PushAsync(const std::shared_ptr<Model>& model, const PushRequest& header,
                         const std::vector<GradientRef>& grads, PushResponse* response);
  // Sync: installs the partitions of `step` applied outside the lock; when
  // they were the step's last open ones, publishes the step. Returns whether
  // the step completed.
  bool FinishPartitionsLocked(const Model& model,
                              std::vector<std::pair<PartitionState*, Buffer>>* applied,
                              int64_t step, std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sync: version advances past `step`, `contributors` gradients applied.
  void CompleteStepLocked(int64_t step, int contributors, std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finds `table` and checks a rows request's common fields.
  absl::Status CheckRowsRequestLocked(uint64_t incarnation, int worker, const std::string& table,
                                      Model::Table** out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sync: the open step's deadline passed: go on short or fail the step.
  // Releases and retakes mu_ while it applies.
  void ExpireSyncStepLocked(std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  bool FinishedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string WaitingOnLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a pull may be served now: its version is there (or it must end
  // anyway), and an async worker is within the staleness bound (`rows`: a
  // row pull, not held back by the bound; its dense pull was).
  bool ReadyLocked(const PullRequest& request, bool rows = false) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks a pull's arguments; OK means it may wait or be served.
  absl::Status CheckPullLocked(const PullRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sync: whether a float32 pull of the open step's outcome (min_version
  // == version_ + 1) names only partitions already applied for it: they are
  // final, so it is served from their `next` buffers at version_ + 1 before
  // the rest of the step is in (never the run's last step, whose pulls say
  // it finished). A worker's forward pass needs every partition, so no
  // gradient for version_ + 1 can come before the step is published.
  bool EarlyReadyLocked(const PullRequest& request) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How a pull (`rows`: a row pull's wait for its version) is served now.
  enum class Serve { kWait, kNow, kEarly };
  Serve ServeLocked(const PullRequest& request, bool rows) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes references to the requested partitions' current buffers (with
  // `rows`, only the version: a row pull's; with `early`, their applied
  // `next` buffers, at version_ + 1).
  absl::Status SnapshotLocked(const PullRequest& request, PullReply* reply, bool rows = false,
                              bool early = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The blocking Pull's and PullRows' wait for the parked call `id` (its
  // request's timeout_ms) to end `done`.
  void AwaitParked(uint64_t id, int64_t timeout_ms, absl::Notification* done);
  // Parks `done` (a pull, or a row pull with `rows`) until `request` is
  // ready, or runs it now (through `completions`); returns the waiter's id,
  // 0 when it did not wait.
  uint64_t ServeOrParkLocked(const PullRequest& request, PullCallback done, bool rows,
                             std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves every waiter that is now ready (or must end) to `out`.
  void CollectReadyLocked(std::vector<Completion>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the callbacks (outside mu_), converting bfloat16 pulls first.
  static void RunCompletions(std::vector<Completion>* completions);
  // The error of a parked pull whose deadline passed: what it waited for,
  // and what the server waits on.
  absl::Status TimedOutLocked(const ParkedPulls::Waiter& w) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();
  // Sync: takes a checkpoint's snapshot when `version` (just reached) is due.
  void MaybeSnapshotLocked(int64_t version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a cut of the partitions as they stand, with `cursors`, for the
  // writer. No apply may run meanwhile (sync: the step boundary; async:
  // pushes held).
  void CutLocked(int64_t step, const std::vector<StepCursor>& cursors)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How a cut of `step` saves the embedding rows (checkpoint.full_every).
  RowsPlan PlanRowsLocked(int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits while an async cut holds pushes (up to max_wait_); UNAVAILABLE or
  // FAILED_PRECONDITION when the server shut down or `model` was replaced.
  absl::Status AwaitPushesReleasedLocked(const std::shared_ptr<Model>& model, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const absl::Duration max_wait_;
  TierSettings tier_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex mu_;
  bool initialized_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool destroying_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  // The incarnation a new one replaced (0: none), and when (a rollback or a
  // new run): a task still on it is told so.
  uint64_t replaced_incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time replaced_at_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Model> model_ ABSL_GUARDED_BY(mu_);
  // Number of applied updates (sync: steps; async: pushes).
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  // Sync: the open step's quorum, clock, outcome and cursors.
  SyncStep sync_ ABSL_GUARDED_BY(mu_);
  // An Initialize sent in parts, gathered until the last part is in.
  InitParts init_parts_ ABSL_GUARDED_BY(mu_);
  // Async: updates admitted and applied, the workers' clocks and cursors.
  AsyncClock async_ ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);
  // Counts a refused push (never an UNAVAILABLE one: a server not ready or
  // shutting down refuses nothing about the push itself).
  void RejectLocked(Rejection reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Histogram apply_seconds_{Histogram::SecondsBounds()};
  Histogram quorum_wait_seconds_{Histogram::SecondsBounds()};
  Histogram staleness_{StalenessBounds()};
  ParkedPulls parked_ ABSL_GUARDED_BY(mu_);
  // Each worker's newest session (its process; PushRequest.session), and
  // the step open when a later session than the first reached this server
  // (-1: none): its gradients for that step may repeat what its earlier
  // process had pushed (the same batch from the same parameters), and are
  // then taken once.
  std::vector<int32_t> worker_session_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> session_start_step_ ABSL_GUARDED_BY(mu_);
  // Refuses a push of a session older than the worker's newest; on a newer
  // one, drops the rows the earlier process staged for the open step (the
  // new one pushes them again).
  absl::Status AdmitSessionLocked(int worker, int32_t session, const char* method)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `worker`'s push for `step` may repeat partitions already in.
  bool ReplayAllowedLocked(int worker, int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return session_start_step_[worker] == step;
  }
  // Async: each worker's push in parts being received.
  HeldPushes held_ ABSL_GUARDED_BY(mu_);
  // Async: parts of multi-part pushes being applied, dropped pushes' too (a
  // cut waits for them).
  int64_t parts_applying_ ABSL_GUARDED_BY(mu_) = 0;
  // Worker `w`'s admitted async update is applied: it counts (version, the
  // worker's clock), the push is answered APPLIED, and the pulls it
  // releases are collected.
  void AsyncAppliedLocked(int w, PushResponse* response, std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops worker `w`'s push in parts, if open (HeldPushes::Drop), giving
  // back its admission.
  void DropHeldPushLocked(int w, std::string why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Refuses (and counts) a push for a step ahead of this server's version.
  absl::Status CheckNotAheadLocked(const PushRequest& header) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Admits an async push (its session admitted already): false when
  // max_steps is reached (answer FINISHED), else true with its update
  // number in `ticket`.
  absl::StatusOr<bool> AdmitAsyncLocked(const Model& model, const PushRequest& header,
                                        int64_t* ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops pushes in parts older than the model's held_push_ttl (a worker
  // that died or gave up mid-push: it is admitted, so a cut would wait for
  // it). From a part (`throttled`), looks at most once per min(ttl, 1 s),
  // so a part costs no walk over every worker; the timer thread also calls
  // it at the earliest such deadline, so a cut never waits past it.
  void ExpireHeldPushesLocked(const Model& model, absl::Time now, bool throttled = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When the next open push in parts passes its held_push_ttl.
  absl::Time NextHeldPushExpiryLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Async: whether a checkpoint's cut is holding new pushes.
  bool holding_pushes_ ABSL_GUARDED_BY(mu_) = false;
  // Async: row pushes being applied (a cut waits for them).
  int64_t rows_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Checkpoint cuts, their writer and outcomes (its own lock, taken after mu_).
  Snapshotter snapshots_;
  absl::CondVar timer_cv_;
  // When the timer thread sleeps until (InfinitePast while it is awake).
  absl::Time timer_wakes_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread timer_;  // expires waiting pulls at their deadlines
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_PARAMETER_SERVER_H_
