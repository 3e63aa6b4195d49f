#include "chief/driver.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "chief/evaluation.h"
#include "chief/rollback.h"
#include "chief/summary.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace pstrain {

ServerPoll Driver::PollServers() {
  ServerPoll poll;
  for (int s = 0; s < ps_->num_servers(); ++s) {
    PsStatusResponse status;
    absl::Status answered = ps_->GetStatus(s, &status);
    if (!answered.ok()) {
      poll.version = std::numeric_limits<int64_t>::min();
      poll.all_answered = false;
      ++poll.down;
      if (down_since_[s] == absl::InfiniteFuture()) {
        down_since_[s] = absl::Now();
        LOG_WARN("ps:{} does not answer ({}); waiting up to {} for it to come back", s, answered,
                 absl::FormatDuration(run_.startup_timeout));
      }
      continue;
    }
    if (down_since_[s] != absl::InfiniteFuture()) {
      LOG_INFO("ps:{} answers again after {}", s,
               absl::FormatDuration(
                   absl::Trunc(absl::Now() - down_since_[s], absl::Milliseconds(1))));
      down_since_[s] = absl::InfiniteFuture();
    }
    if (!status.initialized() || status.incarnation() != ps_->incarnation()) {
      poll.restarted.push_back(absl::StrCat("ps:", s));
      poll.version = std::numeric_limits<int64_t>::min();
      poll.all_answered = false;
      continue;
    }
    poll.version = std::min(poll.version, status.version());
    if (s == 0) poll.learning_rate = status.learning_rate();
    poll.staleness_count += status.staleness_count();
    poll.staleness_sum += status.staleness_sum();
  }
  return poll;
}

bool Driver::ServersOnRun() {
  for (int s = 0; s < ps_->num_servers(); ++s) {
    PsStatusResponse status;
    if (!ps_->GetStatus(s, &status).ok() || !status.initialized() ||
        status.incarnation() != ps_->incarnation()) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<int64_t> Driver::RollBackTo(std::optional<ResumePoint> point,
                                           const std::string& why, absl::Time began) {
  ASSIGN_OR_RETURN(int64_t step, RollBack(run_, std::move(point), model_, ps_, chief_));
  // The driver's schedule from there.
  evals_.Restart(step);
  schedule_.Restart(step);
  LOG_INFO("rolled back to step {} in {:.3f} s ({}); incarnation {:x}; the workers follow", step,
           absl::ToDoubleSeconds(absl::Now() - began), why, ps_->incarnation());
  return step;
}

// An operator's restore: refused once the run is finishing, or when the
// checkpoint does not fit (training goes on); a failed rollback ends the run.
absl::Status Driver::Restore(const std::string& checkpoint, bool finishing) {
  if (finishing) {
    chief_->FinishRestoreRequest(
        absl::FailedPreconditionError("the run is finishing: no restore"), 0);
    return absl::OkStatus();
  }
  const absl::Time began = absl::Now();
  absl::StatusOr<std::optional<ResumePoint>> point =
      LoadRollbackPoint(run_, checkpoint, init_from_);
  if (!point.ok()) {
    LOG_WARN("restore of {} refused, training goes on: {}", checkpoint, point.status());
    chief_->FinishRestoreRequest(point.status(), 0);
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> to =
      RollBackTo(std::move(*point), absl::StrCat("an operator's restore of ", checkpoint), began);
  chief_->FinishRestoreRequest(to.status(), to.value_or(0));
  if (!to.ok()) {
    chief_->FailRollback(to.status());
    return absl::Status(to.status().code(), absl::StrCat("rolling back to ", checkpoint, ": ",
                                                         to.status().message()));
  }
  return absl::OkStatus();
}

// A server that restarted lost its partitions: every server goes back to the
// latest checkpoint.
absl::Status Driver::RecoverFromRestart(const std::vector<std::string>& restarted) {
  const absl::Time began = absl::Now();
  const std::string why =
      absl::StrCat(absl::StrJoin(restarted, ", "), " restarted and lost its partitions");
  LOG_WARN("{}: rolling every server back to the latest checkpoint", why);
  chief_->BeginRollback();  // workers that lost the server wait from now on
  absl::StatusOr<std::optional<ResumePoint>> point = LoadRollbackPoint(run_, "", init_from_);
  absl::StatusOr<int64_t> to = point.ok() ? RollBackTo(std::move(*point), why, began)
                                          : absl::StatusOr<int64_t>(point.status());
  if (!to.ok()) {
    chief_->FailRollback(to.status());
    return absl::Status(to.status().code(),
                        absl::StrCat(why, "; the rollback failed: ", to.status().message()));
  }
  return absl::OkStatus();
}

// A server that has not answered for rpc.startup_timeout_ms is gone.
absl::Status Driver::CheckServersBack() {
  for (int s = 0; s < ps_->num_servers(); ++s) {
    if (down_since_[s] != absl::InfiniteFuture() &&
        absl::Now() - down_since_[s] > run_.startup_timeout) {
      chief_->RequestStop();
      chief_->SetState("failed");
      return absl::UnavailableError(absl::StrCat(
          "ps:", s, " has not answered for ", absl::FormatDuration(run_.startup_timeout),
          " (rpc.startup_timeout_ms): it is gone"));
    }
  }
  return absl::OkStatus();
}

// No progress for longer than a step may take fails the run. (While a
// server is down, the wait for it bounds the run instead.)
absl::Status Driver::CheckProgress(int down, int64_t step) {
  const absl::Duration limit = run_.step_timeout + run_.rpc_timeout;
  if (down == 0 && absl::Now() - chief_->last_progress() > limit) {
    chief_->RequestStop();
    chief_->SetState("failed");
    return absl::DeadlineExceededError(absl::StrCat(
        "no training progress for ", absl::FormatDuration(limit), " (global step ", step,
        "): a worker or parameter server is stuck or gone"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Driver::EvaluateAt(int64_t step) {
  absl::StatusOr<Evaluation> evaluated = Evaluate(ps_, model_, run_.config, test_, &params_);
  if (!evaluated.ok()) {
    // A server lost in the meantime: the heartbeat takes it up.
    if (ServersOnRun()) return evaluated.status();
    LOG_WARN("evaluation at step {} put off: {}", step, evaluated.status());
    return false;
  }
  const Evaluation& e = *evaluated;
  chief_->SetEval(e.step, e.result.accuracy(), e.result.loss);
  ChiefStatusResponse progress;
  chief_->GetStatus(&progress);
  LOG_INFO("step {}: train loss {:.4f}, eval accuracy {:.4f}, eval loss {:.4f}{}, {:.0f} "
           "examples/s",
           StepText(e.step, max_steps_), progress.train_loss(), e.result.accuracy(), e.result.loss,
           e.auc ? absl::StrFormat(", eval AUC %.4f", *e.auc) : "", progress.examples_per_sec());
  events_.WriteEvalScalars(e);
  // The chief evaluates the newest parameters when it gets to them: the
  // evaluation due then ran at `step`, and those due meanwhile are skipped
  // (said here, so that a reader of the log sees why).
  const int64_t due = evals_.next();
  const int64_t passed = evals_.Ran(step);
  if (passed > 1) {
    LOG_INFO("evaluation due at step {} ran at step {}; {} more due by then skipped", due, e.step,
             passed - 1);
  }
  return true;
}

absl::Status Driver::Train() {
  started_ = absl::Now();
  for (;;) {
    if (stop_->stopped() && StopNow(chief_->global_step())) {
      chief_->RequestStop();
      chief_->SetState("stopped");
      return absl::CancelledError(stop_->reason());
    }
    // Workers' reports only wake this loop; the step acted on is what the
    // servers confirm (a forged report cannot end the run or trigger a save).
    // The servers' slowest version caps it, as workers report the slowest
    // they pulled; without every server's answer nothing is confirmed.
    // At least every 250 ms the servers are polled: the heartbeat that finds
    // one restarted (or gone) within a quarter second.
    chief_->WaitForStep(stop_save_.began ? schedule_.next_sync_cut()
                                         : std::min(evals_.next(), schedule_.next_sync_cut()),
                        absl::Milliseconds(250));
    ServerPoll poll = PollServers();
    stop_save_.servers_down = poll.down;
    if (poll.learning_rate.has_value()) events_.set_learning_rate(*poll.learning_rate);
    if (poll.all_answered) events_.SetStalenessTotals(poll.staleness_count, poll.staleness_sum);
    // An operator's restore, or a server that restarted: roll back. Not
    // once the run is finishing (the servers at max_steps, or every worker
    // done): it ends from here.
    const bool finishing = chief_->global_step() >= max_steps_ || chief_->AllWorkersDone();
    std::string requested;
    if (chief_->TakeRestoreRequest(&requested)) {
      RETURN_IF_ERROR(Restore(requested, finishing));
      continue;
    }
    if (poll.restarted.empty() && chief_->server_restarted()) {
      // The heartbeat saw it; this round's poll missed it (back up since?).
      poll.restarted.push_back("a parameter server");
    }
    if (!poll.restarted.empty() && !finishing) {
      RETURN_IF_ERROR(RecoverFromRestart(poll.restarted));
      continue;
    }
    chief_->SetServersDown(poll.down);
    RETURN_IF_ERROR(CheckServersBack());
    const int64_t step = chief_->ConfirmStep(poll.version);
    if (step >= max_steps_ || chief_->AllWorkersDone()) {
      chief_->SetState("finishing");  // before the last commit: tasks may leave from here on
    }
    RETURN_IF_ERROR(CheckProgress(poll.down, step));
    RecordWorkerEvals();
    if (evals_.Due(step) && !stop_save_.began) {
      ASSIGN_OR_RETURN(bool evaluated, EvaluateAt(step));
      if (!evaluated) continue;
    }
    schedule_.CommitDue(std::min(step, max_steps_));
    if (!stop_save_.began) schedule_.TimedSave(step);
    events_.WriteTrainScalars(step, chief_);
    if (step >= max_steps_ || chief_->AllWorkersDone()) return absl::OkStatus();
  }
}

bool Driver::StopNow(int64_t step) {
  if (!stop_save_.began) {
    stop_save_.began = true;
    const absl::Duration timeout = StopSaveTimeout(run_.config);
    if (timeout <= absl::ZeroDuration()) return true;
    stop_save_.deadline = absl::Now() + timeout;
    stop_save_.step = schedule_.SaveOnStop(step);
    if (!stop_save_.step.has_value()) return true;
    if (schedule_.committed() >= *stop_save_.step) return true;  // async: saved already
    chief_->SetState("stopping");
    LOG_INFO("{}: saving the steps since the last checkpoint first, at step {} (the workers "
             "train on to it; at most {})",
             stop_->reason(), *stop_save_.step, absl::FormatDuration(timeout));
    return false;
  }
  if (!stop_save_.step.has_value() || schedule_.committed() >= *stop_save_.step) return true;
  if (stop_save_.servers_down > 0) {
    // Stopped with the rest of the job (a terminal's Ctrl-C to the whole
    // process group, every pod deleted): no save to wait for.
    LOG_WARN("stopping without the save at step {}: {} parameter server(s) down",
             *stop_save_.step, stop_save_.servers_down);
    return true;
  }
  if (absl::Now() < stop_save_.deadline) return false;
  LOG_WARN("stopping without the save at step {}: not committed within checkpoint."
           "stop_save_seconds (the servers are at step {})",
           *stop_save_.step, step);
  return true;
}

void Driver::RecordWorkerEvals() {
  int64_t dropped = 0;
  for (const Chief::WorkerEval& e : chief_->TakeWorkerEvals(&dropped)) {
    std::vector<std::pair<std::string, double>> scalars;
    for (const auto& [name, value] : e.metrics) scalars.emplace_back("eval/" + name, value);
    LOG_INFO("step {}: worker {}'s evaluation ({} examples): {}", StepText(e.step, max_steps_),
             e.worker, e.examples, e.MetricsLine());
    events_.Write(e.step, scalars);
  }
  if (dropped > 0) {
    LOG_WARN("{} evaluations reported by workers were not logged: more than {} arrived between "
             "two rounds of the chief",
             dropped, Chief::kMaxPendingEvals);
  }
}

absl::Status Driver::Finish() {
  chief_->RequestStop();
  chief_->SetState("finishing");  // also when the loop ended otherwise
  if (adopted_ == 0 && !chief_->WaitForWorkersDone(run_.step_timeout)) {
    LOG_WARN("not every worker reported done within {}", absl::FormatDuration(run_.step_timeout));
  }
  RecordWorkerEvals();  // (their last, sent before they reported done)
  ASSIGN_OR_RETURN(Evaluation final_eval, Evaluate(ps_, model_, run_.config, test_, &params_));
  if (final_eval.result.count > 0) {
    chief_->SetEval(final_eval.step, final_eval.result.accuracy(), final_eval.result.loss);
    events_.WriteEvalScalars(final_eval);
  }
  events_.Sync();
  // The workers can end before their reports carried the last step: commit
  // what the servers reached (the final evaluation pulled their version).
  schedule_.CommitDue(std::min(final_eval.step, max_steps_));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started_);
  RETURN_IF_ERROR(WriteRunOutputs(run_, ps_, chief_, final_eval,
                                  ParameterValues(model_, params_), seconds));
  absl::Status st = ps_->ShutdownAll("training finished");
  if (!st.ok()) LOG_WARN("shutting down parameter servers: {}", st);
  chief_->SetState("finished");
  return absl::OkStatus();
}

}  // namespace pstrain
