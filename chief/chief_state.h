// The chief's shared state: worker registration, the global step as workers
// report it and as the servers confirm it, the stop decision and the latest
// evaluation. The RPC service
// reads and updates it; the driver (chief_runner.h) waits on it. No gRPC here.
// Thread-safe: all state is guarded by mu_.
#ifndef PSTRAIN_CHIEF_CHIEF_STATE_H_
#define PSTRAIN_CHIEF_CHIEF_STATE_H_

#include <array>
#include <cstdint>
#include <string>
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

  // Constant after construction.
  const int num_workers_;
  const int64_t max_steps_;
  const uint64_t incarnation_;
  const uint64_t fingerprint_;
  const absl::Duration max_wait_;

  absl::Mutex mu_;
  bool initialized_ ABSL_GUARDED_BY(mu_) = false;
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
};

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_CHIEF_STATE_H_
