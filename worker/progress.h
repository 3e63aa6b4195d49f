// What a worker process has trained, as its metrics and its progress
// reports to the chief carry it, and the reports themselves: kept alike by
// the C++ trainer (worker/trainer.cc) and by the session of a worker whose
// model the caller computes (worker/session.h).
#ifndef PSTRAIN_WORKER_PROGRESS_H_
#define PSTRAIN_WORKER_PROGRESS_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/client/chief_client.h"
#include "common/client/ps_client.h"
#include "proto/chief_service.pb.h"
#include "proto/ps_service.pb.h"

namespace pstrain {

// What the training loop has done so far, for the worker's metrics: plain
// atomics the loop adds to once a step, read at scrape time.
struct WorkerStats {
  std::atomic<bool> registered{false};
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> examples{0};
  std::atomic<int64_t> gradients_dropped_stale{0};
  // Nanoseconds spent per phase of a step.
  std::atomic<int64_t> pull_ns{0};
  std::atomic<int64_t> data_ns{0};
  std::atomic<int64_t> compute_ns{0};
  std::atomic<int64_t> push_ns{0};
  // On a GPU: the device's memory in use (by every process on it) and its
  // size, read at start and at each progress report. Zero on the CPU.
  std::atomic<int64_t> device_memory_used{0};
  std::atomic<int64_t> device_memory_total{0};
};

struct WorkerTally {
  // A restarted worker's earlier process's steps (reported with its own).
  int64_t steps_before = 0;
  int64_t local_steps = 0;
  int64_t examples = 0;
  int64_t dropped = 0;  // gradients the servers dropped as stale
  // The losses since the last report (their mean is reported).
  double loss_sum = 0;
  int loss_count = 0;
  // Time spent in each phase of a step.
  absl::Duration pull, data, compute, push;
  int late_reports = 0;  // reports in a row that only timed out

  // Counts a step of `examples` with its loss, and publishes the totals to
  // `stats` (the worker's metrics).
  void CountStep(int64_t examples, float loss, WorkerStats* stats);
};

// A push's outcomes (outcomes[s] from server s, for steps[s]): the stale
// gradients dropped counted, and each server's next pull waiting for
// steps[s] + 1 (sync). Returns whether every server had finished.
bool CountPushOutcomes(const std::vector<PushOutcome>& outcomes,
                       const std::vector<int64_t>& steps, std::vector<int64_t>* min_versions,
                       WorkerTally* tally);

// The next step's pull, sent with a step's push (PsClient::PrefetchPull),
// as the trainer and a session overlap them; the next PullInto takes the
// replies. Sync: each server answers each call as soon as the partitions
// it names are applied at steps[s] + 1, while this step still computes and
// pushes.
void PrefetchNextSyncPull(PsClient* ps, const std::vector<int64_t>& steps, absl::Duration wait);
// Async: `push`'s calls leave (all `num_variables`), then the pull, which
// each server answers once it has applied the push (its count of this
// worker's pushes, known from the last push's replies, plus one): the pull
// sees it, a round trip sooner. Nothing before the first push this client
// made.
absl::Status PrefetchPullAfterPush(PsClient* ps, PsClient::Push* push, size_t num_variables,
                                   absl::Duration wait);

// Sends worker `worker`'s report of `tally` (`done`: it is leaving) on
// `registration`'s incarnation and session, its global step the oldest of
// `pulled_versions` (none yet: the start step), and restarts the loss mean.
// *stop_requested: the chief asks the worker to stop.
// `eval` (optional): an evaluation this worker ran, sent with the report
// (checked first: INVALID_ARGUMENT naming a bad metric, nothing sent).
struct WorkerEvaluation {
  int64_t step = 0;  // the version evaluated
  int64_t examples = 0;
  std::vector<std::pair<std::string, double>> metrics;
};
absl::Status SendProgress(ChiefClient* chief, const RegisterWorkerResponse& registration,
                          int worker, const std::vector<int64_t>& pulled_versions, bool done,
                          WorkerTally* tally, bool* stop_requested,
                          const WorkerEvaluation* eval = nullptr);

// A report that failed by its deadline while this process may have been
// paused is only late: up to two in a row are logged and forgiven (OK);
// the third, or any other failure, is `st`. An OK report resets the count.
absl::Status ForgiveLateReport(const absl::Status& st, WorkerTally* tally);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_PROGRESS_H_
