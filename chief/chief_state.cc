#include "chief/chief_state.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/client/eval_report.h"

namespace pstrain {

Chief::Chief(int num_workers, int64_t max_steps, uint64_t incarnation, uint64_t fingerprint,
             int64_t start_step, absl::Duration max_wait)
    : num_workers_(num_workers),
      max_steps_(max_steps),
      fingerprint_(fingerprint),
      max_wait_(max_wait),
      incarnation_(incarnation),
      global_step_(start_step),
      claimed_step_(start_step),
      claim_checked_(start_step),
      workers_(num_workers),
      last_progress_(absl::Now()) {}

absl::Status Chief::RegisterWorker(const RegisterWorkerRequest& request,
                                   RegisterWorkerResponse* response) {
  const int w = request.worker();
  if (w < 0 || w >= num_workers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", w, " out of range; the cluster has ", num_workers_, " workers"));
  }
  if (request.config_fingerprint() != fingerprint_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", w, " runs a different training config than the chief (fingerprint ",
        request.config_fingerprint(), " vs ", fingerprint_, ")"));
  }
  if (request.timeout_ms() < 0) return absl::InvalidArgumentError("negative timeout_ms");
  absl::MutexLock lock(&mu_);
  if (request.previous_incarnation() != 0) return RegisterAfterRollbackLocked(request, response);
  const absl::Duration timeout = std::min(absl::Milliseconds(request.timeout_ms()), max_wait_);
  // (A rollback that failed, or a run that is ending, ends the wait too.)
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return initialized_ || stop_requested_ || !rollback_failed_.ok();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("variables not initialised after ",
                                                    absl::FormatDuration(timeout)));
  }
  if (!rollback_failed_.ok()) return rollback_failed_;
  if (!initialized_) return absl::FailedPreconditionError("the run is ending");
  WorkerState& ws = workers_[w];
  if (ws.registered) {
    // The worker was restarted: what its earlier process did still counts.
    ++ws.restarts;
    ws.prior_examples += ws.examples;
    for (size_t i = 0; i < ws.phase_seconds.size(); ++i) {
      ws.prior_phase_seconds[i] += ws.phase_seconds[i];
    }
    ws.examples = 0;
    ws.phase_seconds = {};
    response->set_rejoin(true);
    response->set_local_steps_before(ws.local_steps);
    LOG_INFO("worker {} registered again (restart {}): it rejoins the run at step {}", w,
             ws.restarts, global_step_);
  }
  AnswerRegistrationLocked(w, response);
  return absl::OkStatus();
}

void Chief::AnswerRegistrationLocked(int w, RegisterWorkerResponse* response) {
  WorkerState& ws = workers_[w];
  ws.registered = true;
  ws.done = false;
  last_progress_ = absl::Now();
  response->set_incarnation(incarnation_);
  response->set_session(ws.restarts);
  response->set_start_step(global_step_);
  for (const WorkerCursor& c : cursors_) {
    if (c.worker() != w) continue;
    response->set_has_cursor(true);
    response->set_cursor_epoch(c.epoch());
    response->set_cursor_position(c.position());
  }
}

absl::Status Chief::RegisterAfterRollbackLocked(const RegisterWorkerRequest& request,
                                                RegisterWorkerResponse* response) {
  const int w = request.worker();
  const uint64_t previous = request.previous_incarnation();
  const absl::Time start = absl::Now();
  const absl::Duration timeout = std::min(absl::Milliseconds(request.timeout_ms()), max_wait_);
  // A chief still starting may be a restarted one about to take its run
  // over: which incarnations that run had, it knows once it has started.
  auto started = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !starting_ || stop_requested_ || !rollback_failed_.ok();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&started), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("the chief did not start within ", absl::FormatDuration(timeout)));
  }
  if (previous != incarnation_ &&
      std::find(earlier_incarnations_.begin(), earlier_incarnations_.end(), previous) ==
          earlier_incarnations_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", w, " names incarnation ", previous,
        ", which this chief never ran (a task from another run?)"));
  }
  if (request.session() < workers_[w].restarts) {
    // An earlier process of a restarted worker (hung, not dead) must not
    // come back to life on the new incarnation.
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", w, " session ", request.session(), "; its current session is ",
        workers_[w].restarts, " (it was restarted: this is an earlier process of it)"));
  }
  // A worker can lose a server before the chief's heartbeat (every 250 ms,
  // on a thread of its own) does: a few seconds for a rollback, or a server
  // found down or restarted, to show.
  auto expected = [this, previous]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return incarnation_ != previous || rolling_back_ || servers_down_ > 0 || server_restarted_ ||
           !rollback_failed_.ok() || stop_requested_;
  };
  mu_.AwaitWithTimeout(
      absl::Condition(&expected),
      std::clamp(timeout - (absl::Now() - start), absl::ZeroDuration(), absl::Seconds(5)));
  if (!expected()) {
    return absl::FailedPreconditionError(
        "no rollback under way: every parameter server answers, on the run's incarnation");
  }
  // Settled: the rollback done, failed, the run ending, or the lost servers
  // back without one (a network blip, not a restart).
  auto settled = [this, previous]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (incarnation_ != previous && initialized_ && !rolling_back_) ||
           !rollback_failed_.ok() || stop_requested_ ||
           (incarnation_ == previous && !rolling_back_ && servers_down_ == 0 &&
            !server_restarted_);
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&settled),
                            std::max(absl::ZeroDuration(), timeout - (absl::Now() - start)))) {
    return absl::DeadlineExceededError(
        absl::StrCat("the job's rollback did not finish within ", absl::FormatDuration(timeout)));
  }
  if (!rollback_failed_.ok()) return rollback_failed_;
  if (incarnation_ == previous) {
    return absl::FailedPreconditionError(
        stop_requested_ ? "the run is ending"
                        : "no rollback: the parameter servers are back on the run's incarnation");
  }
  if (!initialized_ || rolling_back_) {
    // Stopped before the new incarnation reached the servers (a takeover or
    // a rollback cut short): there is nothing to follow.
    return absl::FailedPreconditionError("the run is ending");
  }
  // A chief that took its run over learns the worker's session from it: a
  // process of an earlier session registering after it is refused above.
  workers_[w].restarts = std::max(workers_[w].restarts, request.session());
  AnswerRegistrationLocked(w, response);
  response->set_rolled_back(true);
  LOG_INFO("worker {} follows the rollback: it goes on from step {}", w, global_step_);
  return absl::OkStatus();
}

absl::Status Chief::ReportProgress(const ProgressReport& report, ProgressResponse* response) {
  const int w = report.worker();
  if (w < 0 || w >= num_workers_) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", w, " out of range"));
  }
  // The step-time split is only for display: a value that cannot be one
  // (negative after a wall-clock step, NaN, beyond a year) is ignored, never
  // a reason to refuse the report that carries the worker's progress.
  // A bad evaluation refuses the report whole: the worker hears why.
  RETURN_IF_ERROR(CheckEvalReport(report));
  std::array<double, 4> phases = {report.pull_seconds(), report.data_seconds(),
                                  report.compute_seconds(), report.push_seconds()};
  for (double& s : phases) {
    if (!std::isfinite(s) || s < 0 || s > 3.2e7) s = 0;
  }
  absl::MutexLock lock(&mu_);
  if (report.incarnation() != incarnation_) {
    return absl::FailedPreconditionError(
        absl::StrCat("progress from cluster incarnation ", report.incarnation(),
                     ", this chief runs ", incarnation_));
  }
  const absl::Time now = absl::Now();
  if (first_report_ == absl::InfinitePast()) first_report_ = now;
  WorkerState& ws = workers_[w];
  if (report.session() != ws.restarts) {
    return absl::FailedPreconditionError(absl::StrCat(
        "progress from worker ", w, " session ", report.session(), "; its current session is ",
        ws.restarts, " (it was restarted: this is an earlier process of it)"));
  }
  ws.registered = true;
  ws.examples = std::max(ws.examples, report.examples());
  ws.local_steps = std::max(ws.local_steps, report.local_steps());
  for (size_t i = 0; i < phases.size(); ++i) {
    ws.phase_seconds[i] = std::max(ws.phase_seconds[i], phases[i]);
  }
  if (report.local_steps() > 0 && report.loss() > 0) ws.loss = report.loss();
  ws.done = report.done();
  claimed_step_ = std::max(claimed_step_, report.global_step());
  if (report.eval_size() > 0) TakeEvalLocked(report);
  response->set_stop(stop_requested_ || (max_steps_ > 0 && global_step_ >= max_steps_));
  return absl::OkStatus();
}

void Chief::GetStatus(ChiefStatusResponse* r) {
  r->Clear();
  absl::MutexLock lock(&mu_);
  r->set_state(state_);
  r->set_global_step(global_step_);
  r->set_max_steps(max_steps_);
  int registered = 0, done = 0;
  float loss_sum = 0;
  int loss_n = 0;
  int64_t examples = 0, local_steps = 0;
  std::array<double, 4> phases{};
  for (const WorkerState& ws : workers_) {
    registered += ws.registered;
    done += ws.done;
    examples += ws.prior_examples + ws.examples;
    local_steps += ws.local_steps;
    for (size_t i = 0; i < phases.size(); ++i) {
      phases[i] += ws.prior_phase_seconds[i] + ws.phase_seconds[i];
    }
    if (ws.loss > 0) {
      loss_sum += ws.loss;
      ++loss_n;
    }
  }
  r->set_local_steps(local_steps);
  r->set_pull_seconds(phases[0]);
  r->set_data_seconds(phases[1]);
  r->set_compute_seconds(phases[2]);
  r->set_push_seconds(phases[3]);
  r->set_workers_registered(registered);
  r->set_workers_done(done);
  r->set_train_loss(loss_n > 0 ? loss_sum / loss_n : 0);
  const double secs = absl::ToDoubleSeconds(absl::Now() - first_report_);
  r->set_examples_per_sec(first_report_ != absl::InfinitePast() && secs > 0 ? examples / secs : 0);
  r->set_eval_step(eval_step_);
  r->set_eval_accuracy(eval_accuracy_);
  r->set_eval_loss(eval_loss_);
  r->set_eval_worker(-1);
  if (eval_by_worker_ && latest_worker_eval_.has_value()) {
    r->set_eval_worker(latest_worker_eval_->worker);
    r->set_eval_examples(latest_worker_eval_->examples);
    for (const auto& [name, value] : latest_worker_eval_->metrics) {
      EvalMetric* m = r->add_eval_metrics();
      m->set_name(name);
      m->set_value(value);
    }
  }
  r->set_rollbacks(rollbacks_);
  r->set_rolled_back_to(rolled_back_to_);
}

void Chief::MarkInitialized() { MarkInitialized(0, {}); }

void Chief::MarkInitialized(int64_t start_step, const std::vector<WorkerCursor>& cursors) {
  absl::MutexLock lock(&mu_);
  initialized_ = true;
  starting_ = false;
  state_ = "training";
  last_progress_ = absl::Now();
  global_step_ = std::max(global_step_, start_step);
  claimed_step_ = std::max(claimed_step_, global_step_);
  claim_checked_ = std::max(claim_checked_, global_step_);
  cursors_ = cursors;
}

void Chief::TakeOver(const std::vector<uint64_t>& incarnations) {
  absl::MutexLock lock(&mu_);
  for (uint64_t i : incarnations) {
    if (i != incarnation_ && std::find(earlier_incarnations_.begin(), earlier_incarnations_.end(),
                                       i) == earlier_incarnations_.end()) {
      earlier_incarnations_.push_back(i);
    }
  }
  state_ = "taking over";
}

void Chief::Adopt(uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  incarnation_ = incarnation;
}

void Chief::BeginRollback() {
  absl::MutexLock lock(&mu_);
  rolling_back_ = true;
  initialized_ = false;  // registrations wait for the new incarnation
  state_ = "rolling back";
}

void Chief::FinishRollback(uint64_t incarnation, int64_t step,
                           const std::vector<WorkerCursor>& cursors) {
  absl::MutexLock lock(&mu_);
  if (incarnation != incarnation_) {
    earlier_incarnations_.push_back(incarnation_);
    incarnation_ = incarnation;
  }
  rolling_back_ = false;
  initialized_ = true;
  state_ = "training";
  last_progress_ = absl::Now();
  // The one place the global step goes back.
  global_step_ = step;
  claimed_step_ = step;
  claim_checked_ = step;
  cursors_ = cursors;
  ++rollbacks_;
  rolled_back_to_ = step;
  servers_down_ = 0;
  server_restarted_ = false;
  // Every worker trains again from `step`, one that had finished too.
  for (WorkerState& ws : workers_) ws.done = false;
}

void Chief::FailRollback(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  rollback_failed_ = status.ok() ? absl::InternalError("rollback failed") : status;
  rolling_back_ = false;
  stop_requested_ = true;
  state_ = "failed";
  AnswerRestoreLocked(rollback_failed_, 0);
}

void Chief::SetServersDown(int n) {
  absl::MutexLock lock(&mu_);
  servers_down_ = n;
}

int64_t Chief::health_generation() {
  absl::MutexLock lock(&mu_);
  return rolling_back_ ? -1 : rollbacks_;
}

void Chief::SetServerHealth(int64_t generation, int down, bool restarted) {
  absl::MutexLock lock(&mu_);
  // A probe that straddled a rollback saw servers between incarnations.
  if (generation != rollbacks_ || rolling_back_) return;
  servers_down_ = down;
  server_restarted_ = restarted;
}

bool Chief::server_restarted() {
  absl::MutexLock lock(&mu_);
  return server_restarted_;
}

void Chief::AnswerRestoreLocked(const absl::Status& status, int64_t step) {
  if (restore_ == nullptr) return;
  restore_->answered = true;
  restore_->status = status;
  restore_->step = step;
  restore_.reset();
}

uint64_t Chief::incarnation() {
  absl::MutexLock lock(&mu_);
  return incarnation_;
}

int Chief::rollbacks() {
  absl::MutexLock lock(&mu_);
  return rollbacks_;
}

absl::Status Chief::RequestRestore(const std::string& checkpoint, absl::Duration timeout,
                                   int64_t* step) {
  absl::MutexLock lock(&mu_);
  if (state_ != "training" || rolling_back_ || stop_requested_) {
    return absl::UnavailableError(absl::StrCat(
        "the chief is ", stop_requested_ && state_ == "training" ? "stopping" : state_,
        ": a restore is taken only while it trains"));
  }
  if (restore_ != nullptr) return absl::UnavailableError("another restore is under way");
  auto request = std::make_shared<RestoreRequestState>();
  request->checkpoint = checkpoint;
  restore_ = request;
  auto answered = [&request]() { return request->answered; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&answered), timeout)) {
    if (!request->taken) restore_.reset();  // withdrawn before the driver saw it
    return absl::DeadlineExceededError(
        absl::StrCat("the restore did not finish within ", absl::FormatDuration(timeout),
                     request->taken ? " (it goes on: see the chief's log)" : " (withdrawn)"));
  }
  *step = request->step;
  return request->status;
}

bool Chief::TakeRestoreRequest(std::string* checkpoint) {
  absl::MutexLock lock(&mu_);
  if (restore_ == nullptr || restore_->taken) return false;
  restore_->taken = true;
  *checkpoint = restore_->checkpoint;
  return true;
}

void Chief::FinishRestoreRequest(const absl::Status& status, int64_t step) {
  absl::MutexLock lock(&mu_);
  AnswerRestoreLocked(status, step);
}

void Chief::RequestStop() {
  absl::MutexLock lock(&mu_);
  stop_requested_ = true;
  // A restore queued or under way is not carried out any more.
  AnswerRestoreLocked(absl::UnavailableError("the run is ending: no restore"), 0);
}

bool Chief::AllDoneLocked() const {
  for (const WorkerState& ws : workers_) {
    if (!ws.done) return false;
  }
  return true;
}

int64_t Chief::WaitForStep(int64_t step, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto reached = [this, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (claimed_step_ >= step && claimed_step_ > claim_checked_) || AllDoneLocked() ||
           stop_requested_ || (restore_ != nullptr && !restore_->taken) || server_restarted_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  return claimed_step_;
}

int64_t Chief::ConfirmStep(int64_t servers_version) {
  absl::MutexLock lock(&mu_);
  claim_checked_ = claimed_step_;
  const int64_t confirmed = std::min(claimed_step_, servers_version);
  if (confirmed > global_step_) {
    global_step_ = confirmed;
    last_progress_ = absl::Now();
  }
  return global_step_;
}

bool Chief::WaitForWorkersDone(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return AllDoneLocked(); };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

bool Chief::AllWorkersDone() {
  absl::MutexLock lock(&mu_);
  return AllDoneLocked();
}

int64_t Chief::global_step() {
  absl::MutexLock lock(&mu_);
  return global_step_;
}

absl::Time Chief::last_progress() {
  absl::MutexLock lock(&mu_);
  return last_progress_;
}

std::optional<double> Chief::WorkerEval::Get(const std::string& name) const {
  for (const auto& [n, v] : metrics) {
    if (n == name) return v;
  }
  return std::nullopt;
}

std::string Chief::WorkerEval::MetricsLine() const {
  std::string line;
  for (const auto& [name, value] : metrics) {
    absl::StrAppendFormat(&line, "%s%s %.4f", line.empty() ? "" : ", ", name, value);
  }
  return line;
}

void Chief::TakeEvalLocked(const ProgressReport& report) {
  WorkerEval e;
  e.worker = report.worker();
  e.step = report.eval_step();
  e.examples = report.eval_examples();
  for (const EvalMetric& m : report.eval()) e.metrics.emplace_back(m.name(), m.value());
  eval_step_ = e.step;
  // (GetStatus's eval_accuracy and eval_loss; 0 where the evaluation has
  // none, and /metrics and the launch's progress line then leave them out.)
  eval_accuracy_ = static_cast<float>(e.Get("accuracy").value_or(0));
  eval_loss_ = static_cast<float>(e.Get("loss").value_or(0));
  eval_by_worker_ = true;
  latest_worker_eval_ = e;
  if (pending_evals_.size() >= static_cast<size_t>(kMaxPendingEvals)) {
    pending_evals_.erase(pending_evals_.begin());
    ++evals_dropped_;
  }
  pending_evals_.push_back(std::move(e));
}

std::vector<Chief::WorkerEval> Chief::TakeWorkerEvals(int64_t* dropped) {
  absl::MutexLock lock(&mu_);
  *dropped = evals_dropped_;
  evals_dropped_ = 0;
  return std::exchange(pending_evals_, {});
}

std::optional<Chief::WorkerEval> Chief::latest_worker_eval() {
  absl::MutexLock lock(&mu_);
  return latest_worker_eval_;
}

void Chief::SetEval(int64_t step, float accuracy, float loss) {
  absl::MutexLock lock(&mu_);
  eval_by_worker_ = false;
  eval_step_ = step;
  eval_accuracy_ = accuracy;
  eval_loss_ = loss;
}

void Chief::SetState(const std::string& state) {
  absl::MutexLock lock(&mu_);
  state_ = state;
}

void Chief::RecordCheckpoint(bool ok, int64_t step, int64_t bytes, double seconds) {
  absl::MutexLock lock(&mu_);
  if (!ok) {
    ++checkpoints_.failed;
    return;
  }
  ++checkpoints_.committed;
  checkpoints_.last_step = step;
  checkpoints_.last_bytes = bytes;
  checkpoints_.last_seconds = seconds;
  checkpoints_.last_success_unix = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
}

Chief::CheckpointStats Chief::checkpoint_stats() {
  absl::MutexLock lock(&mu_);
  return checkpoints_;
}

}  // namespace pstrain
