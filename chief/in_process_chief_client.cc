#include "chief/in_process_chief_client.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace pstrain {

absl::Status InProcessChiefClient::RegisterWorker(int worker, uint64_t fingerprint,
                                                  absl::Duration timeout,
                                                  RegisterWorkerResponse* response,
                                                  uint64_t previous_incarnation, int32_t session,
                                                  StopSignal* stop) {
  RegisterWorkerRequest request;
  request.set_worker(worker);
  request.set_previous_incarnation(previous_incarnation);
  request.set_session(session);
  request.set_config_fingerprint(fingerprint);
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (stop != nullptr && stop->stopped()) return absl::CancelledError(stop->reason());
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    request.set_timeout_ms(absl::ToInt64Milliseconds(std::min(left, absl::Milliseconds(50))));
    response->Clear();
    absl::Status st = chief_->RegisterWorker(request, response);
    if (!absl::IsDeadlineExceeded(st) || absl::Now() >= deadline) return st;
  }
}

absl::Status InProcessChiefClient::Restore(const std::string& checkpoint, absl::Duration timeout,
                                           int64_t* step) {
  return chief_->RequestRestore(checkpoint, timeout, step);
}

absl::Status InProcessChiefClient::ReportProgress(const ProgressReport& report,
                                                  ProgressResponse* response) {
  return chief_->ReportProgress(report, response);
}

absl::Status InProcessChiefClient::GetStatus(ChiefStatusResponse* response) {
  chief_->GetStatus(response);
  return absl::OkStatus();
}

}  // namespace pstrain
