// Client for all parameter servers of a cluster, driven by the placement: it
// splits full variables into their row partitions, sends one RPC per server
// per operation (all servers in parallel, each with a deadline) and assembles
// pulled partitions back into full tensors, validating what the servers send.
// Pulls and pushes travel as frames (common/rpc/wire_frame.h): a push is sent
// straight from the caller's gradient memory (no copy), a pull is copied once,
// from the received slices into the caller's memory.
// One PsClient is used by one thread at a time.
#ifndef PSTRAIN_COMMON_CLIENT_PS_CLIENT_H_
#define PSTRAIN_COMMON_CLIENT_PS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/rpc/call_window.h"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/placement.h"
#include "common/base/tensor.h"
#include "common/rpc/wire_frame.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/ps_service.grpc.pb.h"

namespace pstrain {

class PsClient {
 public:
  // `worker` is this caller's worker index, or -1 for the chief and tools.
  PsClient(const ClusterSpec& cluster, const Placement* placement, int worker,
           absl::Duration rpc_timeout);
  ~PsClient();

  int num_servers() const { return static_cast<int>(stubs_.size()); }
  void set_incarnation(uint64_t incarnation) { incarnation_ = incarnation; }
  // The worker process's session (RegisterWorkerResponse.session), on pushes.
  void set_session(int32_t session) { session_ = session; }
  uint64_t incarnation() const { return incarnation_; }
  // The dtype tensors travel in: DT_FLOAT (default) or DT_BFLOAT16 (pushes
  // rounded here, pulls rounded by the servers; both halve the bytes).
  void set_wire_dtype(DataType dtype) { wire_dtype_ = dtype; }
  // Split a pull from and a push to one server into calls of up to this
  // many bytes of whole partitions, in flight together (0: one call per
  // server, which must then fit one message). A push whose calls are all
  // started at once (PushFrom) numbers its parts (PushRequest.num_parts):
  // an async server applies each part as it comes and counts the push once,
  // as one update, when its last part is in. Pushes started piecemeal
  // (PushReady) are for sync servers only.
  void set_chunk_bytes(int64_t bytes) { chunk_bytes_ = bytes; }
  // At most this many calls in flight to one server in each direction
  // (pulls; pushes and Initialize), the rest starting as earlier ones end
  // (rpc.calls_in_flight, whose 0 means 16; here 0 means no limit). Pulls
  // and pushes have windows of their own, so a push never waits behind this
  // client's parked pulls. A push or prefetched pull under way is abandoned.
  static constexpr int kDefaultCallsInFlight = 16;
  void set_calls_in_flight(int calls);
  // Calls that waited for room in a window so far.
  int64_t calls_waited() const;
  // Pull, Push, PullRows and PushRows calls to one server take turns over
  // this many TCP connections (rpc.connections_per_server; default 1), so
  // that more than one of gRPC's transport threads carries a server's
  // traffic at each end. The other calls use the first. A push or
  // prefetched pull under way is abandoned.
  void set_connections_per_server(int connections);
  int connections_per_server() const { return static_cast<int>(raw_stubs_[0].size()); }
  // How a pull in several calls treats a server whose calls answered at
  // different versions (its version moved between them): false (sync
  // workers) makes the pull again; true (async, the chief's evaluation)
  // takes the parts as they are and reports the oldest version.
  void set_mixed_versions(bool allowed) { mixed_versions_ = allowed; }
  // The deadline of each Push and PushRows call (default: the rpc timeout). A worker's
  // push is part of its step and gets the step's: a worker paused (SIGSTOP,
  // a long GC, swapping) with a push in flight failed with DEADLINE_EXCEEDED
  // on resuming, though the step timeout had not passed.
  void set_push_timeout(absl::Duration timeout) { push_timeout_ = timeout; }
  // Sync: the worker's data cursor after the batch it is about to push,
  // carried in every push call (a checkpoint records it).
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
  absl::Status InitializeAll(const TrainingConfig& config, uint64_t fingerprint, int num_workers,
                             int64_t start_step, const std::vector<Tensor>& params,
                             absl::Duration startup_timeout,
                             const OptimizerState* optimizer_state = nullptr);
  // Waits up to `timeout` for server `server`'s checkpoint shard of `step`.
  absl::Status GetShard(int server, int64_t step, absl::Duration timeout,
                        GetShardResponse* response);

  struct PullResult {
    std::vector<int64_t> versions;  // per server
    bool finished = false;          // every server reached max_steps
  };
  // Reads every variable into `params` (resized and shaped as needed), each
  // server waiting up to `wait` for its version to reach min_versions[s].
  absl::Status PullAll(const std::vector<int64_t>& min_versions, absl::Duration wait,
                       std::vector<Tensor>* params, PullResult* result);
  // The same into caller memory: destinations[v] holds variable v's full
  // tensor (e.g. the model's pinned host block), written in place. On a
  // failure, some partitions may have been written.
  absl::Status PullInto(const std::vector<int64_t>& min_versions, absl::Duration wait,
                        const std::vector<float*>& destinations, PullResult* result);
  // Sync workers: starts the next step's pull now (min_versions: the step
  // being pushed, plus one), while this step still computes and pushes. A
  // sync server parks each call and answers it as soon as the partitions it
  // names are applied (with set_chunk_bytes, float32; otherwise when the
  // step completes); the replies wait in gRPC's buffers, and the next
  // PullInto with the same min_versions copies them into its destinations
  // instead of calling again. A prefetched call that failed, a pull that
  // straddled a step, or one older than the server's version in the push's
  // replies (backup workers went on without this one) is made again by that
  // PullInto within what is left of its wait.
  //
  // Async workers: the same with empty min_versions and, per server, the
  // count of this worker's pushes it must have applied first
  // (min_own_pushes[s]: own_pushes()[s] + 1, sent after the push's calls):
  // the pull still sees the worker's own push, as one made after it would.
  //
  // `as_is` (async, rpc.async_prefetch): the replies are taken whatever the
  // servers' versions, not pulled again when this worker's push came back
  // from a newer version (the pull was sent before it, on purpose).
  void PrefetchPull(const std::vector<int64_t>& min_versions, absl::Duration wait,
                    const std::vector<int64_t>& min_own_pushes = {}, bool as_is = false);
  // Async: per server, how many of this worker's pushes it had applied as
  // of the last PushEnd's replies (PushResponse.own_pushes); -1 where no
  // reply said (before the first push, or a push that did not apply).
  const std::vector<int64_t>& own_pushes() const { return own_pushes_; }

  // Sends each server its slices of `grads`, stamped with steps[s] (the
  // version pulled from that server). outcomes[s] says what each server did.
  absl::Status PushAll(const std::vector<int64_t>& steps, const std::vector<Tensor>& grads,
                       std::vector<PushOutcome>* outcomes);
  // The same from caller memory: sources[v] holds variable v's full gradient.
  absl::Status PushFrom(const std::vector<int64_t>& steps, const std::vector<const float*>& sources,
                        std::vector<PushOutcome>* outcomes);
  // PushFrom in parts, to overlap the push with the backward pass: PushBegin
  // names the step and the gradient memory, PushReady(first, end) starts
  // the calls for variables [first, end) as soon as their gradients are final
  // (and returns at once), PushEnd sends whatever is left, waits for every
  // call and says what each server did. The memory must stay unchanged until
  // PushEnd returns.
  absl::Status PushBegin(const std::vector<int64_t>& steps,
                         const std::vector<const float*>& sources);
  absl::Status PushReady(size_t first, size_t end);
  absl::Status PushEnd(std::vector<PushOutcome>* outcomes);
  // A step that failed after PushBegin: waits for (or cancels) the calls in
  // flight and sends nothing more (the rest of the gradient memory was never
  // computed). Also what the destructor does.
  void AbandonPush();

  // Embedding rows, each id asked of the server that holds it
  // (ServerForId), the servers called in parallel. PullRows reads the rows
  // of `ids` (duplicates allowed) of `table` into out[i * dim, (i + 1) * dim),
  // each server waiting up to `wait` for min_version; *version (optional)
  // gets the oldest version a server answered at.
  absl::Status PullRows(const std::string& table, int dim, absl::Span<const uint64_t> ids,
                        int64_t min_version, absl::Duration wait, float* out,
                        int64_t* version = nullptr);
  // Sends the row gradients grads[i * dim, ...) of `ids`, stamped with
  // steps[s] for server s; outcomes[s] says what each server did (servers
  // that held none of the ids: PUSH_OUTCOME_UNSPECIFIED). In sync mode, send
  // a step's rows before its dense push.
  absl::Status PushRows(const std::string& table, int dim, absl::Span<const uint64_t> ids,
                        const float* grads, const std::vector<int64_t>& steps,
                        std::vector<PushOutcome>* outcomes);

  // Restores rows of `table` from a checkpoint onto the servers that hold
  // their ids now: values[i * dim, ...) of ids[i], each slot likewise
  // (`slots` empty: fresh optimizer state), update counts and last-touched
  // steps per id (empty: 0). Sent in requests of about 4 MiB.
  absl::Status LoadRows(const std::string& table, int dim, absl::Span<const uint64_t> ids,
                        const float* values, const std::vector<const float*>& slots,
                        absl::Span<const int64_t> updates, absl::Span<const int64_t> touched);

  absl::Status ShutdownAll(const std::string& reason);
  // Async checkpoints: every server takes its cut for `step` at once
  // (SnapshotRequest); `responses` gets one per server.
  absl::Status SnapshotAll(int64_t step, absl::Duration timeout,
                           std::vector<SnapshotResponse>* responses);
  absl::Status GetStatus(int server, PsStatusResponse* response);
  // A restarted worker's status read that claims its `session` on `server`.
  absl::Status ClaimSession(int server, int32_t session, PsStatusResponse* response);

  // Tensor payload this client moved, and the bytes it copied to move them.
  struct Counters {
    int64_t push_payload_bytes = 0;
    int64_t push_copied_bytes = 0;
    int64_t pull_payload_bytes = 0;
    int64_t pull_copied_bytes = 0;
    int64_t prefetched_pulls = 0;  // pulls whose replies a PrefetchPull had asked for
  };
  const Counters& counters() const { return counters_; }

 private:
  std::string ServerName(int s) const;
  absl::Status StatusCall(int server, const PsStatusRequest& request, PsStatusResponse* response);
  struct PushBatch;
  // Waits for the calls of push_ to end and gRPC to release their slices.
  absl::Status WaitForPushCalls();
  void StartPushCall(int server, const PushRequest& header, std::vector<OutgoingPayload> payload);
  // A server at its limits (--max_concurrent_calls, its in-flight memory)
  // refuses a call with RESOURCE_EXHAUSTED before reading it. A dense pull
  // only reads, so `attempt` is made again, backing off 5 ms doubling to
  // 200 ms, until the pull's deadline (`wait` plus the rpc timeout); each
  // attempt gets what is left of `wait` for the servers to wait. Pushes and
  // row pulls (a lookup counts toward a row's admission) are not made again.
  absl::Status RetryRefusedPull(absl::Duration wait,
                                const std::function<absl::Status(absl::Duration)>& attempt) const;
  // Sends the pull calls and assembles the replies; sets *straddled (and
  // returns OK) when one server's parts came from different versions.
  absl::Status PullCalls(const std::vector<int>& servers,
                         const std::vector<PullRequest>& requests, absl::Duration wait,
                         const std::vector<float*>& destinations, PullResult* result,
                         bool* straddled);
  // The calls of a full pull (chunked as set_chunk_bytes says), and the
  // server each goes to; min_own_pushes (empty: none) as PrefetchPull's.
  std::vector<PullRequest> PullRequests(const std::vector<int64_t>& min_versions,
                                        absl::Duration wait, std::vector<int>* servers,
                                        const std::vector<int64_t>& min_own_pushes = {}) const;
  // A full pull's replies, taken one by one into `result`.
  struct PullAssembly {
    PullAssembly(const Placement& placement, int num_servers, PullResult* result);
    // Every partition arrived.
    absl::Status Complete() const;
    PullResult* result;
    std::vector<std::vector<char>> seen;  // per variable, per partition
    int64_t expected = 0, received = 0;
  };
  // Checks server s's reply and copies its partitions into `destinations`;
  // sets *straddled (and returns OK) when it came from another version than
  // the server's earlier parts.
  absl::Status AssembleReply(int s, const grpc::ByteBuffer& response,
                             const std::vector<float*>& destinations, PullAssembly* assembly,
                             bool* straddled);
  struct PullPrefetch;
  // Takes the prefetched pull's replies when it matches (waiting for them
  // until `deadline` at most); false when there is none, it does not match,
  // a call failed (*status: the failure), its parts straddled a step, or a
  // server answered older than the version its last push reply showed (the
  // caller pulls again).
  bool TakePrefetch(const std::vector<int64_t>& min_versions, absl::Time deadline,
                    const std::vector<float*>& destinations, PullResult* result,
                    absl::Status* status);
  // Cancels the prefetched pull's calls and waits for their callbacks.
  void DropPrefetch();

  const Placement* const placement_;
  const int worker_;
  const absl::Duration rpc_timeout_;
  absl::Duration push_timeout_ = rpc_timeout_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<PsService::Stub>> stubs_;
  // Pull and Push are raw methods: ByteBuffers in and out. Per server, one
  // stub per connection (the first shares stubs_' channel), and the
  // connection its next data call takes.
  std::vector<std::vector<std::unique_ptr<grpc::GenericStub>>> raw_stubs_;
  // Atomic, although a client is used by one thread at a time: a call's
  // stub choice stays safe should that change (TSan once found a test
  // sharing a client between threads).
  std::deque<std::atomic<size_t>> next_connection_;
  // The stub of server s's next data call (connections in turn). Call sites
  // pick their stubs on the caller's thread before they start the calls: a
  // window may start a call later, on one of gRPC's threads.
  // With one connection it touches no counter.
  grpc::GenericStub* NextStub(int s);
  std::vector<grpc::GenericStub*> NextStubs(const std::vector<int>& servers);
  // Per server: the windows on its pull calls and on its push calls.
  std::vector<std::unique_ptr<CallWindow>> pull_windows_, push_windows_;
  uint64_t incarnation_ = 0;
  int32_t session_ = 0;
  DataType wire_dtype_ = DT_FLOAT;
  int64_t chunk_bytes_ = 0;
  bool mixed_versions_ = false;
  int64_t cursor_epoch_ = 0;
  int64_t cursor_position_ = 0;
  std::vector<uint16_t> bf16_grads_;  // bfloat16 pushes are sent from here
  std::unique_ptr<PushBatch> push_;   // the push under way, if any
  uint64_t pushes_started_ = 0;  // PushRequest.push_seq of the last one
  std::unique_ptr<PullPrefetch> prefetch_;  // the next step's pull, started early
  std::vector<int64_t> pushed_versions_;     // per server, in the last PushEnd's replies
  std::vector<int64_t> own_pushes_;          // per server, in the last PushEnd's replies
  Counters counters_;
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CLIENT_PS_CLIENT_H_
