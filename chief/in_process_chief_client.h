// The chief as a Chief object in this process: ChiefClient's
// implementation for the trainer's unit tests (tests/trainer_test.cc), with
// the calls the gRPC service (chief_service.h) would make, minus the wire
// and its authentication. A registration waits in slices of 50 ms, so that
// a raised stop ends it as over gRPC. The Chief must outlive the client.
#ifndef PSTRAIN_CHIEF_IN_PROCESS_CHIEF_CLIENT_H_
#define PSTRAIN_CHIEF_IN_PROCESS_CHIEF_CLIENT_H_

#include <string>

#include "chief/chief_state.h"
#include "common/client/chief_client.h"

namespace pstrain {

class InProcessChiefClient final : public ChiefClient {
 public:
  explicit InProcessChiefClient(Chief* chief) : chief_(chief) {}

  absl::Status RegisterWorker(int worker, uint64_t fingerprint, absl::Duration timeout,
                              RegisterWorkerResponse* response, uint64_t previous_incarnation = 0,
                              int32_t session = 0, StopSignal* stop = nullptr) override;
  absl::Status Restore(const std::string& checkpoint, absl::Duration timeout,
                       int64_t* step) override;
  absl::Status ReportProgress(const ProgressReport& report, ProgressResponse* response) override;
  absl::Status GetStatus(ChiefStatusResponse* response) override;

 private:
  Chief* const chief_;
};

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_IN_PROCESS_CHIEF_CLIENT_H_
