// The chief's shared state: worker registration, the global step as workers
// report it and as the servers confirm it, the stop decision and the latest
// evaluation. The RPC service
// reads and updates it; the driver (chief_runner.h) waits on it. No gRPC here.
// Thread-safe: all state is guarded by mu_.
#ifndef PSTRAIN_CHIEF_CHIEF_STATE_H_
#define PSTRAIN_CHIEF_CHIEF_STATE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/checkpoint.pb.h"
#include "proto/chief_service.pb.h"

namespace pstrain {

class Chief {
 public:
  Chief(int num_workers, int64_t max_steps, uint64_t incarnation, uint64_t fingerprint,
        int64_t start_step, absl::Duration max_wait = absl::Minutes(10));

  // --- Called by the RPC service.
  // Waits (up to the request's timeout) until the variables are initialised.
  absl::Status RegisterWorker(const RegisterWorkerRequest& request,
                              RegisterWorkerResponse* response);
  absl::Status ReportProgress(const ProgressReport& report, ProgressResponse* response);
  void GetStatus(ChiefStatusResponse* response);

  // --- Called by the driver.
  void MarkInitialized();
  // Resuming from a checkpoint: the global step starts at `start_step`, and
  // each worker gets its data cursor at registration.
  void MarkInitialized(int64_t start_step, const std::vector<WorkerCursor>& cursors);
  // Workers are told to stop at their next report.
  void RequestStop();
  // Waits until a worker claims a step at or past `step` that is newer than
  // the last ConfirmStep saw, every worker is done, a stop is requested, or
  // `timeout` passes. Returns the highest step claimed: a report is only a
  // hint (a forged one must not end the run), confirmed with ConfirmStep.
  int64_t WaitForStep(int64_t step, absl::Duration timeout);
  // The global step becomes the highest step claimed, capped by
  // `servers_version` (the furthest version the parameter servers report);
  // it never goes back. Returns it. Workers are told to stop, and the driver
  // ends the run, only at a confirmed max_steps.
  int64_t ConfirmStep(int64_t servers_version);
  // Waits until every registered worker has reported done, or `timeout`.
  bool WaitForWorkersDone(absl::Duration timeout);
  bool AllWorkersDone();
  int64_t global_step();
  absl::Time last_progress();
  void SetEval(int64_t step, float accuracy, float loss);
  void SetState(const std::string& state);

  // --- Evaluations the workers ran themselves (ProgressReport.eval: a
  // model the chief does not compute). The latest is the run's evaluation
  // (GetStatus: eval_metrics, eval_step, eval_accuracy and eval_loss from
  // its "accuracy" and "loss").
  struct WorkerEval {
    int worker = 0;
    int64_t step = 0;
    int64_t examples = 0;
    std::vector<std::pair<std::string, double>> metrics;  // in the report's order
    std::optional<double> Get(const std::string& name) const;
    // "accuracy 0.9663, loss 0.0990": the log's and the summary's line.
    std::string MetricsLine() const;
  };
  // The evaluations reported since the last call, oldest first: the
  // driver logs them and writes them to TensorBoard. At most
  // kMaxPendingEvals wait; *dropped gets how many older ones made room.
  static constexpr int kMaxPendingEvals = 64;
  std::vector<WorkerEval> TakeWorkerEvals(int64_t* dropped);
  std::optional<WorkerEval> latest_worker_eval();

  // --- Rollbacks of the running job to a checkpoint (a restarted parameter
  // server's, or an operator's `pstrain checkpoint restore`), by the driver.
  // From BeginRollback on, registrations wait and workers that lost their
  // servers wait for the new incarnation.
  void BeginRollback();
  // Training goes on from `step` under `incarnation`: the global step goes
  // back to it, and each worker gets its cursor when it registers again.
  void FinishRollback(uint64_t incarnation, int64_t step, const std::vector<WorkerCursor>& cursors);
  // The rollback failed: the run ends; workers waiting for it are refused.
  void FailRollback(const absl::Status& status);
  // How many servers the driver finds unreachable now: a worker that lost
  // one waits for the rollback its restart brings.
  void SetServersDown(int n);
  // The heartbeat thread's findings: servers unreachable, and whether one
  // answered restarted (uninitialised, or for another incarnation), from a
  // probe begun at health_generation() (-1 during a rollback: not probed).
  // A restarted server wakes the driver, and workers wait for the rollback.
  int64_t health_generation();
  void SetServerHealth(int64_t generation, int down, bool restarted);
  bool server_restarted();
  uint64_t incarnation();
  int rollbacks();
  // A restarted chief (--resume) that found the servers still serving the
  // run its earlier process started, on `incarnations`: it takes that run
  // over, rolling it back to the latest checkpoint as a rollback does, and
  // its workers, naming one of these, follow. Called before MarkInitialized.
  void TakeOver(const std::vector<uint64_t>& incarnations);
  // A restarted chief whose servers had already finished the run: it goes
  // on under their incarnation (it only ends the run). Before MarkInitialized.
  void Adopt(uint64_t incarnation);

  // An operator's rollback (the Restore RPC): queued for the driver, which
  // carries it out between its rounds; waits up to `timeout` for the outcome.
  absl::Status RequestRestore(const std::string& checkpoint, absl::Duration timeout,
                              int64_t* step);
  // The driver: takes the queued request, if any.
  bool TakeRestoreRequest(std::string* checkpoint);
  // The driver: the taken request's outcome.
  void FinishRestoreRequest(const absl::Status& status, int64_t step);

  // Checkpoints the driver committed (or failed to), for the metrics.
  struct CheckpointStats {
    int64_t committed = 0;
    int64_t failed = 0;
    int64_t last_step = -1;
    int64_t last_bytes = 0;
    double last_seconds = 0;       // asking for the shards to the pointer file
    double last_success_unix = 0;  // 0: never
  };
  void RecordCheckpoint(bool ok, int64_t step, int64_t bytes, double seconds);
  CheckpointStats checkpoint_stats();

 private:
  void TakeEvalLocked(const ProgressReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct WorkerState {
    bool registered = false;
    bool done = false;
    int64_t examples = 0;     // this process's (its reports count from 0)
    // All of the worker's steps (a restarted one counts its earlier ones).
    int64_t local_steps = 0;
    float loss = 0;
    std::array<double, 4> phase_seconds{};  // pull, data, compute, push
    int restarts = 0;  // registrations after the first in this run
    // What the worker's earlier processes did, before it was restarted.
    int64_t prior_examples = 0;
    std::array<double, 4> prior_phase_seconds{};
  };
  bool AllDoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A registration naming an earlier incarnation (the worker's servers
  // moved on): waits for the rollback, then answers as the run's restart.
  absl::Status RegisterAfterRollbackLocked(const RegisterWorkerRequest& request,
                                           RegisterWorkerResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks worker `w` registered and answers it: incarnation, session, step
  // and its cursor.
  void AnswerRegistrationLocked(int w, RegisterWorkerResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers the Restore request waiting (if any) with `status`.
  void AnswerRestoreLocked(const absl::Status& status, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const int num_workers_;
  const int64_t max_steps_;
  const uint64_t fingerprint_;
  const absl::Duration max_wait_;

  absl::Mutex mu_;
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> earlier_incarnations_ ABSL_GUARDED_BY(mu_);  // rolled back from
  bool rolling_back_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status rollback_failed_ ABSL_GUARDED_BY(mu_);
  int servers_down_ ABSL_GUARDED_BY(mu_) = 0;
  bool server_restarted_ ABSL_GUARDED_BY(mu_) = false;
  int rollbacks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rolled_back_to_ ABSL_GUARDED_BY(mu_) = -1;
  // The Restore RPC's request, from queued to answered.
  struct RestoreRequestState {
    std::string checkpoint;
    bool taken = false;
    bool answered = false;
    absl::Status status;
    int64_t step = 0;
  };
  std::shared_ptr<RestoreRequestState> restore_ ABSL_GUARDED_BY(mu_);
  bool initialized_ ABSL_GUARDED_BY(mu_) = false;
  bool starting_ ABSL_GUARDED_BY(mu_) = true;  // until the first MarkInitialized
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  std::string state_ ABSL_GUARDED_BY(mu_) = "starting";
  int64_t global_step_ ABSL_GUARDED_BY(mu_);    // confirmed by the servers
  int64_t claimed_step_ ABSL_GUARDED_BY(mu_);   // the highest step reported
  int64_t claim_checked_ ABSL_GUARDED_BY(mu_);  // claimed_step_ at the last ConfirmStep
  std::vector<WorkerState> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<WorkerCursor> cursors_ ABSL_GUARDED_BY(mu_);  // a resume's, by worker
  absl::Time first_report_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time last_progress_ ABSL_GUARDED_BY(mu_);
  int64_t eval_step_ ABSL_GUARDED_BY(mu_) = -1;
  float eval_accuracy_ ABSL_GUARDED_BY(mu_) = 0;
  float eval_loss_ ABSL_GUARDED_BY(mu_) = 0;
  CheckpointStats checkpoints_ ABSL_GUARDED_BY(mu_);
  std::optional<WorkerEval> latest_worker_eval_ ABSL_GUARDED_BY(mu_);
  bool eval_by_worker_ ABSL_GUARDED_BY(mu_) = false;  // eval_* are latest_worker_eval_'s
  std::vector<WorkerEval> pending_evals_ ABSL_GUARDED_BY(mu_);
  int64_t evals_dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_CHIEF_STATE_H_
