// The chief's rollbacks. A parameter server that restarted (it answers
// uninitialised, or for another incarnation) lost its partitions, and the
// others have moved on without it: every server goes back to the latest
// checkpoint, the one consistent point, under a new incarnation. Workers,
// refused on the old one, register again (previous_incarnation) and go on
// from the checkpoint's cursors; nothing else restarts. An operator's
// `pstrain checkpoint restore` does the same from the checkpoint it names.
// No state; called from the driver's thread.
#ifndef PSTRAIN_CHIEF_ROLLBACK_H_
#define PSTRAIN_CHIEF_ROLLBACK_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "chief/chief_state.h"
#include "chief/run_context.h"
#include "chief/start_point.h"
#include "common/client/ps_client.h"
#include "worker/model/model.h"

namespace pstrain {

// Where a rollback goes: the checkpoint named (`checkpoint`), or else the
// latest good one of the run, or else where the run started (`init_from`,
// or none: the seed at step 0). Read and checked before anything changes,
// so a bad one leaves the run as it was.
absl::StatusOr<std::optional<ResumePoint>> LoadRollbackPoint(const RunContext& run,
                                                             const std::string& checkpoint,
                                                             const std::string& init_from);

// Puts `point` (none: the seed) on every server under a new incarnation,
// sets aside the checkpoints past its step and tells the chief's state;
// returns the step. The caller restarts its schedules from there.
absl::StatusOr<int64_t> RollBack(const RunContext& run, std::optional<ResumePoint> point,
                                 Model* model, PsClient* ps, Chief* chief);

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_ROLLBACK_H_
