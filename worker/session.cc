#include "worker/session.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/client/grpc_ps_client.h"
#include "common/cluster/config.h"
#include "common/cluster/sizing.h"
#include "common/observability/monitoring.h"
#include "common/rpc/rpc.h"
#include "worker/model/model.h"
#include "worker/progress.h"
#include "worker/rejoin.h"
#include "worker/worker_metrics.h"

namespace pstrain {
namespace {

constexpr int kReportEvery = 10;

// Sets each "--name=value" (or "--name" for a boolean) through Abseil's
// registry, as the worker binary's command line would; `saved` gets each
// flag's value before (Abseil's FlagSaver would log a line per flag).
absl::Status SetFlags(const std::vector<std::string>& args,
                      std::vector<std::pair<absl::CommandLineFlag*, std::string>>* saved) {
  for (const std::string& arg : args) {
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", arg, "\": expected a flag, --name=value"));
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": not a worker flag"));
    }
    std::string value = eq == std::string::npos ? "true" : arg.substr(eq + 1);
    if (eq == std::string::npos && !flag->IsOfType<bool>()) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": expected --", name, "=VALUE"));
    }
    saved->emplace_back(flag, flag->CurrentValue());
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value, ": ", error));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerSession>> WorkerSession::Open(
    const std::vector<std::string>& args) {
  std::unique_ptr<WorkerSession> s(new WorkerSession());
  // The flags go back to what they were once the setup has read them: a
  // second session in this process starts from the defaults too.
  std::vector<std::pair<absl::CommandLineFlag*, std::string>> saved;
  absl::Status set = SetFlags(args, &saved);
  if (set.ok() && absl::GetFlag(FLAGS_job) != kWorkerJob) {
    set = absl::InvalidArgumentError(
        absl::StrCat("--job=", absl::GetFlag(FLAGS_job), ": a session is a worker's"));
  }
  if (set.ok()) {
    absl::StatusOr<DaemonSetup> setup =
        SetUpDaemon(kWorkerJob, /*config_required=*/true, std::getenv("TF_CONFIG"));
    if (setup.ok()) s->setup_ = std::move(*setup);
    set = setup.status();
  }
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
    std::string ignored;
    it->first->ParseFrom(it->second, &ignored);
  }
  RETURN_IF_ERROR(set);
  RETURN_IF_ERROR(s->Start());
  return s;
}

WorkerSession::~WorkerSession() {
  if (!closed_ && ps_ != nullptr) {
    LOG_WARN("leaving after {} local steps without a final report: the session was not closed "
             "(the training script failed or stopped early)",
             tally_.local_steps);
  }
}

absl::Status WorkerSession::Start() {
  const TrainingConfig& config = *setup_.config;
  const ClusterSpec& cluster = setup_.task.cluster;
  sync_ = IsSyncMode(config);
  step_timeout_ = absl::Milliseconds(config.rpc().step_timeout_ms());
  clip_norm_ = config.optimizer().clip_global_norm();
  startup_timeout_ = absl::Milliseconds(config.rpc().startup_timeout_ms());
  // (CheckConfiguredModelFits, with the variables read and placed once.)
  ASSIGN_OR_RETURN(variables_, ModelVariables(config.model()));
  ASSIGN_OR_RETURN(placement_, Placement::Compute(variables_, cluster.num_ps(),
                                                  config.placement().partition_min_bytes(),
                                                  config.placement().partition_max_bytes()));
  RETURN_IF_ERROR(CheckModelFits(variables_, *placement_, setup_.task.task.ToString()));
  if (!setup_.metrics_address.empty()) {
    ASSIGN_OR_RETURN(
        monitoring_,
        MonitoringServer::Start(
            setup_.metrics_address, {WorkerMetrics(&stats_), ProcessMetrics(), RpcMetrics()},
            [this]() -> std::string {
              return stats_.registered ? "" : "registering with the chief";
            },
            {{"job", kWorkerJob}, {"task", std::to_string(worker())}}, setup_.auth.tls));
    LOG_INFO("metrics on {}", monitoring_->url());
  }
  // The worker's connections (worker/trainer.h), with its settings.
  WorkerConnections connections = GrpcConnections(config, cluster, worker());
  chief_ = std::move(connections.chief);
  connect_ = std::move(connections.connect);
  fingerprint_ = RunFingerprint(config, variables_);
  RETURN_IF_ERROR(chief_->RegisterWorker(worker(), fingerprint_, startup_timeout_, &registration_,
                                         /*previous_incarnation=*/0, /*session=*/0, &stop_));
  LOG_INFO("registered with the chief: incarnation {:x}, starting at step {}; {} variables, {} "
           "mode",
           registration_.incarnation(), registration_.start_step(), variables_.size(),
           sync_ ? "sync" : "async");
  stats_.registered = true;
  ps_ = connect_(*placement_, registration_);
  min_versions_.assign(ps_->num_servers(), registration_.start_step());
  tally_.steps_before = registration_.local_steps_before();
  if (registration_.has_cursor()) {
    start_cursor_ = DataCursor{registration_.cursor_epoch(), registration_.cursor_position()};
  }
  if (registration_.rejoin()) {
    ASSIGN_OR_RETURN(const RejoinPoint point,
                     ClaimSession(ps_.get(), worker(), registration_.session(), sync_));
    tally_.steps_before = std::max(tally_.steps_before, point.pushes_applied);
    if (point.cursor.has_value()) start_cursor_ = point.cursor;
    LOG_INFO("rejoined the running job after a restart (session {}): data goes on at {}",
             registration_.session(),
             start_cursor_.has_value()
                 ? absl::StrCat("epoch ", start_cursor_->epoch, ", position ",
                                start_cursor_->position)
                 : std::string("the run's start"));
    if (sync_ && point.max_version > point.min_version) {
      // (As the C++ trainer says it: worker/trainer.cc.)
      LOG_WARN("the servers are at steps {} to {}: the step its earlier process left open was "
               "completed on some of them, so this step's gradient is computed from newer "
               "parameters there than its earlier process had",
               point.min_version, point.max_version);
    }
  }
  return absl::OkStatus();
}

absl::Status WorkerSession::Pull(absl::Span<float* const> dst, bool* finished, int64_t* step) {
  if (closed_) return absl::FailedPreconditionError("the session is closed");
  if (dst.size() != variables_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a pull into ", dst.size(),
                                                   " buffers; the model has ",
                                                   variables_.size(), " variables"));
  }
  if (push_ != nullptr) {
    return absl::FailedPreconditionError(
        "a pull after some of this step's gradients left (PushReady) and before its push: push "
        "the step first");
  }
  held_rows_.clear();  // (a step left without its push)
  absl::Status st = PullOnce(dst, finished, step);
  if (st.ok()) return st;
  // Followed, the pull reads the rolled-back values.
  RETURN_IF_ERROR(FollowRollback(st));
  return PullOnce(dst, finished, step);
}

absl::Status WorkerSession::FollowRollback(const absl::Status& cause) {
  if (!MayHaveLostPeer(cause) && !absl::IsFailedPrecondition(cause) &&
      !absl::IsAborted(cause)) {
    return cause;
  }
  RegisterWorkerResponse again;
  RETURN_IF_ERROR(RegisterAfterFailure(chief_.get(), worker(), fingerprint_, registration_,
                                       std::exchange(chief_lost_, false), startup_timeout_,
                                       step_timeout_, &stop_, cause, &again));
  LOG_WARN("the job was rolled back to step {} (this worker's step had failed: {}); going on "
           "from there",
           again.start_step(), cause);
  registration_ = again;
  push_.reset();  // (before its client goes)
  ps_ = connect_(*placement_, registration_);
  min_versions_.assign(ps_->num_servers(), registration_.start_step());
  pulled_ = PsClient::PullResult();
  pulled_for_push_ = false;
  held_rows_.clear();
  steps_.clear();
  read_step_.reset();
  start_cursor_ = registration_.has_cursor()
                      ? DataCursor{registration_.cursor_epoch(), registration_.cursor_position()}
                      : DataCursor{0, 0};
  ++rollbacks_;
  LOG_INFO("data cursor after the rollback: epoch {}, position {}", start_cursor_->epoch,
           start_cursor_->position);
  return absl::OkStatus();
}

absl::Status WorkerSession::PullOnce(absl::Span<float* const> dst, bool* finished,
                                     int64_t* step) {
  const absl::Time t0 = absl::Now();
  RETURN_IF_ERROR(ps_->PullInto(sync_ ? min_versions_ : std::vector<int64_t>(), step_timeout_,
                                std::vector<float*>(dst.begin(), dst.end()), &pulled_));
  tally_.pull += absl::Now() - t0;
  *finished = pulled_.finished;
  pulled_for_push_ = !pulled_.finished;
  steps_ = pulled_.versions;
  const int64_t oldest =
      steps_.empty() ? 0 : *std::min_element(steps_.begin(), steps_.end());
  // Sync: one step for every server, the oldest version pulled (as the C++
  // trainer: a server already past it drops the gradient).
  if (sync_) steps_.assign(steps_.size(), oldest);
  if (step != nullptr) *step = oldest;
  if (!pulled_.finished && !steps_.empty()) read_step_ = oldest;
  // rpc.async_prefetch: the next step's pull leaves now and travels while
  // this step computes and pushes; the next Pull takes its replies as they
  // are, without this step's push in them (the C++ trainer's TrainStep).
  if (!sync_ && !pulled_.finished && config().rpc().async_prefetch()) {
    ps_->PrefetchPull({}, step_timeout_, {}, /*as_is=*/true);
  }
  return absl::OkStatus();
}

absl::Status WorkerSession::Push(absl::Span<const float* const> src, const StepReport& report,
                                 bool* end) {
  *end = false;
  if (closed_) return absl::FailedPreconditionError("the session is closed");
  if (!pulled_for_push_) {
    return absl::FailedPreconditionError("a push without a pull before it: each step pulls the "
                                         "variables, computes, then pushes");
  }
  if (src.size() != variables_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a push of ", src.size(),
                                                   " gradients; the model has ",
                                                   variables_.size(), " variables"));
  }
  if (report.examples < 0 || report.cursor.epoch < 0 || report.cursor.position < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a push's examples and data cursor must be >= 0 (examples ", report.examples,
        ", cursor ", report.cursor.epoch, ", ", report.cursor.position, ")"));
  }
  if (!std::isfinite(report.compute_seconds) || report.compute_seconds < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute_seconds ", report.compute_seconds, ": expected seconds >= 0"));
  }
  const absl::Time t0 = absl::Now();
  // A checkpoint at the step this push completes records where the data
  // stands after this batch.
  ps_->set_data_cursor(report.cursor.epoch, report.cursor.position);
  std::vector<const float*> grads(src.begin(), src.end());
  absl::Status pushed = ClipAndPushHeldRows(&grads);
  if (pushed.ok()) pushed = PushAndPrefetch(grads);
  if (!pushed.ok()) {
    // Followed, the step is dropped: the next pull reads the step rolled
    // back to.
    return FollowRollback(pushed);
  }
  tally_.push += absl::Now() - t0;
  tally_.compute += absl::Seconds(report.compute_seconds);
  pulled_for_push_ = false;
  *end = CountPushOutcomes(outcomes_, steps_, &min_versions_, &tally_);
  tally_.CountStep(report.examples, report.loss, &stats_);
  if (tally_.local_steps % kReportEvery != 0) return absl::OkStatus();
  bool stop_requested = false;
  // A chief that stays silent fails the run on the third late report.
  if (absl::Status reported = ForgiveLateReport(
          SendProgress(chief_.get(), registration_, worker(), pulled_.versions, /*done=*/false,
                       &tally_, &stop_requested),
          &tally_);
      !reported.ok()) {
    chief_lost_ = true;
    absl::Status followed = FollowRollback(reported);
    chief_lost_ = false;
    // (The servers finished, and then were rolled back: they start over.)
    if (followed.ok()) *end = false;
    return followed;
  }
  if (stop_requested) *end = true;
  return absl::OkStatus();
}

absl::Status WorkerSession::ClipAndPushHeldRows(std::vector<const float*>* src) {
  if (clip_norm_ <= 0) return absl::OkStatus();
  double sum = 0;
  for (size_t v = 0; v < src->size(); ++v) {
    const float* g = (*src)[v];
    for (int64_t i = 0, n = variables_[v].num_elements(); i < n; ++i) {
      sum += static_cast<double>(g[i]) * g[i];
    }
  }
  for (const HeldRows& rows : held_rows_) {
    for (const float g : rows.grads) sum += static_cast<double>(g) * g;
  }
  // As the C++ trainer (Model::ClipGradientsByGlobalNorm): a norm that is
  // not finite leaves the gradients as they are.
  const double norm = std::sqrt(sum);
  if (std::isfinite(norm) && norm > clip_norm_) {
    const float scale = static_cast<float>(clip_norm_ / norm);
    clipped_.resize(src->size());
    for (size_t v = 0; v < src->size(); ++v) {
      const float* g = (*src)[v];
      clipped_[v].resize(variables_[v].num_elements());
      for (size_t i = 0; i < clipped_[v].size(); ++i) clipped_[v][i] = g[i] * scale;
      (*src)[v] = clipped_[v].data();
    }
    for (HeldRows& rows : held_rows_) {
      for (float& g : rows.grads) g *= scale;
    }
  }
  std::vector<HeldRows> held = std::move(held_rows_);
  held_rows_.clear();
  for (const HeldRows& rows : held) {
    RETURN_IF_ERROR(ps_->PushRows(rows.table, rows.dim, rows.ids, rows.grads.data(), steps_,
                                  &row_outcomes_));
  }
  return absl::OkStatus();
}

bool WorkerSession::streams_pushes() const {
  return sync_ && !config().rpc().sequential() && clip_norm_ == 0;
}

absl::Status WorkerSession::PushReady(absl::Span<const int> vars,
                                      absl::Span<const float* const> src) {
  if (closed_) return absl::FailedPreconditionError("the session is closed");
  if (!pulled_for_push_) {
    return absl::FailedPreconditionError(
        "gradients ready outside a step: pull the variables first");
  }
  if (vars.size() != src.size()) {
    return absl::InvalidArgumentError(absl::StrCat(vars.size(), " variables ready with ",
                                                   src.size(), " gradients"));
  }
  for (size_t i = 0; i < vars.size(); ++i) {
    if (vars[i] < 0 || static_cast<size_t>(vars[i]) >= variables_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("variable ", vars[i], " ready; the model has ",
                                                     variables_.size(), " variables"));
    }
    if (src[i] == nullptr) return absl::InvalidArgumentError("a null gradient");
  }
  if (!streams_pushes()) return absl::OkStatus();  // the Push sends them
  if (!streamed_) {
    LOG_INFO("gradients leave during the backward pass as they are final (PushReady), as the C++ "
             "worker pushes layer by layer");
    streamed_ = true;
  }
  if (push_ == nullptr) RETURN_IF_ERROR(StartStepPush({}));
  for (size_t i = 0; i < vars.size(); ++i) {
    push_->SetSource(vars[i], src[i]);
    RETURN_IF_ERROR(push_->Ready(vars[i], vars[i] + 1));
  }
  return absl::OkStatus();
}

absl::Status WorkerSession::StartStepPush(absl::Span<const float* const> src) {
  std::vector<const float*> sources(variables_.size(), nullptr);
  if (!src.empty()) sources.assign(src.begin(), src.end());
  ASSIGN_OR_RETURN(push_, ps_->StartPush(steps_, sources));
  // As the C++ trainer (Trainer::PushFirstLayers, PushRest), the next
  // step's pull leaves with this push (async: not with
  // rpc.async_prefetch, whose pull left with the step's Pull).
  if (config().rpc().sequential()) return absl::OkStatus();
  if (sync_) {
    PrefetchNextSyncPull(ps_.get(), steps_, step_timeout_);
  } else if (!config().rpc().async_prefetch()) {
    RETURN_IF_ERROR(
        PrefetchPullAfterPush(ps_.get(), push_.get(), variables_.size(), step_timeout_));
  }
  return absl::OkStatus();
}

absl::Status WorkerSession::PushAndPrefetch(absl::Span<const float* const> src) {
  if (push_ == nullptr) {
    RETURN_IF_ERROR(StartStepPush(src));
  } else {
    // (Streamed: the variables not started yet.)
    for (size_t v = 0; v < src.size(); ++v) push_->SetSource(v, src[v]);
  }
  absl::Status waited = push_->Wait(&outcomes_);
  push_.reset();
  return waited;
}

absl::StatusOr<int> WorkerSession::TableDim(const std::string& table) const {
  for (const EmbeddingTableConfig& t : config().embedding_tables()) {
    if (t.name() == table) return t.dim();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no embedding table \"", table, "\" in the config's embedding_tables"));
}

absl::Status WorkerSession::PullRows(const std::string& table, absl::Span<const uint64_t> ids,
                                     float* out) {
  if (closed_) return absl::FailedPreconditionError("the session is closed");
  ASSIGN_OR_RETURN(const int dim, TableDim(table));
  if (!pulled_for_push_) {
    return absl::FailedPreconditionError("rows pulled outside a step: pull the variables first");
  }
  absl::Status st = ps_->PullRows(table, dim, ids, sync_ ? steps_[0] : 0, step_timeout_, out);
  return st.ok() ? st : DropStepAfter(st);
}

absl::Status WorkerSession::PushRows(const std::string& table, absl::Span<const uint64_t> ids,
                                     const float* grads) {
  if (closed_) return absl::FailedPreconditionError("the session is closed");
  ASSIGN_OR_RETURN(const int dim, TableDim(table));
  if (!pulled_for_push_) {
    return absl::FailedPreconditionError("rows pushed outside a step: pull the variables first");
  }
  if (push_ != nullptr) {
    // (The dense gradients that left may complete the step on a server
    // before its rows arrive.)
    return absl::FailedPreconditionError(
        "rows pushed after some of this step's gradients left (PushReady): push a step's rows "
        "first");
  }
  if (clip_norm_ > 0) {
    // Held for the Push, which clips them with the dense gradients.
    const size_t n = ids.size() * static_cast<size_t>(dim);
    held_rows_.push_back({table, dim, std::vector<uint64_t>(ids.begin(), ids.end()),
                          std::vector<float>(grads, grads + n)});
    return absl::OkStatus();
  }
  absl::Status st = ps_->PushRows(table, dim, ids, grads, steps_, &row_outcomes_);
  return st.ok() ? st : DropStepAfter(st);
}

absl::Status WorkerSession::DropStepAfter(const absl::Status& cause) {
  RETURN_IF_ERROR(FollowRollback(cause));
  return absl::AbortedError(absl::StrCat(
      "step dropped: the job was rolled back to step ", registration_.start_step(),
      " while this step's rows were pulled or pushed (", cause.message(),
      "); pull the variables again"));
}

absl::Status WorkerSession::ReportEval(WorkerEvaluation eval) {
  if (closed_) return absl::FailedPreconditionError("the session is closed");
  if (eval.step < 0) eval.step = read_step_.value_or(registration_.start_step());
  bool ignored;  // (a stop is heard at the next push)
  absl::Status st = SendProgress(chief_.get(), registration_, worker(), pulled_.versions,
                                 /*done=*/false, &tally_, &ignored, &eval);
  if (st.ok() || absl::IsInvalidArgument(st)) return st;
  // The chief late, restarting or rolling the job back: the evaluation is
  // lost, not the worker (the next step follows any rollback).
  LOG_WARN("the evaluation at step {} did not reach the chief: {}", eval.step, st);
  return absl::OkStatus();
}

absl::Status WorkerSession::Close() {
  if (closed_) return absl::OkStatus();
  closed_ = true;
  bool ignored;
  absl::Status st = SendProgress(chief_.get(), registration_, worker(), pulled_.versions,
                                 /*done=*/true, &tally_, &ignored);
  // As the C++ worker's: the training is over, and a chief already gone
  // (the run stopped, or ended while this worker finished) only misses the
  // count; not an error of the worker's.
  if (!st.ok()) LOG_WARN("final report to the chief failed: {}", st);
  LOG_INFO("done after {} local steps ({} examples, {} stale gradients dropped)", tally_.local_steps,
           tally_.examples, tally_.dropped);
  return absl::OkStatus();
}

}  // namespace pstrain
