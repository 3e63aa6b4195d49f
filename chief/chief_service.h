// gRPC adapter for the chief: unpacks RPCs, calls Chief, converts the status.
// Thread-safe (Chief is).
#ifndef PSTRAIN_CHIEF_CHIEF_SERVICE_H_
#define PSTRAIN_CHIEF_CHIEF_SERVICE_H_

#include "chief/chief_state.h"
#include "common/security/auth.h"
#include "proto/chief_service.grpc.pb.h"

namespace pstrain {

class ChiefServiceImpl final : public ChiefService::Service {
 public:
  // Only workers register and report, each as itself; anyone authenticated
  // reads GetStatus, only the operator restores (common/security/auth.h). `auth` outlives this.
  ChiefServiceImpl(Chief* chief, Authorizer* auth) : chief_(chief), auth_(auth) {}

  grpc::Status RegisterWorker(grpc::ServerContext* ctx, const RegisterWorkerRequest* req,
                              RegisterWorkerResponse* resp) override;
  grpc::Status ReportProgress(grpc::ServerContext* ctx, const ProgressReport* req,
                              ProgressResponse* resp) override;
  grpc::Status GetStatus(grpc::ServerContext* ctx, const ChiefStatusRequest* req,
                         ChiefStatusResponse* resp) override;
  // An operator's rollback to a checkpoint (`pstrain checkpoint restore`).
  grpc::Status Restore(grpc::ServerContext* ctx, const RestoreRequest* req,
                       RestoreResponse* resp) override;

 private:
  Chief* const chief_;
  Authorizer* const auth_;
};

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_CHIEF_SERVICE_H_
