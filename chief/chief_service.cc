#include "chief/chief_service.h"

#include "common/logging.h"
#include "common/rpc.h"

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

}  // namespace pstrain
