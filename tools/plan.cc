#include "tools/plan.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/embedding_ids.h"
#include "common/base/status_macros.h"
#include "common/base/wire_limits.h"
#include "common/cluster/sizing.h"
#include "common/rpc/rpc.h"
#include "worker/model/model.h"

namespace pstrain {

absl::StatusOr<ModelPlan> PlanModel(const ClusterSpec& cluster, const TrainingConfig& config) {
  ModelPlan plan;
  ASSIGN_OR_RETURN(plan.variables, ModelVariables(config.model()));
  ASSIGN_OR_RETURN(plan.placement,
                   Placement::Compute(plan.variables, cluster.num_ps(),
                                      config.placement().partition_min_bytes(),
                                      config.placement().partition_max_bytes()));
  ASSIGN_OR_RETURN(plan.optimizer, CreateOptimizer(config.optimizer()));
  return plan;
}

absl::Status CheckPlanFits(const ClusterSpec& cluster, const ModelPlan& plan, std::ostream* out) {
  const int64_t copies = 1 + static_cast<int64_t>(plan.optimizer->slot_names().size());
  RETURN_IF_ERROR(
      CheckPartitionsFitMessages(plan.placement, kMaxMessageBytes, static_cast<int>(copies)));
  const int64_t machine = PhysicalMemoryBytes();
  const int64_t model_process = ModelProcessBytes(plan.variables);
  int64_t local = 0;
  std::vector<std::string> per_ps;
  for (const TaskId& t : cluster.AllTasks()) {
    const int64_t need = t.job == kPsJob ? plan.placement.server_bytes()[t.index] * copies
                                         : model_process;
    RETURN_IF_ERROR(CheckMemory(t.ToString(), need, machine));
    if (t.job == kPsJob) per_ps.push_back(absl::StrCat(t.ToString(), " ", FormatBytes(need)));
    auto hp = ParseHostPort(cluster.address(t.job, t.index));
    if (hp.ok() && IsThisMachine(hp->host)) local += need;
  }
  if (out != nullptr) {
    *out << "memory, at least: " << absl::StrJoin(per_ps, ", ") << " (values and slots), chief "
         << FormatBytes(model_process) << ", each worker " << FormatBytes(model_process)
         << "; the tasks on this machine together " << FormatBytes(local) << " of its "
         << FormatBytes(machine) << "\n";
  }
  return CheckMemory("the spec's tasks on this machine together", local, machine);
}

namespace {

// The job's calls' need at its busiest server (JobInflightBytes).
int64_t JobInflight(const ClusterSpec& cluster, const TrainingConfig& config,
                    const ModelPlan& plan) {
  // The chief pulls in calls of up to 64 MiB (chief/chief_runner.cc).
  return JobInflightBytes(plan.placement, cluster.num_workers(), config.rpc().calls_in_flight(),
                          config.rpc().call_bytes(), int64_t{64} << 20,
                          config.rpc().wire_dtype() == "bfloat16" ? 2 : 4);
}

// The tasks on this machine that take an in-flight quota: its servers and
// the chief.
int LocalQuotaProcesses(const ClusterSpec& cluster) {
  int n = 0;
  for (const TaskId& t : cluster.AllTasks()) {
    auto hp = ParseHostPort(cluster.address(t.job, t.index));
    n += t.job != kWorkerJob && hp.ok() && IsThisMachine(hp->host);
  }
  return n;
}

}  // namespace

int64_t LaunchInflightMib(const ClusterSpec& cluster, const TrainingConfig& config,
                          const ModelPlan& plan) {
  const int64_t machine = PhysicalMemoryBytes();
  const int64_t quota =
      JobInflightQuota(JobInflight(cluster, config, plan), machine, LocalQuotaProcesses(cluster));
  if (quota <= DefaultInflightBytes(machine)) return 0;
  constexpr int64_t kMiB = int64_t{1} << 20;
  return quota / kMiB + (quota % kMiB != 0 ? 1 : 0);
}

absl::Status PrintPlan(const ClusterSpec& cluster, const TrainingConfig& config,
                       const ModelPlan& plan, std::ostream& out) {
  out << plan.placement.DebugString();
  const std::vector<std::string> slots = plan.optimizer->slot_names();
  out << "optimizer " << plan.optimizer->name() << " on the servers: "
      << (slots.empty() ? std::string("no slots")
                        : absl::StrCat(slots.size(), " slot(s) (", absl::StrJoin(slots, ", "),
                                       "), each the size of its variable"))
      << "; server memory is " << 1 + slots.size() << "x the parameters above\n";
  const int n = cluster.num_ps();
  for (const EmbeddingTableConfig& t : config.embedding_tables()) {
    auto table_opt = CreateOptimizer(t.has_optimizer() ? t.optimizer() : config.optimizer());
    if (!table_opt.ok()) return table_opt.status();
    const int64_t row_bytes =
        int64_t{4} * t.dim() * (1 + static_cast<int64_t>((*table_opt)->slot_names().size()));
    // Each server's share of ids, counted by the hash the client routes
    // with: every id of a fixed-size table (up to 10M), or 1M sample ids.
    const bool exact = t.num_rows() > 0 && t.num_rows() <= 10000000;
    const int64_t count = exact ? t.num_rows() : 1000000;
    std::vector<int64_t> share(n, 0);
    for (int64_t id = 0; id < count; ++id) ++share[ServerForId(static_cast<uint64_t>(id), n)];
    out << "table " << t.name() << ": "
        << (t.num_rows() > 0 ? absl::StrCat(t.num_rows(), " rows")
                             : std::string("hashed (rows on first touch)"))
        << " of " << t.dim() << " floats, " << row_bytes << " bytes per row with "
        << (*table_opt)->name() << "'s slots; ids spread by hash:";
    for (int s = 0; s < n; ++s) {
      out << absl::StrFormat(" ps:%d %.2f%%", s, 100.0 * share[s] / count);
      if (exact) out << " (" << share[s] * row_bytes / 1024 / 1024 << " MiB)";
    }
    out << (exact ? "" : " of any id set");
    if (t.memory_budget_bytes() > 0) {
      const int64_t rows = std::max<int64_t>(1, t.memory_budget_bytes() / row_bytes);
      out << "; in memory at most " << rows << " rows (" << FormatBytes(rows * row_bytes)
          << ") on each server, the rest in its disk tier (--tier_dir)";
    }
    out << "\n";
  }
  RETURN_IF_ERROR(CheckPlanFits(cluster, plan, &out));
  const int64_t need = JobInflight(cluster, config, plan);
  const int64_t mib = LaunchInflightMib(cluster, config, plan);
  out << "messages in flight at the busiest server, at most: " << FormatBytes(need) << " ("
      << cluster.num_workers() << " worker(s)' pulls and pushes and the chief's pulls, "
      << config.rpc().calls_in_flight() << " calls each way of up to "
      << FormatBytes(config.rpc().call_bytes()) << "); "
      << (mib == 0 ? absl::StrCat("the servers' default of ",
                                  FormatBytes(DefaultInflightBytes(PhysicalMemoryBytes())),
                                  " here holds them")
                   : absl::StrCat("pstrain launch gives the servers --max_inflight_mib=", mib,
                                  " (half of this machine's memory at most, among its ",
                                  LocalQuotaProcesses(cluster), " servers and chief)"))
      << "\n";
  return absl::OkStatus();
}

}  // namespace pstrain
