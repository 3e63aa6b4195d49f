#include "ps_server/ps_service.h"

#include <atomic>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/rpc/rpc.h"
#include "common/base/tsan_handoff.h"
#include "common/rpc/wire_frame.h"

namespace pstrain {

// One of the service's max_calls_ places, held for a data call's life:
// released just before the call is answered (Release), so that a client
// that starts its next call when one ends (a window of calls in flight)
// never finds the place still taken.
class CallSlot {
 public:
  explicit CallSlot(PsServiceImpl* service) : service_(service) {
    // Taken only while below the limit: a call about to be refused never
    // holds a place, even for a moment, that a call beside it could get.
    int before = service_->calls_.load(std::memory_order_acquire);
    while (before < service_->max_calls_ &&
           !service_->calls_.compare_exchange_weak(before, before + 1,
                                                   std::memory_order_acq_rel)) {
    }
    if (before >= service_->max_calls_) {
      service_ = nullptr;
      refused_ = grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("this parameter server is serving ", before,
                       " data calls, its limit (--max_concurrent_calls); try again later"));
    }
  }
  ~CallSlot() { Release(); }
  void Release() {
    if (service_ != nullptr) service_->calls_.fetch_sub(1, std::memory_order_acq_rel);
    service_ = nullptr;
  }
  CallSlot(CallSlot&& other) noexcept
      : service_(std::exchange(other.service_, nullptr)), refused_(other.refused_) {}
  CallSlot(const CallSlot&) = delete;
  CallSlot& operator=(const CallSlot&) = delete;
  CallSlot& operator=(CallSlot&&) = delete;

  // Whether the call got a place (also after Release).
  bool ok() const { return refused_.ok(); }
  const grpc::Status& refused() const { return refused_; }

 private:
  PsServiceImpl* service_;
  grpc::Status refused_;
};

grpc::Status PsServiceImpl::Initialize(grpc::ServerContext* ctx, const InitializeRequest* req,
                                       InitializeResponse* resp) {
  if (auto caller = auth_->Check(*ctx, {Role::kChief}, "Initialize"); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  absl::Status st = ps_->Initialize(*req);
  if (st.ok()) {
    int64_t bytes = 0;
    for (const NamedTensor& nt : req->variables()) bytes += nt.tensor().content().size();
    resp->set_num_partitions(req->variables_size());
    resp->set_num_bytes(bytes);
    if (req->num_parts() <= 1) {
      LOG_INFO("initialized {} partitions ({} bytes) for incarnation {:x}, {} workers, start step {}",
               req->variables_size(), bytes, req->incarnation(), req->num_workers(),
               req->start_step());
    } else {
      LOG_DEBUG("Initialize part {} of {}: {} partitions ({} bytes) for incarnation {:x}",
                req->part() + 1, req->num_parts(), req->variables_size(), bytes,
                req->incarnation());
    }
  } else if (!absl::IsAlreadyExists(st)) {
    LOG_WARN("Initialize refused: {}", st.ToString());
  }
  return ToGrpcStatus(st);
}

namespace {

// A pull's frame: its header, and every tensor sent from the version buffer
// itself (or its bfloat16 rounding); each reference keeps the buffer from
// being reused until gRPC releases the slice.
grpc::ByteBuffer PullFrame(ParameterServer::PullReply reply) {
  PullResponse header;
  header.set_version(reply.version);
  header.set_finished(reply.finished);
  std::vector<OutgoingPayload> payload;
  payload.reserve(reply.tensors.size());
  for (ParameterServer::PulledTensor& t : reply.tensors) {
    NamedTensor* nt = header.add_tensors();
    nt->mutable_ref()->set_variable(t.variable);
    nt->mutable_ref()->set_partition(t.partition);
    for (int64_t d : t.shape) nt->mutable_tensor()->add_shape(d);
    if (t.bfloat16 != nullptr) {
      nt->mutable_tensor()->set_dtype(DT_BFLOAT16);
      const uint16_t* data = t.bfloat16->data();
      const int64_t bytes = static_cast<int64_t>(t.bfloat16->size()) * 2;
      payload.push_back({data, bytes, [keep = std::move(t.bfloat16)]() mutable { keep.reset(); }});
    } else {
      nt->mutable_tensor()->set_dtype(DT_FLOAT);
      const float* data = t.values->data();
      const int64_t bytes = static_cast<int64_t>(t.values->size()) * 4;
      payload.push_back({data, bytes, [keep = std::move(t.values)]() mutable { keep.reset(); }});
    }
  }
  return EncodeFrame(header, std::move(payload));
}

// A row pull's frame: version and width, then the rows, sent from the
// buffer they were gathered into (back to its pool when gRPC releases it).
grpc::ByteBuffer PullRowsFrame(ParameterServer::PulledRows rows) {
  PullRowsResponse header;
  header.set_version(rows.version);
  header.set_dim(rows.dim);
  const float* data = rows.values->data();
  std::vector<OutgoingPayload> payload;
  payload.push_back(
      {data, rows.floats * 4, [keep = std::move(rows.values)]() mutable { keep.reset(); }});
  return EncodeFrame(header, std::move(payload));
}

// One Pull or PullRows call: parked in ParameterServer until it is ready;
// gRPC's cancellation (client gone, deadline) ends the wait at once.
class ParkedPullReactor final : public grpc::ServerUnaryReactor {
 public:
  ParkedPullReactor(ParameterServer* ps, grpc::ByteBuffer* response, CallSlot slot)
      : ps_(ps), response_(response), slot_(std::move(slot)) {}

  // `start` hands `reply` to ParameterServer (StartPull, StartPullRows) and
  // returns the id of the parked call (0: it ended at once).
  void Start(const std::function<uint64_t(std::function<void(absl::Status, grpc::ByteBuffer)>)>&
                 start) {
    const uint64_t id = start([this](absl::Status status, grpc::ByteBuffer frame) {
      Reply(std::move(status), std::move(frame));
    });
    bool cancel_now = false;
    {
      absl::MutexLock lock(&mu_);
      id_ = id;
      cancel_now = cancelled_;
    }
    if (cancel_now && id != 0) ps_->CancelPull(id);
    Unref();
  }

  void OnCancel() override {
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      id = id_;
    }
    if (id != 0) ps_->CancelPull(id);  // no-op when it already finished
    handoff_.Release();  // gRPC runs OnCancel before OnDone
  }

  void OnDone() override {
    handoff_.Acquire();  // after Reply and OnCancel, which touched this reactor
    Unref();
  }

 private:
  // Start and gRPC (through OnDone) each hold a reference: the reply can be
  // sent, and the call completed, before Start returns.
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  void Reply(absl::Status status, grpc::ByteBuffer frame) {
    slot_.Release();  // runs once, before the call is answered
    if (status.ok()) *response_ = std::move(frame);
    // Finish hands the call to gRPC's core, which runs OnDone on one of its
    // threads; it is ordered after this, but TSan does not see that order.
    handoff_.Release();
    Finish(status.ok() ? grpc::Status::OK : ToGrpcStatus(status));
  }

  ParameterServer* const ps_;
  grpc::ByteBuffer* const response_;
  CallSlot slot_;  // released by Reply
  absl::Mutex mu_;
  uint64_t id_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> refs_{2};
  // Reply and OnCancel, each through gRPC's core, before OnDone (which
  // destroys the reactor): gRPC orders them, but TSan does not see it.
  const HandoffToken handoff_{};
};

// A pull's request, parsed and checked against the caller; an error ends the
// call at once (through `ctx`'s default reactor), else null.
template <typename Request>
grpc::ServerUnaryReactor* RefusePull(grpc::CallbackServerContext* ctx, CallSlot& slot,
                                     Authorizer* auth, const char* method,
                                     const grpc::ByteBuffer* req, Request* request) {
  absl::Status st;
  if (slot.ok()) {
    absl::StatusOr<Caller> caller = auth->Check(*ctx, {Role::kWorker, Role::kChief}, method);
    st = caller.status();
    if (st.ok()) st = ParseMessage(*req, request);
    if (st.ok()) st = auth->CheckWorkerField(*caller, request->worker(), method);
  }
  if (slot.ok() && st.ok()) return nullptr;
  grpc::ServerUnaryReactor* refused = ctx->DefaultReactor();
  const grpc::Status answer = slot.ok() ? ToGrpcStatus(st) : slot.refused();
  slot.Release();
  refused->Finish(answer);
  return refused;
}

}  // namespace

grpc::ServerUnaryReactor* PsServiceImpl::Pull(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* req,
                                              grpc::ByteBuffer* resp) {
  CallSlot slot(this);
  PullRequest request;
  if (auto* refused = RefusePull(ctx, slot, auth_, "Pull", req, &request)) return refused;
  auto* reactor = new ParkedPullReactor(ps_, resp, std::move(slot));
  reactor->Start([&](std::function<void(absl::Status, grpc::ByteBuffer)> reply) {
    return ps_->StartPull(request, [reply](absl::Status st, ParameterServer::PullReply r) {
      reply(st, st.ok() ? PullFrame(std::move(r)) : grpc::ByteBuffer());
    });
  });
  return reactor;
}

grpc::ServerUnaryReactor* PsServiceImpl::PullRows(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* req,
                                                  grpc::ByteBuffer* resp) {
  CallSlot slot(this);
  PullRowsRequest request;
  if (auto* refused = RefusePull(ctx, slot, auth_, "PullRows", req, &request)) return refused;
  auto* reactor = new ParkedPullReactor(ps_, resp, std::move(slot));
  reactor->Start([&](std::function<void(absl::Status, grpc::ByteBuffer)> reply) {
    return ps_->StartPullRows(request,
                              [reply](absl::Status st, ParameterServer::PulledRows rows) {
                                reply(st, st.ok() ? PullRowsFrame(std::move(rows))
                                                  : grpc::ByteBuffer());
                              });
  });
  return reactor;
}

namespace {

// A push frame's call (Push, PushRows): checked against the caller, decoded
// in place, handed to `push`, answered with its response.
// `push(header, payload, &response)` is ParameterServer's method.
template <typename Header, typename Response, typename PushFn>
grpc::ServerUnaryReactor* ServePush(grpc::CallbackServerContext* ctx, CallSlot& slot,
                                    Authorizer* auth, ParameterServer* ps,
                                    ReplacedIncarnationLog* replaced, const char* method,
                                    const char* what, const grpc::ByteBuffer* req,
                                    grpc::ByteBuffer* resp, const PushFn& push) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (!slot.ok()) {
    reactor->Finish(slot.refused());
    return reactor;
  }
  Header header;
  IncomingFrame frame;
  absl::StatusOr<Caller> caller = auth->Check(*ctx, {Role::kWorker}, method);
  absl::Status st = caller.status();
  if (st.ok()) {
    st = DecodeFrame(*req, &header, &frame);
    if (!st.ok()) ps->RecordRejection(ParameterServer::Rejection::kMalformed);
  }
  if (st.ok()) st = auth->CheckWorkerField(*caller, header.worker(), method);
  Response response;
  if (st.ok()) st = push(header, frame.payload, &response);
  if (!st.ok() && ParameterServer::FromReplacedIncarnation(st)) {
    // Expected after a rollback until the worker re-registers: said once.
    if (replaced->First(header.worker(), header.incarnation())) {
      LOG_INFO("{}es from worker {} of incarnation {:x}, which a rollback or restore replaced, "
               "are refused until it registers with the chief again",
               what, header.worker(), header.incarnation());
    }
  } else if (!st.ok() && !absl::IsUnavailable(st) && !absl::IsUnauthenticated(st) &&
             !absl::IsPermissionDenied(st)) {
    LOG_WARN("{} from worker {} step {} refused: {}", what, header.worker(), header.step(),
             st.ToString());
  }
  if (st.ok()) *resp = SerializeMessage(response);
  slot.Release();
  reactor->Finish(ToGrpcStatus(st));
  return reactor;
}

}  // namespace

bool ReplacedIncarnationLog::First(int worker, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  if (seen_.size() >= 4096) seen_.clear();  // bounded: at worst a line said again
  return seen_.emplace(worker, incarnation).second;
}

grpc::ServerUnaryReactor* PsServiceImpl::Push(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* req,
                                              grpc::ByteBuffer* resp) {
  CallSlot slot(this);
  return ServePush<PushRequest, PushResponse>(
      ctx, slot, auth_, ps_, &replaced_log_, "Push", "push", req, resp,
      [this](const PushRequest& h, const SegmentedBytes& p, PushResponse* r) {
        return ps_->Push(h, p, r);
      });
}

grpc::ServerUnaryReactor* PsServiceImpl::PushRows(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* req,
                                                  grpc::ByteBuffer* resp) {
  CallSlot slot(this);
  return ServePush<PushRowsRequest, PushRowsResponse>(
      ctx, slot, auth_, ps_, &replaced_log_, "PushRows", "row push", req, resp,
      [this](const PushRowsRequest& h, const SegmentedBytes& p, PushRowsResponse* r) {
        return ps_->PushRows(h, p, r);
      });
}

grpc::Status PsServiceImpl::GetStatus(grpc::ServerContext* ctx, const PsStatusRequest* req,
                                      PsStatusResponse* resp) {
  absl::StatusOr<Caller> caller = auth_->CheckAuthenticated(*ctx, "GetStatus");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (req->claim_session() != 0) {
    if (caller->role != Role::kAnyone && caller->role != Role::kWorker) {
      return ToGrpcStatus(absl::PermissionDeniedError(
          absl::StrCat("GetStatus: only a worker claims a session; ", caller->name, " may not")));
    }
    if (absl::Status st = auth_->CheckWorkerField(*caller, req->worker(), "GetStatus");
        !st.ok()) {
      return ToGrpcStatus(st);
    }
    return ToGrpcStatus(ps_->GetStatus(req->worker(), req->claim_session(), resp));
  }
  ps_->GetStatus(resp);
  resp->set_data_calls(data_calls());
  return grpc::Status::OK;
}

grpc::Status PsServiceImpl::LoadRows(grpc::ServerContext* ctx, const LoadRowsRequest* req,
                                     LoadRowsResponse* resp) {
  if (auto caller = auth_->Check(*ctx, {Role::kChief}, "LoadRows"); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  return ToGrpcStatus(ps_->LoadRows(*req, resp));
}

grpc::Status PsServiceImpl::Snapshot(grpc::ServerContext* ctx, const SnapshotRequest* req,
                                     SnapshotResponse* resp) {
  if (auto caller = auth_->Check(*ctx, {Role::kChief}, "Snapshot"); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  return ToGrpcStatus(ps_->Snapshot(*req, resp));
}

grpc::Status PsServiceImpl::GetShard(grpc::ServerContext* ctx, const GetShardRequest* req,
                                     GetShardResponse* resp) {
  if (auto caller = auth_->Check(*ctx, {Role::kChief}, "GetShard"); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  return ToGrpcStatus(ps_->GetShard(*req, resp));
}

grpc::Status PsServiceImpl::Shutdown(grpc::ServerContext* ctx, const ShutdownRequest* req,
                                     ShutdownResponse* resp) {
  if (auto caller = auth_->Check(*ctx, {Role::kChief}, "Shutdown"); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  PsStatusResponse status;
  ps_->GetStatus(&status);
  if (status.initialized() && req->incarnation() != status.incarnation()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "Shutdown from another cluster incarnation refused");
  }
  stop_->Stop(absl::StrCat("Shutdown RPC: ", req->reason()));
  return grpc::Status::OK;
}

}  // namespace pstrain
