#include "ps_server/parameter_server.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/status_macros.h"

namespace pstrain {

ParameterServer::ParameterServer(absl::Duration max_wait) : max_wait_(max_wait) {}

std::string ParameterServer::KeyString(const Key& key) {
  return absl::StrCat(key.first, "/part", key.second);
}

absl::Status ParameterServer::Initialize(const InitializeRequest& request) {
  TrainingConfig config = request.config();
  RETURN_IF_ERROR(ValidateAndFillDefaults(&config, "(from Initialize)"));
  if (request.incarnation() == 0) {
    return absl::InvalidArgumentError("Initialize: incarnation must be non-zero");
  }
  if (request.num_workers() <= 0 || request.num_workers() > 100000) {
    return absl::InvalidArgumentError("Initialize: num_workers must be 1..100000");
  }
  int replicas = request.num_workers();
  if (config.has_sync() && config.sync().replicas_to_aggregate() > 0) {
    replicas = config.sync().replicas_to_aggregate();
    if (replicas > request.num_workers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Initialize: replicas_to_aggregate ", replicas, " exceeds the ",
                       request.num_workers(), " workers"));
    }
  }
  if (request.start_step() < 0) return absl::InvalidArgumentError("Initialize: negative start_step");
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer, CreateOptimizer(config.optimizer()));
  std::map<Key, PartitionState> partitions;
  for (const NamedTensor& nt : request.variables()) {
    Key key{nt.ref().variable(), nt.ref().partition()};
    absl::StatusOr<Tensor> t = FromProto(nt.tensor());
    if (!t.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Initialize: ", KeyString(key), ": ", t.status().message()));
    }
    if (key.first.empty() || key.second < 0) {
      return absl::InvalidArgumentError("Initialize: empty variable name or negative partition");
    }
    if (!AllFinite(t->span())) {
      return absl::InvalidArgumentError(absl::StrCat("Initialize: ", KeyString(key), " not finite"));
    }
    if (!partitions.emplace(key, PartitionState{std::move(*t), {}}).second) {
      return absl::InvalidArgumentError(absl::StrCat("Initialize: duplicate ", KeyString(key)));
    }
  }

  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("parameter server is shutting down");
  if (initialized_ && incarnation_ == request.incarnation()) {
    return absl::AlreadyExistsError("already initialized for this incarnation");
  }
  initialized_ = true;
  incarnation_ = request.incarnation();
  sync_ = IsSyncMode(config);
  num_workers_ = request.num_workers();
  replicas_to_aggregate_ = replicas;
  staleness_bound_ = config.has_async() ? config.async().staleness_bound() : 0;
  max_steps_ = config.max_steps();
  optimizer_ = std::move(optimizer);
  partitions_ = std::move(partitions);
  version_ = request.start_step();
  pending_.clear();
  worker_clock_.assign(num_workers_, 0);
  return absl::OkStatus();
}

absl::Status ParameterServer::CheckIncarnationLocked(uint64_t incarnation) const {
  if (shut_down_) return absl::UnavailableError("parameter server is shutting down");
  if (!initialized_) return absl::UnavailableError("parameter server not initialized yet");
  if (incarnation != incarnation_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request from cluster incarnation ", incarnation, ", this server serves ", incarnation_,
        " (a task from an earlier run?)"));
  }
  return absl::OkStatus();
}

bool ParameterServer::FinishedLocked() const { return max_steps_ > 0 && version_ >= max_steps_; }

int64_t ParameterServer::MinWorkerClockLocked() const {
  return worker_clock_.empty() ? 0 : *std::min_element(worker_clock_.begin(), worker_clock_.end());
}

std::string ParameterServer::WaitingOnLocked() const {
  if (sync_) {
    std::vector<int> missing;
    for (int w = 0; w < num_workers_; ++w) {
      if (pending_.count(w) == 0) missing.push_back(w);
    }
    return absl::StrCat("step ", version_, " has ", pending_.size(), " of ",
                        replicas_to_aggregate_, " gradients, waiting on worker(s) ",
                        absl::StrJoin(missing, ","));
  }
  std::vector<int> slowest;
  const int64_t min_clock = MinWorkerClockLocked();
  for (int w = 0; w < num_workers_; ++w) {
    if (worker_clock_[w] == min_clock) slowest.push_back(w);
  }
  return absl::StrCat("slowest worker(s) ", absl::StrJoin(slowest, ","), " at ", min_clock,
                      " pushes");
}

absl::Status ParameterServer::Pull(const PullRequest& request, PullResponse* response) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckIncarnationLocked(request.incarnation()));
  const int worker = request.worker();
  if (worker < -1 || worker >= num_workers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Pull: worker ", worker, " out of range; expected -1..", num_workers_ - 1));
  }
  if (request.timeout_ms() < 0) return absl::InvalidArgumentError("Pull: negative timeout_ms");
  const bool bounded = !sync_ && staleness_bound_ > 0 && worker >= 0;
  auto ready = [this, &request, worker, bounded]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shut_down_ || FinishedLocked()) return true;
    if (version_ < request.min_version()) return false;
    return !bounded || worker_clock_[worker] - MinWorkerClockLocked() <= staleness_bound_;
  };
  const absl::Duration timeout = std::min(absl::Milliseconds(request.timeout_ms()), max_wait_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "Pull by worker ", worker, " waited ", absl::FormatDuration(timeout), " for version >= ",
        request.min_version(), "; server at version ", version_, ": ", WaitingOnLocked()));
  }
  if (shut_down_) return absl::UnavailableError("parameter server is shutting down");
  response->set_version(version_);
  response->set_finished(FinishedLocked());
  auto add = [response](const Key& key, const PartitionState& p) {
    NamedTensor* nt = response->add_tensors();
    nt->mutable_ref()->set_variable(key.first);
    nt->mutable_ref()->set_partition(key.second);
    ToProto(p.value, nt->mutable_tensor());
  };
  if (request.refs_size() == 0) {
    for (const auto& [key, p] : partitions_) add(key, p);
  } else {
    for (const PartitionRef& ref : request.refs()) {
      Key key{ref.variable(), ref.partition()};
      auto it = partitions_.find(key);
      if (it == partitions_.end()) {
        response->Clear();
        return absl::NotFoundError(absl::StrCat("Pull: no partition ", KeyString(key),
                                                " on this server"));
      }
      add(key, it->second);
    }
  }
  ++counters_.pulls;
  return absl::OkStatus();
}

absl::Status ParameterServer::ValidateGradientsLocked(
    const std::vector<std::pair<Key, Tensor>>& grads) const {
  std::set<Key> seen;
  for (const auto& [key, t] : grads) {
    auto it = partitions_.find(key);
    if (it == partitions_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown variable partition ", KeyString(key)));
    }
    if (t.shape() != it->second.value.shape()) {
      return absl::InvalidArgumentError(absl::StrCat("gradient for ", KeyString(key), " has shape ",
                                                     t.ShapeString(), ", variable has ",
                                                     it->second.value.ShapeString()));
    }
    if (!AllFinite(t.span())) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient for ", KeyString(key), " contains NaN or Inf"));
    }
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate gradient for ", KeyString(key)));
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterServer::Push(const PushRequest& request, PushResponse* response) {
  // Decode outside the lock; nothing is applied until everything validated.
  std::vector<std::pair<Key, Tensor>> grads;
  grads.reserve(request.gradients_size());
  absl::Status decode_status;
  for (const NamedTensor& nt : request.gradients()) {
    Key key{nt.ref().variable(), nt.ref().partition()};
    absl::StatusOr<Tensor> t = FromProto(nt.tensor());
    if (!t.ok()) {
      decode_status = absl::InvalidArgumentError(
          absl::StrCat("gradient for ", KeyString(key), ": ", t.status().message()));
      break;
    }
    grads.emplace_back(std::move(key), std::move(*t));
  }

  absl::MutexLock lock(&mu_);
  absl::Status st = CheckIncarnationLocked(request.incarnation());
  if (st.ok() && (request.worker() < 0 || request.worker() >= num_workers_)) {
    st = absl::InvalidArgumentError(absl::StrCat("Push: worker ", request.worker(),
                                                 " out of range; expected 0..", num_workers_ - 1));
  }
  if (st.ok()) st = decode_status;
  if (st.ok()) st = ValidateGradientsLocked(grads);
  if (st.ok() && request.step() > version_) {
    st = absl::FailedPreconditionError(absl::StrCat(
        "Push: step ", request.step(), " is ahead of this server's version ", version_));
  }
  if (!st.ok()) {
    if (!absl::IsUnavailable(st)) ++counters_.pushes_rejected;
    return st;
  }
  const int worker = request.worker();
  if (FinishedLocked()) {
    response->set_outcome(FINISHED);
  } else if (sync_) {
    if (request.step() < version_) {
      ++counters_.gradients_dropped_stale;
      response->set_outcome(DROPPED_STALE);
    } else if (pending_.count(worker) != 0) {
      ++counters_.pushes_rejected;
      return absl::InvalidArgumentError(
          absl::StrCat("Push: worker ", worker, " already pushed for step ", version_));
    } else {
      pending_.emplace(worker, std::move(grads));
      if (static_cast<int>(pending_.size()) >= replicas_to_aggregate_) {
        ApplySyncStepLocked();
        response->set_outcome(APPLIED);
      } else {
        response->set_outcome(ACCUMULATED);
      }
    }
  } else {
    for (auto& [key, g] : grads) {
      PartitionState& p = partitions_.at(key);
      optimizer_->Apply(absl::MakeSpan(p.value.values()), g.span(), &p.slots, version_ + 1);
    }
    ++version_;
    ++worker_clock_[worker];
    ++counters_.pushes_applied;
    response->set_outcome(APPLIED);
  }
  response->set_version(version_);
  return absl::OkStatus();
}

void ParameterServer::ApplySyncStepLocked() {
  // Sum per partition in worker-index order (pending_ is ordered by worker),
  // so the result is bitwise reproducible, then average and apply.
  std::map<Key, std::pair<std::vector<float>, int>> sums;
  for (const auto& [worker, grads] : pending_) {
    for (const auto& [key, g] : grads) {
      auto [it, fresh] = sums.try_emplace(key);
      std::vector<float>& sum = it->second.first;
      if (fresh) {
        sum = g.values();
      } else {
        const float* src = g.data();
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += src[i];
      }
      ++it->second.second;
    }
  }
  for (auto& [key, entry] : sums) {
    std::vector<float>& sum = entry.first;
    const float count = static_cast<float>(entry.second);
    for (float& v : sum) v /= count;
    PartitionState& p = partitions_.at(key);
    optimizer_->Apply(absl::MakeSpan(p.value.values()), sum, &p.slots, version_ + 1);
  }
  counters_.pushes_applied += static_cast<int64_t>(pending_.size());
  pending_.clear();
  ++version_;
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
}

void ParameterServer::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
}

ParameterServer::Counters ParameterServer::counters() {
  absl::MutexLock lock(&mu_);
  return counters_;
}

}  // namespace pstrain
