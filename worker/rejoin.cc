#include "worker/rejoin.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/rpc/rpc.h"

namespace pstrain {

absl::StatusOr<RejoinPoint> ClaimSession(PsClient* ps, int worker, int32_t session, bool sync) {
  RejoinPoint point;
  DataCursor resume_at{0, 0};
  bool have_cursor = false;
  int64_t min_version = std::numeric_limits<int64_t>::max(), max_version = -1;
  for (int s = 0; s < ps->num_servers(); ++s) {
    PsStatusResponse st;
    // Claiming the session fences off any earlier process of this worker
    // still alive (hung, not dead), and the cursor read with it already
    // counts each push of that process the server took.
    RETURN_IF_ERROR(ps->ClaimSession(s, session, &st));
    if (worker >= st.workers_size()) continue;
    const WorkerProgress& wp = st.workers(worker);
    point.pushes_applied = std::max(point.pushes_applied, wp.pushes_applied());
    const DataCursor c{wp.cursor_epoch(), wp.cursor_position()};
    bool take;
    if (sync) {
      take = st.version() < min_version;
      max_version = std::max(max_version, st.version());
      min_version = std::min(min_version, st.version());
    } else {
      take = !have_cursor || std::make_pair(c.epoch, c.position) >
                                 std::make_pair(resume_at.epoch, resume_at.position);
    }
    if (take) {
      have_cursor = wp.has_cursor();
      if (have_cursor) resume_at = c;
    }
  }
  if (have_cursor) point.cursor = resume_at;
  if (sync && max_version >= 0) {
    point.min_version = min_version;
    point.max_version = max_version;
  }
  return point;
}

// Waits until the chief answers, up to `timeout`; a stop ends the wait.
absl::Status WaitForChief(ChiefClient* chief, absl::Duration timeout, StopSignal* stop) {
  const absl::Time deadline = absl::Now() + timeout;
  for (bool told = false;;) {
    ChiefStatusResponse status;
    absl::Status st = chief->GetStatus(&status);
    if (st.ok()) {
      if (told) LOG_INFO("the chief answers again (state: {})", status.state());
      return absl::OkStatus();
    }
    if (!MayHaveLostPeer(st)) return st;
    if (!told) {
      LOG_WARN("the chief does not answer ({}); waiting up to {} for it to come back", st,
               absl::FormatDuration(timeout));
      told = true;
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("the chief has not answered for ",
                                                 absl::FormatDuration(timeout),
                                                 " (rpc.startup_timeout_ms): ", st.message()));
    }
    if (stop->WaitFor(absl::Milliseconds(100))) return absl::CancelledError(stop->reason());
  }
}

namespace {

absl::Status WaitForChiefToFollow(ChiefClient* chief, absl::Duration timeout, StopSignal* stop) {
  absl::Status up = WaitForChief(chief, timeout, stop);
  if (!up.ok() && !(absl::IsCancelled(up) && stop->stopped())) {
    LOG_WARN("no chief to follow ({}): the step's failure stands", up);
  }
  return up;
}

}  // namespace

absl::Status RegisterAfterFailure(ChiefClient* chief, int worker, uint64_t fingerprint,
                                  const RegisterWorkerResponse& registration, bool chief_lost,
                                  absl::Duration startup_timeout, absl::Duration step_timeout,
                                  StopSignal* stop, const absl::Status& cause,
                                  RegisterWorkerResponse* again) {
  bool waited = false;
  if (chief_lost) {
    waited = true;
    if (absl::Status up = WaitForChiefToFollow(chief, startup_timeout, stop); !up.ok()) {
      return absl::IsCancelled(up) && stop->stopped() ? up : cause;
    }
  }
  // The chief may wait up to the startup timeout for a lost server to come
  // back, and as long again to put the checkpoint on every server.
  const absl::Duration wait = 2 * startup_timeout + step_timeout;
  auto register_again = [&]() {
    return chief->RegisterWorker(worker, fingerprint, wait, again, registration.incarnation(),
                                 registration.session(), stop);
  };
  absl::Status st = register_again();
  // A restarted chief may have taken the run over (the servers refused
  // this step on its new incarnation) before any report of this worker
  // failed: a report that only timed out, its connection to the dead
  // chief gone silent, leaves the channel backing off from refused
  // connects, and the call fails at once (seen with a chief's container
  // killed, tests/k8s_test). Wait for the chief as above and ask again.
  if (!waited && absl::IsUnavailable(st)) {
    LOG_WARN("the chief did not take the registration ({}); waiting for it", st);
    if (absl::Status up = WaitForChiefToFollow(chief, startup_timeout, stop); !up.ok()) {
      return absl::IsCancelled(up) && stop->stopped() ? up : cause;
    }
    st = register_again();
  }
  if (absl::IsCancelled(st) && stop->stopped()) return st;
  if (!st.ok()) {
    LOG_WARN("no rollback to follow ({}): the step's failure stands", st);
    return cause;
  }
  return absl::OkStatus();
}

}  // namespace pstrain
