#include "ps_server/in_process_client.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/base/segmented_bytes.h"
#include "common/base/status_macros.h"
#include "common/client/ps_requests.h"

namespace pstrain {
namespace {

// `st` with what failed in front, as FromGrpcStatus names a failed RPC.
absl::Status Named(const absl::Status& st, absl::string_view what) {
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat(what, ": ", st.message()));
}

int64_t Millis(absl::Duration d) {
  return absl::ToInt64Milliseconds(std::max(d, absl::ZeroDuration()));
}

}  // namespace

// One full pull: a parked call per server, answered by the servers'
// callbacks (on this thread when ready at once, else on the thread that
// makes it ready, times it out or cancels it). Shared with the callbacks,
// so a pull dropped early is freed by the last of them.
struct InProcessPsClient::PendingPull {
  absl::Mutex mu;
  int pending ABSL_GUARDED_BY(mu) = 0;
  std::vector<absl::Status> status ABSL_GUARDED_BY(mu);
  std::vector<PullReply> replies ABSL_GUARDED_BY(mu);
  std::vector<uint64_t> ids;  // per server, for CancelPull (0: answered at once)
};

InProcessPsClient::InProcessPsClient(std::vector<ParameterServer*> servers,
                                     const Placement* placement, int worker)
    : servers_(std::move(servers)), placement_(placement), worker_(worker) {}

std::string InProcessPsClient::ServerName(int s) { return absl::StrCat("ps:", s, " (in-process)"); }

absl::Status InProcessPsClient::InitializeAll(const TrainingConfig& config, uint64_t fingerprint,
                                              int num_workers, int64_t start_step,
                                              const std::vector<Tensor>& params,
                                              absl::Duration /*startup_timeout*/,
                                              const OptimizerState* optimizer_state) {
  ASSIGN_OR_RETURN(InitializeCalls calls,
                   InitializeRequests(*placement_, incarnation_, config, fingerprint, num_workers,
                                      start_step, params, optimizer_state, 4 << 20));
  for (size_t r = 0; r < calls.size(); ++r) {
    const int s = calls.server(r);
    absl::Status st = servers_[s]->Initialize(calls.Request(r));
    // A retried Initialize that already landed is fine, as over gRPC.
    if (!st.ok() && !absl::IsAlreadyExists(st)) {
      return Named(st, absl::StrCat("Initialize ", ServerName(s)));
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<InProcessPsClient::PendingPull> InProcessPsClient::StartPull(
    const std::vector<int64_t>& min_versions, absl::Duration wait,
    const std::vector<int64_t>& min_own_pushes) {
  auto pull = std::make_shared<PendingPull>();
  const int n = num_servers();
  {
    absl::MutexLock lock(&pull->mu);
    pull->pending = n;
    pull->status.assign(n, absl::OkStatus());
    pull->replies.resize(n);
  }
  pull->ids.assign(n, 0);
  for (int s = 0; s < n; ++s) {
    PullRequest request;  // no refs: every partition of the server
    request.set_incarnation(incarnation_);
    request.set_worker(worker_);
    request.set_min_version(min_versions.empty() ? 0 : min_versions[s]);
    if (!min_own_pushes.empty()) request.set_min_own_pushes(min_own_pushes[s]);
    request.set_timeout_ms(Millis(wait));
    request.set_wire_dtype(DT_FLOAT);
    pull->ids[s] = servers_[s]->StartPull(request, [pull, s](absl::Status st, PullReply reply) {
      absl::MutexLock lock(&pull->mu);
      pull->status[s] = std::move(st);
      pull->replies[s] = std::move(reply);
      --pull->pending;
    });
  }
  return pull;
}

absl::Status InProcessPsClient::FinishPull(PendingPull* pull, absl::Time deadline,
                                           const std::vector<float*>& destinations,
                                           PullResult* result) {
  auto done = [pull]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pull->mu) { return pull->pending == 0; };
  bool answered;
  {
    // The servers end each parked call at its own deadline; this guards
    // against one that does not.
    absl::MutexLock lock(&pull->mu);
    answered = pull->mu.AwaitWithDeadline(absl::Condition(&done), deadline + absl::Seconds(5));
  }
  if (!answered) {
    for (int s = 0; s < num_servers(); ++s) {
      if (pull->ids[s] != 0) servers_[s]->CancelPull(pull->ids[s]);
    }
  }
  absl::MutexLock lock(&pull->mu);
  // A cancel runs its callback at once (or a completion under way does);
  // bounded all the same: the callbacks share the pull, so giving up here
  // leaves nothing of theirs dangling.
  if (!pull->mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(5))) {
    return absl::DeadlineExceededError("pull: a server did not answer its cancelled call");
  }
  PullAssembly assembly(*placement_, num_servers(), result);
  for (int s = 0; s < num_servers(); ++s) {
    RETURN_IF_ERROR(Named(pull->status[s], absl::StrCat("Pull from ", ServerName(s))));
    const PullReply& reply = pull->replies[s];
    result->versions[s] = reply.version;
    result->finished &= reply.finished;
    for (const PulledTensor& t : reply.tensors) {
      if (t.values == nullptr) {
        return absl::DataLossError(absl::StrCat(ServerName(s), " sent ", t.variable, "/",
                                                t.partition, " without values"));
      }
      ASSIGN_OR_RETURN(const PullAssembly::Part part,
                       assembly.Take(s, t.variable, t.partition,
                                     static_cast<int64_t>(t.values->size()), &ServerName));
      const int64_t row = placement_->variables()[part.variable].spec.row_elements();
      std::copy(t.values->begin(), t.values->end(),
                destinations[part.variable] + part.partition->row_begin * row);
      counters_.pull_payload_bytes += static_cast<int64_t>(t.values->size()) * 4;
      counters_.pull_copied_bytes += static_cast<int64_t>(t.values->size()) * 4;
    }
  }
  // The version buffers go back to their servers now.
  for (PullReply& reply : pull->replies) reply.tensors.clear();
  return assembly.Complete();
}

void InProcessPsClient::PrefetchPull(const std::vector<int64_t>& min_versions,
                                     absl::Duration wait,
                                     const std::vector<int64_t>& min_own_pushes, bool as_is) {
  DropPrefetch();
  prefetch_ = StartPull(min_versions, wait, min_own_pushes);
  prefetch_versions_ = min_versions;
  prefetch_as_is_ = as_is;
}

void InProcessPsClient::DropPrefetch() {
  if (prefetch_ == nullptr) return;
  for (int s = 0; s < num_servers(); ++s) {
    if (prefetch_->ids[s] != 0) servers_[s]->CancelPull(prefetch_->ids[s]);
  }
  prefetch_.reset();  // the last callback frees it
}

absl::Status InProcessPsClient::PullInto(const std::vector<int64_t>& min_versions,
                                         absl::Duration wait,
                                         const std::vector<float*>& destinations,
                                         PullResult* result) {
  if (destinations.size() != placement_->variables().size()) {
    return absl::InvalidArgumentError("PullInto: destinations do not match the placement");
  }
  if (before_pull_) before_pull_(min_versions);
  const absl::Time deadline = absl::Now() + std::max(wait, absl::ZeroDuration());
  if (prefetch_ != nullptr && prefetch_versions_ == min_versions) {
    std::shared_ptr<PendingPull> pull = std::move(prefetch_);
    absl::Status st = FinishPull(pull.get(), deadline, destinations, result);
    // As GrpcPsClient: a server already past what it answered when this
    // worker's push came back (backup workers completed a step without
    // it) is pulled again, for the newer version.
    bool again = !st.ok();
    for (size_t s = 0; st.ok() && !prefetch_as_is_ && s < pushed_versions_.size(); ++s) {
      again |= result->versions[s] < pushed_versions_[s];
    }
    if (!again) {
      ++counters_.prefetched_pulls;
      return absl::OkStatus();
    }
    if (!st.ok() && absl::Now() >= deadline) return st;
  }
  DropPrefetch();
  std::shared_ptr<PendingPull> pull = StartPull(min_versions, deadline - absl::Now(), {});
  return FinishPull(pull.get(), deadline, destinations, result);
}

// A push: each Ready sends one call per server with the ready variables'
// partitions, read in place from the caller's memory (the server returns
// once it has staged or applied them); Wait sends the rest.
class InProcessPsClient::InProcessPush final : public PsClient::Push {
 public:
  InProcessPush(InProcessPsClient* client, std::vector<int64_t> steps,
                std::vector<const float*> sources)
      : client_(client),
        seq_(++client->pushes_started_),
        steps_(std::move(steps)),
        sources_(std::move(sources)),
        pushed_(sources_.size(), 0),
        server_used_(client->num_servers(), 0),
        replies_(client->num_servers()) {}
  ~InProcessPush() override { Detach(); }

  // The push is over (or its client going): nothing more is sent.
  void Detach() {
    if (client_ != nullptr && client_->push_ == this) client_->push_ = nullptr;
    client_ = nullptr;
  }

  absl::Status Ready(size_t first, size_t end) override {
    if (client_ == nullptr) return absl::FailedPreconditionError("Push::Ready after the push ended");
    const auto& vars = client_->placement_->variables();
    if (first > end || end > vars.size()) {
      return absl::InvalidArgumentError("Push::Ready: bad range");
    }
    std::vector<size_t> ready;
    for (size_t v = first; v < end; ++v) {
      if (!pushed_[v]) ready.push_back(v);
      pushed_[v] = 1;
    }
    for (const PartitionGroup& g : GroupPartitions(*client_->placement_, ready, 0, 4, false)) {
      PushRequest header = Header(g.server);
      SegmentedBytes payload;
      for (const auto& [v, part] : g.parts) {
        const int64_t row = vars[v].spec.row_elements();
        const int64_t bytes = part->num_rows() * row * 4;
        NamedTensor* nt = header.add_gradients();
        SetRef(vars[v].spec, *part, nt->mutable_ref());
        nt->mutable_tensor()->set_dtype(DT_FLOAT);
        for (int64_t d : PartitionShape(vars[v].spec, *part)) nt->mutable_tensor()->add_shape(d);
        payload.Append(absl::string_view(
            reinterpret_cast<const char*>(sources_[v] + part->row_begin * row), bytes));
        client_->counters_.push_payload_bytes += bytes;
      }
      Call(g.server, header, payload);
    }
    return absl::OkStatus();
  }

  void SetSource(size_t v, const float* source) override {
    if (v < sources_.size() && !pushed_[v]) sources_[v] = source;
  }

  absl::Status Wait(std::vector<PushOutcome>* outcomes) override {
    if (client_ == nullptr) return absl::FailedPreconditionError("Push::Wait after the push ended");
    InProcessPsClient* client = client_;
    client->own_pushes_.assign(client->num_servers(), -1);
    RETURN_IF_ERROR(Ready(0, sources_.size()));
    // A server without partitions still counts the push (sync quorum).
    for (int s = 0; s < client->num_servers(); ++s) {
      if (!server_used_[s]) Call(s, Header(s), SegmentedBytes());
    }
    Detach();
    RETURN_IF_ERROR(failed_);
    client->pushed_versions_ = replies_.versions();
    client->own_pushes_ = replies_.own_pushes();
    return replies_.Outcomes(&InProcessPsClient::ServerName, outcomes);
  }

 private:
  PushRequest Header(int s) const {
    PushRequest header;
    header.set_incarnation(client_->incarnation_);
    header.set_worker(client_->worker_);
    header.set_step(steps_[s]);
    header.set_cursor_epoch(client_->cursor_epoch_);
    header.set_cursor_position(client_->cursor_position_);
    header.set_session(client_->session_);
    header.set_push_seq(seq_);
    return header;
  }
  // A failure is kept for Wait, as a failed gRPC call's is.
  void Call(int s, const PushRequest& header, const SegmentedBytes& payload) {
    server_used_[s] = 1;
    PushResponse response;
    absl::Status st = client_->servers_[s]->Push(header, payload, &response);
    if (!st.ok()) {
      if (failed_.ok()) failed_ = Named(st, absl::StrCat("Push to ", ServerName(s)));
      return;
    }
    replies_.Add(s, response);
  }

  InProcessPsClient* client_;  // null once the push is over
  const uint64_t seq_;         // PushRequest.push_seq
  const std::vector<int64_t> steps_;
  std::vector<const float*> sources_;  // (SetSource names the null ones)
  std::vector<char> pushed_;       // per variable
  std::vector<char> server_used_;  // per server
  PushReplies replies_;
  absl::Status failed_;
};

InProcessPsClient::~InProcessPsClient() {
  DropPrefetch();
  if (push_ != nullptr) push_->Detach();
}

absl::StatusOr<std::unique_ptr<PsClient::Push>> InProcessPsClient::StartPush(
    const std::vector<int64_t>& steps, const std::vector<const float*>& sources) {
  if (push_ != nullptr) return absl::FailedPreconditionError("StartPush: a push is under way");
  if (sources.size() != placement_->variables().size() ||
      static_cast<int>(steps.size()) != num_servers()) {
    return absl::InvalidArgumentError("StartPush: gradients or steps do not match the placement");
  }
  auto push = std::make_unique<InProcessPush>(this, steps, sources);
  push_ = push.get();
  return std::unique_ptr<Push>(std::move(push));
}

absl::Status InProcessPsClient::PullRows(const std::string& table, int dim,
                                         absl::Span<const uint64_t> ids, int64_t min_version,
                                         absl::Duration wait, float* out, int64_t* version) {
  const std::vector<std::vector<uint32_t>> by = RowsByServer(ids, num_servers());
  int64_t oldest = -1;
  const int64_t row_bytes = int64_t{dim} * 4;
  for (int s : ServersWithRows(by)) {
    const std::string what = absl::StrCat("PullRows ", table, " from ", ServerName(s));
    PullRowsRequest request;
    request.set_incarnation(incarnation_);
    request.set_worker(worker_);
    request.set_table(table);
    request.set_ids(IdBytes(ids, by[s]));
    request.set_min_version(min_version);
    request.set_timeout_ms(Millis(wait));
    PullRowsResponse response;
    RETURN_IF_ERROR(Named(servers_[s]->PullRows(request, &response), what));
    if (response.dim() != dim ||
        static_cast<int64_t>(response.rows().size()) !=
            static_cast<int64_t>(by[s].size()) * row_bytes) {
      return absl::DataLossError(absl::StrCat(what, ": ", response.rows().size(),
                                              " bytes of rows of width ", response.dim(), " for ",
                                              by[s].size(), " ids of width ", dim));
    }
    const char* p = response.rows().data();
    for (uint32_t i : by[s]) {
      std::memcpy(out + static_cast<size_t>(i) * dim, p, row_bytes);
      p += row_bytes;
    }
    if (oldest < 0 || response.version() < oldest) oldest = response.version();
  }
  counters_.pull_payload_bytes += static_cast<int64_t>(ids.size()) * dim * 4;
  counters_.pull_copied_bytes += static_cast<int64_t>(ids.size()) * dim * 4;
  if (version != nullptr) *version = oldest;
  return absl::OkStatus();
}

absl::Status InProcessPsClient::PushRows(const std::string& table, int dim,
                                         absl::Span<const uint64_t> ids, const float* grads,
                                         const std::vector<int64_t>& steps,
                                         std::vector<PushOutcome>* outcomes) {
  if (static_cast<int>(steps.size()) != num_servers()) {
    return absl::InvalidArgumentError("PushRows: one step per server expected");
  }
  const std::vector<std::vector<uint32_t>> by = RowsByServer(ids, num_servers());
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  outcomes->assign(num_servers(), PUSH_OUTCOME_UNSPECIFIED);
  for (int s : ServersWithRows(by)) {
    PushRowsRequest request;
    request.set_incarnation(incarnation_);
    request.set_worker(worker_);
    request.set_step(steps[s]);
    request.set_session(session_);
    request.set_table(table);
    request.set_ids(IdBytes(ids, by[s]));
    std::string* gradients = request.mutable_gradients();
    gradients->resize(by[s].size() * row_bytes);
    char* p = gradients->data();
    for (uint32_t i : by[s]) {
      std::memcpy(p, grads + static_cast<size_t>(i) * dim, row_bytes);
      p += row_bytes;
    }
    PushRowsResponse response;
    RETURN_IF_ERROR(Named(servers_[s]->PushRows(request, &response),
                          absl::StrCat("PushRows ", table, " to ", ServerName(s))));
    (*outcomes)[s] = response.outcome();
  }
  counters_.push_payload_bytes += static_cast<int64_t>(ids.size()) * dim * 4;
  counters_.push_copied_bytes += static_cast<int64_t>(ids.size()) * dim * 4;
  return absl::OkStatus();
}

absl::Status InProcessPsClient::LoadRows(const std::string& table, int dim,
                                         absl::Span<const uint64_t> ids, const float* values,
                                         const std::vector<const float*>& slots,
                                         absl::Span<const int64_t> updates,
                                         absl::Span<const int64_t> touched) {
  for (const auto& [s, request] : LoadRowsRequests(incarnation_, num_servers(), table, dim, ids,
                                                   values, slots, updates, touched)) {
    LoadRowsResponse response;
    RETURN_IF_ERROR(Named(servers_[s]->LoadRows(request, &response),
                          absl::StrCat("LoadRows ", table, " to ", ServerName(s))));
  }
  return absl::OkStatus();
}

absl::Status InProcessPsClient::ShutdownAll(const std::string& /*reason*/) {
  for (int s = 0; s < num_servers(); ++s) {
    PsStatusResponse status;
    servers_[s]->GetStatus(&status);
    if (status.initialized() && status.incarnation() != incarnation_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Shutdown ", ServerName(s), ": Shutdown from another cluster incarnation refused"));
    }
    servers_[s]->Shutdown();
  }
  return absl::OkStatus();
}

absl::Status InProcessPsClient::SnapshotAll(int64_t step, absl::Duration timeout,
                                            std::vector<SnapshotResponse>* responses) {
  responses->assign(num_servers(), SnapshotResponse());
  for (int s = 0; s < num_servers(); ++s) {
    SnapshotRequest request;
    request.set_incarnation(incarnation_);
    request.set_step(step);
    request.set_timeout_ms(Millis(timeout));
    RETURN_IF_ERROR(Named(servers_[s]->Snapshot(request, &(*responses)[s]),
                          absl::StrCat("Snapshot ", ServerName(s), " step ", step)));
  }
  return absl::OkStatus();
}

absl::Status InProcessPsClient::GetShard(int server, int64_t step, absl::Duration timeout,
                                         GetShardResponse* response) {
  GetShardRequest request;
  request.set_incarnation(incarnation_);
  request.set_step(step);
  request.set_timeout_ms(Millis(timeout));
  return Named(servers_[server]->GetShard(request, response),
               absl::StrCat("GetShard ", ServerName(server), " step ", step));
}

absl::Status InProcessPsClient::GetStatus(int server, PsStatusResponse* response) {
  servers_[server]->GetStatus(response);
  return absl::OkStatus();
}

absl::Status InProcessPsClient::ClaimSession(int server, int32_t session,
                                             PsStatusResponse* response) {
  return Named(servers_[server]->GetStatus(worker_, session, response),
               absl::StrCat("GetStatus ", ServerName(server)));
}

}  // namespace pstrain
