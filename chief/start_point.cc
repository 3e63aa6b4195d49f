#include "chief/start_point.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/cluster/config.h"
#include "common/storage/env.h"

namespace pstrain {

absl::Status CheckTables(const TrainingConfig& config, const ResumePoint& r) {
  for (const EmbeddingTableConfig& tc : config.embedding_tables()) {
    auto it = r.tables.find(tc.name());
    if (it == r.tables.end()) continue;
    const RestoredTable& t = it->second;
    const std::string kind =
        OptimizerKindName(tc.has_optimizer() ? tc.optimizer() : config.optimizer());
    if (r.table_state && t.optimizer != kind) {
      return absl::FailedPreconditionError(absl::StrCat(
          "embedding table ", tc.name(), " was saved with optimizer ", t.optimizer,
          ", the config's is ", kind, ": --init_from starts from its rows with fresh state"));
    }
    if (t.dim != tc.dim()) {
      return absl::FailedPreconditionError(absl::StrCat("embedding table ", tc.name(),
                                                        " was saved with dim ", t.dim,
                                                        ", the config says ", tc.dim()));
    }
  }
  return absl::OkStatus();
}

absl::Status LoadTables(const TrainingConfig& config, ResumePoint* r, PsClient* ps) {
  RETURN_IF_ERROR(CheckTables(config, *r));
  for (const EmbeddingTableConfig& tc : config.embedding_tables()) {
    auto it = r->tables.find(tc.name());
    if (it == r->tables.end()) {
      LOG_WARN("the checkpoint has no rows of embedding table {}: it starts empty", tc.name());
      continue;
    }
    int64_t rows = 0;
    RETURN_IF_ERROR(StreamTableRows(
        Env::Default(), r->rows_from, r->manifest, tc.name(), kRestoreChunkRows,
        [&](const RestoredTable& t) -> absl::Status {
          std::vector<const float*> slots;
          if (r->table_state) {
            for (const std::vector<float>& slot : t.slots) slots.push_back(slot.data());
          }
          rows += static_cast<int64_t>(t.ids.size());
          return ps->LoadRows(tc.name(), t.dim, t.ids, t.values.data(), slots,
                              r->table_state ? t.updates : std::vector<int64_t>(),
                              r->table_state ? t.touched : std::vector<int64_t>());
        }));
    LOG_INFO("embedding table {}: {} rows restored{}", tc.name(), rows,
             r->table_state ? " with their optimizer state" : "");
  }
  return absl::OkStatus();
}

namespace {

// ReadStartPoint's layout of a checkpoint read from `path`.
absl::StatusOr<ResumePoint> LayOut(const RunContext& run, const std::string& path,
                                   RestoredCheckpoint ckpt, bool with_state) {
  const TrainingConfig& config = run.config;
  if (with_state && ckpt.manifest.config_fingerprint() != run.fingerprint) {
    LOG_WARN("resume: {} was written under another training config (fingerprint {:x}, now {:x}); "
             "its variables fit, so training goes on from it",
             path, ckpt.manifest.config_fingerprint(), run.fingerprint);
  }
  if (with_state && !ckpt.manifest.optimizer().empty() &&
      ckpt.manifest.optimizer() != OptimizerKindName(config.optimizer())) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " was saved with optimizer ", ckpt.manifest.optimizer(), ", the config's is ",
        OptimizerKindName(config.optimizer()),
        ": --init_from starts from its values with fresh optimizer state"));
  }
  ResumePoint r;
  if (with_state) r.step = ckpt.manifest.step();
  for (const VariablePlacement& vp : run.placement.variables()) {
    auto it = ckpt.variables.find(vp.spec.name);
    if (it == ckpt.variables.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " has no variable ", vp.spec.name, ": another model?"));
    }
    if (it->second.shape != vp.spec.shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": ", vp.spec.name, " has shape [", absl::StrJoin(it->second.shape, ","),
          "], the model's is [", absl::StrJoin(vp.spec.shape, ","), "]"));
    }
    Tensor t(vp.spec.shape);
    std::copy(it->second.values.begin(), it->second.values.end(), t.data());
    r.params.push_back(std::move(t));
    if (with_state) {
      r.optimizer.slots.push_back(std::move(it->second.slots));
      r.optimizer.updates.push_back(it->second.updates);
    }
  }
  if (with_state) r.cursors.assign(ckpt.manifest.cursors().begin(), ckpt.manifest.cursors().end());
  r.manifest = ckpt.manifest;
  r.tables = std::move(ckpt.tables);
  r.rows_from = path;
  r.table_state = with_state;
  LOG_INFO("{}: from {} (step {}, {} shard(s) written, {} now; optimizer slots {})",
           with_state ? "resume" : "init_from", path, ckpt.manifest.step(),
           ckpt.manifest.num_shards(), run.placement.server_bytes().size(),
           !with_state ? "not taken"
           : ckpt.manifest.slot_names_size() == 0 ? "none"
                                                   : absl::StrJoin(ckpt.manifest.slot_names(), ","));
  return r;
}

// A restore's progress as a log line at most once a second, and at the end
// of one that took longer than a second.
CheckpointProgress RestoreProgressLog() {
  struct State {
    absl::Time start = absl::Now();
    absl::Time last = absl::Now();
  };
  auto state = std::make_shared<State>();
  return [state](int64_t done, int64_t total) {
    const absl::Time now = absl::Now();
    const bool end = done >= total;
    if (now - state->last < absl::Seconds(1) && !(end && now - state->start >= absl::Seconds(1))) {
      return;
    }
    state->last = now;
    LOG_INFO("restoring: {:.1f} of {:.1f} MiB read ({:.0f}%, {:.1f} s)", done / 1048576.0,
             total / 1048576.0, total > 0 ? 100.0 * done / total : 100.0,
             absl::ToDoubleSeconds(now - state->start));
  };
}

}  // namespace

absl::StatusOr<ResumePoint> ReadStartPoint(const RunContext& run, const std::string& path,
                                           bool with_state) {
  ASSIGN_OR_RETURN(RestoredCheckpoint ckpt,
                   LoadCheckpointForRestore(Env::Default(), path, RestoreProgressLog()));
  return LayOut(run, path, std::move(ckpt), with_state);
}

absl::StatusOr<std::optional<ResumePoint>> FindResumePoint(const RunContext& run) {
  const std::string& dir = run.config.checkpoint().dir();
  if (dir.empty()) {
    return absl::FailedPreconditionError("--resume needs checkpoint.dir in the config");
  }
  std::vector<std::string> skipped;
  std::string path;
  absl::StatusOr<RestoredCheckpoint> ckpt =
      LoadLatestGoodCheckpoint(Env::Default(), dir, &skipped, &path, RestoreProgressLog(),
                               /*for_restore=*/true);
  for (const std::string& s : skipped) LOG_WARN("resume: skipping {}", s);
  if (absl::IsNotFound(ckpt.status())) {
    LOG_INFO("resume: {}; starting from the seed at step 0", ckpt.status().message());
    return std::optional<ResumePoint>();
  }
  RETURN_IF_ERROR(ckpt.status());
  ASSIGN_OR_RETURN(ResumePoint r, LayOut(run, path, std::move(*ckpt), /*with_state=*/true));
  return std::optional<ResumePoint>(std::move(r));
}

absl::StatusOr<std::optional<ResumePoint>> FindRollbackPoint(const RunContext& run) {
  const std::string& dir = run.config.checkpoint().dir();
  if (dir.empty()) return std::optional<ResumePoint>();
  ASSIGN_OR_RETURN(std::optional<ResumePoint> point, FindResumePoint(run));
  if (!point.has_value() && Env::Default()->IsDirectory(dir) &&
      !ListCheckpoints(Env::Default(), dir).value_or(std::vector<CheckpointInfo>()).empty()) {
    return absl::DataLossError(
        absl::StrCat("no checkpoint in ", dir, " verifies: nothing to roll back to"));
  }
  return point;
}

void SetAsideAbandonedCheckpoints(const TrainingConfig& config, int64_t step) {
  if (config.checkpoint().dir().empty()) return;
  std::vector<std::string> moved;
  absl::Status st =
      SetAsideCheckpointsAfter(Env::Default(), config.checkpoint().dir(), step, &moved);
  if (!st.ok()) LOG_WARN("setting aside the checkpoints past step {}: {}", step, st);
  for (const std::string& m : moved) {
    LOG_INFO("set aside {}: it is past the step rolled back to", m);
  }
}

namespace {

// What StartRun found, before anything changed on the servers.
struct FoundStart {
  std::optional<ResumePoint> from;
  RunStart run;
  // The servers serve a run an earlier chief process started and had not
  // finished: taken over from its latest checkpoint.
  bool taking_over = false;
};

absl::StatusOr<FoundStart> FindStart(const RunContext& run, const ChiefStart& start, PsClient* ps,
                                     Chief* chief) {
  FoundStart found;
  if (start.resume) {
    // Servers that answer initialised serve the run an earlier process of
    // this chief started (it died; they and the workers went on): this one
    // takes the run over from its latest checkpoint, under a new
    // incarnation, as a rollback does, and the workers follow.
    std::vector<uint64_t> serving;
    int64_t furthest = -1, lowest = std::numeric_limits<int64_t>::max();
    for (int s = 0; s < ps->num_servers(); ++s) {
      PsStatusResponse status;
      if (ps->GetStatus(s, &status).ok() && status.initialized()) {
        serving.push_back(status.incarnation());
        furthest = std::max(furthest, status.version());
        lowest = std::min(lowest, status.version());
      }
    }
    // Every server at max_steps, on one incarnation: the run had finished.
    const bool finished =
        static_cast<int>(serving.size()) == ps->num_servers() &&
        lowest >= run.config.max_steps() &&
        std::all_of(serving.begin(), serving.end(),
                    [&](uint64_t i) { return i == serving.front(); });
    if (serving.empty()) {
      ASSIGN_OR_RETURN(found.from, FindResumePoint(run));
    } else if (finished) {
      found.run.adopted = serving.front();
      found.run.step = lowest;
      LOG_WARN("the parameter servers already finished the run (incarnation {:x}, step {}): "
               "ending it from there",
               found.run.adopted, lowest);
    } else {
      chief->TakeOver(serving);
      LOG_WARN("{} of {} parameter server(s) still serve the run (incarnation {:x}, step {}): "
               "taking it over from its latest checkpoint",
               serving.size(), ps->num_servers(), serving.front(), furthest);
      ASSIGN_OR_RETURN(found.from, FindRollbackPoint(run));
      found.taking_over = true;
    }
  }
  if (!found.from.has_value() && !start.init_from.empty()) {
    ASSIGN_OR_RETURN(found.from, ReadStartPoint(run, start.init_from, /*with_state=*/false));
  }
  return found;
}

}  // namespace

absl::StatusOr<RunStart> StartRun(const RunContext& run, const ChiefStart& start, Model* model,
                                  PsClient* ps, Chief* chief) {
  const TrainingConfig& config = run.config;
  ASSIGN_OR_RETURN(FoundStart found, FindStart(run, start, ps, chief));
  std::optional<ResumePoint>& from = found.from;
  if (found.run.adopted != 0) {
    ps->set_incarnation(found.run.adopted);
    chief->Adopt(found.run.adopted);
  } else if (from.has_value()) {
    found.run.step = from->step;
    RETURN_IF_ERROR(ps->InitializeAll(config, run.fingerprint, run.cluster.num_workers(),
                                      found.run.step, from->params, run.startup_timeout,
                                      from->table_state ? &from->optimizer : nullptr));
    RETURN_IF_ERROR(LoadTables(config, &*from, ps));
    if (from->table_state) {
      LOG_INFO("initialised variables and optimizer slots on {} parameter server(s) from the "
               "checkpoint of step {}",
               run.cluster.num_ps(), found.run.step);
    } else {
      LOG_INFO("initialised variables on {} parameter server(s) from {} (fresh optimizer state)",
               run.cluster.num_ps(), start.init_from);
    }
  } else {
    RETURN_IF_ERROR(ps->InitializeAll(config, run.fingerprint, run.cluster.num_workers(),
                                      /*start_step=*/0, model->Initialize(config.seed()),
                                      run.startup_timeout));
    LOG_INFO("initialised variables on {} parameter server(s) from {}", run.cluster.num_ps(),
             config.model().has_external()
                 ? config.model().external().variables()
                 : absl::StrCat("seed ", config.seed()));
  }
  if (found.taking_over) SetAsideAbandonedCheckpoints(config, found.run.step);
  chief->MarkInitialized(found.run.step,
                         from.has_value() ? from->cursors : std::vector<WorkerCursor>());
  return found.run;
}

}  // namespace pstrain
