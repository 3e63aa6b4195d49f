#include "chief/chief_service.h"

#include <algorithm>
#include <chrono>

#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/rpc/rpc.h"

namespace pstrain {

grpc::Status ChiefServiceImpl::RegisterWorker(grpc::ServerContext* ctx,
                                              const RegisterWorkerRequest* req,
                                              RegisterWorkerResponse* resp) {
  absl::StatusOr<Caller> caller = auth_->Check(*ctx, {Role::kWorker}, "RegisterWorker");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status st = auth_->CheckWorkerField(*caller, req->worker(), "RegisterWorker");
      !st.ok()) {
    return ToGrpcStatus(st);
  }
  absl::Status st = chief_->RegisterWorker(*req, resp);
  if (st.ok()) {
    LOG_INFO("worker {} registered", req->worker());
  } else {
    LOG_WARN("worker {} registration refused: {}", req->worker(), st);
  }
  return ToGrpcStatus(st);
}

grpc::Status ChiefServiceImpl::ReportProgress(grpc::ServerContext* ctx, const ProgressReport* req,
                                              ProgressResponse* resp) {
  absl::StatusOr<Caller> caller = auth_->Check(*ctx, {Role::kWorker}, "ReportProgress");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status st = auth_->CheckWorkerField(*caller, req->worker(), "ReportProgress");
      !st.ok()) {
    return ToGrpcStatus(st);
  }
  absl::Status st = chief_->ReportProgress(*req, resp);
  if (st.ok() && req->done()) LOG_INFO("worker {} done", req->worker());
  return ToGrpcStatus(st);
}

grpc::Status ChiefServiceImpl::GetStatus(grpc::ServerContext* ctx, const ChiefStatusRequest* req,
                                         ChiefStatusResponse* resp) {
  if (auto caller = auth_->CheckAuthenticated(*ctx, "GetStatus"); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  chief_->GetStatus(resp);
  return grpc::Status::OK;
}

grpc::Status ChiefServiceImpl::Restore(grpc::ServerContext* ctx, const RestoreRequest* req,
                                       RestoreResponse* resp) {
  if (auto caller = auth_->Check(*ctx, {Role::kOperator}, "Restore"); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  if (req->checkpoint().empty() || req->checkpoint().size() > 4096) {
    return ToGrpcStatus(absl::InvalidArgumentError("Restore: a checkpoint path of 1 to 4096 bytes"));
  }
  // The rollback itself is bounded by the servers' startup timeout; the
  // call's own deadline (the caller's) ends the wait sooner.
  absl::Duration timeout = absl::Minutes(10);
  if (ctx->deadline() != std::chrono::system_clock::time_point::max()) {
    timeout = std::min(timeout, absl::FromChrono(ctx->deadline()) - absl::Now());
  }
  LOG_INFO("restore of {} asked by {}", req->checkpoint(), ctx->peer());
  int64_t step = 0;
  absl::Status st = chief_->RequestRestore(req->checkpoint(), timeout, &step);
  if (st.ok()) resp->set_step(step);
  return ToGrpcStatus(st);
}

}  // namespace pstrain
