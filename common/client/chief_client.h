// What workers, the launcher and the CLI see of the chief: an interface,
// with GrpcChiefClient (below) the daemons' implementation and
// InProcessChiefClient (chief/in_process_chief_client.h) a Chief object in
// this process, for the trainer's unit tests. Each call has a deadline.
// Thread-compatible.
#ifndef PSTRAIN_COMMON_CLIENT_CHIEF_CLIENT_H_
#define PSTRAIN_COMMON_CLIENT_CHIEF_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/base/shutdown.h"
#include "proto/chief_service.grpc.pb.h"

namespace pstrain {

class ChiefClient {
 public:
  virtual ~ChiefClient() = default;

  // Blocks until the chief is up and has initialised the variables, at most `timeout`.
  // `previous_incarnation` (non-zero): registering again after this
  // worker's servers went over to another incarnation (a rollback), as the
  // process of `session`. A `stop` (not null) raised meanwhile cancels the
  // call within 50 ms and returns CANCELLED with its reason: the wait can be
  // long (the chief starting, or rolling the job back).
  virtual absl::Status RegisterWorker(int worker, uint64_t fingerprint, absl::Duration timeout,
                                      RegisterWorkerResponse* response,
                                      uint64_t previous_incarnation = 0, int32_t session = 0,
                                      StopSignal* stop = nullptr) = 0;
  // Rolls the running job back to `checkpoint` (a path the chief reads);
  // waits up to `timeout`. *step gets the step it went back to.
  virtual absl::Status Restore(const std::string& checkpoint, absl::Duration timeout,
                               int64_t* step) = 0;
  virtual absl::Status ReportProgress(const ProgressReport& report,
                                      ProgressResponse* response) = 0;
  virtual absl::Status GetStatus(ChiefStatusResponse* response) = 0;
};

class GrpcChiefClient final : public ChiefClient {
 public:
  GrpcChiefClient(const std::string& address, absl::Duration rpc_timeout);

  absl::Status RegisterWorker(int worker, uint64_t fingerprint, absl::Duration timeout,
                              RegisterWorkerResponse* response, uint64_t previous_incarnation = 0,
                              int32_t session = 0, StopSignal* stop = nullptr) override;
  absl::Status Restore(const std::string& checkpoint, absl::Duration timeout,
                       int64_t* step) override;
  absl::Status ReportProgress(const ProgressReport& report, ProgressResponse* response) override;
  absl::Status GetStatus(ChiefStatusResponse* response) override;

 private:
  const std::string address_;
  const absl::Duration rpc_timeout_;
  std::unique_ptr<ChiefService::Stub> stub_;
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CLIENT_CHIEF_CLIENT_H_
