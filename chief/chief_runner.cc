#include "chief/chief_runner.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "chief/checkpoint_schedule.h"
#include "chief/evaluation.h"
#include "chief/rollback.h"
#include "chief/run_context.h"
#include "chief/summary.h"
#include "chief/training_events.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/client/grpc_ps_client.h"
#include "common/cluster/config.h"
#include "common/cluster/placement.h"
#include "common/storage/env.h"
#include "worker/data/loader.h"
#include "worker/model/backend.h"
#include "worker/model/model.h"

namespace pstrain {
namespace {

// The model is written to output_dir at the end: find out now, not after
// the run, that it cannot be.
absl::Status CheckOutputWritable(const std::string& output_dir) {
  Env* env = Env::Default();
  const std::string probe = JoinPath(output_dir, ".pstrain-write-test");
  absl::Status writable = env->CreateDirs(output_dir);
  if (writable.ok()) writable = env->WriteFile(probe, "ok\n", /*sync=*/false);
  if (!writable.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("output_dir ", output_dir, " is not writable: ", writable.message()));
  }
  (void)env->DeleteFile(probe);
  return absl::OkStatus();
}

// The variables' placement on this cluster's servers, one log line per
// server and per variable.
absl::StatusOr<Placement> PlaceVariables(const TrainingConfig& config, const ClusterSpec& cluster,
                                         const Model& model) {
  ASSIGN_OR_RETURN(Placement placement,
                   Placement::Compute(model.variables(), cluster.num_ps(),
                                      config.placement().partition_min_bytes(),
                                      config.placement().partition_max_bytes()));
  for (absl::string_view line : absl::StrSplit(placement.DebugString(), '\n', absl::SkipEmpty())) {
    LOG_INFO("placement: {}", line);
  }
  return placement;
}

// The held-out examples, when the config has a test split.
absl::StatusOr<std::optional<Dataset>> LoadTestSet(const TrainingConfig& config,
                                                   const Model& model) {
  if (!HasTestSplit(config.data())) return std::optional<Dataset>();
  ASSIGN_OR_RETURN(Dataset test, LoadDataset(Env::Default(), config.data(), DataSplit::kTest,
                                             model.input_dim(), model.num_labels()));
  if (test.size == 0) {
    // Its accuracy would read 0.0000, as if the model had learnt nothing.
    return absl::InvalidArgumentError(
        "the test split has no examples: nothing to evaluate on (give data a test file with "
        "examples, or none to train without evaluation)");
  }
  LOG_INFO("{} held-out examples for evaluation", test.size);
  return std::optional<Dataset>(std::move(test));
}

// Every 250 ms, on a thread of its own (the driver can be busy evaluating or
// committing a checkpoint), every server's status: a restarted one wakes the
// driver, and workers that lost it wait for the rollback instead of failing.
// Stopped and joined by the destructor.
class Heartbeat {
 public:
  Heartbeat(const RunContext& run, Chief* chief)
      : thread_([this, &run, chief] { Run(run, chief); }) {}
  ~Heartbeat() {
    stop_.Notify();
    thread_.join();
  }

 private:
  void Run(const RunContext& run, Chief* chief) {
    GrpcPsClient probe(run.cluster, &run.placement, /*worker=*/-1, run.rpc_timeout);
    while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(250))) {
      const int64_t generation = chief->health_generation();
      if (generation < 0) continue;  // a rollback under way
      const uint64_t incarnation = chief->incarnation();
      int down = 0;
      bool restarted = false;
      for (int s = 0; s < probe.num_servers(); ++s) {
        PsStatusResponse status;
        if (!probe.GetStatus(s, &status).ok()) {
          ++down;
        } else if (!status.initialized() || status.incarnation() != incarnation) {
          restarted = true;
        }
      }
      chief->SetServerHealth(generation, down, restarted);
    }
  }

  absl::Notification stop_;
  std::thread thread_;  // last: started once the notification exists
};

// What one round's poll of every server's status found.
struct ServerPoll {
  // The slowest version of the servers on this run's incarnation; the
  // lowest int64 when one did not answer or restarted (nothing confirmed).
  int64_t version = std::numeric_limits<int64_t>::max();
  bool all_answered = true;
  int down = 0;
  std::vector<std::string> restarted;  // "ps:1"
  std::optional<float> learning_rate;  // ps:0's
  int64_t staleness_count = 0;         // over every server
  double staleness_sum = 0;
};

// The training loop and the end of the run, over the state they share.
class Driver {
 public:
  Driver(const RunContext& run, Model* model, const Dataset* test, PsClient* ps, Chief* chief,
         StopSignal* stop, const ChiefStart& start, const RunStart& begun)
      : run_(run),
        model_(model),
        test_(test),
        ps_(ps),
        chief_(chief),
        stop_(stop),
        init_from_(start.init_from),
        adopted_(begun.adopted),
        max_steps_(run.config.max_steps()),
        eval_every_(run.config.eval_every_steps() > 0 ? run.config.eval_every_steps()
                                                      : max_steps_),
        next_eval_(NextEvalAfter(begun.step)),
        schedule_(run, ps, chief, begun.step, begun.adopted != 0),
        events_(run.config.output_dir(), begun.step),
        down_since_(ps->num_servers(), absl::InfiniteFuture()) {}

  // Until max_steps or every worker done: confirms the global step from the
  // servers, evaluates, commits checkpoints, rolls back, writes events.
  absl::Status Train();
  // The final evaluation, the last checkpoint, the model and the summary;
  // the servers shut down.
  absl::Status Finish();

 private:
  int64_t NextEvalAfter(int64_t step) const;
  ServerPoll PollServers();
  // Whether every server answers, on this run's incarnation.
  bool ServersOnRun();
  absl::Status Restore(const std::string& checkpoint, bool finishing);
  absl::Status RecoverFromRestart(const std::vector<std::string>& restarted);
  absl::StatusOr<int64_t> RollBackTo(std::optional<ResumePoint> point, const std::string& why,
                                     absl::Time began);
  absl::Status CheckServersBack();
  absl::Status CheckProgress(int down, int64_t step);
  // false: put off (a server lost meanwhile; the rollback takes it up).
  absl::StatusOr<bool> EvaluateAt(int64_t step);

  const RunContext& run_;
  Model* const model_;
  const Dataset* const test_;  // null: no test split
  PsClient* const ps_;
  Chief* const chief_;
  StopSignal* const stop_;
  const std::string init_from_;
  const uint64_t adopted_;
  const int64_t max_steps_;
  const int64_t eval_every_;
  int64_t next_eval_;
  CheckpointSchedule schedule_;
  TrainingEvents events_;
  // Servers the loop finds not answering, since when.
  std::vector<absl::Time> down_since_;
  // The variables as the last evaluation pulled them: the final model.
  std::vector<Tensor> params_;
  absl::Time started_;
};

int64_t Driver::NextEvalAfter(int64_t step) const {
  int64_t next = std::min(eval_every_, max_steps_);
  while (next <= step && next < max_steps_) next += eval_every_;
  return std::min(next, max_steps_);
}

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
  next_eval_ = NextEvalAfter(step);
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
  LOG_INFO("step {}/{}: train loss {:.4f}, eval accuracy {:.4f}, eval loss {:.4f}{}, {:.0f} "
           "examples/s",
           e.step, max_steps_, progress.train_loss(), e.result.accuracy(), e.result.loss,
           e.auc ? absl::StrFormat(", eval AUC %.4f", *e.auc) : "", progress.examples_per_sec());
  events_.WriteEvalScalars(e);
  while (next_eval_ <= step) next_eval_ += eval_every_;
  next_eval_ = std::min(next_eval_, max_steps_);
  return true;
}

absl::Status Driver::Train() {
  started_ = absl::Now();
  for (;;) {
    if (stop_->stopped()) {
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
    chief_->WaitForStep(std::min(next_eval_, schedule_.next_sync_cut()), absl::Milliseconds(250));
    ServerPoll poll = PollServers();
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
    if (step >= next_eval_ && step < max_steps_) {
      ASSIGN_OR_RETURN(bool evaluated, EvaluateAt(step));
      if (!evaluated) continue;
    }
    schedule_.CommitDue(std::min(step, max_steps_));
    schedule_.TimedSave(step);
    events_.WriteTrainScalars(step, chief_);
    if (step >= max_steps_ || chief_->AllWorkersDone()) return absl::OkStatus();
  }
}

absl::Status Driver::Finish() {
  chief_->RequestStop();
  chief_->SetState("finishing");  // also when the loop ended otherwise
  if (adopted_ == 0 && !chief_->WaitForWorkersDone(run_.step_timeout)) {
    LOG_WARN("not every worker reported done within {}", absl::FormatDuration(run_.step_timeout));
  }
  ASSIGN_OR_RETURN(Evaluation final_eval, Evaluate(ps_, model_, run_.config, test_, &params_));
  chief_->SetEval(final_eval.step, final_eval.result.accuracy(), final_eval.result.loss);
  events_.WriteEvalScalars(final_eval);
  events_.Sync();
  // The workers can end before their reports carried the last step: commit
  // what the servers reached (the final evaluation pulled their version).
  schedule_.CommitDue(std::min(final_eval.step, max_steps_));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started_);
  RETURN_IF_ERROR(WriteRunOutputs(run_, ps_, chief_, final_eval, params_, seconds));
  absl::Status st = ps_->ShutdownAll("training finished");
  if (!st.ok()) LOG_WARN("shutting down parameter servers: {}", st);
  chief_->SetState("finished");
  return absl::OkStatus();
}

}  // namespace

absl::Status RunChief(const TrainingConfig& config, const ClusterSpec& cluster, uint64_t incarnation,
                      Chief* chief, StopSignal* stop, const ChiefStart& start) {
  RETURN_IF_ERROR(CheckOutputWritable(config.output_dir()));
  RETURN_IF_ERROR(CheckConfiguredModelFits(config, cluster.num_ps(), "the chief"));
  // The chief evaluates on the CPU: it is one process beside the workers,
  // and its numbers should not depend on which device a run had.
  std::unique_ptr<Backend> cpu = NewCpuBackend(config.compute_threads());
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(config.model(), cpu.get()));
  LOG_INFO("model: {}", model->Summary());
  ASSIGN_OR_RETURN(const Placement placement, PlaceVariables(config, cluster, *model));
  ASSIGN_OR_RETURN(const std::optional<Dataset> test, LoadTestSet(config, *model));
  const RunContext run(config, cluster, placement);

  GrpcPsClient ps(cluster, &placement, /*worker=*/-1, run.rpc_timeout);
  ps.set_incarnation(incarnation);
  // The evaluation's pulls: a share of up to 64 MiB in one call, read at
  // one version; a larger one in calls of up to 64 MiB of whole
  // partitions, each at the version it found (the oldest is reported).
  ps.set_chunk_bytes(int64_t{64} << 20);
  ps.set_calls_in_flight(config.rpc().calls_in_flight());
  ps.set_connections_per_server(config.rpc().connections_per_server());
  ps.set_mixed_versions(true);

  ASSIGN_OR_RETURN(const RunStart begun, StartRun(run, start, model.get(), &ps, chief));
  Driver driver(run, model.get(), test.has_value() ? &*test : nullptr, &ps, chief, stop, start,
                begun);
  Heartbeat heartbeat(run, chief);
  RETURN_IF_ERROR(driver.Train());
  return driver.Finish();
}

}  // namespace pstrain
