// Where a run starts (the chief driver's first phase): its own latest
// checkpoint (--resume), another run's values (--init_from) or the seed; or,
// when the servers still serve the run an earlier chief process started, a
// takeover from its latest checkpoint, or the end of a run they already
// finished. StartRun puts the start point on every server and tells the
// chief's state. The checkpoint readers here are shared with rollbacks
// (chief/rollback.h), and the checkpoints past a rollback's step set aside
// here. Called from the driver's thread only; no state.
#ifndef PSTRAIN_CHIEF_START_POINT_H_
#define PSTRAIN_CHIEF_START_POINT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chief/chief_state.h"
#include "chief/run_context.h"
#include "common/base/tensor.h"
#include "common/client/ps_client.h"
#include "common/storage/checkpoint.h"
#include "worker/model/model.h"

namespace pstrain {

struct ChiefStart {
  // Start from the latest complete, intact checkpoint in checkpoint.dir
  // (values, optimizer slots, global step, each worker's data cursor), under
  // this cluster's placement (any number of servers); a newer damaged or
  // incomplete one is skipped with a log line saying why; with none, from
  // the seed at step 0.
  bool resume = false;
  // A new run whose variables start as this checkpoint's values (verified;
  // its optimizer slots, step and cursors are not taken): step 0, fresh
  // optimizer state. Ignored when `resume` finds a checkpoint of its own, so
  // a resumed run goes on from where it was, not from here again.
  std::string init_from;
};

// A checkpoint laid out for this placement: its values and slots, its step
// and the workers' cursors.
struct ResumePoint {
  int64_t step = 0;
  std::vector<Tensor> params;
  PsClient::OptimizerState optimizer;
  std::vector<WorkerCursor> cursors;
  // Embedding tables (their dim, optimizer and slots; the rows stay in the
  // checkpoint at `rows_from`, whose manifest is `manifest`, and LoadTables
  // streams them), and whether optimizer state (variables' and rows') goes
  // with them: a resume, not an init_from.
  std::map<std::string, RestoredTable> tables;
  std::string rows_from;
  CheckpointManifest manifest;
  bool table_state = false;
};

// Reads the checkpoint at `path` and lays it out for this placement: every
// variable must be there with the model's shape. With `with_state`, also its
// optimizer slots and update counts, step and cursors (a resume); else
// values alone.
absl::StatusOr<ResumePoint> ReadStartPoint(const RunContext& run, const std::string& path,
                                           bool with_state);

// The latest good checkpoint in checkpoint.dir, laid out with its state;
// none (no checkpoint there): the seed.
absl::StatusOr<std::optional<ResumePoint>> FindResumePoint(const RunContext& run);

// Where a rollback of the running run goes back to (and a takeover starts
// from): the latest good checkpoint of the run, or none (its start).
// Checkpoints that exist but none of which verifies are a sick disk, not a
// reason to throw the run away: DATA_LOSS.
absl::StatusOr<std::optional<ResumePoint>> FindRollbackPoint(const RunContext& run);

// After going back to `step`: the checkpoints past it belong to the
// abandoned timeline, and a later --resume must not take them.
void SetAsideAbandonedCheckpoints(const TrainingConfig& config, int64_t step);

// Whether the start point's embedding rows fit the config's tables (width,
// and optimizer when their state comes too): checked before anything changes.
absl::Status CheckTables(const TrainingConfig& config, const ResumePoint& point);

// Sends the start point's embedding rows to the servers that hold them now,
// read from its checkpoint kRestoreChunkRows at a time: a table larger than
// the chief's memory restores too.
inline constexpr int64_t kRestoreChunkRows = 1 << 16;
absl::Status LoadTables(const TrainingConfig& config, ResumePoint* point, PsClient* ps);

// The run as StartRun began it.
struct RunStart {
  int64_t step = 0;
  // Non-zero: the servers had already finished the run on this incarnation
  // when an earlier chief process died; this one only ends it (evaluation,
  // the last checkpoint, the model), and its workers may be gone.
  uint64_t adopted = 0;
};

// Finds the start point, initialises every server from it (the client's
// incarnation is the run's), and marks the chief initialised with its step
// and cursors.
absl::StatusOr<RunStart> StartRun(const RunContext& run, const ChiefStart& start, Model* model,
                                  PsClient* ps, Chief* chief);

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_START_POINT_H_
