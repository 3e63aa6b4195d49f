#include "chief/rollback.h"

#include <random>
#include <utility>
#include <vector>

#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace pstrain {
namespace {

// A fresh, non-zero incarnation other than `old`.
uint64_t NewIncarnation(uint64_t old) {
  std::random_device rd;
  for (;;) {
    const uint64_t fresh = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    if (fresh != 0 && fresh != old) return fresh;
  }
}

}  // namespace

absl::StatusOr<std::optional<ResumePoint>> LoadRollbackPoint(const RunContext& run,
                                                             const std::string& checkpoint,
                                                             const std::string& init_from) {
  std::optional<ResumePoint> point;
  if (!checkpoint.empty()) {
    ASSIGN_OR_RETURN(point, ReadStartPoint(run, checkpoint, /*with_state=*/true));
  } else {
    ASSIGN_OR_RETURN(point, FindRollbackPoint(run));
  }
  if (!point.has_value() && !init_from.empty()) {
    // No checkpoint of the run yet: back to where it started.
    ASSIGN_OR_RETURN(point, ReadStartPoint(run, init_from, /*with_state=*/false));
  }
  if (point.has_value()) {
    RETURN_IF_ERROR(CheckTables(run.config, *point));
  } else {
    LOG_WARN("no checkpoint of the run yet: the job starts again from the seed at step 0");
  }
  return point;
}

absl::StatusOr<int64_t> RollBack(const RunContext& run, std::optional<ResumePoint> point,
                                 Model* model, PsClient* ps, Chief* chief) {
  chief->BeginRollback();
  chief->SetServersDown(0);
  const uint64_t fresh = NewIncarnation(ps->incarnation());
  ps->set_incarnation(fresh);
  const int64_t step = point.has_value() ? point->step : 0;
  std::vector<Tensor> values =
      point.has_value() ? std::move(point->params) : model->Initialize(run.config.seed());
  RETURN_IF_ERROR(ps->InitializeAll(run.config, run.fingerprint, run.cluster.num_workers(), step,
                                    values, run.startup_timeout,
                                    point.has_value() ? &point->optimizer : nullptr));
  if (point.has_value()) RETURN_IF_ERROR(LoadTables(run.config, &*point, ps));
  SetAsideAbandonedCheckpoints(run.config, step);
  chief->FinishRollback(fresh, step,
                        point.has_value() ? point->cursors : std::vector<WorkerCursor>());
  return step;
}

}  // namespace pstrain
