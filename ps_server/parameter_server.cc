#include "ps_server/parameter_server.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace pstrain {

// Marks CheckIncarnationLocked's refusal of a replaced incarnation.
constexpr char kReplacedIncarnationPayload[] = "pstrain.ps/replaced-incarnation";


ParameterServer::ParameterServer(absl::Duration max_wait)
    : max_wait_(max_wait), timer_([this] { TimerLoop(); }) {}

ParameterServer::~ParameterServer() {
  snapshots_.Stop();  // no queued shard is written from here on
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    destroying_ = true;
    shut_down_ = true;
    CollectReadyLocked(&completions);
    timer_cv_.SignalAll();
  }
  RunCompletions(&completions);
  timer_.join();
}

void ParameterServer::InstallLocked(const InitializeRequest& request, std::shared_ptr<Model> model,
                                    std::vector<Completion>* completions) {
  // Pulls parked for an earlier incarnation end now.
  parked_.TakeAll(absl::FailedPreconditionError("parameter server re-initialized for another run"),
                  completions);
  if (initialized_ && incarnation_ != request.incarnation()) {
    replaced_incarnation_ = incarnation_;
    replaced_at_ = absl::Now();
  }
  initialized_ = true;
  incarnation_ = request.incarnation();
  model_ = std::move(model);
  version_ = request.start_step();
  int index = 0;
  for (auto& [key, p] : model_->partitions) p->index = index++;
  sync_.Reset(index, model_->num_workers, model_->replicas_to_aggregate);
  async_.Reset(model_->num_workers);
  held_.Reset(model_->num_workers);
  worker_session_.assign(model_->num_workers, 0);
  session_start_step_.assign(model_->num_workers, -1);
  holding_pushes_ = false;
  rows_in_flight_ = 0;
  // Shards of the run before are not this run's (one being written is
  // dropped when done, by its incarnation).
  snapshots_.Reset(incarnation_);
}

void ParameterServer::SetTier(TierSettings tier) {
  absl::MutexLock lock(&mu_);
  tier_ = std::move(tier);
}

absl::Status ParameterServer::Initialize(const InitializeRequest& request) {
  // Checked in NewModel.
  const int num_parts = std::max(1, request.num_parts());
  TierSettings tier;
  {
    absl::MutexLock lock(&mu_);
    tier = tier_;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model, NewServerModel(request, tier));
  for (const NamedTensor& nt : request.variables()) {
    ASSIGN_OR_RETURN(std::unique_ptr<PartitionState> p, NewPartition(nt, *model));
    const Key key = p->key;
    if (!model->partitions.emplace(key, std::move(p)).second) {
      return absl::InvalidArgumentError(absl::StrCat("Initialize: duplicate ", KeyString(key)));
    }
  }
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("parameter server is shutting down");
    if (initialized_ && incarnation_ == request.incarnation()) {
      return absl::AlreadyExistsError("already initialized for this incarnation");
    }
    if (num_parts > 1) {
      ASSIGN_OR_RETURN(bool complete, init_parts_.Add(request, &model));
      if (!complete) return absl::OkStatus();
    }
    InstallLocked(request, std::move(model), &completions);
  }
  RunCompletions(&completions);
  return absl::OkStatus();
}

bool ParameterServer::FromReplacedIncarnation(const absl::Status& st) {
  return st.GetPayload(kReplacedIncarnationPayload).has_value();
}

absl::Status ParameterServer::ReinitializedError() {
  absl::Status st = absl::FailedPreconditionError("parameter server re-initialized");
  st.SetPayload(kReplacedIncarnationPayload, absl::Cord("1"));
  return st;
}

absl::Status ParameterServer::CheckIncarnationLocked(uint64_t incarnation) const {
  if (shut_down_) return absl::UnavailableError("parameter server is shutting down");
  if (!initialized_) return absl::UnavailableError("parameter server not initialized yet");
  if (incarnation != incarnation_ && incarnation == replaced_incarnation_) {
    absl::Status st = absl::FailedPreconditionError(absl::StrCat(
        "request from cluster incarnation ", incarnation, ", whose state this server dropped ",
        absl::ToInt64Seconds(absl::Now() - replaced_at_),
        " s ago when its chief initialized it again for incarnation ", incarnation_,
        " (a rollback, or a new run): register with the chief again"));
    st.SetPayload(kReplacedIncarnationPayload, absl::Cord("1"));
    return st;
  }
  if (incarnation != incarnation_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request from cluster incarnation ", incarnation, ", this server serves ", incarnation_,
        " (a task from an earlier run?)"));
  }
  return absl::OkStatus();
}

bool ParameterServer::FinishedLocked() const {
  return model_ && model_->max_steps > 0 && version_ >= model_->max_steps;
}

std::string ParameterServer::WaitingOnLocked() const {
  if (model_->sync) {
    return absl::StrCat("step ", version_, " has ", sync_.FewestOpen(), " of ",
                        model_->replicas_to_aggregate, " gradients (", sync_.open(),
                        " partition(s) open), waiting on worker(s) ",
                        absl::StrJoin(sync_.Missing(), ","));
  }
  return absl::StrCat("slowest worker(s) ", absl::StrJoin(async_.SlowestWorkers(), ","), " at ",
                      async_.Slowest(), " pushes");
}

// ---------------------------------------------------------------------------
// Sessions, the step's end and checkpoints

absl::Status ParameterServer::AdmitSessionLocked(int worker, int32_t session,
                                                const char* method) {
  int32_t& newest = worker_session_[worker];
  if (session < 0) {
    RejectLocked(Rejection::kMalformed);
    return absl::InvalidArgumentError(absl::StrCat(method, ": negative session ", session));
  }
  if (session < newest) {
    RejectLocked(Rejection::kSuperseded);
    return absl::FailedPreconditionError(absl::StrCat(
        method, ": worker ", worker, " session ", session, " was superseded by session ", newest,
        " (the worker was restarted; this is an earlier process of it)"));
  }
  if (session > newest) {
    newest = session;
    session_start_step_[worker] = version_;
    // Its earlier process's push in parts, if one is open, never completes
    // now (its parts are refused): dropped, so that no cut waits for it,
    // and a part of it still being applied is not counted.
    if (worker < held_.num_workers()) {
      const HeldPushes::Push& h = held_.of(worker);
      if (h.open()) {
        LOG_WARN("worker {}'s push for step {} (session {}) dropped with {} of its {} parts in: "
                 "session {} of the worker claimed it",
                 worker, h.step, h.session, h.parts_in(), h.num_parts, session);
      }
      DropHeldPushLocked(worker, "the worker was restarted (a later session claimed it)");
    }
    // Rows its earlier process staged for the open step are pushed again.
    RowStore::DropStaged(model_.get(), worker);
  }
  return absl::OkStatus();
}

void ParameterServer::CompleteStepLocked(int64_t step, int contributors,
                                         std::vector<Completion>* completions) {
  RowStore::ApplyStaged(model_.get(), step, contributors);
  counters_.pushes_applied += contributors;
  version_ = step + 1;
  // A step applying when the one before failed at its deadline completes
  // still: its shard may be cut, later ones not.
  if (!sync_.failure().ok()) snapshots_.FailAfter(version_, sync_.failure());
  if (std::optional<absl::Duration> wait = sync_.Completed(absl::Now())) {
    // Wall-clock times: a clock stepped back must not make a negative wait.
    quorum_wait_seconds_.Observe(std::max(0.0, absl::ToDoubleSeconds(*wait)));
  }
  MaybeSnapshotLocked(version_);  // with the step's cursors
  sync_.CommitCursors();
  CollectReadyLocked(completions);
}

void ParameterServer::MaybeSnapshotLocked(int64_t version) {
  const Model& model = *model_;
  if (model.checkpoint_dir.empty()) return;
  const bool scheduled = snapshots_.TakeScheduled(version);
  const bool due = (model.checkpoint_every > 0 && version % model.checkpoint_every == 0) ||
                   version == model.max_steps || scheduled;
  if (!due) return;
  // The step is complete and the next one cannot start before this returns
  // (its pulls are served after it), so no apply runs.
  CutLocked(version, sync_.cursors());
}

void ParameterServer::CutLocked(int64_t step, const std::vector<StepCursor>& cursors) {
  snapshots_.Enqueue(CutShard(*model_, step, incarnation_, cursors, PlanRowsLocked(step)));
}

RowsPlan ParameterServer::PlanRowsLocked(int64_t step) const {
  return snapshots_.PlanRows(step, model_->checkpoint_full_every, model_->max_steps);
}

absl::Status ParameterServer::AwaitPushesReleasedLocked(const std::shared_ptr<Model>& model,
                                                        const char* what) {
  // Only an async cut holds pushes: a few milliseconds (bounded anyway).
  auto released = [this, &model]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !holding_pushes_ || model_ != model || shut_down_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&released), max_wait_)) {
    return absl::UnavailableError(
        absl::StrCat(what, ": held for a checkpoint longer than the wait limit"));
  }
  if (shut_down_) return absl::UnavailableError("parameter server is shutting down");
  if (model_ != model) return ReinitializedError();
  return absl::OkStatus();
}

absl::Status ParameterServer::Snapshot(const SnapshotRequest& request,
                                       SnapshotResponse* response) {
  if (request.timeout_ms() < 0) return absl::InvalidArgumentError("Snapshot: negative timeout_ms");
  const int64_t step = request.step();
  if (step < 0) return absl::InvalidArgumentError("Snapshot: negative step");
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckIncarnationLocked(request.incarnation()));
  if (model_->checkpoint_dir.empty()) {
    return absl::FailedPreconditionError("Snapshot: this run writes no checkpoints");
  }
  if (model_->sync) {
    // A cut at a step boundary ahead: taken when that step completes.
    if (step <= version_) {
      return absl::OutOfRangeError(absl::StrCat("Snapshot: step ", step,
                                                " is not ahead of this server's version ",
                                                version_));
    }
    if (model_->max_steps > 0 && step > model_->max_steps) {
      return absl::InvalidArgumentError(absl::StrCat("Snapshot: step ", step, " is past max_steps"));
    }
    RETURN_IF_ERROR(snapshots_.Schedule(step));
    response->set_version(version_);
    return absl::OkStatus();
  }
  if (holding_pushes_) return absl::FailedPreconditionError("Snapshot: one is already being taken");
  // A retried request for a cut already taken is answered, not taken twice.
  if (snapshots_.Taken(step)) {
    response->set_version(version_);
    return absl::OkStatus();
  }
  const absl::Time start = absl::Now();
  holding_pushes_ = true;
  const std::shared_ptr<Model> model = model_;
  auto drained = [this, &model]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (async_.in_flight() == 0 && rows_in_flight_ == 0 && parts_applying_ == 0) ||
           shut_down_ || model_ != model;
  };
  const absl::Duration timeout = std::min(absl::Milliseconds(request.timeout_ms()), max_wait_);
  const bool ok = mu_.AwaitWithTimeout(absl::Condition(&drained), timeout);
  if (!ok || shut_down_ || model_ != model) {
    if (model_ == model) holding_pushes_ = false;
    if (shut_down_) return absl::UnavailableError("parameter server is shutting down");
    if (model_ != model) return ReinitializedError();
    return absl::DeadlineExceededError(absl::StrCat(
        "Snapshot: ", async_.in_flight() + rows_in_flight_ + parts_applying_,
        " push(es) or parts still applying or awaiting parts after ",
        absl::FormatDuration(timeout)));
  }
  std::unique_ptr<ShardSnapshot> cut =
      CutShard(*model_, step, incarnation_, async_.cursors(), PlanRowsLocked(step));
  holding_pushes_ = false;  // waiting pushes go on as mu_ is released
  const absl::Duration pause = absl::Now() - start;
  cut->pause_seconds = absl::ToDoubleSeconds(pause);  // the hold, the cut's copy included
  snapshots_.Enqueue(std::move(cut));
  response->set_version(version_);
  response->set_pause_us(absl::ToInt64Microseconds(pause));
  return absl::OkStatus();
}

absl::Status ParameterServer::GetShard(const GetShardRequest& request,
                                       GetShardResponse* response) {
  if (request.timeout_ms() < 0) return absl::InvalidArgumentError("GetShard: negative timeout_ms");
  const int64_t step = request.step();
  const absl::Duration timeout = std::min(absl::Milliseconds(request.timeout_ms()), max_wait_);
  uint64_t incarnation = 0;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckIncarnationLocked(request.incarnation()));
    if (model_->checkpoint_dir.empty()) {
      return absl::FailedPreconditionError(
          "GetShard: this run writes no checkpoints (checkpoint.dir is not set)");
    }
    incarnation = incarnation_;
  }
  // Waits on the snapshotter's lock, not this one.
  bool timed_out = false;
  absl::StatusOr<GetShardResponse> shard = snapshots_.Await(incarnation, step, timeout, &timed_out);
  if (timed_out) {
    absl::MutexLock lock(&mu_);
    return absl::DeadlineExceededError(absl::StrCat(shard.status().message(),
                                                    " (server at version ", version_, ")"));
  }
  RETURN_IF_ERROR(shard.status());
  *response = *std::move(shard);
  return absl::OkStatus();
}
// ---------------------------------------------------------------------------

std::vector<bool> ParameterServer::SyncWaitingOn() {
  absl::MutexLock lock(&mu_);
  std::vector<bool> out;
  if (!initialized_ || !model_->sync || FinishedLocked()) return out;
  return sync_.WaitingOn();
}

const char* ParameterServer::RejectionName(Rejection r) {
  switch (r) {
    case Rejection::kIncarnation: return "incarnation";
    case Rejection::kWorker: return "worker";
    case Rejection::kShape: return "shape";
    case Rejection::kNonFinite: return "non_finite";
    case Rejection::kAhead: return "ahead";
    case Rejection::kDuplicate: return "duplicate";
    case Rejection::kOutOfRange: return "out_of_range";
    case Rejection::kSize: return "size";
    case Rejection::kMalformed: return "malformed";
    case Rejection::kSuperseded: return "superseded";
    case Rejection::kOverBound: return "gradient_bound";
  }
  return "unknown";
}

void ParameterServer::RecordRejection(Rejection reason) {
  absl::MutexLock lock(&mu_);
  RejectLocked(reason);
}

void ParameterServer::RejectLocked(Rejection reason) {
  ++counters_.pushes_rejected;
  ++counters_.rejected[static_cast<size_t>(reason)];
}

std::vector<double> ParameterServer::StalenessBounds() {
  return {0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256};
}

std::vector<ParameterServer::PartitionStats> ParameterServer::partition_stats() {
  std::shared_ptr<Model> model;
  {
    absl::MutexLock lock(&mu_);
    model = model_;
  }
  std::vector<PartitionStats> out;
  if (model == nullptr) return out;
  out.reserve(model->partitions.size());
  for (const auto& [key, p] : model->partitions) {
    PartitionStats s;
    s.variable = key.first;
    s.partition = key.second;
    s.pushes = p->pushes.load(std::memory_order_relaxed);
    s.pulls = p->pulls.load(std::memory_order_relaxed);
    s.push_bytes = p->push_bytes.load(std::memory_order_relaxed);
    s.pull_bytes = p->pull_bytes.load(std::memory_order_relaxed);
    s.apply_seconds = static_cast<double>(p->apply_nanos.load(std::memory_order_relaxed)) * 1e-9;
    out.push_back(std::move(s));
  }
  return out;
}

ParameterServer::CheckpointStats ParameterServer::checkpoint_stats() {
  return snapshots_.stats();
}

absl::Status ParameterServer::GetStatus(int worker, int32_t session,
                                        PsStatusResponse* response) {
  {
    absl::MutexLock lock(&mu_);
    if (model_ == nullptr) return absl::UnavailableError("GetStatus: not initialized yet");
    if (worker < 0 || worker >= model_->num_workers) {
      return absl::InvalidArgumentError(absl::StrCat("GetStatus: worker ", worker, " out of range"));
    }
    RETURN_IF_ERROR(AdmitSessionLocked(worker, session, "GetStatus"));
  }
  // (Pushes admitted before the claim were counted under the lock above;
  // none of the earlier session's is admitted after it.)
  GetStatus(response);
  return absl::OkStatus();
}

void ParameterServer::GetStatus(PsStatusResponse* response) {
  absl::MutexLock lock(&mu_);
  response->set_initialized(initialized_);
  response->set_incarnation(incarnation_);
  response->set_version(version_);
  response->set_pushes_applied(counters_.pushes_applied);
  response->set_gradients_dropped_stale(counters_.gradients_dropped_stale);
  response->set_pushes_rejected(counters_.pushes_rejected);
  response->set_pulls(counters_.pulls);
  response->set_push_payload_bytes(counters_.push_payload_bytes);
  response->set_push_copied_bytes(counters_.push_copied_bytes);
  response->set_push_staged_bytes(counters_.push_staged_bytes);
  response->set_pull_payload_bytes(counters_.pull_payload_bytes);
  response->set_pull_copied_bytes(counters_.pull_copied_bytes);
  response->set_held_pushes_expired(counters_.held_pushes_expired);
  const Histogram::Snapshot staleness = staleness_.Read();
  response->set_staleness_count(static_cast<int64_t>(staleness.cumulative.back()));
  response->set_staleness_sum(staleness.sum);
  if (model_ == nullptr) return;
  response->set_learning_rate(model_->learning_rate.At(version_));
  for (int w = 0; w < async_.num_workers(); ++w) {
    WorkerProgress* wp = response->add_workers();
    const StepCursor& c = model_->sync ? sync_.completed_cursors()[w] : async_.cursors()[w];
    if (!model_->sync) wp->set_pushes_applied(async_.pushes(w));
    wp->set_has_cursor(c.set);
    wp->set_cursor_epoch(c.epoch);
    wp->set_cursor_position(c.position);
  }
  for (const auto& [name, t] : model_->tables) {
    const EmbeddingTable::Stats st = t->rows->stats();
    TableStatus* ts = response->add_tables();
    ts->set_name(name);
    ts->set_rows(st.rows);
    ts->set_bytes(st.bytes);
    ts->set_pending_ids(st.pending_ids);
    ts->set_rows_expired(st.rows_expired);
    ts->set_gradients_dropped(st.gradients_dropped);
    ts->set_rows_on_disk(st.rows_on_disk);
    ts->set_disk_bytes(st.disk_bytes);
    ts->set_disk_reads(st.disk_reads);
    ts->set_disk_writes(st.disk_writes);
    ts->set_disk_write_errors(st.disk_write_errors);
    if (absl::Status f = t->rows->failure(); !f.ok()) ts->set_failure(std::string(f.message()));
  }
}

void ParameterServer::Shutdown() {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    CollectReadyLocked(&completions);
  }
  snapshots_.Close();
  RunCompletions(&completions);
}

ParameterServer::Counters ParameterServer::counters() {
  absl::MutexLock lock(&mu_);
  return counters_;
}

}  // namespace pstrain
