// What `pstrain plan` prints and `pstrain launch` checks before any task
// starts: the model's variables, their placement on the spec's servers, the
// servers' optimizer, each process's memory against the machine's, and the
// servers' memory for RPC messages in flight.
#ifndef PSTRAIN_TOOLS_PLAN_H_
#define PSTRAIN_TOOLS_PLAN_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/placement.h"
#include "common/cluster/config.h"
#include "ps_server/optimizer.h"

namespace pstrain {

struct ModelPlan {
  std::vector<VariableSpec> variables;
  Placement placement;
  std::unique_ptr<Optimizer> optimizer;
};

absl::StatusOr<ModelPlan> PlanModel(const ClusterSpec& cluster, const TrainingConfig& config);

// The plan against the message cap and this machine's memory: each
// process's own need, and the tasks `pstrain launch` would start here
// together. `out`, when set, gets the figures.
absl::Status CheckPlanFits(const ClusterSpec& cluster, const ModelPlan& plan, std::ostream* out);

// The in-flight message memory `pstrain launch` gives the servers and the
// chief on this machine (JobInflightQuota over the job's calls), in MiB,
// rounded up; 0 where the daemons' own default (DefaultInflightBytes) is as
// large.
int64_t LaunchInflightMib(const ClusterSpec& cluster, const TrainingConfig& config,
                          const ModelPlan& plan);

// Everything `pstrain plan` prints: the placement, the optimizer's slots,
// each embedding table's spread over the servers, the memory each process
// needs and the in-flight memory; fails where the plan does not fit.
absl::Status PrintPlan(const ClusterSpec& cluster, const TrainingConfig& config,
                       const ModelPlan& plan, std::ostream& out);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_PLAN_H_
