// `pstrain sweep`: runs a search space's trials (tools/sweep_space.h), each
// an ordinary `pstrain launch` of its own config on its own cluster of free
// loopback ports, in its own directory, at most `parallel` at once (or each
// a task of a Slurm job array). A
// failed trial is recorded with its error and the sweep goes on. The
// results: a table on the terminal (best first), results.csv, and the best
// trial's config ready to launch (best.pbtxt).
#ifndef PSTRAIN_TOOLS_SWEEP_H_
#define PSTRAIN_TOOLS_SWEEP_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/base/shutdown.h"
#include "tools/args.h"
#include "tools/sweep_kubernetes.h"

namespace pstrain {

struct SweepOptions {
  std::string sweep_file;
  // Its shape (how many servers and workers, all on loopback) is each
  // trial's; the ports are each trial's own, chosen free.
  std::string cluster_spec;
  std::string out_dir = "sweep_output";
  int parallel = 0;  // 0: the cores / workers per trial, at least 1
  // Runs only the trials not finished in out_dir (an earlier sweep of the
  // same space); without it, an out_dir with trials is refused.
  bool resume = false;
  std::string pstrain;  // the pstrain binary each trial's launch runs
  std::string bin_dir;  // passed to each launch (empty: next to pstrain)
  absl::Duration trial_timeout = absl::Hours(24);
  // Each trial a task of one Slurm job array (tools/trial_launcher.h) of
  // 1 + num_ps + num_workers tasks, instead of a launch on this machine;
  // `parallel` 0 leaves how many at once to Slurm.
  bool slurm = false;
  int num_ps = 1;
  int num_workers = 1;
  int base_port = 8470;
  std::vector<std::string> sbatch_args;
  // Writes each trial's Kubernetes manifest (tools/sweep_kubernetes.h)
  // instead of running it.
  bool kubernetes = false;
  SweepKubernetesOptions kubernetes_options;
  // Ranks the trials from what their runs left in out_dir, running none.
  bool collect = false;
};

// One trial's outcome, as trial-<k>/trial.json keeps it.
struct TrialResult {
  int index = 0;
  std::vector<std::pair<std::string, std::string>> params;
  std::string state;  // "finished", "stopped early", "failed", "stopped"
  std::string error;  // why it failed
  std::optional<double> metric;
  double accuracy = 0, loss = 0;
  std::optional<double> auc;
  int64_t steps = 0;
  double examples_per_sec = 0;
  double seconds = 0;
  // Early stopping: its metric at each rung it reached.
  std::vector<double> rung_values;
};

// Runs the sweep; the table and progress go to `out`. Returns the exit
// status: 0 when every trial finished, 1 when some failed (the others'
// results are written), 2 for a bad sweep (nothing run), 128 + signal when
// stopped.
int RunSweep(const SweepOptions& options, StopSignal* stop, std::ostream& out);

// `pstrain sweep` with its flags (`pstrain`: this program's path, which
// each trial runs); its flags for --help.
Args::FlagSpec SweepFlags();
int RunSweepCommand(const std::vector<std::string>& argv, const std::string& pstrain,
                    StopSignal* stop, std::ostream& out);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_SWEEP_H_
