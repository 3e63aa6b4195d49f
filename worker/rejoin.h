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

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_REJOIN_H_
