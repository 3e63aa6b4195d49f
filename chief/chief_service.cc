#include "chief/chief_service.h"

#include "common/logging.h"
#include "common/rpc.h"

namespace pstrain {

grpc::Status ChiefServiceImpl::RegisterWorker(grpc::ServerContext* ctx,
                                              const RegisterWorkerRequest* req,
                                              RegisterWorkerResponse* resp) {
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
  absl::Status st = chief_->ReportProgress(*req, resp);
  if (st.ok() && req->done()) LOG_INFO("worker {} done", req->worker());
  return ToGrpcStatus(st);
}

grpc::Status ChiefServiceImpl::GetStatus(grpc::ServerContext* ctx, const ChiefStatusRequest* req,
                                         ChiefStatusResponse* resp) {
  chief_->GetStatus(resp);
  return grpc::Status::OK;
}

}  // namespace pstrain
