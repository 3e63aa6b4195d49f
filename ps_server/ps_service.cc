#include "ps_server/ps_service.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/rpc.h"

namespace pstrain {

grpc::Status PsServiceImpl::Initialize(grpc::ServerContext* ctx, const InitializeRequest* req,
                                       InitializeResponse* resp) {
  absl::Status st = ps_->Initialize(*req);
  if (st.ok()) {
    int64_t bytes = 0;
    for (const NamedTensor& nt : req->variables()) bytes += nt.tensor().content().size();
    resp->set_num_partitions(req->variables_size());
    resp->set_num_bytes(bytes);
    LOG_INFO("initialized {} partitions ({} bytes) for incarnation {:x}, {} workers, start step {}",
             req->variables_size(), bytes, req->incarnation(), req->num_workers(),
             req->start_step());
  } else if (!absl::IsAlreadyExists(st)) {
    LOG_WARN("Initialize refused: {}", st.ToString());
  }
  return ToGrpcStatus(st);
}

grpc::Status PsServiceImpl::Pull(grpc::ServerContext* ctx, const PullRequest* req,
                                 PullResponse* resp) {
  return ToGrpcStatus(ps_->Pull(*req, resp));
}

grpc::Status PsServiceImpl::Push(grpc::ServerContext* ctx, const PushRequest* req,
                                 PushResponse* resp) {
  absl::Status st = ps_->Push(*req, resp);
  if (!st.ok() && !absl::IsUnavailable(st)) {
    LOG_WARN("push from worker {} step {} refused: {}", req->worker(), req->step(), st.ToString());
  }
  return ToGrpcStatus(st);
}

grpc::Status PsServiceImpl::GetStatus(grpc::ServerContext* ctx, const PsStatusRequest* req,
                                      PsStatusResponse* resp) {
  ps_->GetStatus(resp);
  return grpc::Status::OK;
}

grpc::Status PsServiceImpl::Shutdown(grpc::ServerContext* ctx, const ShutdownRequest* req,
                                     ShutdownResponse* resp) {
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
