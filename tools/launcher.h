// `pstrain launch`: starts every local task of a cluster spec as a child
// process (chief, parameter servers, workers), files each task's output under
// log_dir with the task as prefix, shows a live progress line from the chief,
// stops every task on Ctrl-C or SIGTERM, and returns non-zero if any task
// fails; with max_restarts, a failed job starts again from its latest
// checkpoint instead. Single-threaded apart from the signal thread.
#ifndef PSTRAIN_TOOLS_LAUNCHER_H_
#define PSTRAIN_TOOLS_LAUNCHER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cluster/cluster_spec.h"
#include "tools/metrics_targets.h"
#include "common/base/shutdown.h"

namespace pstrain {

struct LaunchOptions {
  std::string cluster_spec;
  std::string config;
  std::string bin_dir;  // where ps_server, worker and chief live; empty = next to pstrain
  std::string log_dir;  // empty = <output_dir>/logs
  bool verbose = false; // echo every task line, not only warnings and errors
  bool progress = true;
  bool resume = false;  // the chief starts from the latest good checkpoint
  std::string init_from;  // the chief starts a new run from this checkpoint's values
  // A run into an output_dir that holds an earlier run's outputs (its
  // summary, final model or events) is refused unless it resumes that run or
  // is told to start afresh over it: then the earlier run's summary, final
  // model and events are removed first, so that TensorBoard shows one run,
  // and its checkpoints set aside (CheckEarlierRun).
  bool overwrite = false;
  // --restart=on-failure: up to this many restarts, with a backoff of 1, 2,
  // 4, ... 30 s (a task's first restart alone is immediate). A failed worker
  // or server, or a chief ended by a signal, is restarted alone and the job
  // goes on (servers and chief: from the latest checkpoint, every server
  // rolled back to it); any other failure stops every task and starts the
  // job again from its latest checkpoint. 0: a failed task ends the run.
  int max_restarts = 0;
  // Each local task serves /metrics, /healthz and /readyz on a free port of
  // its host (printed as each task reports it).
  bool metrics = true;
  // Passed on as they are: to the parameter servers and the chief (their
  // RPC limits: --max_inflight_mib, --max_rpc_threads,
  // --handshake_timeout_ms, --keepalive_ms), and to the
  // parameter servers alone (--max_concurrent_calls).
  std::vector<std::string> server_flags;
  std::vector<std::string> ps_flags;
  // No authentication: no secret is made for the run, and every task is
  // started with --insecure. Without it, a run on loopback whose spec names
  // neither a secret nor TLS signs its calls with a secret made for it
  // (MakeRunSecret).
  bool insecure = false;
  // The cluster secret every task and the launcher sign with, instead of
  // the spec's (and of one made for the run).
  std::string secret_file;
  // The workers are this shell command (e.g. "python3 train.py", a model
  // of the user's own: model { external { ... } }) instead of the worker
  // binary, run by /bin/sh in the launch's directory with the flags the
  // worker binary would get in PSTRAIN_WORKER_ARGS (one per line; the
  // Python package's pstrain.Session reads them) and the task in
  // TF_CONFIG. Supervised, logged and restarted as the C++ workers.
  std::string worker_cmd;
  // Passed to every task (the run's secret, --insecure); set by Launch.
  std::vector<std::string> task_flags;
  // Where the tasks' metrics addresses are kept as they report them
  // (<output_dir>/metrics_targets.json); set by Launch, null: nowhere.
  MetricsTargets* metrics_targets = nullptr;
  // The config's save on stop (StopSaveTimeout); set by Launch. Stopped by
  // a signal, the launcher signals the chief alone and gives it this and
  // 10 s more to save and tell the workers to stop, before the others.
  absl::Duration stop_save = absl::ZeroDuration();
};

// Where a run that makes its own secret keeps it, in its output_dir.
inline constexpr char kRunSecretFile[] = "run.secret";

// The secret file this run's calls are signed with: options.secret_file
// when given; else, when `cluster` names no secret and no TLS, all its
// tasks are on loopback and the run is not `insecure`, a new one for each
// launch, output_dir/run.secret with mode 0600 (as Jupyter makes a
// token per server); its absolute path, or "" for none of these (the
// spec's own, or none). An earlier run's secret there is replaced, or
// removed when this run makes none (no tool should pick it up).
absl::StatusOr<std::string> MakeRunSecret(const LaunchOptions& options,
                                          const ClusterSpec& cluster,
                                          const std::string& output_dir);

// Returns the process exit code: 0 when every task succeeded.
int Launch(const LaunchOptions& options, StopSignal* stop);

// This program's own path (/proc/self/exe), or "" where it cannot be named.
std::string SelfPath();

// Refuses (FAILED_PRECONDITION, naming what it found and the flags) a run
// into an output_dir that holds an earlier run's summary, final model or
// events, unless `options` resumes it; with `options.overwrite`, removes
// those first and sets the checkpoints of `checkpoint_dir` aside
// (ckpt-<n>.rolled-back), so that the new run never resumes from them.
absl::Status CheckEarlierRun(const LaunchOptions& options, const std::string& output_dir,
                             const std::string& checkpoint_dir);

// Finds a daemon binary (`name`, built in Bazel package `package`): in
// `bin_dir` when set, else next to this executable or in Bazel's layout
// (bazel-bin/tools/pstrain beside bazel-bin/ps_server/ps_server). "" if none.
std::string FindBinary(const std::string& bin_dir, const std::string& package,
                       const std::string& name);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_LAUNCHER_H_
