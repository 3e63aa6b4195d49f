// Where `pstrain sweep` runs its trials: each as a `pstrain launch` on this
// machine on free loopback ports, or each as one task of a Slurm job array
// (`srun pstrain launch --slurm`), the sweep following them through the
// trial directories on a shared file system and squeue. Either way a trial
// is its directory: config.pbtxt in, launch.log, events/ and summary.json
// out.
#ifndef PSTRAIN_TOOLS_TRIAL_LAUNCHER_H_
#define PSTRAIN_TOOLS_TRIAL_LAUNCHER_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pstrain {

// One trial started by a TrialLauncher. Owned by one thread.
class TrialRun {
 public:
  virtual ~TrialRun() = default;
  // Asks it to stop, once (its chief saves first where it checkpoints).
  virtual void Terminate() = 0;
  // Its exit code once it has ended (0: finished), else nullopt.
  virtual std::optional<int> Poll() = 0;
  // Stops it: Terminate, then waits up to `grace`, then kills it. Its exit code.
  virtual int Kill(absl::Duration grace) = 0;
  // Since when it has run; nullopt while it waits for resources (Slurm).
  virtual std::optional<absl::Time> running_since() const = 0;
  // Why it failed with `code`: the first error a task logged, else what
  // ended it.
  virtual std::string Error(int code) const = 0;
};

class TrialLauncher {
 public:
  virtual ~TrialLauncher() = default;
  // How many trials the sweep keeps started at once.
  virtual int capacity() const = 0;
  // Every trial the sweep is about to start (their directories written);
  // Slurm submits them here as one job array. What to tell the user.
  virtual absl::StatusOr<std::string> Prepare(const std::vector<int>& trials) = 0;
  virtual absl::StatusOr<std::unique_ptr<TrialRun>> Start(int trial) = 0;
  // Once per round of the sweep, before the trials are polled.
  virtual void Refresh() {}
  // Where and how many at once the trials run, for the sweep's first line.
  virtual std::string Describe() const = 0;
};

// A trial's directory under the sweep's output directory.
std::string TrialDirectory(const std::string& out_dir, int trial);

// Trials as `pstrain launch` of trial-<k>/config.pbtxt on a fresh spec of
// `num_ps` servers and `num_workers` workers on free loopback ports, at
// most `parallel` at once.
struct LocalTrialOptions {
  std::string out_dir;
  std::string pstrain;  // the pstrain binary
  std::string bin_dir;  // passed to each launch (empty: next to pstrain)
  int num_ps = 1;
  int num_workers = 1;
  int parallel = 1;
};
std::unique_ptr<TrialLauncher> LocalTrials(const LocalTrialOptions& options);

// Trials as the tasks of one Slurm job array (sbatch --array, at most
// `parallel` at once where it is above 0): task k runs `srun pstrain launch
// --slurm` of trial-<k>/config.pbtxt with 1 + num_ps + num_workers tasks,
// a secret of its own, listening from base_port + k x its task count; it
// writes trial-<k>/exit_code when srun returns.
struct SlurmTrialOptions {
  std::string out_dir;  // on a file system the nodes share
  std::string pstrain;
  std::string bin_dir;
  int num_ps = 1;
  int num_workers = 1;
  int parallel = 0;
  int base_port = 8470;
  std::vector<std::string> sbatch_args;  // more, before the script: --partition=gpu
  std::string sweep_file;                // for the script's header
  // squeue's and scancel's environment is the sweep's own (SLURM_CONF).
};
std::unique_ptr<TrialLauncher> SlurmTrials(const SlurmTrialOptions& options);

// The id of a sweep's job array with tasks still pending or running, from
// out_dir/slurm_job; empty if none; an error when Slurm cannot say.
absl::StatusOr<std::string> LiveSlurmArray(const std::string& out_dir);

// squeue's "%i %T" lines ("12_3 RUNNING") for array `job`'s tasks, by task.
std::map<int, std::string> ParseArrayStates(const std::string& job, absl::string_view squeue);

// Why a launch failed, from its log (launch.log, or a Slurm trial's
// output): the first error a task logged, else the launcher's last word.
std::string LaunchError(const std::string& log_path, int code);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_TRIAL_LAUNCHER_H_
