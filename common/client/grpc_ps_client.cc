#include "common/client/grpc_ps_client.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/bfloat16.h"
#include "common/rpc/call_window.h"
#include "common/rpc/fan_out.h"
#include "common/base/embedding_ids.h"
#include "common/rpc/rpc.h"
#include "common/base/status_macros.h"
#include "common/base/tsan_handoff.h"
#include "common/client/ps_requests.h"
#include "common/rpc/wire_frame.h"

namespace pstrain {
namespace {

const char kPullMethod[] = "/pstrain.PsService/Pull";
const char kPushMethod[] = "/pstrain.PsService/Push";

}  // namespace

// One step's push, started in parts and finished together. The frames point
// at the caller's gradients (or bf16_grads_); gRPC releases each slice once it
// no longer needs the bytes, and Wait returns only after all were released,
// so the caller may overwrite its gradients once it returns.
struct GrpcPsClient::PushBatch {
  struct Call {
    int server = 0;
    grpc::ClientContext context;
    grpc::ByteBuffer request, response;
    grpc::Status status;
  };
  uint64_t seq = 0;  // PushRequest.push_seq
  std::vector<int64_t> steps;
  std::vector<const float*> sources;
  std::vector<char> pushed;       // per variable
  std::vector<char> server_used;  // per server: a call was started
  std::vector<int64_t> bf16_offsets;
  std::vector<uint16_t> kept_bf16;  // a batch kept for gRPC keeps the bf16 bytes too
  std::deque<Call> calls;         // stable addresses while gRPC holds them
  absl::Mutex mu;
  int pending ABSL_GUARDED_BY(mu) = 0;  // calls not yet completed
  int slices ABSL_GUARDED_BY(mu) = 0;   // payload slices gRPC still holds
  std::atomic<bool> abandoned{false};   // calls still waiting in a window end unsent
};

// The handle: owns the batch until Wait has its replies (or, abandoned,
// until its calls ended). Its client knows it as push_ while it is under way.
class GrpcPsClient::GrpcPush final : public PsClient::Push {
 public:
  GrpcPush(GrpcPsClient* client, std::unique_ptr<PushBatch> batch)
      : client_(client), batch_(std::move(batch)) {}
  ~GrpcPush() override { Abandon(); }

  absl::Status Ready(size_t first, size_t end) override;
  void SetSource(size_t v, const float* source) override {
    if (v < batch_->sources.size() && !batch_->pushed[v]) batch_->sources[v] = source;
  }
  absl::Status Wait(std::vector<PushOutcome>* outcomes) override;
  // Waits for (or cancels) the calls in flight and sends nothing more.
  void Abandon();

 private:
  // Waits for the calls to end and gRPC to release their slices.
  absl::Status WaitForCalls();
  void StartCall(int server, const PushRequest& header, std::vector<OutgoingPayload> payload);
  PushRequest Header(int server) const;
  // The push is over: the client may start the next.
  void Finish() {
    if (client_ != nullptr && client_->push_ == this) client_->push_ = nullptr;
    client_ = nullptr;
  }

  GrpcPsClient* client_;  // null once the push is over
  std::unique_ptr<PushBatch> batch_;
};

GrpcPsClient::GrpcPsClient(const ClusterSpec& cluster, const Placement* placement, int worker,
                           absl::Duration rpc_timeout)
    : placement_(placement), worker_(worker), rpc_timeout_(rpc_timeout) {
  for (int s = 0; s < cluster.num_ps(); ++s) {
    addresses_.push_back(cluster.address(kPsJob, s));
    std::shared_ptr<grpc::Channel> channel =
        CreateChannel(addresses_.back(), TaskId{kPsJob, s}.ToString());
    stubs_.push_back(PsService::NewStub(channel));
    raw_stubs_.emplace_back().push_back(std::make_unique<grpc::GenericStub>(channel));
    next_connection_.emplace_back(0);
  }
  set_calls_in_flight(kDefaultCallsInFlight);
}

void GrpcPsClient::set_connections_per_server(int connections) {
  connections = std::max(connections, 1);
  // Their calls refer to the stubs.
  if (push_ != nullptr) push_->Abandon();
  DropPrefetch();
  for (int s = 0; s < num_servers(); ++s) {
    raw_stubs_[s].resize(1);
    for (int k = 1; k < connections; ++k) {
      raw_stubs_[s].push_back(std::make_unique<grpc::GenericStub>(
          CreateChannel(addresses_[s], TaskId{kPsJob, s}.ToString(), k)));
    }
    next_connection_[s].store(0, std::memory_order_relaxed);
  }
}

grpc::GenericStub* GrpcPsClient::NextStub(int s) {
  const auto& stubs = raw_stubs_[s];
  if (stubs.size() == 1) return stubs[0].get();
  const size_t k = next_connection_[s].fetch_add(1, std::memory_order_relaxed) % stubs.size();
  return stubs[k].get();
}

std::vector<grpc::GenericStub*> GrpcPsClient::NextStubs(const std::vector<int>& servers) {
  std::vector<grpc::GenericStub*> stubs;
  for (int s : servers) stubs.push_back(NextStub(s));
  return stubs;
}

void GrpcPsClient::set_calls_in_flight(int calls) {
  // Their calls refer to the windows.
  if (push_ != nullptr) push_->Abandon();
  DropPrefetch();
  pull_windows_.clear();
  push_windows_.clear();
  for (int s = 0; s < num_servers(); ++s) {
    pull_windows_.push_back(std::make_unique<CallWindow>(calls));
    push_windows_.push_back(std::make_unique<CallWindow>(calls));
  }
}

int64_t GrpcPsClient::calls_waited() const {
  int64_t waited = 0;
  for (const auto* windows : {&pull_windows_, &push_windows_}) {
    for (const auto& w : *windows) waited += w->stats().waited;
  }
  return waited;
}

std::string GrpcPsClient::ServerName(int s) const {
  return absl::StrCat("ps:", s, " (", addresses_[s], ")");
}

absl::Status GrpcPsClient::InitializeAll(const TrainingConfig& config, uint64_t fingerprint,
                                     int num_workers, int64_t start_step,
                                     const std::vector<Tensor>& params,
                                     absl::Duration startup_timeout,
                                     const OptimizerState* optimizer_state) {
  // Each server's share in parts of up to 4 MiB of whole partitions, so no
  // message nears gRPC's cap.
  ASSIGN_OR_RETURN(InitializeCalls calls,
                   InitializeRequests(*placement_, incarnation_, config, fingerprint, num_workers,
                                      start_step, params, optimizer_state, 4 << 20));
  // A server that came up while a call waited for it refuses it as signed
  // before it started (common/security/auth.h kStartMargin): made again,
  // freshly signed (parts that landed answer ALREADY_EXISTS: fine).
  const absl::Time deadline = absl::Now() + startup_timeout;
  return RetrySignedBeforeStart(deadline,
                                [&] { return InitializeOnce(calls, deadline - absl::Now()); });
}

absl::Status GrpcPsClient::InitializeOnce(const InitializeCalls& calls, absl::Duration timeout) {
  // Each request is made as its call starts and freed as it ends: the
  // calls in flight hold a window's worth of the model, not a copy of it.
  std::vector<InitializeRequest> requests(calls.size());
  std::vector<InitializeResponse> responses(calls.size());
  return CallAll(
      static_cast<int>(calls.size()), timeout, /*wait_for_ready=*/true,
      [this, &calls](int r) { return absl::StrCat("Initialize ", ServerName(calls.server(r))); },
      [&](int r, grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
        requests[r] = calls.Request(r);
        stubs_[calls.server(r)]->async()->Initialize(
            ctx, &requests[r], &responses[r], [done, request = &requests[r]](grpc::Status g) {
              *request = InitializeRequest();
              // A retried Initialize that already landed is fine.
              if (g.error_code() == grpc::StatusCode::ALREADY_EXISTS) g = grpc::Status::OK;
              done(g);
            });
      },
      [this, &calls](int r) { return push_windows_[calls.server(r)].get(); });
}

std::vector<PullRequest> GrpcPsClient::PullRequests(const std::vector<int64_t>& min_versions,
                                                absl::Duration wait, std::vector<int>* servers,
                                                const std::vector<int64_t>& min_own_pushes) const {
  const auto& vars = placement_->variables();
  // One call per server for all its partitions (no refs: everything), or,
  // with chunk_bytes_, per group of whole partitions up to that size, in
  // flight together. A server without partitions still reports its version.
  const std::vector<PartitionGroup> groups = GroupPartitions(
      *placement_, AllVariables(*placement_), chunk_bytes_, 4, /*every_server=*/true);
  servers->clear();
  std::vector<PullRequest> requests(groups.size());
  for (size_t c = 0; c < groups.size(); ++c) {
    const int s = groups[c].server;
    servers->push_back(s);
    PullRequest& req = requests[c];
    req.set_incarnation(incarnation_);
    req.set_worker(worker_);
    req.set_min_version(min_versions.empty() ? 0 : min_versions[s]);
    if (!min_own_pushes.empty()) req.set_min_own_pushes(min_own_pushes[s]);
    req.set_timeout_ms(absl::ToInt64Milliseconds(wait));
    req.set_wire_dtype(wire_dtype_);
    for (const auto& [v, part] : groups[c].parts) {
      if (chunk_bytes_ > 0) SetRef(vars[v].spec, *part, req.add_refs());
    }
  }
  return requests;
}

// A pull started ahead of its PullInto: its calls and their replies.
struct GrpcPsClient::PullPrefetch {
  struct Call {
    grpc::ClientContext context;
    grpc::ByteBuffer request, response;
    grpc::Status status;  // written by gRPC's callback under mu
  };
  std::vector<int64_t> min_versions;
  DataType wire_dtype = DT_FLOAT;
  bool as_is = false;   // taken whatever the versions in the push's replies
  absl::Time deadline;  // of its calls
  std::vector<int> servers;
  std::deque<Call> calls;  // stable addresses while gRPC holds them
  absl::Mutex mu;
  int pending ABSL_GUARDED_BY(mu) = 0;
  std::vector<size_t> ended ABSL_GUARDED_BY(mu);  // calls, in the order they ended
  std::atomic<bool> dropped{false};  // calls still waiting in a window end unstarted
};

void GrpcPsClient::PrefetchPull(const std::vector<int64_t>& min_versions, absl::Duration wait,
                            const std::vector<int64_t>& min_own_pushes, bool as_is) {
  DropPrefetch();
  auto prefetch = std::make_unique<PullPrefetch>();
  PullPrefetch* p = prefetch.get();
  p->min_versions = min_versions;
  p->wire_dtype = wire_dtype_;
  p->as_is = as_is;
  p->deadline = absl::Now() + wait + rpc_timeout_;
  // The same calls as PullInto's (a call per variable instead, so that none
  // waits for a later layer's gradient, measured slower: more calls).
  const std::vector<PullRequest> requests =
      PullRequests(min_versions, wait, &p->servers, min_own_pushes);
  {
    absl::MutexLock lock(&p->mu);
    p->pending = static_cast<int>(requests.size());
  }
  for (const PullRequest& request : requests) {
    PullPrefetch::Call& call = p->calls.emplace_back();
    call.context.set_deadline(absl::ToChronoTime(p->deadline));
    call.request = SerializeMessage(request);
  }
  // Started last variable first: the backward pass pushes the last layer
  // first, so its partitions are applied (and answered) first, and a full
  // window is not held by calls that wait for the end of the step.
  for (size_t c = requests.size(); c-- > 0;) {
    PullPrefetch::Call& call = p->calls[c];
    StartInWindow(pull_windows_[p->servers[c]].get(), &p->dropped,
                  RawCall(NextStub(p->servers[c]), kPullMethod, &call),
                  [p, &call, c](grpc::Status st) {
                    absl::MutexLock lock(&p->mu);
                    call.status = std::move(st);
                    p->ended.push_back(c);
                    --p->pending;
                  });
  }
  prefetch_ = std::move(prefetch);
}

void GrpcPsClient::DropPrefetch() {
  if (prefetch_ == nullptr) return;
  PullPrefetch* p = prefetch_.get();
  p->dropped.store(true, std::memory_order_release);
  for (PullPrefetch::Call& call : p->calls) call.context.TryCancel();
  {
    // After TryCancel gRPC runs every callback promptly (a call still
    // waiting in its window ends without starting); they refer to p.
    absl::MutexLock lock(&p->mu);
    p->mu.Await(absl::Condition(
        +[](int* pending) { return *pending == 0; }, &p->pending));
  }
  prefetch_.reset();
}

bool GrpcPsClient::TakePrefetch(const std::vector<int64_t>& min_versions, absl::Time deadline,
                            const std::vector<float*>& destinations, PullResult* result,
                            absl::Status* status) {
  if (prefetch_ == nullptr) return false;
  PullPrefetch* p = prefetch_.get();
  if (p->min_versions != min_versions || p->wire_dtype != wire_dtype_) {
    DropPrefetch();
    return false;
  }
  // Each reply is checked and copied as soon as it is in, while the later
  // ones still travel (the copy overlaps the wait for the last partitions).
  PullAssembly assembly(*placement_, num_servers(), result);
  bool again = false;  // the parts straddled a step
  for (size_t k = 0; k < p->calls.size(); ++k) {
    size_t c = 0;
    {
      absl::MutexLock lock(&p->mu);
      auto in = [p, k]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu) { return p->ended.size() > k; };
      // gRPC enforces the calls' own deadline; this bounds the wait by the
      // caller's, and guards against a stuck library.
      if (!p->mu.AwaitWithDeadline(absl::Condition(&in),
                                   std::min(deadline, p->deadline + absl::Seconds(5)))) {
        again = true;
      } else {
        c = p->ended[k];
        if (!p->calls[c].status.ok()) {
          *status = FromGrpcStatus(p->calls[c].status,
                                   absl::StrCat("Pull from ", ServerName(p->servers[c])));
          again = true;
        }
      }
    }
    if (again) break;
    // Ended calls are not written by gRPC any more.
    *status = AssembleReply(p->servers[c], p->calls[c].response, destinations, &assembly, &again);
    if (!status->ok()) {
      DropPrefetch();
      return true;
    }
    if (again) break;
  }
  if (again) {
    DropPrefetch();
    return false;
  }
  *status = assembly.Complete();
  const bool as_is = p->as_is;
  prefetch_.reset();
  if (!status->ok()) return true;
  // A server already past what it answered when this worker's push came
  // back (backup workers completed a step without it): pull again, for the
  // newer version, as a pull made after the push would have.
  for (size_t s = 0; !as_is && s < pushed_versions_.size() && s < result->versions.size(); ++s) {
    again |= result->versions[s] < pushed_versions_[s];
  }
  if (!again) ++counters_.prefetched_pulls;
  return !again;
}

absl::Status GrpcPsClient::PullInto(const std::vector<int64_t>& min_versions, absl::Duration wait,
                                const std::vector<float*>& destinations, PullResult* result) {
  const auto& vars = placement_->variables();
  if (destinations.size() != vars.size()) {
    return absl::InvalidArgumentError("PullInto: destinations do not match the placement");
  }
  const absl::Time start = absl::Now();
  absl::Status taken;
  if (TakePrefetch(min_versions, start + wait + rpc_timeout_, destinations, result, &taken)) {
    return taken;
  }
  // What is left of the wait after the prefetched pull's; none left: the
  // prefetched pull's failure, which names what the servers waited for.
  wait = std::max(absl::ZeroDuration(), start + wait - absl::Now());
  if (wait == absl::ZeroDuration() && !taken.ok()) return taken;
  std::vector<int> servers;
  std::vector<PullRequest> requests = PullRequests(min_versions, wait, &servers);
  return RetryRefusedPull(wait, [&](absl::Duration left) {
    for (PullRequest& req : requests) req.set_timeout_ms(absl::ToInt64Milliseconds(left));
    // In sync mode a server's version cannot move while this worker has not
    // pushed, unless backup workers complete a step without it; then the
    // parts of one pull may straddle a step, and the pull is made again.
    for (int attempt = 0;; ++attempt) {
      bool straddled = false;
      absl::Status st = PullCalls(servers, requests, left, destinations, result, &straddled);
      if (!straddled) return st;
      if (attempt == 4) {
        return absl::AbortedError(
            "pull: a server's version moved between the parts of one pull 5 times in a row");
      }
    }
  });
}

absl::Status GrpcPsClient::RetryRefusedPull(
    absl::Duration wait, const std::function<absl::Status(absl::Duration)>& attempt) const {
  wait = std::max(wait, absl::ZeroDuration());
  const absl::Time deadline = absl::Now() + wait + rpc_timeout_;
  absl::Duration backoff = absl::Milliseconds(5);
  for (int refused = 0;; ++refused) {
    absl::Status st =
        attempt(std::clamp(deadline - rpc_timeout_ - absl::Now(), absl::ZeroDuration(), wait));
    if (!absl::IsResourceExhausted(st)) return st;
    if (absl::Now() + backoff >= deadline) {
      return refused == 0 ? st
                          : absl::ResourceExhaustedError(absl::StrCat(
                                st.message(), " (refused ", refused + 1, " times until its deadline)"));
    }
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, absl::Milliseconds(200));
  }
}

absl::Status GrpcPsClient::PullCalls(const std::vector<int>& servers,
                                 const std::vector<PullRequest>& pull_requests,
                                 absl::Duration wait, const std::vector<float*>& destinations,
                                 PullResult* result, bool* straddled) {
  const size_t n = servers.size();
  std::vector<grpc::ByteBuffer> requests(n), responses(n);
  for (size_t c = 0; c < n; ++c) requests[c] = SerializeMessage(pull_requests[c]);
  const std::vector<grpc::GenericStub*> stubs = NextStubs(servers);
  absl::Status st = CallAll(
      static_cast<int>(n), wait + rpc_timeout_, /*wait_for_ready=*/false,
      [this, &servers](int c) { return absl::StrCat("Pull from ", ServerName(servers[c])); },
      [&](int c, grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
        stubs[c]->UnaryCall(ctx, kPullMethod, grpc::StubOptions(), &requests[c], &responses[c],
                            std::move(done));
      },
      [this, &servers](int c) { return pull_windows_[servers[c]].get(); });
  if (!st.ok()) return st;
  PullAssembly assembly(*placement_, num_servers(), result);
  for (size_t c = 0; c < n; ++c) {
    RETURN_IF_ERROR(AssembleReply(servers[c], responses[c], destinations, &assembly, straddled));
    if (*straddled) return absl::OkStatus();
  }
  return assembly.Complete();
}

absl::Status GrpcPsClient::AssembleReply(int s, const grpc::ByteBuffer& response,
                                     const std::vector<float*>& destinations,
                                     PullAssembly* assembly, bool* straddled) {
  PullResult* result = assembly->result();
  // Checks that every partition arrives once, with its shape, that the
  // payload holds exactly those bytes, and that a server's parts all come
  // from one version.
  PullResponse header;
  IncomingFrame frame;
  absl::Status decoded = DecodeFrame(response, &header, &frame);
  if (!decoded.ok()) {
    return absl::DataLossError(absl::StrCat(ServerName(s), " sent a bad pull reply: ",
                                            decoded.message()));
  }
  if (result->versions[s] >= 0 && result->versions[s] != header.version()) {
    if (!mixed_versions_) {
      *straddled = true;
      return absl::OkStatus();
    }
    result->versions[s] = std::min(result->versions[s], header.version());
  } else {
    result->versions[s] = header.version();
  }
  result->finished &= header.finished();
  int64_t offset = 0;
  for (const NamedTensor& nt : header.tensors()) {
    const int p = nt.ref().partition();
    const TensorProto& t = nt.tensor();
    const int64_t elements =
        DenseFloatBytes(absl::MakeConstSpan(t.shape().data(), t.shape_size())) / 4;
    if (t.dtype() != wire_dtype_) {
      return absl::DataLossError(absl::StrCat(ServerName(s), " sent ", nt.ref().variable(), "/",
                                              p, " with the wrong dtype or shape"));
    }
    ASSIGN_OR_RETURN(const PullAssembly::Part part,
                     assembly->Take(s, nt.ref().variable(), p, elements,
                                    [this](int server) { return ServerName(server); }));
    const int64_t row = placement_->variables()[part.variable].spec.row_elements();
    const int64_t bytes = elements * (wire_dtype_ == DT_BFLOAT16 ? 2 : 4);
    if (frame.payload.size() - offset < bytes) {
      return absl::DataLossError(absl::StrCat(ServerName(s), " sent ", nt.ref().variable(), "/",
                                              p, " short of its bytes"));
    }
    frame.payload.CopyFloatsTo(offset, elements, wire_dtype_ == DT_BFLOAT16,
                               destinations[part.variable] + part.partition->row_begin * row);
    offset += bytes;
    counters_.pull_payload_bytes += bytes;
    counters_.pull_copied_bytes += bytes;
  }
  if (offset != frame.payload.size()) {
    return absl::DataLossError(absl::StrCat(ServerName(s), " sent ",
                                            frame.payload.size() - offset,
                                            " payload bytes beyond its tensors"));
  }
  return absl::OkStatus();
}

GrpcPsClient::~GrpcPsClient() {
  // A handle that outlives its client is the caller's bug; its calls refer
  // to this client's windows, so they end here.
  if (push_ != nullptr) push_->Abandon();
  DropPrefetch();
}

void GrpcPsClient::GrpcPush::Abandon() {
  if (client_ == nullptr) return;
  batch_->abandoned.store(true, std::memory_order_release);
  WaitForCalls().IgnoreError();
  batch_.reset();
  Finish();
}

absl::Status GrpcPsClient::GrpcPush::WaitForCalls() {
  PushBatch* batch = batch_.get();
  {
    absl::MutexLock lock(&batch->mu);
    auto done = [batch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(batch->mu) { return batch->pending == 0; };
    if (!batch->mu.AwaitWithTimeout(absl::Condition(&done),
                                    client_->push_timeout_ + absl::Seconds(5))) {
      // gRPC enforces the deadlines; this guards against a stuck library.
      batch->abandoned.store(true, std::memory_order_release);
      for (PushBatch::Call& call : batch->calls) call.context.TryCancel();
      batch->mu.Await(absl::Condition(&done));
    }
  }
  for (PushBatch::Call& call : batch->calls) call.request.Clear();  // our own slice references
  {
    absl::MutexLock lock(&batch->mu);
    auto released = [batch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(batch->mu) {
      return batch->slices == 0;
    };
    if (!batch->mu.AwaitWithTimeout(absl::Condition(&released), absl::Seconds(10))) {
      // The batch must outlive the slices' release callbacks, and the bytes
      // they point at must stay allocated: keep both (the caller's
      // gradients are its own; the bf16 copy goes with the batch).
      batch->kept_bf16.swap(client_->bf16_grads_);
      batch_.release();
      const char held[] = "gRPC still references the gradient buffers 10 s after the calls ended";
      // A call that failed is the cause (a server killed under it: its
      // transport may hold the slices until it is torn down), and says so.
      for (const PushBatch::Call& call : batch->calls) {
        if (!call.status.ok()) {
          const absl::Status failed = FromGrpcStatus(
              call.status, absl::StrCat("Push to ", client_->ServerName(call.server)));
          return absl::Status(failed.code(), absl::StrCat(failed.message(), "; ", held));
        }
      }
      return absl::InternalError(absl::StrCat("Push: ", held));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PsClient::Push>> GrpcPsClient::StartPush(
    const std::vector<int64_t>& steps, const std::vector<const float*>& sources) {
  const auto& vars = placement_->variables();
  if (push_ != nullptr) return absl::FailedPreconditionError("StartPush: a push is under way");
  if (sources.size() != vars.size() || static_cast<int>(steps.size()) != num_servers()) {
    return absl::InvalidArgumentError("StartPush: gradients or steps do not match the placement");
  }
  auto batch = std::make_unique<PushBatch>();
  batch->seq = ++pushes_started_;
  batch->steps = steps;
  batch->sources = sources;
  batch->pushed.assign(vars.size(), 0);
  batch->server_used.assign(num_servers(), 0);
  if (wire_dtype_ == DT_BFLOAT16) {
    int64_t total = 0;
    for (const VariablePlacement& vp : vars) {
      batch->bf16_offsets.push_back(total);
      total += vp.spec.num_elements();
    }
    bf16_grads_.resize(total);
  }
  auto push = std::make_unique<GrpcPush>(this, std::move(batch));
  push_ = push.get();
  return push;
}

PushRequest GrpcPsClient::GrpcPush::Header(int server) const {
  PushRequest header;
  header.set_incarnation(client_->incarnation_);
  header.set_worker(client_->worker_);
  header.set_step(batch_->steps[server]);
  header.set_cursor_epoch(client_->cursor_epoch_);
  header.set_cursor_position(client_->cursor_position_);
  header.set_session(client_->session_);
  header.set_push_seq(batch_->seq);
  return header;
}

void GrpcPsClient::GrpcPush::StartCall(int server, const PushRequest& header,
                                       std::vector<OutgoingPayload> payload) {
  PushBatch* batch = batch_.get();
  PushBatch::Call& call = batch->calls.emplace_back();
  call.server = server;
  SetDeadline(&call.context, client_->push_timeout_);
  call.request = EncodeFrame(header, std::move(payload));
  {
    absl::MutexLock lock(&batch->mu);
    ++batch->pending;
  }
  batch->server_used[server] = 1;
  StartInWindow(client_->push_windows_[server].get(), &batch->abandoned,
                RawCall(client_->NextStub(server), kPushMethod, &call),
                [batch, &call](grpc::Status st) {
                  absl::MutexLock lock(&batch->mu);
                  call.status = std::move(st);
                  --batch->pending;
                });
}

absl::Status GrpcPsClient::GrpcPush::Ready(size_t first, size_t end) {
  if (client_ == nullptr) return absl::FailedPreconditionError("Push::Ready after the push ended");
  const Placement& placement = *client_->placement_;
  const auto& vars = placement.variables();
  if (first > end || end > vars.size()) return absl::InvalidArgumentError("Push::Ready: bad range");
  PushBatch* batch = batch_.get();
  const bool bf16 = client_->wire_dtype_ == DT_BFLOAT16;
  std::vector<size_t> ready;
  for (size_t v = first; v < end; ++v) {
    if (batch->pushed[v]) continue;
    batch->pushed[v] = 1;
    ready.push_back(v);
    if (bf16) {
      // The one copy: round this variable's gradient into bf16_grads_.
      FloatsToBfloat16(batch->sources[v], vars[v].spec.num_elements(),
                       client_->bf16_grads_.data() + batch->bf16_offsets[v]);
      client_->counters_.push_copied_bytes += vars[v].spec.num_elements() * 2;
    }
  }
  // Per server, calls of up to chunk_bytes_ of whole partitions (or one).
  const std::vector<PartitionGroup> groups = GroupPartitions(
      placement, ready, client_->chunk_bytes_, bf16 ? 2 : 4, /*every_server=*/false);
  // A push started whole numbers each server's parts (async servers count
  // the push once, when its last part is in).
  const int servers = client_->num_servers();
  const bool whole = ready.size() == vars.size();
  std::vector<int> num_parts(servers, 0), next_part(servers, 0);
  for (const PartitionGroup& g : groups) ++num_parts[g.server];
  for (const PartitionGroup& g : groups) {
    PushRequest header = Header(g.server);
    if (whole && num_parts[g.server] > 1) {
      header.set_part(next_part[g.server]++);
      header.set_num_parts(num_parts[g.server]);
    }
    std::vector<OutgoingPayload> payload;
    for (const auto& [v, part] : g.parts) {
      const int64_t row = vars[v].spec.row_elements();
      const int64_t bytes = part->num_rows() * row * (bf16 ? 2 : 4);
      NamedTensor* nt = header.add_gradients();
      SetRef(vars[v].spec, *part, nt->mutable_ref());
      nt->mutable_tensor()->set_dtype(bf16 ? DT_BFLOAT16 : DT_FLOAT);
      for (int64_t d : PartitionShape(vars[v].spec, *part)) nt->mutable_tensor()->add_shape(d);
      const void* data =
          bf16 ? static_cast<const void*>(client_->bf16_grads_.data() + batch->bf16_offsets[v] +
                                          part->row_begin * row)
               : static_cast<const void*>(batch->sources[v] + part->row_begin * row);
      {
        absl::MutexLock lock(&batch->mu);
        ++batch->slices;
      }
      payload.push_back({data, bytes, [batch] {
                           absl::MutexLock lock(&batch->mu);
                           --batch->slices;
                         }});
      client_->counters_.push_payload_bytes += bytes;
    }
    StartCall(g.server, header, std::move(payload));
  }
  return absl::OkStatus();
}

absl::Status GrpcPsClient::GrpcPush::Wait(std::vector<PushOutcome>* outcomes) {
  if (client_ == nullptr) return absl::FailedPreconditionError("Push::Wait after the push ended");
  GrpcPsClient* client = client_;
  client->own_pushes_.assign(client->num_servers(), -1);  // known again from this push's replies
  absl::Status st = Ready(0, client->placement_->variables().size());  // whatever is left
  PushBatch* batch = batch_.get();
  for (int s = 0; s < client->num_servers(); ++s) {
    // A server without partitions still counts the push (sync quorum).
    if (!batch->server_used[s]) StartCall(s, Header(s), {});
  }
  absl::Status waited = WaitForCalls();
  Finish();
  RETURN_IF_ERROR(waited);
  std::unique_ptr<PushBatch> finished = std::move(batch_);
  if (!st.ok()) return st;
  for (PushBatch::Call& call : finished->calls) {
    if (!call.status.ok()) {
      return FromGrpcStatus(call.status, absl::StrCat("Push to ", client->ServerName(call.server)));
    }
  }
  PushReplies replies(client->num_servers());
  for (PushBatch::Call& call : finished->calls) {
    PushResponse response;
    absl::Status parsed = ParseMessage(call.response, &response);
    if (!parsed.ok()) {
      return absl::DataLossError(absl::StrCat(client->ServerName(call.server),
                                              " sent a bad push reply: ", parsed.message()));
    }
    replies.Add(call.server, response);
  }
  client->pushed_versions_ = replies.versions();
  client->own_pushes_ = replies.own_pushes();
  return replies.Outcomes([client](int s) { return client->ServerName(s); }, outcomes);
}

absl::Status GrpcPsClient::ShutdownAll(const std::string& reason) {
  std::vector<ShutdownRequest> requests(num_servers());
  std::vector<ShutdownResponse> responses(num_servers());
  for (ShutdownRequest& r : requests) {
    r.set_incarnation(incarnation_);
    r.set_reason(reason);
  }
  return CallAll(
      num_servers(), rpc_timeout_, /*wait_for_ready=*/false,
      [this](int s) { return absl::StrCat("Shutdown ", ServerName(s)); },
      [&](int s, grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
        stubs_[s]->async()->Shutdown(ctx, &requests[s], &responses[s], std::move(done));
      });
}

absl::Status GrpcPsClient::SnapshotAll(int64_t step, absl::Duration timeout,
                                   std::vector<SnapshotResponse>* responses) {
  std::vector<SnapshotRequest> requests(num_servers());
  responses->assign(num_servers(), SnapshotResponse());
  for (SnapshotRequest& r : requests) {
    r.set_incarnation(incarnation_);
    r.set_step(step);
    r.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  }
  return CallAll(
      num_servers(), timeout + rpc_timeout_, /*wait_for_ready=*/false,
      [this, step](int s) { return absl::StrCat("Snapshot ", ServerName(s), " step ", step); },
      [&](int s, grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
        stubs_[s]->async()->Snapshot(ctx, &requests[s], &(*responses)[s], std::move(done));
      });
}

absl::Status GrpcPsClient::GetShard(int server, int64_t step, absl::Duration timeout,
                                GetShardResponse* response) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout + rpc_timeout_);
  GetShardRequest req;
  req.set_incarnation(incarnation_);
  req.set_step(step);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  return FromGrpcStatus(stubs_[server]->GetShard(&ctx, req, response),
                        absl::StrCat("GetShard ", ServerName(server), " step ", step));
}

absl::Status GrpcPsClient::ClaimSession(int server, int32_t session, PsStatusResponse* response) {
  PsStatusRequest req;
  req.set_worker(worker_);
  req.set_claim_session(session);
  return StatusCall(server, req, response);
}

absl::Status GrpcPsClient::GetStatus(int server, PsStatusResponse* response) {
  return StatusCall(server, PsStatusRequest(), response);
}

absl::Status GrpcPsClient::StatusCall(int server, const PsStatusRequest& request,
                                  PsStatusResponse* response) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, rpc_timeout_);
  return FromGrpcStatus(stubs_[server]->GetStatus(&ctx, request, response),
                        absl::StrCat("GetStatus ", ServerName(server)));
}

}  // namespace pstrain
