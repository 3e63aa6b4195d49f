#include "worker/progress.h"

#include <algorithm>

#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/client/eval_report.h"

namespace pstrain {

void WorkerTally::CountStep(int64_t step_examples, float loss, WorkerStats* stats) {
  ++local_steps;
  examples += step_examples;
  loss_sum += loss;
  ++loss_count;
  stats->steps.fetch_add(1, std::memory_order_relaxed);
  stats->examples.fetch_add(step_examples, std::memory_order_relaxed);
  stats->gradients_dropped_stale.store(dropped, std::memory_order_relaxed);
  stats->pull_ns.store(absl::ToInt64Nanoseconds(pull), std::memory_order_relaxed);
  stats->data_ns.store(absl::ToInt64Nanoseconds(data), std::memory_order_relaxed);
  stats->compute_ns.store(absl::ToInt64Nanoseconds(compute), std::memory_order_relaxed);
  stats->push_ns.store(absl::ToInt64Nanoseconds(push), std::memory_order_relaxed);
}

bool CountPushOutcomes(const std::vector<PushOutcome>& outcomes,
                       const std::vector<int64_t>& steps, std::vector<int64_t>* min_versions,
                       WorkerTally* tally) {
  size_t finished = 0;
  for (size_t s = 0; s < outcomes.size(); ++s) {
    if (outcomes[s] == FINISHED) ++finished;
    if (outcomes[s] == DROPPED_STALE) ++tally->dropped;
    (*min_versions)[s] = steps[s] + 1;
  }
  return finished == outcomes.size();
}

void PrefetchNextSyncPull(PsClient* ps, const std::vector<int64_t>& steps, absl::Duration wait) {
  std::vector<int64_t> next(steps.size());
  for (size_t s = 0; s < steps.size(); ++s) next[s] = steps[s] + 1;
  ps->PrefetchPull(next, wait);
}

absl::Status PrefetchPullAfterPush(PsClient* ps, PsClient::Push* push, size_t num_variables,
                                   absl::Duration wait) {
  const std::vector<int64_t>& own = ps->own_pushes();
  if (own.empty() || *std::min_element(own.begin(), own.end()) < 0) return absl::OkStatus();
  RETURN_IF_ERROR(push->Ready(0, num_variables));
  std::vector<int64_t> after(own.size());
  for (size_t s = 0; s < own.size(); ++s) after[s] = own[s] + 1;
  ps->PrefetchPull({}, wait, after);
  return absl::OkStatus();
}

absl::Status SendProgress(ChiefClient* chief, const RegisterWorkerResponse& registration,
                          int worker, const std::vector<int64_t>& pulled_versions, bool done,
                          WorkerTally* tally, bool* stop_requested,
                          const WorkerEvaluation* eval) {
  ProgressReport r;
  r.set_incarnation(registration.incarnation());
  r.set_worker(worker);
  r.set_session(registration.session());
  r.set_global_step(pulled_versions.empty()
                        ? registration.start_step()
                        : *std::min_element(pulled_versions.begin(), pulled_versions.end()));
  r.set_local_steps(tally->steps_before + tally->local_steps);
  r.set_loss(tally->loss_count > 0 ? static_cast<float>(tally->loss_sum / tally->loss_count)
                                   : 0.0f);
  r.set_examples(tally->examples);
  r.set_done(done);
  r.set_pull_seconds(absl::ToDoubleSeconds(tally->pull));
  r.set_data_seconds(absl::ToDoubleSeconds(tally->data));
  r.set_compute_seconds(absl::ToDoubleSeconds(tally->compute));
  r.set_push_seconds(absl::ToDoubleSeconds(tally->push));
  if (eval != nullptr) {
    r.set_eval_step(eval->step);
    r.set_eval_examples(eval->examples);
    for (const auto& [name, value] : eval->metrics) {
      EvalMetric* m = r.add_eval();
      m->set_name(name);
      m->set_value(value);
    }
    RETURN_IF_ERROR(CheckEvalReport(r));
  }
  ProgressResponse resp;
  RETURN_IF_ERROR(chief->ReportProgress(r, &resp));
  *stop_requested = resp.stop();
  tally->loss_sum = 0;
  tally->loss_count = 0;
  return absl::OkStatus();
}

absl::Status ForgiveLateReport(const absl::Status& st, WorkerTally* tally) {
  if (absl::IsDeadlineExceeded(st) && ++tally->late_reports < 3) {
    LOG_WARN("progress report to the chief timed out ({} in a row); training on: {}",
             tally->late_reports, st);
    return absl::OkStatus();
  }
  if (st.ok()) tally->late_reports = 0;
  return st;
}

}  // namespace pstrain
