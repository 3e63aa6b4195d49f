#include "worker/rejoin.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "common/base/status_macros.h"

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

}  // namespace pstrain
