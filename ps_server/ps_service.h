// gRPC adapter for the parameter server: unpacks each RPC, calls
// ParameterServer, converts the status. Holds no state of its own beyond the
// stop signal raised by the Shutdown RPC. Thread-safe (gRPC calls handlers
// concurrently; ParameterServer is thread-safe).
#ifndef PSTRAIN_PS_SERVER_PS_SERVICE_H_
#define PSTRAIN_PS_SERVER_PS_SERVICE_H_

#include "common/shutdown.h"
#include "proto/ps_service.grpc.pb.h"
#include "ps_server/parameter_server.h"

namespace pstrain {

class PsServiceImpl final : public PsService::Service {
 public:
  PsServiceImpl(ParameterServer* ps, StopSignal* stop) : ps_(ps), stop_(stop) {}

  grpc::Status Initialize(grpc::ServerContext* ctx, const InitializeRequest* req,
                          InitializeResponse* resp) override;
  grpc::Status Pull(grpc::ServerContext* ctx, const PullRequest* req, PullResponse* resp) override;
  grpc::Status Push(grpc::ServerContext* ctx, const PushRequest* req, PushResponse* resp) override;
  grpc::Status GetStatus(grpc::ServerContext* ctx, const PsStatusRequest* req,
                         PsStatusResponse* resp) override;
  grpc::Status Shutdown(grpc::ServerContext* ctx, const ShutdownRequest* req,
                        ShutdownResponse* resp) override;

 private:
  ParameterServer* const ps_;
  StopSignal* const stop_;
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_PS_SERVICE_H_
