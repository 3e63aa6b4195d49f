// A worker whose model lives outside this process's code: a user's own
// training script (PyTorch, through the C API of worker/c_api.h and the
// Python package `pstrain`) that computes the gradients itself and uses this
// session for everything else the C++ trainer does around its model:
// the task, config and credentials resolved as the worker binary resolves
// them (its flags, or TF_CONFIG), registration with the chief, the
// variables' placement, pulls into and pushes from the caller's memory
// with the step bookkeeping of sync and async mode, the data cursor a
// checkpoint records, progress reports, /metrics, and a restarted
// process's rejoin.
//
// One step is Pull, the caller's compute, Push. Sync: each pull waits for
// the version after this worker's last push, and a push is stamped with
// the oldest version pulled. Async: a pull takes the servers' current
// versions and a push is stamped with them (the servers hold back a worker
// that runs past the staleness bound).
//
// A rollback of the job (a server lost and restarted: the chief puts every
// server back to the latest checkpoint) is followed as the C++ trainer
// follows it: a Pull or Push that fails on the lost server registers again,
// waits for the rollback, and goes on from its step (a Pull then reads the
// rolled-back values; a Push's step is dropped). rollbacks() counts them,
// and start_cursor() is then where the data goes on. A PullRows or PushRows
// that fails so follows it too, and returns ABORTED ("step dropped"): the
// caller's step is gone with its rows, and the next Pull reads the step
// rolled back to.
//
// One session per process at a time (the credentials and transport
// security are the process's); a session belongs to one thread at a time.
#ifndef PSTRAIN_WORKER_SESSION_H_
#define PSTRAIN_WORKER_SESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/base/shutdown.h"
#include "common/client/chief_client.h"
#include "common/client/ps_client.h"
#include "common/cluster/placement.h"
#include "common/runtime/daemon.h"
#include "proto/config.pb.h"
#include "worker/data/partition.h"
#include "worker/progress.h"
#include "worker/trainer.h"

namespace pstrain {

class MonitoringServer;

class WorkerSession {
 public:
  // `args`: the worker binary's flags ("--cluster_spec=FILE", "--task=N",
  // "--config=FILE", "--auth_token_file=FILE", "--tls_dir=DIR",
  // "--metrics_address=HOST:PORT", "--log_level=LEVEL", ...); without
  // --cluster_spec the task comes from TF_CONFIG. An unknown flag or a bad
  // value is INVALID_ARGUMENT naming it. Registers with the chief (waiting
  // up to rpc.startup_timeout_ms for it) before it returns.
  static absl::StatusOr<std::unique_ptr<WorkerSession>> Open(const std::vector<std::string>& args);
  ~WorkerSession();

  const TrainingConfig& config() const { return *setup_.config; }
  int worker() const { return setup_.task.task.index; }
  int num_workers() const { return setup_.task.cluster.num_workers(); }
  bool sync() const { return sync_; }
  // The model's variables, in placement order (an external model's: its
  // file's order).
  const std::vector<VariableSpec>& variables() const { return variables_; }
  // Where the data goes on: a resumed run's checkpoint cursor, a restarted
  // process's own, or none (start at the beginning).
  // After a rollback: the cursor this worker's data stood at in its checkpoint.
  std::optional<DataCursor> start_cursor() const { return start_cursor_; }
  // Rollbacks of the job this session followed.
  int rollbacks() const { return rollbacks_; }
  int64_t start_step() const { return registration_.start_step(); }
  // This worker's steps so far (a restarted process's include its earlier
  // one's).
  int64_t local_steps() const { return tally_.steps_before + tally_.local_steps; }

  // Reads every variable into dst[v] (num_elements floats each). *finished:
  // the servers reached max_steps (nothing was read; stop training).
  // *step (optional): the version read (sync: the step this worker
  // computes next).
  absl::Status Pull(absl::Span<float* const> dst, bool* finished, int64_t* step = nullptr);

  struct StepReport {
    float loss = 0;
    int64_t examples = 0;
    // Where this worker's data stands after the batch the push is for.
    DataCursor cursor;
    double compute_seconds = 0;  // the caller's forward and backward
  };
  // Pushes src[v] (variable v's gradient) for the step last pulled.
  // *end: training is over (every server reached max_steps, or the chief
  // asked to stop). Reports progress every 10 steps.
  absl::Status Push(absl::Span<const float* const> src, const StepReport& report, bool* end);

  // Variables vars[i] of the step last pulled have their final gradients
  // in src[i] (the backward pass is past them): their calls leave now, as
  // the C++ worker pushes layer by layer. The memory must stay unchanged
  // until the step's Push returns, which sends the rest (its src for these
  // variables is not read again). Only where streams_pushes(); elsewhere
  // (async, rpc.sequential, clip_global_norm, which needs the whole
  // gradient first) nothing leaves before the Push. A step's rows must be
  // pushed before its first PushReady.
  absl::Status PushReady(absl::Span<const int> vars, absl::Span<const float* const> src);
  bool streams_pushes() const;

  // Embedding rows of `table` (the config's embedding_tables), as the C++
  // worker's bags use them: PullRows reads ids' rows into out[i * dim, ...)
  // at the step last pulled; PushRows sends their gradients for it (sync:
  // before the step's dense Push; with optimizer.clip_global_norm, held
  // until the Push, which clips both together). ABORTED: the job rolled
  // back under the call, which followed it; the step is dropped (Pull
  // again).
  absl::Status PullRows(const std::string& table, absl::Span<const uint64_t> ids, float* out);
  absl::Status PushRows(const std::string& table, absl::Span<const uint64_t> ids,
                        const float* grads);
  // A table's width (INVALID_ARGUMENT naming an unknown one).
  absl::StatusOr<int> TableDim(const std::string& table) const;

  // An evaluation the caller ran (its own metrics: "accuracy", "loss", ...)
  // sent to the chief at once: it lands in the chief's log, /metrics,
  // TensorBoard (eval/<name>) and summary.json. eval.step < 0: the version
  // the last pull read (one that found training over reads nothing).
  // INVALID_ARGUMENT naming a bad metric (common/client/eval_report.h),
  // nothing sent. An evaluation the chief does not take for another reason
  // (late, restarting, a rollback under way) is logged and dropped: OK.
  absl::Status ReportEval(WorkerEvaluation eval);

  // The final report to the chief (done): this worker has finished its
  // training. Once. A report that fails (the chief already gone: the run
  // stopped, or ended as this worker finished) is logged; OK. A session destroyed without it (the caller's step
  // failed, the process is ending on an error) sends none, as a C++ worker
  // that fails: the chief does not count a worker that failed as done, and
  // under pstrain launch --restart=on-failure the process is restarted and
  // rejoins.
  absl::Status Close();

 private:
  WorkerSession() = default;
  absl::Status Start();
  absl::Status PullOnce(absl::Span<float* const> dst, bool* finished, int64_t* step);
  // Starts the push of the step last pulled (push_) from `src` (empty:
  // sources named later), and the next step's pull with it (not with
  // rpc.sequential, nor rpc.async_prefetch's, which left with the step's
  // Pull).
  absl::Status StartStepPush(absl::Span<const float* const> src);
  // The rest of the step's push (all of it unless PushReady started it),
  // and its end.
  absl::Status PushAndPrefetch(absl::Span<const float* const> src);
  // optimizer.clip_global_norm: scales the held rows in place and the
  // dense gradients `src` into clipped_ (pointing *src there) where the
  // global norm of both exceeds it, then pushes the held rows.
  absl::Status ClipAndPushHeldRows(std::vector<const float*>* src);
  // A step failed with `cause`: where the job is rolling back, registers
  // again and goes on from its step (OK); else returns `cause`.
  absl::Status FollowRollback(const absl::Status& cause);
  // A pull or push of rows failed with `cause`: where the job is rolling
  // back, follows it and returns ABORTED ("step dropped: ..."; the step's
  // rows and gradients are gone with it, the next Pull reads the step
  // rolled back to); else returns `cause`.
  absl::Status DropStepAfter(const absl::Status& cause);

  DaemonSetup setup_;
  StopSignal stop_;
  bool sync_ = true;
  absl::Duration step_timeout_;
  std::vector<VariableSpec> variables_;
  std::optional<Placement> placement_;
  absl::Duration startup_timeout_;
  uint64_t fingerprint_ = 0;
  std::unique_ptr<ChiefClient> chief_;
  std::function<std::unique_ptr<PsClient>(const Placement&, const RegisterWorkerResponse&)>
      connect_;
  bool chief_lost_ = false;  // the last report to the chief failed
  int rollbacks_ = 0;
  std::unique_ptr<PsClient> ps_;
  RegisterWorkerResponse registration_;
  std::optional<DataCursor> start_cursor_;
  WorkerStats stats_;
  std::unique_ptr<MonitoringServer> monitoring_;

  PsClient::PullResult pulled_;
  bool pulled_for_push_ = false;  // a Pull since the last Push
  std::optional<int64_t> read_step_;  // the version the last Pull that read values read
  std::vector<int64_t> min_versions_, steps_;
  std::vector<PushOutcome> outcomes_, row_outcomes_;
  // The step's push, from the first PushReady (or the Push) to its end
  // (declared after ps_: it goes first).
  std::unique_ptr<PsClient::Push> push_;
  bool streamed_ = false;  // a PushReady sent gradients early (said once)
  // optimizer.clip_global_norm (0: off). On, a step's row gradients are
  // held until its Push, which scales them with the dense gradients by the
  // global norm of both, as the C++ trainer does, and sends the rows first.
  float clip_norm_ = 0;
  struct HeldRows {
    std::string table;
    int dim = 0;
    std::vector<uint64_t> ids;
    std::vector<float> grads;
  };
  std::vector<HeldRows> held_rows_;
  std::vector<std::vector<float>> clipped_;  // the dense gradients, scaled
  WorkerTally tally_;
  bool closed_ = false;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_SESSION_H_
