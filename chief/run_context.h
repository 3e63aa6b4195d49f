// What the chief's driver and each of its phases work from, fixed for the
// run: the config and its fingerprint (computed once, here), the cluster,
// the variables' placement and the timeouts of rpc.*. Immutable; read from
// the driver's thread and the heartbeat's.
#ifndef PSTRAIN_CHIEF_RUN_CONTEXT_H_
#define PSTRAIN_CHIEF_RUN_CONTEXT_H_

#include <cstdint>

#include "absl/time/time.h"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/config.h"
#include "common/cluster/placement.h"
#include "proto/config.pb.h"

namespace pstrain {

struct RunContext {
  // `fingerprint`: RunFingerprint(config, the model's variables).
  RunContext(const TrainingConfig& config, const ClusterSpec& cluster, const Placement& placement,
             uint64_t fingerprint)
      : config(config),
        cluster(cluster),
        placement(placement),
        fingerprint(fingerprint),
        rpc_timeout(absl::Milliseconds(config.rpc().rpc_timeout_ms())),
        step_timeout(absl::Milliseconds(config.rpc().step_timeout_ms())),
        startup_timeout(absl::Milliseconds(config.rpc().startup_timeout_ms())) {}

  const TrainingConfig& config;
  const ClusterSpec& cluster;
  const Placement& placement;
  // RunFingerprint: what the servers and checkpoints are tagged with.
  const uint64_t fingerprint;
  const absl::Duration rpc_timeout;
  const absl::Duration step_timeout;
  const absl::Duration startup_timeout;
};

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_RUN_CONTEXT_H_
