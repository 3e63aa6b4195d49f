// The parameter servers as ParameterServer objects in this process:
// PsClient's implementation for unit tests of the trainer and the chief's
// driver (a sync step, an async step, a rollback, a resume, without
// processes or sockets). Each call is the server method the gRPC service
// (ps_service.h) would call, with the requests GrpcPsClient sends
// (common/client/ps_requests.h), minus the transport: a push is read from
// the caller's gradient memory in place (a SegmentedBytes view), a pull is
// copied once from the servers' version buffers into the caller's memory,
// and a waiting pull is parked on the server as a gRPC one is. One call per
// server per operation; float32 on the way (no wire, no bfloat16); no
// authentication (no wire to guard).
//
// Owns nothing of the servers: they must outlive the client. Thread-
// compatible, as PsClient; clients of several workers, each on its thread,
// share the servers as the daemons' workers do.
#ifndef PSTRAIN_PS_SERVER_IN_PROCESS_CLIENT_H_
#define PSTRAIN_PS_SERVER_IN_PROCESS_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/client/ps_client.h"
#include "common/cluster/placement.h"
#include "ps_server/parameter_server.h"

namespace pstrain {

class InProcessPsClient final : public PsClient {
 public:
  // servers[s] is parameter server s; `worker` this caller's worker index,
  // or -1 for the chief and tools.
  InProcessPsClient(std::vector<ParameterServer*> servers, const Placement* placement,
                    int worker);
  // Cancels a prefetched pull still parked; a push handle still alive (a
  // caller's bug) is detached: it sends nothing more.
  ~InProcessPsClient() override;

  // Runs at the start of each PullInto with its min_versions, on the
  // caller's thread: a test holds workers at a step with it (a rollback
  // or a restore taken while they wait, never after the run ended).
  void set_before_pull(std::function<void(const std::vector<int64_t>&)> hook) {
    before_pull_ = std::move(hook);
  }

  int num_servers() const override { return static_cast<int>(servers_.size()); }
  const Placement& placement() const override { return *placement_; }

  // `startup_timeout` is not needed: the servers are up.
  absl::Status InitializeAll(const TrainingConfig& config, uint64_t fingerprint, int num_workers,
                             int64_t start_step, const std::vector<Tensor>& params,
                             absl::Duration startup_timeout,
                             const OptimizerState* optimizer_state = nullptr) override;
  absl::Status PullInto(const std::vector<int64_t>& min_versions, absl::Duration wait,
                        const std::vector<float*>& destinations, PullResult* result) override;
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
  absl::Status LoadRows(const std::string& table, int dim, absl::Span<const uint64_t> ids,
                        const float* values, const std::vector<const float*>& slots,
                        absl::Span<const int64_t> updates,
                        absl::Span<const int64_t> touched) override;
  // Shuts every server down (ParameterServer::Shutdown), as the daemon does
  // on the RPC; refused, as there, from another incarnation.
  absl::Status ShutdownAll(const std::string& reason) override;
  absl::Status SnapshotAll(int64_t step, absl::Duration timeout,
                           std::vector<SnapshotResponse>* responses) override;
  absl::Status GetShard(int server, int64_t step, absl::Duration timeout,
                        GetShardResponse* response) override;
  absl::Status GetStatus(int server, PsStatusResponse* response) override;
  absl::Status ClaimSession(int server, int32_t session, PsStatusResponse* response) override;

 private:
  class InProcessPush;
  struct PendingPull;
  static std::string ServerName(int s);
  // Starts a full pull: one parked call per server.
  std::shared_ptr<PendingPull> StartPull(const std::vector<int64_t>& min_versions,
                                         absl::Duration wait,
                                         const std::vector<int64_t>& min_own_pushes);
  // Waits for every call of `pull` until `deadline` (then cancels the rest)
  // and copies the replies into `destinations`.
  absl::Status FinishPull(PendingPull* pull, absl::Time deadline,
                          const std::vector<float*>& destinations, PullResult* result);
  // Cancels the prefetched pull's calls still parked.
  void DropPrefetch();

  const std::vector<ParameterServer*> servers_;
  const Placement* const placement_;
  const int worker_;
  InProcessPush* push_ = nullptr;  // the push under way, if any (the caller owns it)
  uint64_t pushes_started_ = 0;    // PushRequest.push_seq of the last one
  std::shared_ptr<PendingPull> prefetch_;
  std::vector<int64_t> prefetch_versions_;
  bool prefetch_as_is_ = false;
  std::vector<int64_t> pushed_versions_;  // per server, in the last push's replies
  std::function<void(const std::vector<int64_t>&)> before_pull_;
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_IN_PROCESS_CLIENT_H_
