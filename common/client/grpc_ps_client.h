// The parameter servers over gRPC (PsClient's implementation for the
// daemons): one RPC per server per operation, or calls of up to
// set_chunk_bytes of whole partitions, in flight together through per-server
// windows. Pulls and pushes travel as frames (common/rpc/wire_frame.h): a
// push is sent straight from the caller's gradient memory (no copy), a pull
// is copied once, from the received slices into the caller's memory.
// Thread-compatible, as PsClient.
#ifndef PSTRAIN_COMMON_CLIENT_GRPC_PS_CLIENT_H_
#define PSTRAIN_COMMON_CLIENT_GRPC_PS_CLIENT_H_

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
#include "common/client/ps_client.h"
#include "common/client/ps_requests.h"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/placement.h"
#include "common/rpc/call_window.h"
#include "common/rpc/wire_frame.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/ps_service.grpc.pb.h"

namespace pstrain {

class GrpcPsClient final : public PsClient {
 public:
  // `worker` is this caller's worker index, or -1 for the chief and tools.
  GrpcPsClient(const ClusterSpec& cluster, const Placement* placement, int worker,
               absl::Duration rpc_timeout);
  ~GrpcPsClient() override;

  int num_servers() const override { return static_cast<int>(stubs_.size()); }
  const Placement& placement() const override { return *placement_; }
  // The dtype tensors travel in: DT_FLOAT (default) or DT_BFLOAT16 (pushes
  // rounded here, pulls rounded by the servers; both halve the bytes).
  void set_wire_dtype(DataType dtype) { wire_dtype_ = dtype; }
  // Split a pull from and a push to one server into calls of up to this
  // many bytes of whole partitions, in flight together (0: one call per
  // server, which must then fit one message). A push whose calls are all
  // started at once (Ready of every variable, or Wait) numbers its parts
  // (PushRequest.num_parts): an async server applies each part as it comes
  // and counts the push once, as one update, when its last part is in.
  // Pushes started piecemeal are for sync servers only.
  void set_chunk_bytes(int64_t bytes) { chunk_bytes_ = bytes; }
  // At most this many calls in flight to one server in each direction
  // (pulls; pushes and Initialize), the rest starting as earlier ones end
  // (rpc.calls_in_flight, whose 0 means 16; here 0 means no limit). Pulls
  // and pushes have windows of their own, so a push never waits behind this
  // client's parked pulls. Set with no push or prefetched pull under way.
  static constexpr int kDefaultCallsInFlight = 16;
  void set_calls_in_flight(int calls);
  // Calls that waited for room in a window so far.
  int64_t calls_waited() const;
  // Pull, Push, PullRows and PushRows calls to one server take turns over
  // this many TCP connections (rpc.connections_per_server; default 1), so
  // that more than one of gRPC's transport threads carries a server's
  // traffic at each end. The other calls use the first. Set with no push or
  // prefetched pull under way.
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

  absl::Status InitializeAll(const TrainingConfig& config, uint64_t fingerprint, int num_workers,
                             int64_t start_step, const std::vector<Tensor>& params,
                             absl::Duration startup_timeout,
                             const OptimizerState* optimizer_state = nullptr) override;
  absl::Status GetShard(int server, int64_t step, absl::Duration timeout,
                        GetShardResponse* response) override;
  // A server at its limits refusing a pull (RESOURCE_EXHAUSTED) is asked
  // again until the pull's deadline (RetryRefusedPull).
  absl::Status PullInto(const std::vector<int64_t>& min_versions, absl::Duration wait,
                        const std::vector<float*>& destinations, PullResult* result) override;
  // The replies wait in gRPC's buffers until PullInto copies them. A
  // prefetched call that failed, a pull that straddled a step, or one older
  // than the server's version in the push's replies (backup workers went on
  // without this one) is made again by that PullInto.
  void PrefetchPull(const std::vector<int64_t>& min_versions, absl::Duration wait,
                    const std::vector<int64_t>& min_own_pushes = {}, bool as_is = false) override;
  absl::StatusOr<std::unique_ptr<Push>> StartPush(
      const std::vector<int64_t>& steps, const std::vector<const float*>& sources) override;
  absl::Status PullRows(const std::string& table, int dim, absl::Span<const uint64_t> ids,
                        int64_t min_version, absl::Duration wait, float* out,
                        int64_t* version = nullptr) override;
  absl::Status PushRows(const std::string& table, int dim, absl::Span<const uint64_t> ids,
                        const float* grads, const std::vector<int64_t>& steps,
                        std::vector<PushOutcome>* outcomes) override;
  // Every table's calls in one round trip.
  absl::Status PullTables(absl::Span<const TableRows> tables, int64_t min_version,
                          absl::Duration wait) override;
  absl::Status PushTables(absl::Span<const TableRows> tables, const std::vector<int64_t>& steps,
                          std::vector<std::vector<PushOutcome>>* outcomes) override;
  // Sent in requests of about 4 MiB.
  absl::Status LoadRows(const std::string& table, int dim, absl::Span<const uint64_t> ids,
                        const float* values, const std::vector<const float*>& slots,
                        absl::Span<const int64_t> updates,
                        absl::Span<const int64_t> touched) override;
  absl::Status ShutdownAll(const std::string& reason) override;
  absl::Status SnapshotAll(int64_t step, absl::Duration timeout,
                           std::vector<SnapshotResponse>* responses) override;
  absl::Status GetStatus(int server, PsStatusResponse* response) override;
  absl::Status ClaimSession(int server, int32_t session, PsStatusResponse* response) override;

 private:
  // PullRows of several tables in one round trip; *version (optional) the
  // oldest version a server answered at.
  absl::Status PullTablesAt(absl::Span<const TableRows> tables, int64_t min_version,
                            absl::Duration wait, int64_t* version);
  // One try of InitializeAll's calls, each waiting for its server.
  absl::Status InitializeOnce(const InitializeCalls& calls, absl::Duration timeout);
  std::string ServerName(int s) const;
  absl::Status StatusCall(int server, const PsStatusRequest& request, PsStatusResponse* response);
  // The push under way: its calls, and the state machine of its parts.
  class GrpcPush;
  struct PushBatch;
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
  DataType wire_dtype_ = DT_FLOAT;
  int64_t chunk_bytes_ = 0;
  bool mixed_versions_ = false;
  std::vector<uint16_t> bf16_grads_;  // bfloat16 pushes are sent from here
  GrpcPush* push_ = nullptr;          // the push under way, if any (the caller owns it)
  uint64_t pushes_started_ = 0;  // PushRequest.push_seq of the last one
  std::unique_ptr<PullPrefetch> prefetch_;  // the next step's pull, started early
  std::vector<int64_t> pushed_versions_;     // per server, in the last push's replies
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CLIENT_GRPC_PS_CLIENT_H_
