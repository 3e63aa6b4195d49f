// Where a restarted worker process (its registration says rejoin, with a
// session > 0) goes on: it claims its session on every server, which fences
// off any earlier process of the worker still alive, and reads from their
// status the data cursor and step count its earlier process left. Shared by
// the C++ trainer and the session of a user's own workers (worker/session.h).
#ifndef PSTRAIN_WORKER_REJOIN_H_
#define PSTRAIN_WORKER_REJOIN_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/shutdown.h"
#include "common/client/chief_client.h"
#include "common/client/ps_client.h"
#include "worker/data/partition.h"

namespace pstrain {

struct RejoinPoint {
  // Async: the newest cursor a server took with a push (a batch applied on
  // only some servers is not trained again). Sync: the cursor of the last
  // step it helped complete on the server furthest behind, so the open
  // step's gradient is computed from the batch its earlier process had.
  // Empty when no server has one (none of its pushes completed a step).
  std::optional<DataCursor> cursor;
  // The most of its pushes any server applied (async: its exact step count).
  int64_t pushes_applied = 0;
  // Sync: the servers' versions, lowest and highest.
  int64_t min_version = 0, max_version = 0;
};

// Claims `session` for worker `worker` on every server of `ps` and reads
// where it stood.
absl::StatusOr<RejoinPoint> ClaimSession(PsClient* ps, int worker, int32_t session, bool sync);

// Waits until the chief answers, up to `timeout`; a stop ends the wait
// (CANCELLED).
absl::Status WaitForChief(ChiefClient* chief, absl::Duration timeout, StopSignal* stop);

// After a step failed with `cause` on `registration`'s incarnation (a lost
// server: the chief may be rolling the job back to a checkpoint): registers
// again as the same process, which the chief answers once its rollback is
// done, into *again (its start step and this worker's cursor are where to
// go on from). `chief_lost`: the step failed on its report to the chief,
// which is waited for first (as it is when it does not take the
// registration). Returns OK to follow; CANCELLED on a stop; else `cause`,
// where there is no rollback to follow.
absl::Status RegisterAfterFailure(ChiefClient* chief, int worker, uint64_t fingerprint,
                                  const RegisterWorkerResponse& registration, bool chief_lost,
                                  absl::Duration startup_timeout, absl::Duration step_timeout,
                                  StopSignal* stop, const absl::Status& cause,
                                  RegisterWorkerResponse* again);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_REJOIN_H_
