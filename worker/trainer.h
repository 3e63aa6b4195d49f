// The worker's training loop: register with the chief, then repeat
// pull -> compute -> push until the chief or the parameter servers say the
// job is done. In sync mode each pull waits for the version after this
// worker's last push; in async mode it takes the current version (the
// servers hold back a worker that runs past the staleness bound).
#ifndef PSTRAIN_WORKER_TRAINER_H_
#define PSTRAIN_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/cluster/cluster_spec.h"
#include "common/base/shutdown.h"
#include "common/client/chief_client.h"
#include "common/client/ps_client.h"
#include "common/cluster/placement.h"
#include "proto/config.pb.h"
#include "worker/progress.h"

namespace pstrain {

struct WorkerOptions {
  int worker = 0;
  // "auto", "cpu" or "cuda:N"; empty means the config's `device`.
  std::string device;
  // Report progress to the chief every this many steps (and at the end).
  int report_every = 10;
  // Updated as training goes, when set (must outlive RunWorker).
  WorkerStats* stats = nullptr;
};

// How the training loop reaches the chief and the parameter servers: the
// daemon's over gRPC (GrpcConnections), a unit test's in this process
// (chief/in_process_chief_client.h, ps_server/in_process_client.h).
struct WorkerConnections {
  // Registration and progress reports.
  std::unique_ptr<ChiefClient> chief;
  // A client of the servers for `placement` (which outlives it) on the
  // incarnation and session of `registration`; asked again for the new
  // incarnation after each rollback.
  std::function<std::unique_ptr<PsClient>(const Placement& placement,
                                          const RegisterWorkerResponse& registration)>
      connect;
};

// Worker `worker`'s connections over gRPC, as `config.rpc` sets them up.
// `config` and `cluster` must outlive them.
WorkerConnections GrpcConnections(const TrainingConfig& config, const ClusterSpec& cluster,
                                  int worker);

// Runs until training finishes (OK), `stop` is raised (CANCELLED), or a
// failure (its status). Logs one line per report. Without `connections`:
// over gRPC.
absl::Status RunWorker(const TrainingConfig& config, const ClusterSpec& cluster,
                       const WorkerOptions& options, StopSignal* stop);
absl::Status RunWorker(const TrainingConfig& config, const ClusterSpec& cluster,
                       const WorkerOptions& options, StopSignal* stop,
                       WorkerConnections connections);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_TRAINER_H_
