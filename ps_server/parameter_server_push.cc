// ParameterServer's pushes: decoding a push, admitting it (session, step,
// staleness), sync aggregation per partition up to the step's end or its
// deadline, and async applies, whole or in parts. The class's contract and
// locking are in parameter_server.h.

#include "ps_server/parameter_server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace pstrain {

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
    if (model_ != model) return ReinitializedError();
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
                  *admitted ? AsyncClock::Update(*model, ticket, header.step()) : UpdateInfo());
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
  const OverBound over = bad == nullptr ? FirstOverBound(*model, grads) : OverBound();
  const int64_t bytes = bad == nullptr && over.partition == nullptr
                            ? ApplyEach(*model, grads, update, &apply_seconds_)
                            : 0;
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    --parts_applying_;
    counters_.push_payload_bytes += bytes;
    counters_.push_copied_bytes += bytes;
    if (model_ != model) return ReinitializedError();
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
    if (over.partition != nullptr) {
      if (current) {
        DropHeldPushLocked(w, absl::StrCat("its part ", header.part(), " was over the bound"));
      }
      RejectLocked(Rejection::kOverBound);
      return absl::InvalidArgumentError(OverBoundMessage(over));
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
    AsyncAppliedLocked(w, response, &completions);
  }
  RunCompletions(&completions);
  return absl::OkStatus();
}

void ParameterServer::AsyncAppliedLocked(int w, PushResponse* response,
                                         std::vector<Completion>* completions) {
  const int64_t own_pushes = async_.Applied(w);
  ++version_;
  ++counters_.pushes_applied;
  response->set_outcome(APPLIED);
  response->set_version(version_);
  response->set_own_pushes(own_pushes);
  CollectReadyLocked(completions);
}

void ParameterServer::DropHeldPushLocked(int w, std::string why) {
  if (held_.Drop(w, std::move(why))) async_.Abandon();  // admitted, never to be counted
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
  if (model_ != model) return ReinitializedError();
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
void ParameterServer::StageSyncPush(const ServerModel& model, int w, SyncPush* push) {
  if (model.max_gradient_norm > 0 || model.max_relative_gradient_norm > 0) {
    std::vector<GradientRef> accepted;
    for (const GradientRef* g : push->accepted) accepted.push_back(*g);
    push->over_bound = FirstOverBound(model, accepted);
  }
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
  if (push->over_bound.partition != nullptr) {
    RejectLocked(Rejection::kOverBound);
    return absl::InvalidArgumentError(OverBoundMessage(push->over_bound));
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
  StageSyncPush(*model, w, &push);
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
    if (model_ != model) return ReinitializedError();
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
  // Pushes admitted but not yet applied count, so max_steps is exact. The
  // worker's cursor is where its data stands once this push is in; a
  // checkpoint's cut is taken with no push in flight, so it matches what
  // was applied. (A push refused for a NaN, or dropped with parts missing,
  // leaves it a batch ahead: that batch is skipped on resume, as the run
  // itself skipped its gradient, or the part of it that never came.)
  *ticket = async_.Admit(w, version_, model.max_steps,
                         {true, header.cursor_epoch(), header.cursor_position()});
  if (*ticket == 0) return false;
  staleness_.Observe(static_cast<double>(*ticket - 1 - header.step()));
  return true;
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
    if (model_ == model) async_.Abandon();
    RejectLocked(Rejection::kNonFinite);
    return absl::InvalidArgumentError(
        absl::StrCat("gradient for ", KeyString(bad->partition->key), " contains NaN or Inf"));
  }
  if (const OverBound over = FirstOverBound(*model, grads); over.partition != nullptr) {
    absl::MutexLock lock(&mu_);
    if (model_ == model) async_.Abandon();
    RejectLocked(Rejection::kOverBound);
    return absl::InvalidArgumentError(OverBoundMessage(over));
  }
  // This push is update `ticket` of the run.
  const int64_t bytes =
      ApplyEach(*model, grads, AsyncClock::Update(*model, ticket, header.step()), &apply_seconds_);
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    // A re-Initialize while this applied replaced the model and its counts.
    if (model_ != model) return ReinitializedError();
    counters_.push_payload_bytes += bytes;
    counters_.push_copied_bytes += bytes;
    AsyncAppliedLocked(w, response, &completions);
  }
  RunCompletions(&completions);
  return absl::OkStatus();
}
}  // namespace pstrain
