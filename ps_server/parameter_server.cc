#include "ps_server/parameter_server.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/base/tensor.h"

namespace pstrain {

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
  async_admitted_ = 0;
  worker_clock_.assign(model_->num_workers, 0);
  async_cursors_.assign(model_->num_workers, StepCursor());
  held_.Reset(model_->num_workers);
  worker_session_.assign(model_->num_workers, 0);
  session_start_step_.assign(model_->num_workers, -1);
  holding_pushes_ = false;
  rows_in_flight_ = 0;
  // Shards of the run before are not this run's (one being written is
  // dropped when done, by its incarnation).
  snapshots_.Reset(incarnation_);
}

absl::Status ParameterServer::Initialize(const InitializeRequest& request) {
  // Checked in NewModel.
  const int num_parts = std::max(1, request.num_parts());
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model, NewServerModel(request));
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

absl::Status ParameterServer::CheckIncarnationLocked(uint64_t incarnation) const {
  if (shut_down_) return absl::UnavailableError("parameter server is shutting down");
  if (!initialized_) return absl::UnavailableError("parameter server not initialized yet");
  if (incarnation != incarnation_ && incarnation == replaced_incarnation_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request from cluster incarnation ", incarnation, ", whose state this server dropped ",
        absl::ToInt64Seconds(absl::Now() - replaced_at_),
        " s ago when its chief initialized it again for incarnation ", incarnation_,
        " (a rollback, or a new run): register with the chief again"));
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

int64_t ParameterServer::MinWorkerClockLocked() const {
  return worker_clock_.empty() ? 0 : *std::min_element(worker_clock_.begin(), worker_clock_.end());
}

std::string ParameterServer::WaitingOnLocked() const {
  if (model_->sync) {
    return absl::StrCat("step ", version_, " has ", sync_.FewestOpen(), " of ",
                        model_->replicas_to_aggregate, " gradients (", sync_.open(),
                        " partition(s) open), waiting on worker(s) ",
                        absl::StrJoin(sync_.Missing(), ","));
  }
  std::vector<int> slowest;
  const int64_t min_clock = MinWorkerClockLocked();
  for (int w = 0; w < model_->num_workers; ++w) {
    if (worker_clock_[w] == min_clock) slowest.push_back(w);
  }
  return absl::StrCat("slowest worker(s) ", absl::StrJoin(slowest, ","), " at ", min_clock,
                      " pushes");
}

// ---------------------------------------------------------------------------
// Pull

absl::Status ParameterServer::CheckPullLocked(const PullRequest& request) const {
  RETURN_IF_ERROR(CheckIncarnationLocked(request.incarnation()));
  const int worker = request.worker();
  if (worker < -1 || worker >= model_->num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("Pull: worker ", worker,
                                                   " out of range; expected -1..",
                                                   model_->num_workers - 1));
  }
  if (request.timeout_ms() < 0) return absl::InvalidArgumentError("Pull: negative timeout_ms");
  if (request.wire_dtype() != DT_INVALID && request.wire_dtype() != DT_FLOAT &&
      request.wire_dtype() != DT_BFLOAT16) {
    return absl::InvalidArgumentError(
        absl::StrCat("Pull: wire_dtype ", request.wire_dtype(), " unsupported"));
  }
  if (request.min_own_pushes() != 0) {
    if (model_->sync || worker < 0) {
      return absl::InvalidArgumentError(
          "Pull: min_own_pushes is for a worker's pull in async mode");
    }
    // A worker has one push in flight at most: its next pull waits for
    // that one, never for pushes it has not begun (a pull that could only
    // time out is refused at once).
    if (request.min_own_pushes() < 0 || request.min_own_pushes() > worker_clock_[worker] + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Pull: min_own_pushes ", request.min_own_pushes(), " for worker ", worker,
          ", which has ", worker_clock_[worker], " push(es) applied here; at most one more"));
    }
  }
  return absl::OkStatus();
}

bool ParameterServer::ReadyLocked(const PullRequest& request, bool rows) const {
  if (shut_down_ || FinishedLocked()) return true;
  if (version_ < request.min_version()) return !sync_.failure().ok();
  const int worker = request.worker();
  if (request.min_own_pushes() > 0 && worker >= 0 &&
      worker < static_cast<int>(worker_clock_.size()) &&
      worker_clock_[worker] < request.min_own_pushes()) {
    return false;  // async, a worker's pull (CheckPullLocked)
  }
  const bool bounded = !model_->sync && model_->staleness_bound > 0 && worker >= 0 && !rows;
  return !bounded || worker_clock_[worker] - MinWorkerClockLocked() <= model_->staleness_bound;
}

bool ParameterServer::EarlyReadyLocked(const PullRequest& request) const {
  // bfloat16 pulls wait for the step: their rounding is cached for the
  // current buffers only, and each early one would convert (and allocate)
  // again for every worker.
  if (shut_down_ || !model_->sync || !sync_.failure().ok() || sync_.open() == 0 ||
      request.min_version() != version_ + 1 || request.refs_size() == 0 ||
      request.wire_dtype() == DT_BFLOAT16 ||
      (model_->max_steps > 0 && version_ + 1 >= model_->max_steps)) {
    return false;
  }
  for (const PartitionRef& ref : request.refs()) {
    auto it = model_->partitions.find(Key{ref.variable(), ref.partition()});
    if (it == model_->partitions.end() || it->second->next == nullptr) return false;
  }
  return true;
}

absl::Status ParameterServer::SnapshotLocked(const PullRequest& request, PullReply* reply,
                                             bool rows, bool early) {
  if (shut_down_) return absl::UnavailableError("parameter server is shutting down");
  if (version_ < request.min_version() && !sync_.failure().ok()) return sync_.failure();
  reply->version = early ? version_ + 1 : version_;
  reply->finished = !early && FinishedLocked();
  if (rows) return absl::OkStatus();
  reply->bfloat16 = request.wire_dtype() == DT_BFLOAT16;
  reply->tensors.clear();
  int64_t bytes = 0;
  const int element_bytes = reply->bfloat16 ? 2 : 4;
  auto add = [reply, &bytes, element_bytes, early](PartitionState* p) {
    absl::MutexLock lock(&p->mu);
    // `next` (guarded by mu_, held) is final once applied: nothing writes it
    // again, and it becomes `current` when the step is published.
    reply->tensors.push_back(
        {p->key.first, p->key.second, p->shape, early ? p->next : p->current, nullptr, p});
    bytes += p->size * element_bytes;
    p->pulls.fetch_add(1, std::memory_order_relaxed);
    p->pull_bytes.fetch_add(p->size * element_bytes, std::memory_order_relaxed);
  };
  if (request.refs_size() == 0) {
    for (auto& [key, p] : model_->partitions) add(p.get());
  } else {
    for (const PartitionRef& ref : request.refs()) {
      Key key{ref.variable(), ref.partition()};
      auto it = model_->partitions.find(key);
      if (it == model_->partitions.end()) {
        reply->tensors.clear();
        return absl::NotFoundError(absl::StrCat("Pull: no partition ", KeyString(key),
                                                " on this server"));
      }
      add(it->second.get());
    }
  }
  ++counters_.pulls;
  counters_.pull_payload_bytes += bytes;
  return absl::OkStatus();
}

ParameterServer::Serve ParameterServer::ServeLocked(const PullRequest& request, bool rows) const {
  if (ReadyLocked(request, rows)) return Serve::kNow;
  return !rows && EarlyReadyLocked(request) ? Serve::kEarly : Serve::kWait;
}

void ParameterServer::CollectReadyLocked(std::vector<Completion>* out) {
  parked_.TakeReady(
      [this](const ParkedPulls::Waiter& w, absl::Status* status, PullReply* reply)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            const Serve serve = ServeLocked(w.request, w.rows);
            if (serve == Serve::kWait) return false;
            *status = SnapshotLocked(w.request, reply, w.rows, serve == Serve::kEarly);
            return true;
          },
      out);
}

void ParameterServer::AttachBfloat16(PullReply* reply) {
  for (PulledTensor& t : reply->tensors) {
    t.bfloat16 = static_cast<PartitionState*>(t.source)->Bfloat16Of(t.values);
  }
}

void ParameterServer::RunCompletions(std::vector<Completion>* completions) {
  for (Completion& c : *completions) {
    if (c.status.ok() && c.reply.bfloat16) AttachBfloat16(&c.reply);
    c.done(std::move(c.status), std::move(c.reply));
  }
  completions->clear();
}

uint64_t ParameterServer::ServeOrParkLocked(const PullRequest& request, PullCallback done,
                                            bool rows, std::vector<Completion>* completions) {
  const Serve serve = ServeLocked(request, rows);
  if (serve == Serve::kWait) {
    const absl::Duration timeout = std::min(absl::Milliseconds(request.timeout_ms()), max_wait_);
    const uint64_t id = parked_.Park(request, absl::Now() + timeout, rows, std::move(done));
    timer_cv_.Signal();
    return id;
  }
  PullReply reply;
  absl::Status st = SnapshotLocked(request, &reply, rows, serve == Serve::kEarly);
  completions->push_back({std::move(done), std::move(st), std::move(reply)});
  return 0;
}

uint64_t ParameterServer::StartPull(const PullRequest& request, PullCallback done) {
  std::vector<Completion> completions;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    absl::Status st = CheckPullLocked(request);
    if (st.ok()) {
      id = ServeOrParkLocked(request, std::move(done), /*rows=*/false, &completions);
    } else {
      completions.push_back({std::move(done), std::move(st), PullReply()});
    }
  }
  RunCompletions(&completions);
  return id;
}

void ParameterServer::CancelPull(uint64_t id) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    if (!parked_.Cancel(id, absl::CancelledError("pull cancelled"), &completions)) return;
  }
  RunCompletions(&completions);
}

absl::Status ParameterServer::TimedOutLocked(const ParkedPulls::Waiter& w) const {
  const PullRequest& r = w.request;
  const absl::Duration timeout = std::min(absl::Milliseconds(r.timeout_ms()), max_wait_);
  return absl::DeadlineExceededError(absl::StrCat(
      w.rows ? "PullRows" : "Pull", " by worker ", r.worker(), " waited ",
      absl::FormatDuration(timeout), " for version >= ", r.min_version(),
      r.min_own_pushes() > 0
          ? absl::StrCat(" after its push ", r.min_own_pushes(), " (",
                         r.worker() >= 0 && r.worker() < static_cast<int>(worker_clock_.size())
                             ? worker_clock_[r.worker()]
                             : 0,
                         " applied)")
          : "",
      "; server at version ", version_, ": ", WaitingOnLocked()));
}

void ParameterServer::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!destroying_) {
    const absl::Time earliest = std::min(
        {sync_.deadline(), NextHeldPushExpiryLocked(), parked_.EarliestDeadline()});
    timer_wakes_at_ = earliest;
    timer_cv_.WaitWithDeadline(&mu_, earliest);
    timer_wakes_at_ = absl::InfinitePast();  // awake: it looks again before it sleeps
    if (destroying_) break;
    const absl::Time now = absl::Now();
    std::vector<Completion> expired;
    if (sync_.deadline() <= now && !shut_down_) ExpireSyncStepLocked(&expired);
    if (NextHeldPushExpiryLocked() < now) ExpireHeldPushesLocked(*model_, now, false);
    parked_.TakeExpired(
        now,
        [this](const ParkedPulls::Waiter& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return TimedOutLocked(w);
        },
        &expired);
    if (!expired.empty()) {
      mu_.Unlock();
      RunCompletions(&expired);
      mu_.Lock();
    }
  }
}

void ParameterServer::AwaitParked(uint64_t id, int64_t timeout_ms, absl::Notification* done) {
  // The timer ends the call at its deadline; past that (and a margin) it is
  // cancelled, which ends it at once.
  const absl::Duration bound =
      std::min(absl::Milliseconds(std::max<int64_t>(timeout_ms, 0)), max_wait_) +
      absl::Seconds(5);
  if (!done->WaitForNotificationWithTimeout(bound)) {
    CancelPull(id);
    done->WaitForNotification();
  }
}

absl::Status ParameterServer::Pull(const PullRequest& request, PullResponse* response) {
  absl::Notification done;
  absl::Status status;
  PullReply reply;
  const uint64_t id = StartPull(request, [&](absl::Status st, PullReply r) {
    status = std::move(st);
    reply = std::move(r);
    done.Notify();
  });
  AwaitParked(id, request.timeout_ms(), &done);
  if (!status.ok()) return status;
  response->set_version(reply.version);
  response->set_finished(reply.finished);
  int64_t copied = 0;
  for (const PulledTensor& t : reply.tensors) {
    NamedTensor* nt = response->add_tensors();
    nt->mutable_ref()->set_variable(t.variable);
    nt->mutable_ref()->set_partition(t.partition);
    ToProto(t.shape, *t.values, nt->mutable_tensor());
    copied += static_cast<int64_t>(t.values->size()) * 4;
  }
  absl::MutexLock lock(&mu_);
  counters_.pull_copied_bytes += copied;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Push

absl::Status ParameterServer::Push(const PushRequest& header, const SegmentedBytes& payload,
                                   PushResponse* response) {
  return PushImpl(header, &payload, nullptr, response);
}

absl::Status ParameterServer::Push(const PushRequest& request, PushResponse* response) {
  std::vector<SegmentedBytes> contents;
  contents.reserve(request.gradients_size());
  for (const NamedTensor& nt : request.gradients()) contents.emplace_back(nt.tensor().content());
  return PushImpl(request, nullptr, &contents, response);
}

absl::Status ParameterServer::PushImpl(const PushRequest& header, const SegmentedBytes* frame,
                                       const std::vector<SegmentedBytes>* contents,
                                       PushResponse* response) {
  std::shared_ptr<Model> model;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status st = CheckIncarnationLocked(header.incarnation()); !st.ok()) {
      if (!absl::IsUnavailable(st)) RejectLocked(Rejection::kIncarnation);
      return st;
    }
    if (header.worker() < 0 || header.worker() >= model_->num_workers) {
      RejectLocked(Rejection::kWorker);
      return absl::InvalidArgumentError(absl::StrCat("Push: worker ", header.worker(),
                                                     " out of range; expected 0..",
                                                     model_->num_workers - 1));
    }
    if (header.step() < 0) {
      RejectLocked(Rejection::kMalformed);
      return absl::InvalidArgumentError(absl::StrCat("Push: negative step ", header.step()));
    }
    // A push comes in at most one part per partition of this server.
    const int64_t max_parts = std::max<int64_t>(1, static_cast<int64_t>(model_->partitions.size()));
    if (header.num_parts() < 0 || header.num_parts() > max_parts || header.part() < 0 ||
        header.part() >= std::max(1, header.num_parts())) {
      RejectLocked(Rejection::kMalformed);
      return absl::InvalidArgumentError(
          absl::StrCat("Push: part ", header.part(), " of ", header.num_parts(),
                       "; this server takes a push in at most ", max_parts, " parts"));
    }
    model = model_;
  }
  const bool held = !model->sync && header.num_parts() > 1;
  std::vector<GradientRef> grads;
  absl::Status st = LocateGradients(*model, header, frame, contents, &grads);
  if (st.ok() && held && grads.empty()) {
    st = absl::InvalidArgumentError("Push: a part of a multi-part push carries no gradient");
  }
  if (!st.ok()) {
    absl::MutexLock lock(&mu_);
    RejectLocked(Rejection::kShape);
    return st;
  }
  if (model->sync) return PushSync(model, header, grads, response);
  if (!held) return PushAsync(model, header, grads, response);
  return PushAsyncPart(model, header, grads, response);
}

absl::Status ParameterServer::PushAsyncPart(const std::shared_ptr<Model>& model,
                                            const PushRequest& header,
                                            const std::vector<GradientRef>& grads,
                                            PushResponse* response) {
  const int w = header.worker();
  uint64_t id = 0;
  UpdateInfo update;
  {
    absl::MutexLock lock(&mu_);
    if (model_ != model) return absl::FailedPreconditionError("parameter server re-initialized");
    if (header.session() < worker_session_[w]) {
      // Refused at once (AdmitSessionLocked counts it).
      return AdmitSessionLocked(w, header.session(), "Push");
    }
    ExpireHeldPushesLocked(*model, absl::Now());
    if (!held_.IsPartOf(w, header)) {
      // The first of a push's parts to arrive waits while a cut holds new
      // pushes; its other parts do not (the cut waits for the push).
      RETURN_IF_ERROR(AwaitPushesReleasedLocked(model, "Push"));
    }
    HeldPushes::Push& h = held_.of(w);
    if (held_.IsEarlier(w, header)) {
      // A late part of an earlier push must not drop the one being received.
      RejectLocked(Rejection::kSuperseded);
      return absl::FailedPreconditionError(absl::StrCat(
          "Push: worker ", w, "'s part for step ", header.step(), " (session ",
          header.session(), ", push ", header.push_seq(), ") came after parts of its push for step ",
          h.step, " (session ", h.session, ", push ", h.seq, ")"));
    }
    if (!held_.IsPartOf(w, header)) {
      // What could refuse this part is checked before the push being
      // received is dropped (a refused part drops nothing), and that one is
      // dropped before this one is admitted (its slot toward max_steps and
      // its update number are free again).
      RETURN_IF_ERROR(AdmitSessionLocked(w, header.session(), "Push"));
      RETURN_IF_ERROR(CheckNotAheadLocked(header));
      if (h.open()) {
        LOG_WARN("worker {}'s push for step {} (session {}) dropped with {} of its {} parts in: "
                 "a part of another push came",
                 w, h.step, h.session, h.parts_in(), h.num_parts);
      }
      DropHeldPushLocked(w, "a part of a later push came");
      int64_t ticket = 0;
      absl::StatusOr<bool> admitted = AdmitAsyncLocked(*model, header, &ticket);
      if (!admitted.ok()) return admitted.status();
      held_.Start(w, header, absl::Now(), /*finished=*/!*admitted,
                  *admitted ? AsyncUpdate(*model, ticket, header.step()) : UpdateInfo());
      // Its deadline may come before the timer's next wake-up.
      if (h.started + model->held_push_ttl < timer_wakes_at_) timer_cv_.Signal();
    }
    if (h.got[header.part()]) {
      RejectLocked(Rejection::kDuplicate);
      return absl::InvalidArgumentError(absl::StrCat("Push: worker ", w, " sent part ",
                                                     header.part(), " of its push for step ",
                                                     header.step(), " twice"));
    }
    if (!h.closed.empty()) {
      RejectLocked(Rejection::kSuperseded);
      return absl::FailedPreconditionError(
          absl::StrCat("Push: worker ", w, "'s push for step ", header.step(), " (session ",
                       header.session(), ") takes no more parts: ", h.closed));
    }
    for (const GradientRef& g : grads) {
      if (h.partitions.count(g.partition) != 0) {
        RejectLocked(Rejection::kDuplicate);
        return absl::InvalidArgumentError(absl::StrCat("Push: worker ", w, " sent ",
                                                       KeyString(g.partition->key),
                                                       " in two parts of one push"));
      }
    }
    for (const GradientRef& g : grads) h.partitions.insert(g.partition);
    h.got[header.part()] = 1;
    if (h.finished) {
      response->set_outcome(FINISHED);
      response->set_version(version_);
      return absl::OkStatus();
    }
    ++parts_applying_;
    id = h.id;
    update = h.update;
  }
  // Checked, then applied from the received bytes, outside the lock.
  const GradientRef* bad = FirstNonFinite(grads);
  const int64_t bytes = bad == nullptr ? ApplyEach(*model, grads, update, &apply_seconds_) : 0;
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    --parts_applying_;
    counters_.push_payload_bytes += bytes;
    counters_.push_copied_bytes += bytes;
    if (model_ != model) return absl::FailedPreconditionError("parameter server re-initialized");
    HeldPushes::Push& h = held_.of(w);
    const bool current = h.id == id;
    if (bad != nullptr) {
      if (current) {
        DropHeldPushLocked(w, absl::StrCat("its part ", header.part(), " held a NaN or Inf"));
      }
      RejectLocked(Rejection::kNonFinite);
      return absl::InvalidArgumentError(
          absl::StrCat("gradient for ", KeyString(bad->partition->key), " contains NaN or Inf"));
    }
    if (!current || !h.closed.empty() || ++h.applied < h.num_parts) {
      // In the model; the push is not complete (or was dropped meanwhile:
      // then it never will be, and the worker's client sees no APPLIED).
      response->set_outcome(HELD);
      response->set_version(version_);
      return absl::OkStatus();
    }
    // The push's last part: it counts now, as one update.
    held_.Complete(w);
    --async_admitted_;
    ++version_;
    ++worker_clock_[w];
    ++counters_.pushes_applied;
    response->set_outcome(APPLIED);
    response->set_version(version_);
    response->set_own_pushes(worker_clock_[w]);
    CollectReadyLocked(&completions);
  }
  RunCompletions(&completions);
  return absl::OkStatus();
}

void ParameterServer::DropHeldPushLocked(int w, std::string why) {
  if (held_.Drop(w, std::move(why))) --async_admitted_;  // admitted, never to be counted
}

absl::Time ParameterServer::NextHeldPushExpiryLocked() const {
  if (model_ == nullptr || model_->sync) return absl::InfiniteFuture();
  return held_.NextExpiry(model_->held_push_ttl);
}

void ParameterServer::ExpireHeldPushesLocked(const Model& model, absl::Time now, bool throttled) {
  for (int w : held_.Overdue(now, model.held_push_ttl, throttled)) {
    const HeldPushes::Push& h = held_.of(w);
    LOG_WARN("worker {}'s push for step {} (session {}) dropped with {} of its {} parts in, "
             "after {}: past its deadline no part can still come (the parts in stay applied)",
             w, h.step, h.session, h.parts_in(), h.num_parts,
             absl::FormatDuration(absl::Trunc(now - h.started, absl::Milliseconds(1))));
    if (!h.finished) ++counters_.held_pushes_expired;
    DropHeldPushLocked(w, "its parts stopped coming (past the worker's push deadline)");
  }
}

// Sync, under mu_: admits the push of `header` for its step. Answers in
// `response` (true) what needs nothing more: finished, dropped as stale, a
// replay, or a partition-less server's step (completed into `completions`);
// else (false) marks the accepted gradients in flight, each noted in `push`
// with whether it completes its partition's quorum.
absl::StatusOr<bool> ParameterServer::AdmitSyncPushLocked(const std::shared_ptr<Model>& model,
                                                          const PushRequest& header,
                                                          const std::vector<GradientRef>& grads,
                                                          SyncPush* push,
                                                          std::vector<Completion>* completions,
                                                          PushResponse* response) {
  const int w = header.worker();
  const int64_t step = header.step();
  int replayed = 0;  // partitions the worker's earlier process had pushed already
  if (model_ != model) return absl::FailedPreconditionError("parameter server re-initialized");
  if (step > version_) {
    RejectLocked(Rejection::kAhead);
    return absl::FailedPreconditionError(absl::StrCat(
        "Push: step ", step, " is ahead of this server's version ", version_));
  }
  RETURN_IF_ERROR(AdmitSessionLocked(w, header.session(), "Push"));
  if (FinishedLocked()) {
    response->set_outcome(FINISHED);
    response->set_version(version_);
    return true;
  }
  if (!sync_.failure().ok()) return sync_.failure();
  if (step == version_) {
    sync_.SetCursor(w, {true, header.cursor_epoch(), header.cursor_position()});
    // The step's first gradient on this server starts its clock.
    if (sync_.Started(absl::Now(), model->step_deadline)) timer_cv_.Signal();
  }
  if (step == version_ && model->partitions.empty()) {
    // Nothing to aggregate: the step completes when the quorum has pushed.
    if (sync_.PushedEmpty(w)) {
      if (ReplayAllowedLocked(w, step)) {
        response->set_outcome(ACCUMULATED);  // its earlier process's push counted
        response->set_version(version_);
        return true;
      }
      RejectLocked(Rejection::kDuplicate);
      return absl::InvalidArgumentError(
          absl::StrCat("Push: worker ", w, " already pushed for step ", step));
    }
    if (sync_.PushEmpty(w) < model->replicas_to_aggregate) {
      response->set_outcome(ACCUMULATED);
      response->set_version(version_);
      return true;
    }
    sync_.ClearEmpty();
    CompleteStepLocked(step, model->replicas_to_aggregate, completions);
    response->set_outcome(APPLIED);
    response->set_version(version_);
    return true;
  }
  if (step == version_) {
    for (const GradientRef& g : grads) {
      PartitionState* p = g.partition;
      if (sync_.Has(p->index, w)) {
        if (ReplayAllowedLocked(w, step)) {
          ++replayed;  // the same gradient as its earlier process's: taken once
          continue;
        }
        RejectLocked(Rejection::kDuplicate);
        return absl::InvalidArgumentError(absl::StrCat("Push: worker ", w, " already pushed ",
                                                       KeyString(p->key), " for step ", step));
      }
      // A closed partition's quorum is complete.
      if (!sync_.Closed(p->index)) push->accepted.push_back(&g);
    }
  }
  if (push->accepted.empty() && replayed > 0) {
    response->set_outcome(ACCUMULATED);
    response->set_version(version_);
    return true;
  } else if (push->accepted.empty()) {
    ++counters_.gradients_dropped_stale;
    response->set_outcome(DROPPED_STALE);
    response->set_version(version_);
    return true;
  }
  for (const GradientRef* g : push->accepted) {
    // When every other gradient the quorum needs is staged already, this
    // one completes it (unless the step ends first): it is applied from the
    // received bytes, never staged.
    push->direct.push_back(sync_.Begin(g->partition->index, w));
  }
  return false;
}

// Outside the lock, checks each gradient for NaN and Inf, and stages the
// ones that do not complete their quorum: the one copy, from the received
// bytes into this worker's buffer, checked while it is in cache. Only this
// push writes staging[w] of these partitions now (in_flight), and their
// applies wait for it.
void ParameterServer::StageSyncPush(int w, SyncPush* push) {
  for (size_t i = 0; i < push->accepted.size(); ++i) {
    const GradientRef* g = push->accepted[i];
    PartitionState* p = g->partition;
    push->payload += p->size * (g->bfloat16 ? 2 : 4);
    if (push->direct[i]) {
      if (push->non_finite == nullptr && !AllFinite(*g)) push->non_finite = p;
      continue;
    }
    std::vector<float>& stage = p->staging[w];
    if (static_cast<int64_t>(stage.size()) != p->size) stage.resize(p->size);  // first push only
    g->bytes->CopyFloatsTo(g->offset, p->size, g->bfloat16, stage.data());
    push->staged += p->size * (g->bfloat16 ? 2 : 4);
    if (push->non_finite == nullptr && !AllFinite(stage)) push->non_finite = p;
  }
}

// Sync, under mu_: the staged push arrives. Answers in `response` (true)
// when nothing is left to apply; else (false) `to_apply` holds the
// partitions whose quorum it completed, closed.
absl::StatusOr<bool> ParameterServer::ArriveSyncPushLocked(const std::shared_ptr<Model>& model,
                                                           int w, int64_t step, SyncPush* push,
                                                           std::vector<ToApply>* to_apply,
                                                           PushResponse* response) {
  size_t stale = 0;
  if (model_ == model) {  // (a re-Initialize replaced the step, and its indices)
    for (const GradientRef* g : push->accepted) sync_.End(g->partition->index, w);
  }
  counters_.push_payload_bytes += push->payload;
  counters_.push_copied_bytes += push->staged;
  counters_.push_staged_bytes += push->staged;
  if (push->non_finite != nullptr) {
    RejectLocked(Rejection::kNonFinite);
    return absl::InvalidArgumentError(
        absl::StrCat("gradient for ", KeyString(push->non_finite->key), " contains NaN or Inf"));
  }
  if (shut_down_) return absl::UnavailableError("parameter server is shutting down");
  if (model_ != model || step != version_) {
    ++counters_.gradients_dropped_stale;
    response->set_outcome(DROPPED_STALE);
    response->set_version(version_);
    return true;
  }
  for (size_t i = 0; i < push->accepted.size(); ++i) {
    const GradientRef* g = push->accepted[i];
    PartitionState* p = g->partition;
    if (sync_.Closed(p->index)) {  // the quorum completed while this copied (backup workers)
      ++stale;
      continue;
    }
    const int64_t bytes = p->size * (g->bfloat16 ? 2 : 4);
    if (push->direct[i] && sync_.Count(p->index) + 1 < model->replicas_to_aggregate) {
      // Cannot happen (see above); were it to, stage the gradient here,
      // where it is as safe as outside the lock, only slower.
      std::vector<float>& stage = p->staging[w];
      stage.resize(p->size);
      g->bytes->CopyFloatsTo(g->offset, p->size, g->bfloat16, stage.data());
      counters_.push_staged_bytes += bytes;
      push->direct[i] = false;
    }
    counters_.push_copied_bytes += push->direct[i] ? bytes : 0;  // into L1 chunks, as applied
    p->pushes.fetch_add(1, std::memory_order_relaxed);
    p->push_bytes.fetch_add(bytes, std::memory_order_relaxed);
    if (!sync_.Arrive(p->index, w)) continue;
    to_apply->push_back({p, sync_.Close(p->index), push->direct[i] ? g : nullptr});
  }
  if (stale > 0) ++counters_.gradients_dropped_stale;
  if (to_apply->empty()) {
    response->set_outcome(stale == push->accepted.size() ? DROPPED_STALE : ACCUMULATED);
    response->set_version(version_);
    return true;
  }
  return false;
}

absl::Status ParameterServer::PushSync(const std::shared_ptr<Model>& model,
                                       const PushRequest& header,
                                       const std::vector<GradientRef>& grads,
                                       PushResponse* response) {
  const int w = header.worker();
  const int64_t step = header.step();
  SyncPush push;
  {
    std::vector<Completion> empty_step;  // a partition-less server's completed step
    bool answered;
    {
      absl::MutexLock lock(&mu_);
      ASSIGN_OR_RETURN(answered,
                       AdmitSyncPushLocked(model, header, grads, &push, &empty_step, response));
    }
    if (answered) {
      RunCompletions(&empty_step);
      return absl::OkStatus();
    }
  }
  StageSyncPush(w, &push);
  std::vector<ToApply> to_apply;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(bool answered,
                     ArriveSyncPushLocked(model, w, step, &push, &to_apply, response));
    if (answered) return absl::OkStatus();
  }
  // Apply the closed partitions outside the lock; publish when the step's
  // last partition is done, all together, so a pull of the current version
  // sees all of a step or none of it. A pull of the next version may take a
  // partition as soon as it is applied (EarlyReadyLocked).
  std::vector<std::pair<PartitionState*, Buffer>> applied;
  for (const ToApply& a : to_apply) {
    applied.emplace_back(a.partition,
                         ApplyMean(*model, a.partition, a.workers, step, &apply_seconds_, a.direct,
                                   w));
  }
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    if (model_ != model) return absl::FailedPreconditionError("parameter server re-initialized");
    const bool completed_step = FinishPartitionsLocked(*model, &applied, step, &completions);
    response->set_outcome(completed_step ? APPLIED : ACCUMULATED);
    response->set_version(version_);
  }
  RunCompletions(&completions);
  return absl::OkStatus();
}

bool ParameterServer::FinishPartitionsLocked(
    const Model& model, std::vector<std::pair<PartitionState*, Buffer>>* applied, int64_t step,
    std::vector<Completion>* completions) {
  for (auto& [p, buffer] : *applied) p->next = std::move(buffer);
  if (!sync_.Applied(static_cast<int>(applied->size()))) {
    // Pulls of the next version whose partitions are all applied go now.
    CollectReadyLocked(completions);
    return false;
  }
  // Every partition is applied: publish them together.
  for (auto& [key, p] : model.partitions) {
    {
      absl::MutexLock plock(&p->mu);
      p->PublishLocked(std::move(p->next));
    }
    p->next = nullptr;
  }
  CompleteStepLocked(step, sync_.NextStep(), completions);
  return true;
}

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
  snapshots_.Enqueue(CutShard(*model_, step, incarnation_, cursors));
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
  if (model_ != model) return absl::FailedPreconditionError("parameter server re-initialized");
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
    return (async_admitted_ == 0 && rows_in_flight_ == 0 && parts_applying_ == 0) ||
           shut_down_ || model_ != model;
  };
  const absl::Duration timeout = std::min(absl::Milliseconds(request.timeout_ms()), max_wait_);
  const bool ok = mu_.AwaitWithTimeout(absl::Condition(&drained), timeout);
  if (!ok || shut_down_ || model_ != model) {
    if (model_ == model) holding_pushes_ = false;
    if (shut_down_) return absl::UnavailableError("parameter server is shutting down");
    if (model_ != model) return absl::FailedPreconditionError("parameter server re-initialized");
    return absl::DeadlineExceededError(absl::StrCat(
        "Snapshot: ", async_admitted_ + rows_in_flight_ + parts_applying_,
        " push(es) or parts still applying or awaiting parts after ",
        absl::FormatDuration(timeout)));
  }
  std::unique_ptr<ShardSnapshot> cut = CutShard(*model_, step, incarnation_, async_cursors_);
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

void ParameterServer::ExpireSyncStepLocked(std::vector<Completion>* completions) {
  sync_.ClearDeadline();
  if (!initialized_ || !model_->sync || FinishedLocked() || !sync_.failure().ok()) return;
  const std::shared_ptr<Model> model = model_;
  const int64_t step = version_;
  // Go on short only if every open partition has its minimum.
  const int fewest = model->partitions.empty() ? sync_.EmptyCount() : sync_.FewestOpen();
  if (fewest < model->min_replicas) {
    sync_.Fail(absl::DeadlineExceededError(absl::StrCat(
        "sync step ", step, " failed: its deadline (sync.step_deadline_ms ",
        absl::ToInt64Milliseconds(model->step_deadline),
        ", from the step's first gradient) passed with ", fewest, " of the ",
        model->min_replicas, " gradients it needs at least (sync.min_replicas); ",
        WaitingOnLocked())));
    snapshots_.FailAfter(version_, sync_.failure());
    CollectReadyLocked(completions);
    return;
  }
  if (model->partitions.empty()) {
    sync_.ClearEmpty();
    CompleteStepLocked(step, fewest, completions);
    return;
  }
  std::vector<std::pair<PartitionState*, std::vector<int>>> to_apply;
  for (auto& [key, p] : model->partitions) {
    if (!sync_.Closed(p->index)) to_apply.emplace_back(p.get(), sync_.Close(p->index));
  }
  if (to_apply.empty()) return;  // every partition is being applied by its last push
  // Apply outside the lock, as a push does; late pushes of this step find
  // their partitions closed and are dropped as stale.
  mu_.Unlock();
  std::vector<std::pair<PartitionState*, Buffer>> applied;
  for (auto& [p, workers] : to_apply) {
    applied.emplace_back(p, ApplyMean(*model, p, workers, step, &apply_seconds_));
  }
  mu_.Lock();
  if (model_ != model) return;
  FinishPartitionsLocked(*model, &applied, step, completions);
}

absl::Status ParameterServer::CheckNotAheadLocked(const PushRequest& header) {
  if (header.step() > version_) {
    RejectLocked(Rejection::kAhead);
    return absl::FailedPreconditionError(absl::StrCat(
        "Push: step ", header.step(), " is ahead of this server's version ", version_));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ParameterServer::AdmitAsyncLocked(const Model& model,
                                                       const PushRequest& header,
                                                       int64_t* ticket) {
  const int w = header.worker();
  RETURN_IF_ERROR(CheckNotAheadLocked(header));
  // Pushes admitted but not yet applied count, so max_steps is exact.
  if (model.max_steps > 0 && version_ + async_admitted_ >= model.max_steps) return false;
  ++async_admitted_;
  *ticket = version_ + async_admitted_;
  staleness_.Observe(static_cast<double>(*ticket - 1 - header.step()));
  // Where this worker's data stands once this push is in; a checkpoint's
  // cut is taken with no push in flight, so it matches what was applied.
  // (A push refused for a NaN, or dropped with parts missing, leaves it a
  // batch ahead: that batch is skipped on resume, as the run itself skipped
  // its gradient, or the part of it that never came.)
  async_cursors_[w] = {true, header.cursor_epoch(), header.cursor_position()};
  return true;
}

UpdateInfo ParameterServer::AsyncUpdate(const Model& model, int64_t ticket, int64_t step) {
  UpdateInfo update;
  update.learning_rate = model.learning_rate.At(ticket - 1);
  if (model.staleness_scaled_lr) {
    const int64_t staleness = ticket - 1 - step;
    if (staleness > 1) update.learning_rate /= static_cast<float>(staleness);
  }
  return update;
}

absl::Status ParameterServer::PushAsync(const std::shared_ptr<Model>& model,
                                        const PushRequest& header,
                                        const std::vector<GradientRef>& grads,
                                        PushResponse* response) {
  const int w = header.worker();
  int64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(AwaitPushesReleasedLocked(model, "Push"));
    RETURN_IF_ERROR(AdmitSessionLocked(w, header.session(), "Push"));
    absl::StatusOr<bool> admitted = AdmitAsyncLocked(*model, header, &ticket);
    if (!admitted.ok()) return admitted.status();
    if (!*admitted) {
      response->set_outcome(FINISHED);
      response->set_version(version_);
      return absl::OkStatus();
    }
  }
  // Validate every gradient in place before changing anything.
  if (const GradientRef* bad = FirstNonFinite(grads)) {
    absl::MutexLock lock(&mu_);
    if (model_ == model) --async_admitted_;
    RejectLocked(Rejection::kNonFinite);
    return absl::InvalidArgumentError(
        absl::StrCat("gradient for ", KeyString(bad->partition->key), " contains NaN or Inf"));
  }
  // This push is update `ticket` of the run.
  const int64_t bytes =
      ApplyEach(*model, grads, AsyncUpdate(*model, ticket, header.step()), &apply_seconds_);
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    // A re-Initialize while this applied replaced the model and its counts.
    if (model_ != model) return absl::FailedPreconditionError("parameter server re-initialized");
    --async_admitted_;
    ++version_;
    ++worker_clock_[w];
    ++counters_.pushes_applied;
    counters_.push_payload_bytes += bytes;
    counters_.push_copied_bytes += bytes;
    response->set_outcome(APPLIED);
    response->set_version(version_);
    response->set_own_pushes(worker_clock_[w]);
    CollectReadyLocked(&completions);
  }
  RunCompletions(&completions);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Embedding rows

absl::Status ParameterServer::CheckRowsRequestLocked(uint64_t incarnation, int worker,
                                                     const std::string& table,
                                                     Model::Table** out) const {
  RETURN_IF_ERROR(CheckIncarnationLocked(incarnation));
  if (worker < -1 || worker >= model_->num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker, " out of range; expected -1..", model_->num_workers - 1));
  }
  auto it = model_->tables.find(table);
  if (it == model_->tables.end()) {
    return absl::NotFoundError(absl::StrCat("no embedding table \"", table, "\""));
  }
  *out = it->second.get();
  return absl::OkStatus();
}

uint64_t ParameterServer::StartPullRows(const PullRowsRequest& request, PullRowsCallback done) {
  auto ids = std::make_shared<std::vector<uint64_t>>();
  absl::Status st = RowStore::DecodeIds(request.ids(), ids.get());
  std::vector<Completion> completions;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    Model::Table* table = nullptr;
    if (st.ok()) st = CheckRowsRequestLocked(request.incarnation(), request.worker(),
                                             request.table(), &table);
    if (st.ok() && request.timeout_ms() < 0) {
      st = absl::InvalidArgumentError("PullRows: negative timeout_ms");
    }
    if (st.ok() &&
        static_cast<int64_t>(ids->size()) * table->rows->dim() * 4 > RowStore::kMaxRowsBytes) {
      st = absl::InvalidArgumentError(absl::StrCat(
          "PullRows: ", ids->size(), " rows of ", table->rows->dim(), " floats exceed ",
          RowStore::kMaxRowsBytes, " bytes; pull them in parts"));
    }
    if (st.ok()) {
      // Rows follow the dense pull, which already waited for the version,
      // so this rarely waits; when it does, it is parked as a pull is. The
      // rows are looked up once the version is there, outside mu_ (the
      // model reference keeps the table alive through a re-initialisation),
      // on the thread that made it ready (a push completing the step).
      PullRequest wait;
      wait.set_incarnation(request.incarnation());
      wait.set_worker(request.worker());
      wait.set_min_version(request.min_version());
      wait.set_timeout_ms(request.timeout_ms());
      PullCallback lookup = [this, model = model_, table, ids, done = std::move(done)](
                                absl::Status status, PullReply reply) {
        PulledRows rows;
        if (status.ok()) {
          absl::StatusOr<PulledRows> found = rows_.Lookup(*table, *ids, reply.version);
          status = found.status();
          if (found.ok()) rows = *std::move(found);
        }
        if (status.ok()) {
          absl::MutexLock lock(&mu_);
          ++counters_.pulls;
          counters_.pull_payload_bytes += rows.floats * 4;
          counters_.pull_copied_bytes += rows.floats * 4;
        }
        done(std::move(status), std::move(rows));
      };
      id = ServeOrParkLocked(wait, std::move(lookup), /*rows=*/true, &completions);
    }
  }
  if (!st.ok()) {
    done(std::move(st), {});  // refused: `done` was not handed on
    return 0;
  }
  RunCompletions(&completions);
  return id;
}

absl::Status ParameterServer::PullRows(const PullRowsRequest& request,
                                       PullRowsResponse* response) {
  absl::Notification done;
  absl::Status status;
  PulledRows rows;
  const uint64_t id = StartPullRows(request, [&](absl::Status st, PulledRows r) {
    status = std::move(st);
    rows = std::move(r);
    done.Notify();
  });
  AwaitParked(id, request.timeout_ms(), &done);
  if (!status.ok()) return status;
  response->set_version(rows.version);
  response->set_dim(rows.dim);
  response->set_rows(reinterpret_cast<const char*>(rows.values->data()),
                     static_cast<size_t>(rows.floats) * sizeof(float));
  return absl::OkStatus();
}

absl::Status ParameterServer::PushRows(const PushRowsRequest& request,
                                       PushRowsResponse* response) {
  if (request.ids().size() % 8 != 0) {
    absl::MutexLock lock(&mu_);
    RejectLocked(Rejection::kMalformed);
    return absl::InvalidArgumentError(absl::StrCat(
        "PushRows: ", request.ids().size(), " bytes of ids is not a whole number of uint64"));
  }
  PushRowsRequest header;
  header.set_incarnation(request.incarnation());
  header.set_worker(request.worker());
  header.set_step(request.step());
  header.set_table(request.table());
  header.set_session(request.session());
  header.set_num_ids(static_cast<int64_t>(request.ids().size() / 8));
  SegmentedBytes payload(request.ids());
  payload.Append(request.gradients());
  return PushRows(header, payload, response);
}

absl::Status ParameterServer::PushRows(const PushRowsRequest& request,
                                       const SegmentedBytes& payload,
                                       PushRowsResponse* response) {
  std::vector<uint64_t> ids;
  std::vector<float> grads;
  bool oversize = false;
  absl::Status st = RowStore::DecodePushIds(request, payload, &ids, &oversize);
  const Rejection refused = oversize ? Rejection::kSize : Rejection::kMalformed;
  const int64_t grad_bytes = payload.size() - static_cast<int64_t>(ids.size()) * 8;
  std::shared_ptr<Model> model;
  Model::Table* table = nullptr;
  auto reject = [this](absl::Status status, Rejection reason) {
    absl::MutexLock lock(&mu_);
    if (!absl::IsUnavailable(status)) RejectLocked(reason);
    return status;
  };
  // The table's checks of ids and values: OUT_OF_RANGE for an id outside a
  // fixed-size table, INVALID_ARGUMENT for NaN or Inf.
  auto values_reason = [](const absl::Status& status) {
    return absl::IsOutOfRange(status) ? Rejection::kOutOfRange : Rejection::kNonFinite;
  };
  if (!st.ok()) return reject(st, refused);
  {
    absl::MutexLock lock(&mu_);
    st = CheckRowsRequestLocked(request.incarnation(), request.worker(), request.table(), &table);
    if (st.ok() && request.worker() < 0) st = absl::InvalidArgumentError("PushRows: no worker");
    if (st.ok() && request.step() < 0) {
      RejectLocked(Rejection::kMalformed);
      return absl::InvalidArgumentError(absl::StrCat("PushRows: negative step ", request.step()));
    }
    if (!st.ok()) {
      // CheckRowsRequestLocked: FAILED_PRECONDITION (incarnation), NOT_FOUND
      // (no such table), INVALID_ARGUMENT (the worker).
      if (!absl::IsUnavailable(st)) {
        RejectLocked(absl::IsFailedPrecondition(st) ? Rejection::kIncarnation
                     : absl::IsNotFound(st)         ? Rejection::kShape
                                                    : Rejection::kWorker);
      }
      return st;
    }
    model = model_;
  }
  if (absl::Status bad = RowStore::DecodePushGradients(request, payload, *table, ids, &grads);
      !bad.ok()) {
    return reject(bad, Rejection::kShape);
  }
  // Sync stages the rows for later, so they are checked now; async's apply
  // checks them itself, changing nothing when they are refused.
  if (model->sync) {
    if (absl::Status bad = table->rows->CheckGradients(ids, grads.data()); !bad.ok()) {
      return reject(bad, values_reason(bad));
    }
  }
  const int w = request.worker();
  float learning_rate = 0;
  int64_t version = 0;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(AwaitPushesReleasedLocked(model, "PushRows"));
    RETURN_IF_ERROR(AdmitSessionLocked(w, request.session(), "PushRows"));
    if (request.step() > version_) {
      RejectLocked(Rejection::kAhead);
      return absl::FailedPreconditionError(absl::StrCat(
          "PushRows: step ", request.step(), " is ahead of this server's version ", version_));
    }
    response->set_version(version_);
    if (FinishedLocked()) {
      response->set_outcome(FINISHED);
      return absl::OkStatus();
    }
    counters_.push_payload_bytes += grad_bytes;
    counters_.push_copied_bytes += grad_bytes;
    if (model->sync) {
      if (!sync_.failure().ok()) return sync_.failure();
      if (request.step() < version_) {
        ++counters_.gradients_dropped_stale;
        response->set_outcome(DROPPED_STALE);
        return absl::OkStatus();
      }
      if (absl::Status full = RowStore::Stage(table, w, version_, ids, grads); !full.ok()) {
        RejectLocked(Rejection::kSize);
        return full;
      }
      response->set_outcome(ACCUMULATED);
      return absl::OkStatus();
    }
    version = version_;
    learning_rate = table->learning_rate.At(version_);
    if (model->staleness_scaled_lr && version_ - request.step() > 1) {
      learning_rate /= static_cast<float>(version_ - request.step());
    }
    ++rows_in_flight_;
  }
  st = RowStore::ApplyNow(table, ids, grads, learning_rate, version);
  {
    absl::MutexLock lock(&mu_);
    if (model_ == model) --rows_in_flight_;
  }
  if (!st.ok()) return reject(st, values_reason(st));
  response->set_outcome(APPLIED);
  return absl::OkStatus();
}

absl::Status ParameterServer::LoadRows(const LoadRowsRequest& request,
                                       LoadRowsResponse* response) {
  std::vector<uint64_t> ids;
  RETURN_IF_ERROR(RowStore::DecodeIds(request.ids(), &ids));
  Model::Table* table = nullptr;
  std::shared_ptr<Model> model;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckRowsRequestLocked(request.incarnation(), -1, request.table(), &table));
    model = model_;
  }
  ASSIGN_OR_RETURN(const int64_t rows, RowStore::Load(*model, table, ids, request));
  absl::MutexLock lock(&mu_);
  if (model_ != model) return absl::FailedPreconditionError("parameter server re-initialized");
  response->set_rows(rows);
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
  for (size_t w = 0; w < worker_clock_.size(); ++w) {
    WorkerProgress* wp = response->add_workers();
    const StepCursor& c = model_->sync ? sync_.completed_cursors()[w] : async_cursors_[w];
    if (!model_->sync) wp->set_pushes_applied(worker_clock_[w]);
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
