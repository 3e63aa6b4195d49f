// The requests a PsClient cuts out of full variables and id lists, shared by
// both implementations (grpc_ps_client.h, ps_server/in_process_client.h) so
// that the servers see the same calls whatever carries them: partitions
// grouped per server into calls of whole partitions, Initialize in parts,
// ids sorted out by the server that holds them, and a push's replies merged
// into one outcome per server. Pure functions over the placement.
#ifndef PSTRAIN_COMMON_CLIENT_PS_REQUESTS_H_
#define PSTRAIN_COMMON_CLIENT_PS_REQUESTS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/base/tensor.h"
#include "common/client/ps_client.h"
#include "common/cluster/placement.h"
#include "proto/ps_service.pb.h"

namespace pstrain {

// One call's worth of a server's partitions: (variable, partition) pairs.
struct PartitionGroup {
  int server = 0;
  std::vector<std::pair<size_t, const Partition*>> parts;
};

// Groups the partitions of variables `var_indices` (placement order) per
// server into calls of whole partitions of up to `chunk_bytes` at
// `element_bytes` an element (0: one call per server; a bigger partition
// goes alone). With `every_server`, a server without any gets an empty call.
std::vector<PartitionGroup> GroupPartitions(const Placement& placement,
                                            const std::vector<size_t>& var_indices,
                                            int64_t chunk_bytes, int element_bytes,
                                            bool every_server);
// 0, 1, ..., the number of variables - 1.
std::vector<size_t> AllVariables(const Placement& placement);
// A partition's shape: its rows of the variable's shape.
std::vector<int64_t> PartitionShape(const VariableSpec& spec, const Partition& part);
void SetRef(const VariableSpec& spec, const Partition& part, PartitionRef* ref);

// The Initialize calls of a run: each server's share in parts of up to
// `part_bytes` of whole partitions (the server installs the model when its
// last part is in); a server without partitions still gets one, to learn
// the run. Each request is made when its call is sent (Request): all of
// them at once would be a second copy of the model. The arguments given to
// InitializeRequests must outlive it.
class InitializeCalls {
 public:
  size_t size() const { return groups_.size(); }
  int server(size_t r) const { return groups_[r].server; }
  InitializeRequest Request(size_t r) const;

 private:
  friend absl::StatusOr<InitializeCalls> InitializeRequests(
      const Placement&, uint64_t, const TrainingConfig&, uint64_t, int, int64_t,
      const std::vector<Tensor>&, const PsClient::OptimizerState*, int64_t);
  InitializeCalls(const Placement& placement, const TrainingConfig& config,
                  const std::vector<Tensor>& params, const PsClient::OptimizerState* state)
      : placement_(&placement), config_(&config), params_(&params), state_(state) {}

  const Placement* placement_;
  const TrainingConfig* config_;
  const std::vector<Tensor>* params_;
  const PsClient::OptimizerState* state_;
  uint64_t incarnation_ = 0, fingerprint_ = 0;
  int num_workers_ = 0;
  int64_t start_step_ = 0;
  std::vector<PartitionGroup> groups_;
  std::vector<int> part_;     // request r's part number at its server
  std::vector<int> parts_;    // each server's number of parts
};
absl::StatusOr<InitializeCalls> InitializeRequests(
    const Placement& placement, uint64_t incarnation, const TrainingConfig& config,
    uint64_t fingerprint, int num_workers, int64_t start_step, const std::vector<Tensor>& params,
    const PsClient::OptimizerState* optimizer_state, int64_t part_bytes);

// Positions of `ids` by the server that holds them (ServerForId).
std::vector<std::vector<uint32_t>> RowsByServer(absl::Span<const uint64_t> ids, int servers);
// The servers that hold any of the rows.
std::vector<int> ServersWithRows(const std::vector<std::vector<uint32_t>>& by);
// The ids at `positions`, packed as little-endian uint64 (a request's `ids`).
std::string IdBytes(absl::Span<const uint64_t> ids, const std::vector<uint32_t>& positions);
// The LoadRows calls for rows of `table` (PsClient::LoadRows' arguments),
// per server in requests of about 4 MiB: (server, request) pairs.
std::vector<std::pair<int, LoadRowsRequest>> LoadRowsRequests(
    uint64_t incarnation, int num_servers, const std::string& table, int dim,
    absl::Span<const uint64_t> ids, const float* values, const std::vector<const float*>& slots,
    absl::Span<const int64_t> updates, absl::Span<const int64_t> touched);

// A full pull's replies, taken server by server into `result`: every
// partition must come once, from the server that holds it, with its
// shape; `name(s)` names server s in the errors.
class PullAssembly {
 public:
  PullAssembly(const Placement& placement, int num_servers, PsClient::PullResult* result);
  // Server s sent `elements` values of variable/partition: its variable's
  // index and partition, or DATA_LOSS naming what was wrong.
  struct Part {
    size_t variable = 0;
    const Partition* partition = nullptr;
  };
  absl::StatusOr<Part> Take(int s, const std::string& variable, int partition, int64_t elements,
                            const std::function<std::string(int)>& name);
  // Every partition arrived.
  absl::Status Complete() const;
  PsClient::PullResult* result() const { return result_; }

 private:
  const Placement& placement_;
  PsClient::PullResult* const result_;
  std::vector<std::vector<char>> seen_;  // per variable, per partition
  int64_t expected_ = 0, received_ = 0;
};

// A push's replies merged per server, call by call: APPLIED if one
// completed the step (or, async, the push), else ACCUMULATED, else FINISHED
// or DROPPED_STALE; an async push's held parts say nothing of it. Also the
// newest version each server answered at, and (async) its count of this
// worker's pushes applied.
class PushReplies {
 public:
  explicit PushReplies(int num_servers);
  void Add(int server, const PushResponse& reply);
  // Outcomes per server; fails (ABORTED) for a server that held every part
  // and applied none (it dropped the push). `name(s)` names server s.
  absl::Status Outcomes(const std::function<std::string(int)>& name,
                        std::vector<PushOutcome>* outcomes) const;
  const std::vector<int64_t>& versions() const { return versions_; }
  // -1 where no reply said.
  const std::vector<int64_t>& own_pushes() const { return own_pushes_; }

 private:
  std::vector<PushOutcome> outcomes_;
  std::vector<char> seen_;
  std::vector<int64_t> versions_, own_pushes_;
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CLIENT_PS_REQUESTS_H_
