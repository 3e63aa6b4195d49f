// What a worker, the chief and the tools see of the cluster's parameter
// servers: one interface (TensorFlow's WorkerInterface pattern, ps-lite's
// KVWorker shape), whatever carries the calls. Two implementations:
//   GrpcPsClient (grpc_ps_client.h)          the servers over gRPC, the daemons'
//   InProcessPsClient (ps_server/in_process_client.h)  ParameterServer objects
//                                                in this process, for unit tests
//                                                of the trainer and the driver
// A client is driven by the placement: it splits full variables into their
// row partitions, asks every server in parallel (each wait with a deadline)
// and assembles pulled partitions back into full tensors, validating what the
// servers send. Embedding rows go to the server that holds their id
// (ServerForId).
//
// A push is a handle (Push): StartPush names the step and the gradient
// memory, Ready starts the calls for variables whose gradients are final
// (the backward pass pushes layer by layer), Wait sends the rest, waits for
// every call and says what each server did. One push at a time per client.
//
// Thread-compatible: one client is used by one thread at a time, and a push
// handle by the thread that uses its client; a handle must not outlive its
// client.
#ifndef PSTRAIN_COMMON_CLIENT_PS_CLIENT_H_
#define PSTRAIN_COMMON_CLIENT_PS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/base/tensor.h"
#include "common/cluster/placement.h"
#include "proto/config.pb.h"
#include "proto/ps_service.pb.h"

namespace pstrain {

class PsClient {
 public:
  virtual ~PsClient() = default;

  virtual int num_servers() const = 0;
  // Where each variable's partitions live (outlives the client).
  virtual const Placement& placement() const = 0;

  // Stamped on every call: the run's incarnation, the worker process's
  // session (RegisterWorkerResponse.session) on pushes, and (sync) the
  // worker's data cursor after the batch it is about to push, which a
  // checkpoint records.
  void set_incarnation(uint64_t incarnation) { incarnation_ = incarnation; }
  uint64_t incarnation() const { return incarnation_; }
  void set_session(int32_t session) { session_ = session; }
  void set_data_cursor(int64_t epoch, int64_t position) {
    cursor_epoch_ = epoch;
    cursor_position_ = position;
  }

  // A resume's optimizer state, whole variables in placement order: slots[v]
  // holds variable v's slots in the optimizer's order, updates[v] its update
  // count. Empty slots: fresh ones.
  struct OptimizerState {
    std::vector<std::vector<std::vector<float>>> slots;
    std::vector<int64_t> updates;
  };
  // Installs each server's partitions of `params` (full tensors in placement
  // order). Waits up to `startup_timeout` for servers to come up; a server
  // already initialised for this incarnation counts as success.
  virtual absl::Status InitializeAll(const TrainingConfig& config, uint64_t fingerprint,
                                     int num_workers, int64_t start_step,
                                     const std::vector<Tensor>& params,
                                     absl::Duration startup_timeout,
                                     const OptimizerState* optimizer_state = nullptr) = 0;

  struct PullResult {
    std::vector<int64_t> versions;  // per server
    bool finished = false;          // every server reached max_steps
  };
  // Reads every variable into caller memory: destinations[v] holds variable
  // v's full tensor (e.g. the model's pinned host block), written in place,
  // each server waiting up to `wait` for its version to reach
  // min_versions[s] (empty: any). On a failure, some partitions may have
  // been written.
  virtual absl::Status PullInto(const std::vector<int64_t>& min_versions, absl::Duration wait,
                                const std::vector<float*>& destinations, PullResult* result) = 0;
  // The same into `params` (resized and shaped as needed).
  absl::Status PullAll(const std::vector<int64_t>& min_versions, absl::Duration wait,
                       std::vector<Tensor>* params, PullResult* result);
  // Starts the next PullInto's pull now, while this step still computes and
  // pushes; the PullInto with the same min_versions takes its replies
  // instead of calling again (or pulls again, within what is left of its
  // wait, when they are not good for it). Sync workers: min_versions is the
  // step being pushed, plus one; a server answers each of the calls as soon
  // as the partitions it names are applied. Async workers: empty
  // min_versions and, per server, the count of this worker's pushes it must
  // have applied first (min_own_pushes[s]: own_pushes()[s] + 1, started
  // after the push's calls), so the pull still sees the worker's own push.
  // `as_is` (async, rpc.async_prefetch): the replies are taken whatever the
  // servers' versions, not pulled again when this worker's push came back
  // from a newer version (the pull was sent before it, on purpose).
  virtual void PrefetchPull(const std::vector<int64_t>& min_versions, absl::Duration wait,
                            const std::vector<int64_t>& min_own_pushes = {},
                            bool as_is = false) = 0;
  // Async: per server, how many of this worker's pushes it had applied as
  // of the last push's replies (PushResponse.own_pushes); -1 where no reply
  // said (before the first push, or a push that did not apply).
  const std::vector<int64_t>& own_pushes() const { return own_pushes_; }

  // A push under way, from StartPush until Wait returns. Destroying it
  // before Wait abandons it: the calls in flight are waited for (or
  // cancelled) and nothing more is sent (a failed step's gradients were
  // never all computed).
  class Push {
   public:
    virtual ~Push() = default;
    // Starts the calls for variables [first, end) (placement order) now
    // that their gradients are final, and returns at once. Variables already
    // started are skipped. Pushes started piecemeal are for sync servers.
    virtual absl::Status Ready(size_t first, size_t end) = 0;
    // Names variable v's gradient memory (where StartPush had none: null),
    // before its Ready or Wait. A variable already started keeps its own.
    virtual void SetSource(size_t v, const float* source) = 0;
    // Sends whatever is left, waits for every call, and says what each
    // server did: outcomes[s] is APPLIED when a call completed the step (or,
    // async, the push), else ACCUMULATED, FINISHED or DROPPED_STALE. The
    // gradient memory may change once it returns. Once only.
    virtual absl::Status Wait(std::vector<PushOutcome>* outcomes) = 0;
  };
  // Starts a push of sources[v] (variable v's full gradient), stamped with
  // steps[s] for server s (the version pulled from it). The memory must stay
  // unchanged until the push ends; a null source is named later
  // (Push::SetSource), before that variable is started. FAILED_PRECONDITION while another push of
  // this client is under way.
  virtual absl::StatusOr<std::unique_ptr<Push>> StartPush(
      const std::vector<int64_t>& steps, const std::vector<const float*>& sources) = 0;
  // A whole push: StartPush, then Wait.
  absl::Status PushFrom(const std::vector<int64_t>& steps,
                        const std::vector<const float*>& sources,
                        std::vector<PushOutcome>* outcomes);
  absl::Status PushAll(const std::vector<int64_t>& steps, const std::vector<Tensor>& grads,
                       std::vector<PushOutcome>* outcomes);

  // Embedding rows, each id asked of the server that holds it, the servers
  // called in parallel. PullRows reads the rows of `ids` (duplicates
  // allowed) of `table` into out[i * dim, (i + 1) * dim), each server
  // waiting up to `wait` for min_version; *version (optional) gets the
  // oldest version a server answered at.
  virtual absl::Status PullRows(const std::string& table, int dim,
                                absl::Span<const uint64_t> ids, int64_t min_version,
                                absl::Duration wait, float* out, int64_t* version = nullptr) = 0;
  // Sends the row gradients grads[i * dim, ...) of `ids`, stamped with
  // steps[s] for server s; outcomes[s] says what each server did (servers
  // that held none of the ids: PUSH_OUTCOME_UNSPECIFIED). In sync mode, send
  // a step's rows before its dense push.
  virtual absl::Status PushRows(const std::string& table, int dim,
                                absl::Span<const uint64_t> ids, const float* grads,
                                const std::vector<int64_t>& steps,
                                std::vector<PushOutcome>* outcomes) = 0;
  // Several tables' rows at once (a model whose columns look up tables of
  // their own): PullRows and PushRows of each, every table's calls in
  // flight together where the client can (gRPC: one round trip for all).
  // `rows`: the pull's destination, the push's gradients. A push's
  // outcomes[t][s]: table t's on server s. By default, one table after
  // another.
  struct TableRows {
    std::string table;
    int dim = 0;
    absl::Span<const uint64_t> ids;
    float* rows = nullptr;
  };
  virtual absl::Status PullTables(absl::Span<const TableRows> tables, int64_t min_version,
                                  absl::Duration wait);
  virtual absl::Status PushTables(absl::Span<const TableRows> tables,
                                  const std::vector<int64_t>& steps,
                                  std::vector<std::vector<PushOutcome>>* outcomes);
  // Restores rows of `table` from a checkpoint onto the servers that hold
  // their ids now: values[i * dim, ...) of ids[i], each slot likewise
  // (`slots` empty: fresh optimizer state), update counts and last-touched
  // steps per id (empty: 0).
  virtual absl::Status LoadRows(const std::string& table, int dim,
                                absl::Span<const uint64_t> ids, const float* values,
                                const std::vector<const float*>& slots,
                                absl::Span<const int64_t> updates,
                                absl::Span<const int64_t> touched) = 0;

  virtual absl::Status ShutdownAll(const std::string& reason) = 0;
  // Async checkpoints: every server takes its cut for `step` at once
  // (SnapshotRequest); `responses` gets one per server.
  virtual absl::Status SnapshotAll(int64_t step, absl::Duration timeout,
                                   std::vector<SnapshotResponse>* responses) = 0;
  // Waits up to `timeout` for server `server`'s checkpoint shard of `step`.
  virtual absl::Status GetShard(int server, int64_t step, absl::Duration timeout,
                                GetShardResponse* response) = 0;
  virtual absl::Status GetStatus(int server, PsStatusResponse* response) = 0;
  // A restarted worker's status read that claims its `session` on `server`.
  virtual absl::Status ClaimSession(int server, int32_t session,
                                    PsStatusResponse* response) = 0;

  // Tensor payload this client moved, and the bytes it copied to move them.
  struct Counters {
    int64_t push_payload_bytes = 0;
    int64_t push_copied_bytes = 0;
    int64_t pull_payload_bytes = 0;
    int64_t pull_copied_bytes = 0;
    int64_t prefetched_pulls = 0;  // pulls whose replies a PrefetchPull had asked for
  };
  const Counters& counters() const { return counters_; }

 protected:
  PsClient() = default;
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  uint64_t incarnation_ = 0;
  int32_t session_ = 0;
  int64_t cursor_epoch_ = 0;
  int64_t cursor_position_ = 0;
  std::vector<int64_t> own_pushes_;  // written by the implementation's push
  Counters counters_;
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CLIENT_PS_CLIENT_H_
