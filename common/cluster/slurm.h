// A pstrain cluster from a Slurm job step: each task of `srun` works out the
// whole cluster spec and its own place in it from Slurm's environment, the way
// TensorFlow's SlurmClusterResolver does, so no host list is kept by hand.
//
// Ranks are given to roles in order: rank 0 is the chief, the next `num_ps`
// ranks are parameter servers, the rest (or exactly `num_workers`) are
// workers. Slurm places ranks on nodes in blocks by default
// (SLURM_STEP_TASKS_PER_NODE, e.g. "2(x3),1"); the k-th task on a node listens
// on `base_port + k` of that node's name.
#ifndef PSTRAIN_COMMON_CLUSTER_SLURM_H_
#define PSTRAIN_COMMON_CLUSTER_SLURM_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cluster/cluster_spec.h"

namespace pstrain {

// Slurm's compressed host-list syntax, as in SLURM_STEP_NODELIST:
// "node[01-03,07],gpu-a[1-2]" -> node01 node02 node03 node07 gpu-a1 gpu-a2.
// A range keeps the width of its lower bound ("[08-10]" -> 08 09 10); several
// bracket groups in one name expand to every combination ("r[1-2]n[1-2]" ->
// r1n1 r1n2 r2n1 r2n2). Every name must be a valid host (ValidateHost); at
// most 65536 names.
absl::StatusOr<std::vector<std::string>> ExpandHostList(absl::string_view list);

// SLURM_STEP_TASKS_PER_NODE's syntax: "2(x3),1" -> 2 2 2 1.
absl::StatusOr<std::vector<int>> ExpandTasksPerNode(absl::string_view spec);

struct SlurmRoles {
  int num_ps = 1;
  int num_workers = -1;  // -1: every rank after the chief and the servers
  int base_port = 8470;
};

struct SlurmTask {
  TaskConfig task;        // this rank's task and the whole cluster
  std::string tf_config;  // the same as TF_CONFIG's JSON, for the daemon
  int rank = 0;
  int num_tasks = 0;
  std::string node;       // this rank's node
  int node_index = 0;     // its place in the node list (SLURM_NODEID)
  int local_index = 0;    // its task number on that node (SLURM_LOCALID): port base_port + this
};

// Reads SLURM_PROCID, SLURM_STEP_ID, SLURM_STEP_NUM_TASKS,
// SLURM_STEP_NODELIST and SLURM_STEP_TASKS_PER_NODE through `getenv` (srun
// sets them; a batch script outside srun is refused), and SLURMD_NODENAME,
// SLURM_NODEID and SLURM_LOCALID, when set, to check that this rank really
// is where block placement puts it.
// `extras` is the spec's "pstrain" object as JSON ("" for none). An
// allocation that does not fit the roles is one line saying what was given
// and what is needed.
absl::StatusOr<SlurmTask> ResolveSlurmTask(
    const std::function<std::optional<std::string>(const char*)>& getenv,
    const SlurmRoles& roles, const std::string& extras);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CLUSTER_SLURM_H_
