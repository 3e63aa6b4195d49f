// ParameterServer's pulls: when a pull is ready, serving it from the current
// (or, early, the next) version, parking it with its callback until then, and
// the timer that ends parked pulls and late sync steps at their deadlines.
// The class's contract and locking are in parameter_server.h.

#include "ps_server/parameter_server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/base/tensor.h"

namespace pstrain {

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
    if (request.min_own_pushes() < 0 || request.min_own_pushes() > async_.pushes(worker) + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Pull: min_own_pushes ", request.min_own_pushes(), " for worker ", worker,
          ", which has ", async_.pushes(worker), " push(es) applied here; at most one more"));
    }
  }
  return absl::OkStatus();
}

bool ParameterServer::ReadyLocked(const PullRequest& request, bool rows) const {
  if (shut_down_ || FinishedLocked()) return true;
  if (version_ < request.min_version()) return !sync_.failure().ok();
  const int worker = request.worker();
  if (request.min_own_pushes() > 0 && worker >= 0 && worker < async_.num_workers() &&
      async_.pushes(worker) < request.min_own_pushes()) {
    return false;  // async, a worker's pull (CheckPullLocked)
  }
  const bool bounded = !model_->sync && worker >= 0 && !rows;
  return !bounded || async_.WithinBound(worker, model_->staleness_bound);
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
                         async_.pushes(r.worker()), " applied)")
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

}  // namespace pstrain
