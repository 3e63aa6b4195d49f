#include "common/client/chief_client.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster/cluster_spec.h"
#include "common/rpc/rpc.h"
#include "common/base/status_macros.h"

namespace pstrain {

GrpcChiefClient::GrpcChiefClient(const std::string& address, absl::Duration rpc_timeout)
    : address_(address),
      rpc_timeout_(rpc_timeout),
      stub_(ChiefService::NewStub(CreateChannel(address, TaskId{kChiefJob, 0}.ToString()))) {}

absl::Status GrpcChiefClient::RegisterWorker(int worker, uint64_t fingerprint, absl::Duration timeout,
                                         RegisterWorkerResponse* response,
                                         uint64_t previous_incarnation, int32_t session,
                                         StopSignal* stop) {
  RegisterWorkerRequest req;
  req.set_worker(worker);
  req.set_previous_incarnation(previous_incarnation);
  req.set_session(session);
  req.set_config_fingerprint(fingerprint);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  const std::string what = absl::StrCat("RegisterWorker with chief ", address_);
  const absl::Time deadline = absl::Now() + timeout + rpc_timeout_;
  // Signed, then kept waiting for a chief that started since: made again.
  return RetrySignedBeforeStart(deadline, [&]() -> absl::Status {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    // The chief may still be starting; one gone while its workers train
    // (previous_incarnation set) fails the call at once, as it failed the run.
    ctx.set_wait_for_ready(previous_incarnation == 0);
    const grpc::Status status = AwaitCall(
        &ctx,
        [&](std::function<void(grpc::Status)> done) {
          stub_->async()->RegisterWorker(&ctx, &req, response, std::move(done));
        },
        stop);
    if (stop != nullptr && stop->stopped() && status.error_code() == grpc::StatusCode::CANCELLED) {
      return absl::CancelledError(stop->reason());
    }
    return FromGrpcStatus(status, what);
  }, stop);
}

absl::Status GrpcChiefClient::ReportProgress(const ProgressReport& report, ProgressResponse* response) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, rpc_timeout_);
  return FromGrpcStatus(stub_->ReportProgress(&ctx, report, response),
                        absl::StrCat("ReportProgress to chief ", address_));
}

absl::Status GrpcChiefClient::Restore(const std::string& checkpoint, absl::Duration timeout,
                                  int64_t* step) {
  RestoreRequest req;
  req.set_checkpoint(checkpoint);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  RestoreResponse resp;
  RETURN_IF_ERROR(FromGrpcStatus(stub_->Restore(&ctx, req, &resp),
                                 absl::StrCat("Restore on chief ", address_)));
  *step = resp.step();
  return absl::OkStatus();
}

absl::Status GrpcChiefClient::GetStatus(ChiefStatusResponse* response) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, rpc_timeout_);
  ChiefStatusRequest req;
  return FromGrpcStatus(stub_->GetStatus(&ctx, req, response),
                        absl::StrCat("GetStatus of chief ", address_));
}

}  // namespace pstrain
