#include "chief/chief_runner.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/storage/checkpoint.h"
#include "common/cluster/config.h"
#include "common/storage/env.h"
#include "common/observability/event_writer.h"
#include "common/base/logging.h"
#include "chief/binary_metrics.h"
#include "common/cluster/placement.h"
#include "common/client/ps_client.h"
#include "common/base/status_macros.h"
#include "common/storage/tensor_file.h"
#include "nlohmann/json.hpp"
#include "worker/data/loader.h"
#include "worker/model/backend.h"
#include "worker/model/embedding_bag.h"
#include "worker/model/model.h"

namespace pstrain {
namespace {

struct Evaluation {
  int64_t step = 0;
  EvalResult result;
  // Click-through models: AUC and log loss of the held-out clicks.
  std::optional<double> auc;
  double log_loss = 0;
};

// A click-through model's evaluation: the held-out examples in chunks, each
// chunk's bags built from the rows of its ids as the servers hold them now.
absl::Status EvaluateClickThrough(PsClient* ps, Model* model, const ClickThroughConfig& ct,
                                  const Dataset& test, EvalResult* result) {
  const int dim = ct.embedding_dim();
  const EmbeddingBags bags(test.dim, test.id_fields, dim,
                           ct.mean_bags() ? Combiner::kMean : Combiner::kSum);
  constexpr int64_t kChunk = 8192;
  *result = EvalResult();
  double loss = 0;
  std::vector<float> rows, x;
  for (int64_t start = 0; start < test.size; start += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, test.size - start));
    const SparseBatch batch = SparseBatch::OnePerField(
        test.ids.data() + start * test.id_fields, n, test.id_fields);
    const UniqueRows unique = UniqueRows::Of(batch.ids);
    rows.resize(unique.ids.size() * dim);
    RETURN_IF_ERROR(
        ps->PullRows(ct.table(), dim, unique.ids, 0, absl::ZeroDuration(), rows.data()));
    x.resize(static_cast<size_t>(n) * bags.output_dim());
    bags.Forward(batch, unique, rows.data(), test.x.data() + start * test.dim, x.data());
    EvalResult part;
    RETURN_IF_ERROR(model->Evaluate(x.data(), test.y.data() + start, n, &part));
    loss += part.loss * n;
    result->correct += part.correct;
    result->scores.insert(result->scores.end(), part.scores.begin(), part.scores.end());
  }
  result->count = test.size;
  result->loss = test.size > 0 ? loss / static_cast<double>(test.size) : 0;
  return absl::OkStatus();
}

absl::StatusOr<Evaluation> Evaluate(PsClient* ps, Model* model, const TrainingConfig& config,
                                    const Dataset* test, std::vector<Tensor>* params) {
  PsClient::PullResult pulled;
  RETURN_IF_ERROR(ps->PullAll({}, absl::ZeroDuration(), params, &pulled));
  Evaluation e;
  e.step = *std::min_element(pulled.versions.begin(), pulled.versions.end());
  if (test != nullptr) {
    RETURN_IF_ERROR(model->SetParameters(*params));
    if (config.model().has_click_through()) {
      RETURN_IF_ERROR(
          EvaluateClickThrough(ps, model, config.model().click_through(), *test, &e.result));
    } else {
      RETURN_IF_ERROR(model->Evaluate(test->x.data(), test->y.data(), test->size, &e.result));
    }
    if (!e.result.scores.empty()) {
      absl::StatusOr<double> auc = RocAuc(e.result.scores, test->y);
      if (auc.ok()) e.auc = *auc;
      e.log_loss = LogLoss(e.result.scores, test->y);
    }
  }
  return e;
}

// What a resume starts from: the checkpoint's values and slots laid out for
// this placement, its step and the workers' cursors.
struct ResumePoint {
  int64_t step = 0;
  std::vector<Tensor> params;
  PsClient::OptimizerState optimizer;
  std::vector<WorkerCursor> cursors;
  // Embedding tables' rows, and whether optimizer state (variables' and
  // rows') goes with them: a resume, not an init_from.
  std::map<std::string, RestoredTable> tables;
  bool table_state = false;
};

// Whether the start point's embedding rows fit the config's tables (width,
// and optimizer when their state comes too): checked before anything changes.
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

// Sends the start point's embedding rows to the servers that hold them now.
absl::Status LoadTables(const TrainingConfig& config, ResumePoint* r, PsClient* ps) {
  RETURN_IF_ERROR(CheckTables(config, *r));
  for (const EmbeddingTableConfig& tc : config.embedding_tables()) {
    auto it = r->tables.find(tc.name());
    if (it == r->tables.end()) {
      LOG_WARN("the checkpoint has no rows of embedding table {}: it starts empty", tc.name());
      continue;
    }
    RestoredTable& t = it->second;
    std::vector<const float*> slots;
    if (r->table_state) {
      for (const std::vector<float>& slot : t.slots) slots.push_back(slot.data());
    }
    RETURN_IF_ERROR(ps->LoadRows(tc.name(), t.dim, t.ids, t.values.data(), slots,
                                 r->table_state ? t.updates : std::vector<int64_t>(),
                                 r->table_state ? t.touched : std::vector<int64_t>()));
    LOG_INFO("embedding table {}: {} rows restored{}", tc.name(), t.ids.size(),
             r->table_state ? " with their optimizer state" : "");
  }
  return absl::OkStatus();
}

// Lays the checkpoint read from `path` out for this placement: every variable must
// be there with the model's shape. With `with_state`, also its optimizer
// slots and update counts, step and cursors (a resume); else values alone.
absl::StatusOr<ResumePoint> LoadStartPoint(const TrainingConfig& config, const Placement& placement,
                                           const std::string& path, RestoredCheckpoint ckpt,
                                           bool with_state) {
  if (with_state && ckpt.manifest.config_fingerprint() != ConfigFingerprint(config)) {
    LOG_WARN("resume: {} was written under another training config (fingerprint {:x}, now {:x}); "
             "its variables fit, so training goes on from it",
             path, ckpt.manifest.config_fingerprint(), ConfigFingerprint(config));
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
  for (const VariablePlacement& vp : placement.variables()) {
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
  r.tables = std::move(ckpt.tables);
  r.table_state = with_state;
  LOG_INFO("{}: from {} (step {}, {} shard(s) written, {} now; optimizer slots {})",
           with_state ? "resume" : "init_from", path, ckpt.manifest.step(),
           ckpt.manifest.num_shards(), placement.server_bytes().size(),
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

absl::StatusOr<std::optional<ResumePoint>> FindResumePoint(const TrainingConfig& config,
                                                           const Placement& placement) {
  const std::string& dir = config.checkpoint().dir();
  if (dir.empty()) {
    return absl::FailedPreconditionError("--resume needs checkpoint.dir in the config");
  }
  std::vector<std::string> skipped;
  std::string path;
  absl::StatusOr<RestoredCheckpoint> ckpt =
      LoadLatestGoodCheckpoint(Env::Default(), dir, &skipped, &path, RestoreProgressLog());
  for (const std::string& s : skipped) LOG_WARN("resume: skipping {}", s);
  if (absl::IsNotFound(ckpt.status())) {
    LOG_INFO("resume: {}; starting from the seed at step 0", ckpt.status().message());
    return std::optional<ResumePoint>();
  }
  RETURN_IF_ERROR(ckpt.status());
  ASSIGN_OR_RETURN(ResumePoint r, LoadStartPoint(config, placement, path, std::move(*ckpt),
                                                 /*with_state=*/true));
  return std::optional<ResumePoint>(std::move(r));
}

// Where a rollback of the running run goes back to: the latest good
// checkpoint of the run, or none (its start). Checkpoints that exist but none
// of which verifies are a sick disk, not a reason to throw the run away.
absl::StatusOr<std::optional<ResumePoint>> FindRollbackPoint(const TrainingConfig& config,
                                                             const Placement& placement) {
  const std::string& dir = config.checkpoint().dir();
  if (dir.empty()) return std::optional<ResumePoint>();
  ASSIGN_OR_RETURN(std::optional<ResumePoint> point, FindResumePoint(config, placement));
  if (!point.has_value() && Env::Default()->IsDirectory(dir) &&
      !ListCheckpoints(Env::Default(), dir).value_or(std::vector<CheckpointInfo>()).empty()) {
    return absl::DataLossError(
        absl::StrCat("no checkpoint in ", dir, " verifies: nothing to roll back to"));
  }
  return point;
}

// After a rollback to `step`: the checkpoints past it belong to the
// abandoned timeline, and a later --resume must not take them.
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

// Commits the checkpoint of `step`: waits for every server's shard, writes
// the manifest (the commit marker) and the pointer, and prunes old ones.
// `total_bytes` gets the shards' size.
absl::Status WriteCheckpointManifest(const TrainingConfig& config, const Placement& placement,
                                     PsClient* ps, int num_workers, int64_t step,
                                     absl::Duration timeout, int64_t* total_bytes) {
  const absl::Time start = absl::Now();
  const std::string& dir = config.checkpoint().dir();
  const std::string ckpt_dir = JoinPath(dir, CheckpointDirName(step));
  CheckpointManifest m;
  m.set_step(step);
  m.set_config_fingerprint(ConfigFingerprint(config));
  m.set_num_shards(ps->num_servers());
  m.set_num_workers(num_workers);
  m.set_optimizer(OptimizerKindName(config.optimizer()));
  m.set_unix_time_ms(absl::ToUnixMillis(absl::Now()));
  for (const VariablePlacement& vp : placement.variables()) {
    CheckpointVariable* v = m.add_variables();
    v->set_name(vp.spec.name);
    for (int64_t d : vp.spec.shape) v->add_shape(d);
  }
  int64_t bytes = 0;
  for (int s = 0; s < ps->num_servers(); ++s) {
    GetShardResponse shard;
    RETURN_IF_ERROR(ps->GetShard(s, step, timeout, &shard));
    if (shard.shard() != s) {
      return absl::InternalError(absl::StrCat("server ", s, " wrote shard ", shard.shard()));
    }
    ShardFile* f = m.add_shards();
    f->set_shard(s);
    f->set_file(shard.file());
    f->set_bytes(shard.bytes());
    bytes += shard.bytes();
    for (CheckpointTensor& t : *shard.mutable_tensors()) {
      const VariablePlacement* vp = placement.Find(t.variable());
      if (vp == nullptr || t.partition() < 0 ||
          t.partition() >= static_cast<int>(vp->partitions.size())) {
        return absl::InternalError(absl::StrCat("server ", s, " saved an unknown partition ",
                                                t.variable(), "/", t.partition()));
      }
      t.set_first_row(vp->partitions[t.partition()].row_begin);
      if (!t.slot().empty() &&
          std::find(m.slot_names().begin(), m.slot_names().end(), t.slot()) ==
              m.slot_names().end()) {
        m.add_slot_names(t.slot());
      }
      *m.add_tensors() = std::move(t);
    }
    // Every server heard every worker's push for the step; keep the fullest.
    if (shard.cursors_size() > m.cursors_size()) *m.mutable_cursors() = shard.cursors();
    for (CheckpointRows& r : *shard.mutable_rows()) {
      if (r.shard() != s) {
        return absl::InternalError(absl::StrCat("server ", s, " saved rows as shard ", r.shard()));
      }
      *m.add_rows() = std::move(r);
    }
    if (s == 0) *m.mutable_tables() = shard.tables();
  }
  *total_bytes = bytes;
  RETURN_IF_ERROR(WriteManifest(Env::Default(), ckpt_dir, m));
  RETURN_IF_ERROR(CommitAndPrune(Env::Default(), dir, step, config.checkpoint().keep()));
  LOG_INFO("checkpoint step {}: {} committed ({:.1f} MB in {} shard(s), {:.3f} s after the step's "
           "shards were asked for)",
           step, ckpt_dir, bytes / 1e6, ps->num_servers(),
           absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

// The same, its outcome recorded for the chief's metrics.
absl::Status CommitCheckpoint(const TrainingConfig& config, const Placement& placement,
                              PsClient* ps, int num_workers, int64_t step,
                              absl::Duration timeout, Chief* chief) {
  const absl::Time start = absl::Now();
  int64_t bytes = 0;
  absl::Status st =
      WriteCheckpointManifest(config, placement, ps, num_workers, step, timeout, &bytes);
  chief->RecordCheckpoint(st.ok(), step, bytes, absl::ToDoubleSeconds(absl::Now() - start));
  return st;
}

// A fresh, non-zero incarnation other than `old` (a rollback's).
uint64_t NewIncarnation(uint64_t old) {
  std::random_device rd;
  for (;;) {
    const uint64_t fresh = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    if (fresh != 0 && fresh != old) return fresh;
  }
}

}  // namespace

absl::Status RunChief(const TrainingConfig& config, const ClusterSpec& cluster, uint64_t incarnation,
                      Chief* chief, StopSignal* stop, const ChiefStart& start_from) {
  const absl::Duration rpc_timeout = absl::Milliseconds(config.rpc().rpc_timeout_ms());
  const absl::Duration step_timeout = absl::Milliseconds(config.rpc().step_timeout_ms());
  // The model is written to output_dir at the end: find out now, not after
  // the run, that it cannot be.
  {
    Env* env = Env::Default();
    const std::string probe = JoinPath(config.output_dir(), ".pstrain-write-test");
    absl::Status writable = env->CreateDirs(config.output_dir());
    if (writable.ok()) writable = env->WriteFile(probe, "ok\n", /*sync=*/false);
    if (!writable.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "output_dir ", config.output_dir(), " is not writable: ", writable.message()));
    }
    (void)env->DeleteFile(probe);
  }
  RETURN_IF_ERROR(CheckConfiguredModelFits(config, cluster.num_ps(), "the chief"));
  // The chief evaluates on the CPU: it is one process beside the workers,
  // and its numbers should not depend on which device a run had.
  std::unique_ptr<Backend> cpu = NewCpuBackend(config.compute_threads());
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(config.model(), cpu.get()));
  LOG_INFO("model: {}", model->Summary());
  ASSIGN_OR_RETURN(Placement placement,
                   Placement::Compute(model->variables(), cluster.num_ps(),
                                      config.placement().partition_min_bytes(),
                                      config.placement().partition_max_bytes()));
  // One log line per server and per variable.
  for (absl::string_view line : absl::StrSplit(placement.DebugString(), '\n', absl::SkipEmpty())) {
    LOG_INFO("placement: {}", line);
  }
  std::optional<Dataset> test;
  if (HasTestSplit(config.data())) {
    ASSIGN_OR_RETURN(test, LoadDataset(Env::Default(), config.data(), DataSplit::kTest,
                                       model->input_dim(), model->num_labels()));
    if (test->size == 0) {
      // Its accuracy would read 0.0000, as if the model had learnt nothing.
      return absl::InvalidArgumentError(
          "the test split has no examples: nothing to evaluate on (give data a test file with "
          "examples, or none to train without evaluation)");
    }
    LOG_INFO("{} held-out examples for evaluation", test->size);
  }

  PsClient ps(cluster, &placement, /*worker=*/-1, rpc_timeout);
  ps.set_incarnation(incarnation);
  // The evaluation's pulls: a share of up to 64 MiB in one call, read at
  // one version; a larger one in calls of up to 64 MiB of whole
  // partitions, each at the version it found (the oldest is reported).
  ps.set_chunk_bytes(int64_t{64} << 20);
  ps.set_calls_in_flight(config.rpc().calls_in_flight());
  ps.set_connections_per_server(config.rpc().connections_per_server());
  ps.set_mixed_versions(true);
  // Where the run starts: its own latest checkpoint (--resume), another's
  // values (--init_from), or the seed.
  std::optional<ResumePoint> from;
  bool taking_over = false;
  // Servers that had already finished the run (every one at max_steps, on
  // one incarnation) when its earlier process died: this chief only ends it
  // (evaluation, the last checkpoint, the model) on their incarnation; its
  // workers may be gone.
  uint64_t adopted = 0;
  int64_t start_step = 0;
  if (start_from.resume) {
    // Servers that answer initialised serve the run an earlier process of
    // this chief started (it died; they and the workers went on): this one
    // takes the run over from its latest checkpoint, under a new
    // incarnation, as a rollback does, and the workers follow.
    std::vector<uint64_t> serving;
    int64_t furthest = -1, lowest = std::numeric_limits<int64_t>::max();
    for (int s = 0; s < ps.num_servers(); ++s) {
      PsStatusResponse status;
      if (ps.GetStatus(s, &status).ok() && status.initialized()) {
        serving.push_back(status.incarnation());
        furthest = std::max(furthest, status.version());
        lowest = std::min(lowest, status.version());
      }
    }
    const bool finished =
        static_cast<int>(serving.size()) == ps.num_servers() && lowest >= config.max_steps() &&
        std::all_of(serving.begin(), serving.end(),
                    [&](uint64_t i) { return i == serving.front(); });
    if (serving.empty()) {
      ASSIGN_OR_RETURN(from, FindResumePoint(config, placement));
    } else if (finished) {
      adopted = serving.front();
      start_step = lowest;
      LOG_WARN("the parameter servers already finished the run (incarnation {:x}, step {}): "
               "ending it from there",
               adopted, lowest);
    } else {
      chief->TakeOver(serving);
      LOG_WARN("{} of {} parameter server(s) still serve the run (incarnation {:x}, step {}): "
               "taking it over from its latest checkpoint",
               serving.size(), ps.num_servers(), serving.front(), furthest);
      ASSIGN_OR_RETURN(from, FindRollbackPoint(config, placement));
      taking_over = true;
    }
  }
  if (!from.has_value() && !start_from.init_from.empty()) {
    ASSIGN_OR_RETURN(RestoredCheckpoint ckpt, LoadCheckpoint(Env::Default(), start_from.init_from,
                                                             RestoreProgressLog()));
    ASSIGN_OR_RETURN(from, LoadStartPoint(config, placement, start_from.init_from,
                                          std::move(ckpt), /*with_state=*/false));
  }
  std::vector<Tensor> params;
  if (adopted != 0) {
    ps.set_incarnation(adopted);
    chief->Adopt(adopted);
  } else if (from.has_value()) {
    params = std::move(from->params);
    start_step = from->step;
    RETURN_IF_ERROR(ps.InitializeAll(config, ConfigFingerprint(config), cluster.num_workers(),
                                     start_step, params,
                                     absl::Milliseconds(config.rpc().startup_timeout_ms()),
                                     from->table_state ? &from->optimizer : nullptr));
    RETURN_IF_ERROR(LoadTables(config, &*from, &ps));
    if (from->table_state) {
      LOG_INFO("initialised variables and optimizer slots on {} parameter server(s) from the "
               "checkpoint of step {}",
               cluster.num_ps(), start_step);
    } else {
      LOG_INFO("initialised variables on {} parameter server(s) from {} (fresh optimizer state)",
               cluster.num_ps(), start_from.init_from);
    }
  } else {
    params = model->Initialize(config.seed());
    RETURN_IF_ERROR(ps.InitializeAll(config, ConfigFingerprint(config), cluster.num_workers(),
                                     /*start_step=*/0, params,
                                     absl::Milliseconds(config.rpc().startup_timeout_ms())));
    LOG_INFO("initialised variables on {} parameter server(s) from seed {}", cluster.num_ps(),
             config.seed());
  }
  if (taking_over) SetAsideAbandonedCheckpoints(config, start_step);
  chief->MarkInitialized(start_step, from.has_value() ? from->cursors : std::vector<WorkerCursor>());

  const int64_t max_steps = config.max_steps();
  const int64_t every = config.eval_every_steps() > 0 ? config.eval_every_steps() : max_steps;
  int64_t next_eval = std::min(every, max_steps);
  while (next_eval <= start_step && next_eval < max_steps) next_eval += every;
  next_eval = std::min(next_eval, max_steps);
  // Checkpoints the servers take (every_steps and the last step), committed
  // here in order once the global step has passed them.
  const bool checkpoints = !config.checkpoint().dir().empty();
  const int64_t ckpt_every = config.checkpoint().every_steps();
  auto next_checkpoint_after = [&](int64_t step) -> int64_t {
    if (!checkpoints || step >= max_steps) return std::numeric_limits<int64_t>::max();
    if (ckpt_every <= 0) return max_steps;
    return std::min(max_steps, (step / ckpt_every + 1) * ckpt_every);
  };
  const bool sync = IsSyncMode(config);
  // Servers adopted at their end: the last step's cut is theirs to commit,
  // unless the earlier process did.
  bool last_committed = false;
  if (adopted != 0 && checkpoints) {
    for (const CheckpointInfo& c : ListCheckpoints(Env::Default(), config.checkpoint().dir())
                                       .value_or(std::vector<CheckpointInfo>())) {
      last_committed |= c.step == max_steps && c.complete;
    }
  }
  int64_t next_ckpt = adopted != 0 && checkpoints && sync && !last_committed
                          ? max_steps
                          : next_checkpoint_after(start_step);
  // Sync: cut steps the time trigger asked the servers for.
  std::set<int64_t> asked;
  auto next_sync_cut = [&]() {
    return asked.empty() ? next_ckpt : std::min(next_ckpt, *asked.begin());
  };
  const absl::Duration ckpt_period = absl::Seconds(config.checkpoint().every_seconds());
  absl::Time last_save = absl::Now();
  int64_t step_at_save = start_step;
  auto warn_failed = [](int64_t step, const absl::Status& st) {
    LOG_WARN("checkpoint step {} failed, training goes on (the next one is retried): {}", step,
             st);
  };
  // Async: one cut now, named by the global step the chief has seen; each
  // server holds its pushes while it takes its partitions. Never at or
  // before the last cut: after a resume that is the checkpoint resumed
  // from, whose files a new cut would replace.
  int64_t last_cut = start_step;
  auto async_cut = [&](int64_t step) {
    if (step <= last_cut) return;
    last_cut = step;
    std::vector<SnapshotResponse> cuts;
    absl::Status st = ps.SnapshotAll(step, step_timeout, &cuts);
    if (st.ok()) {
      int64_t held_us = 0;
      std::vector<std::string> versions;
      for (const SnapshotResponse& c : cuts) {
        held_us = std::max(held_us, c.pause_us());
        versions.push_back(absl::StrCat(c.version()));
      }
      LOG_INFO("checkpoint step {}: cut taken, pushes held at most {:.2f} ms; servers at "
               "versions {}",
               step, held_us / 1e3, absl::StrJoin(versions, ", "));
      st = CommitCheckpoint(config, placement, &ps, cluster.num_workers(), step, step_timeout,
                            chief);
    }
    if (st.ok()) {
      last_save = absl::Now();
    } else {
      warn_failed(step, st);
    }
  };
  auto commit_due = [&](int64_t step) {
    // Sync: the servers took each due step's cut at its boundary.
    while (sync && next_sync_cut() <= step) {
      const int64_t cut = next_sync_cut();
      absl::Status st =
          CommitCheckpoint(config, placement, &ps, cluster.num_workers(), cut, step_timeout, chief);
      if (st.ok()) {
        last_save = absl::Now();
      } else {
        warn_failed(cut, st);
      }
      asked.erase(cut);
      if (cut == next_ckpt) next_ckpt = next_checkpoint_after(cut);
    }
    if (!sync && next_ckpt <= step) {
      async_cut(step);
      next_ckpt = next_checkpoint_after(step);
    }
  };
  // checkpoint.every_seconds: async cuts at once; sync asks every server for
  // a cut a few steps past the furthest one, committed when it is reached.
  auto timed_save = [&](int64_t step) {
    if (!checkpoints || ckpt_period <= absl::ZeroDuration() ||
        absl::Now() - last_save < ckpt_period || step >= max_steps) {
      return;
    }
    last_save = absl::Now();  // a failed try is not retried before the next period either
    if (!sync) {
      async_cut(step);
      return;
    }
    int64_t furthest = step;
    for (int s = 0; s < ps.num_servers(); ++s) {
      PsStatusResponse status;
      if (ps.GetStatus(s, &status).ok()) furthest = std::max(furthest, status.version());
    }
    // Far enough ahead that no server passes it before the request lands:
    // 10 steps, or the steps of 200 ms at the rate since the last save.
    const double per_second = (step - step_at_save) / absl::ToDoubleSeconds(ckpt_period);
    const int64_t at = furthest + std::max<int64_t>(10, static_cast<int64_t>(per_second * 0.2));
    step_at_save = step;
    if (at >= next_ckpt || at >= max_steps) return;  // a cut comes by then anyway
    std::vector<SnapshotResponse> ignored;
    absl::Status st = ps.SnapshotAll(at, rpc_timeout, &ignored);
    if (!st.ok()) {
      warn_failed(at, st);
      return;
    }
    asked.insert(at);
    LOG_INFO("checkpoint: {} since the last one; the servers cut at step {}",
             absl::FormatDuration(ckpt_period), at);
  };
  // TensorBoard: <output_dir>/events. A failure to write is logged once and
  // never stops training.
  std::unique_ptr<EventWriter> events;
  {
    auto created = EventWriter::Create(Env::Default(), JoinPath(config.output_dir(), "events"));
    if (created.ok()) {
      events = std::move(*created);
      LOG_INFO("TensorBoard events: {} (tensorboard --logdir {})", events->path(),
               config.output_dir());
    } else {
      LOG_WARN("no TensorBoard events: {}", created.status());
    }
  }
  auto write_events = [&](int64_t step,
                          const std::vector<std::pair<std::string, double>>& scalars) {
    if (events == nullptr) return;
    if (absl::Status st = events->WriteScalars(step, scalars); !st.ok()) {
      LOG_WARN("TensorBoard events stop: {}", st);
      events.reset();
    }
  };
  // Training scalars at most once a second, at the chief's global step
  // (which only grows: TensorBoard drops points of a tag whose step goes back).
  int64_t step_at_scalars = start_step;
  absl::Time time_at_scalars = absl::Now();
  // From the servers' status, polled below: ps:0's learning rate (every
  // server runs the same schedule), and all servers' async staleness totals
  // (a point's staleness is the mean over the pushes since the last point).
  float learning_rate = 0;
  int64_t staleness_count = 0, staleness_count_at_scalars = 0;
  double staleness_sum = 0, staleness_sum_at_scalars = 0;
  auto write_train_scalars = [&](int64_t step) {
    const absl::Time now = absl::Now();
    if (step <= step_at_scalars || now - time_at_scalars < absl::Seconds(1)) return;
    ChiefStatusResponse progress;
    chief->GetStatus(&progress);
    std::vector<std::pair<std::string, double>> scalars = {
        {"train/loss", progress.train_loss()},
        {"train/examples_per_second", progress.examples_per_sec()},
        {"train/step_time_seconds", absl::ToDoubleSeconds(now - time_at_scalars) /
                                        static_cast<double>(step - step_at_scalars)},
        {"train/learning_rate", learning_rate}};
    if (staleness_count > staleness_count_at_scalars) {
      scalars.push_back({"train/staleness", (staleness_sum - staleness_sum_at_scalars) /
                                                static_cast<double>(staleness_count -
                                                                    staleness_count_at_scalars)});
      staleness_count_at_scalars = staleness_count;
      staleness_sum_at_scalars = staleness_sum;
    }
    write_events(step, scalars);
    step_at_scalars = step;
    time_at_scalars = now;
  };
  // Evaluation scalars at the step evaluated (the servers' version pulled).
  auto write_eval_scalars = [&](const Evaluation& e) {
    std::vector<std::pair<std::string, double>> scalars = {{"eval/accuracy", e.result.accuracy()},
                                                           {"eval/loss", e.result.loss}};
    if (e.auc) {
      scalars.push_back({"eval/auc", *e.auc});
      scalars.push_back({"eval/log_loss", e.log_loss});
    }
    write_events(e.step, scalars);
  };
  // --- Rollbacks. A parameter server that restarted (it answers
  // uninitialised, or for another incarnation) lost its partitions, and the
  // others have moved on without it: every server goes back to the latest
  // checkpoint, the one consistent point, under a new incarnation. Workers,
  // refused on the old one, register again (previous_incarnation) and go on
  // from the checkpoint's cursors; nothing else restarts. An operator's
  // `pstrain checkpoint restore` does the same from the checkpoint it names.
  const absl::Duration startup_timeout = absl::Milliseconds(config.rpc().startup_timeout_ms());
  // Where a rollback starts from: the checkpoint named, or else the latest
  // good one of the run (none: the seed at step 0). Read before anything
  // changes, so a bad one leaves the run as it was.
  auto load_point = [&](const std::string& checkpoint)
      -> absl::StatusOr<std::optional<ResumePoint>> {
    std::optional<ResumePoint> point;
    if (!checkpoint.empty()) {
      ASSIGN_OR_RETURN(RestoredCheckpoint ckpt,
                       LoadCheckpoint(Env::Default(), checkpoint, RestoreProgressLog()));
      ASSIGN_OR_RETURN(point, LoadStartPoint(config, placement, checkpoint, std::move(ckpt),
                                             /*with_state=*/true));
    } else {
      ASSIGN_OR_RETURN(point, FindRollbackPoint(config, placement));
    }
    if (!point.has_value() && !start_from.init_from.empty()) {
      // No checkpoint of the run yet: back to where it started.
      ASSIGN_OR_RETURN(RestoredCheckpoint ckpt, LoadCheckpoint(Env::Default(), start_from.init_from,
                                                               RestoreProgressLog()));
      ASSIGN_OR_RETURN(point, LoadStartPoint(config, placement, start_from.init_from,
                                             std::move(ckpt), /*with_state=*/false));
    }
    if (point.has_value()) {
      RETURN_IF_ERROR(CheckTables(config, *point));
    } else {
      LOG_WARN("no checkpoint of the run yet: the job starts again from the seed at step 0");
    }
    return point;
  };
  // Puts `point` on every server under a new incarnation; returns its step.
  auto roll_back = [&](std::optional<ResumePoint> point, const std::string& why,
                       absl::Time began) -> absl::StatusOr<int64_t> {
    chief->BeginRollback();
    chief->SetServersDown(0);
    const uint64_t fresh = NewIncarnation(ps.incarnation());
    ps.set_incarnation(fresh);
    const int64_t step = point.has_value() ? point->step : 0;
    std::vector<Tensor> values =
        point.has_value() ? std::move(point->params) : model->Initialize(config.seed());
    RETURN_IF_ERROR(ps.InitializeAll(config, ConfigFingerprint(config), cluster.num_workers(), step,
                                     values, startup_timeout,
                                     point.has_value() ? &point->optimizer : nullptr));
    if (point.has_value()) RETURN_IF_ERROR(LoadTables(config, &*point, &ps));
    SetAsideAbandonedCheckpoints(config, step);
    chief->FinishRollback(fresh, step,
                          point.has_value() ? point->cursors : std::vector<WorkerCursor>());
    // The driver's schedule from there.
    next_eval = std::min(every, max_steps);
    while (next_eval <= step && next_eval < max_steps) next_eval += every;
    next_eval = std::min(next_eval, max_steps);
    next_ckpt = next_checkpoint_after(step);
    asked.clear();
    last_cut = step;
    step_at_save = step;
    last_save = absl::Now();
    LOG_INFO("rolled back to step {} in {:.3f} s ({}); incarnation {:x}; the workers follow", step,
             absl::ToDoubleSeconds(absl::Now() - began), why, fresh);
    return step;
  };
  // Servers the loop below finds not answering, since when.
  std::vector<absl::Time> down_since(ps.num_servers(), absl::InfiniteFuture());
  // The heartbeat: every 250 ms, on a thread of its own (the driver can be
  // busy evaluating or committing a checkpoint), every server's status; a
  // restarted one wakes the driver, and workers that lost it wait for the
  // rollback instead of failing.
  absl::Notification heartbeat_stop;
  std::thread heartbeat([&] {
    PsClient probe(cluster, &placement, /*worker=*/-1, rpc_timeout);
    while (!heartbeat_stop.WaitForNotificationWithTimeout(absl::Milliseconds(250))) {
      const int64_t generation = chief->health_generation();
      if (generation < 0) continue;  // a rollback under way
      const uint64_t incarnation = chief->incarnation();
      int down = 0;
      bool restarted = false;
      for (int s = 0; s < probe.num_servers(); ++s) {
        PsStatusResponse status;
        if (!probe.GetStatus(s, &status).ok()) {
          ++down;
        } else if (!status.initialized() || status.incarnation() != incarnation) {
          restarted = true;
        }
      }
      chief->SetServerHealth(generation, down, restarted);
    }
  });
  struct JoinOnExit {
    absl::Notification* stop;
    std::thread* thread;
    ~JoinOnExit() {
      stop->Notify();
      thread->join();
    }
  } join_heartbeat{&heartbeat_stop, &heartbeat};
  // Whether every server answers, on this run's incarnation.
  auto servers_on_run = [&ps]() {
    for (int s = 0; s < ps.num_servers(); ++s) {
      PsStatusResponse status;
      if (!ps.GetStatus(s, &status).ok() || !status.initialized() ||
          status.incarnation() != ps.incarnation()) {
        return false;
      }
    }
    return true;
  };
  const absl::Time start = absl::Now();
  for (;;) {
    if (stop->stopped()) {
      chief->RequestStop();
      chief->SetState("stopped");
      return absl::CancelledError(stop->reason());
    }
    // Workers' reports only wake this loop; the step acted on is what the
    // servers confirm (a forged report cannot end the run or trigger a save).
    // The servers' slowest version caps it, as workers report the slowest
    // they pulled; without every server's answer nothing is confirmed.
    // At least every 250 ms the servers are polled: the heartbeat that finds
    // one restarted (or gone) within a quarter second.
    chief->WaitForStep(std::min(next_eval, next_sync_cut()), absl::Milliseconds(250));
    int64_t servers_version = std::numeric_limits<int64_t>::max();
    int64_t count = 0;
    double sum = 0;
    bool all_answered = true;
    int down = 0;
    std::vector<std::string> restarted;
    for (int s = 0; s < ps.num_servers(); ++s) {
      PsStatusResponse status;
      absl::Status answered = ps.GetStatus(s, &status);
      if (!answered.ok()) {
        servers_version = std::numeric_limits<int64_t>::min();
        all_answered = false;
        ++down;
        if (down_since[s] == absl::InfiniteFuture()) {
          down_since[s] = absl::Now();
          LOG_WARN("ps:{} does not answer ({}); waiting up to {} for it to come back", s,
                   answered, absl::FormatDuration(startup_timeout));
        }
        continue;
      }
      if (down_since[s] != absl::InfiniteFuture()) {
        LOG_INFO("ps:{} answers again after {}", s,
                 absl::FormatDuration(absl::Trunc(absl::Now() - down_since[s], absl::Milliseconds(1))));
        down_since[s] = absl::InfiniteFuture();
      }
      if (!status.initialized() || status.incarnation() != ps.incarnation()) {
        restarted.push_back(absl::StrCat("ps:", s));
        servers_version = std::numeric_limits<int64_t>::min();
        all_answered = false;
        continue;
      }
      servers_version = std::min(servers_version, status.version());
      if (s == 0) learning_rate = status.learning_rate();
      count += status.staleness_count();
      sum += status.staleness_sum();
    }
    if (all_answered) {
      if (count < staleness_count_at_scalars) {
        // A server started afresh: its totals began again at 0.
        staleness_count_at_scalars = count;
        staleness_sum_at_scalars = sum;
      }
      staleness_count = count;
      staleness_sum = sum;
    }
    // An operator's restore, or a server that restarted: roll back. Not
    // once the run is finishing (the servers at max_steps, or every worker
    // done): it ends from here.
    const bool finishing = chief->global_step() >= max_steps || chief->AllWorkersDone();
    std::string requested;
    if (chief->TakeRestoreRequest(&requested)) {
      if (finishing) {
        chief->FinishRestoreRequest(
            absl::FailedPreconditionError("the run is finishing: no restore"), 0);
        continue;
      }
      const absl::Time began = absl::Now();
      absl::StatusOr<std::optional<ResumePoint>> point = load_point(requested);
      if (!point.ok()) {
        LOG_WARN("restore of {} refused, training goes on: {}", requested, point.status());
        chief->FinishRestoreRequest(point.status(), 0);
        continue;
      }
      absl::StatusOr<int64_t> to =
          roll_back(std::move(*point), absl::StrCat("an operator's restore of ", requested), began);
      chief->FinishRestoreRequest(to.status(), to.value_or(0));
      if (!to.ok()) {
        chief->FailRollback(to.status());
        return absl::Status(to.status().code(),
                            absl::StrCat("rolling back to ", requested, ": ", to.status().message()));
      }
      continue;
    }
    if (restarted.empty() && chief->server_restarted()) {
      // The heartbeat saw it; this round's poll missed it (back up since?).
      restarted.push_back("a parameter server");
    }
    if (!restarted.empty() && !finishing) {
      const absl::Time began = absl::Now();
      const std::string why =
          absl::StrCat(absl::StrJoin(restarted, ", "), " restarted and lost its partitions");
      LOG_WARN("{}: rolling every server back to the latest checkpoint", why);
      chief->BeginRollback();  // workers that lost the server wait from now on
      absl::StatusOr<std::optional<ResumePoint>> point = load_point("");
      absl::StatusOr<int64_t> to =
          point.ok() ? roll_back(std::move(*point), why, began)
                     : absl::StatusOr<int64_t>(point.status());
      if (!to.ok()) {
        chief->FailRollback(to.status());
        return absl::Status(to.status().code(),
                            absl::StrCat(why, "; the rollback failed: ", to.status().message()));
      }
      continue;
    }
    chief->SetServersDown(down);
    for (int s = 0; s < ps.num_servers(); ++s) {
      if (down_since[s] != absl::InfiniteFuture() && absl::Now() - down_since[s] > startup_timeout) {
        chief->RequestStop();
        chief->SetState("failed");
        return absl::UnavailableError(absl::StrCat(
            "ps:", s, " has not answered for ", absl::FormatDuration(startup_timeout),
            " (rpc.startup_timeout_ms): it is gone"));
      }
    }
    const int64_t step = chief->ConfirmStep(servers_version);
    if (step >= max_steps || chief->AllWorkersDone()) {
      chief->SetState("finishing");  // before the last commit: tasks may leave from here on
    }
    // (While a server is down, the wait for it above bounds the run instead.)
    if (down == 0 && absl::Now() - chief->last_progress() > step_timeout + rpc_timeout) {
      chief->RequestStop();
      chief->SetState("failed");
      return absl::DeadlineExceededError(absl::StrCat(
          "no training progress for ", absl::FormatDuration(step_timeout + rpc_timeout),
          " (global step ", step, "): a worker or parameter server is stuck or gone"));
    }
    if (step >= next_eval && step < max_steps) {
      absl::StatusOr<Evaluation> evaluated =
          Evaluate(&ps, model.get(), config, test ? &*test : nullptr, &params);
      if (!evaluated.ok()) {
        // A server lost in the meantime: the heartbeat above takes it up.
        if (servers_on_run()) return evaluated.status();
        LOG_WARN("evaluation at step {} put off: {}", step, evaluated.status());
        continue;
      }
      const Evaluation& e = *evaluated;
      chief->SetEval(e.step, e.result.accuracy(), e.result.loss);
      ChiefStatusResponse progress;
      chief->GetStatus(&progress);
      LOG_INFO("step {}/{}: train loss {:.4f}, eval accuracy {:.4f}, eval loss {:.4f}{}, {:.0f} "
               "examples/s",
               e.step, max_steps, progress.train_loss(), e.result.accuracy(), e.result.loss,
               e.auc ? absl::StrFormat(", eval AUC %.4f", *e.auc) : "",
               progress.examples_per_sec());
      write_eval_scalars(e);
      while (next_eval <= step) next_eval += every;
      next_eval = std::min(next_eval, max_steps);
    }
    commit_due(std::min(step, max_steps));
    timed_save(step);
    write_train_scalars(step);
    if (step >= max_steps || chief->AllWorkersDone()) break;
  }

  chief->RequestStop();
  chief->SetState("finishing");  // also when the loop ended otherwise
  if (adopted == 0 && !chief->WaitForWorkersDone(step_timeout)) {
    LOG_WARN("not every worker reported done within {}", absl::FormatDuration(step_timeout));
  }
  ASSIGN_OR_RETURN(Evaluation final_eval,
                   Evaluate(&ps, model.get(), config, test ? &*test : nullptr, &params));
  chief->SetEval(final_eval.step, final_eval.result.accuracy(), final_eval.result.loss);
  write_eval_scalars(final_eval);
  if (events != nullptr) (void)events->Sync();
  // The workers can end before their reports carried the last step: commit
  // what the servers reached (the final evaluation pulled their version).
  commit_due(std::min(final_eval.step, max_steps));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);

  Env* env = Env::Default();
  RETURN_IF_ERROR(env->CreateDirs(config.output_dir()));
  TensorMap model_file;
  for (size_t v = 0; v < params.size(); ++v) {
    model_file.emplace(placement.variables()[v].spec.name, params[v]);
  }
  const std::string model_path = JoinPath(config.output_dir(), "model_final.pst");
  RETURN_IF_ERROR(WriteTensorFile(env, model_path, model_file));
  // The servers' own counters: what was applied, dropped as stale, refused.
  int64_t applied = 0, dropped_stale = 0, rejected = 0;
  int64_t final_staleness_count = 0;  // async: over every server's admitted pushes
  double final_staleness_sum = 0;
  // Each embedding table's rows and bytes (values and slots) over every server.
  struct TableTotals {
    int64_t rows = 0;
    int64_t bytes = 0;
  };
  std::map<std::string, TableTotals> tables;
  for (const EmbeddingTableConfig& tc : config.embedding_tables()) tables[tc.name()];
  for (int s = 0; s < ps.num_servers(); ++s) {
    PsStatusResponse status;
    absl::Status st = ps.GetStatus(s, &status);
    if (!st.ok()) {
      LOG_WARN("{}", st);
      continue;
    }
    applied += status.pushes_applied();
    dropped_stale += status.gradients_dropped_stale();
    rejected += status.pushes_rejected();
    final_staleness_count += status.staleness_count();
    final_staleness_sum += status.staleness_sum();
    for (const TableStatus& t : status.tables()) {
      auto it = tables.find(t.name());
      if (it == tables.end()) continue;
      it->second.rows += t.rows();
      it->second.bytes += t.bytes();
    }
  }
  LOG_INFO("parameter servers: {} pushes applied, {} gradients dropped as stale, {} refused",
           applied, dropped_stale, rejected);
  nlohmann::json table_totals = nlohmann::json::object();
  for (const auto& [name, totals] : tables) {
    table_totals[name] = {{"rows", totals.rows}, {"bytes", totals.bytes}};
  }
  ChiefStatusResponse progress;
  chief->GetStatus(&progress);
  // Where a worker's step went, per step on average over every worker's.
  auto per_step_ms = [&progress](double seconds) {
    return progress.local_steps() > 0 ? 1000.0 * seconds / progress.local_steps() : 0.0;
  };
  nlohmann::json summary = {
      {"global_step", final_eval.step},
      {"max_steps", max_steps},
      {"eval_accuracy", final_eval.result.accuracy()},
      {"eval_loss", final_eval.result.loss},
      {"eval_examples", final_eval.result.count},
      {"eval_auc", final_eval.auc ? nlohmann::json(*final_eval.auc) : nlohmann::json()},
      {"eval_log_loss",
       final_eval.auc ? nlohmann::json(final_eval.log_loss) : nlohmann::json()},
      {"train_loss", progress.train_loss()},
      {"examples_per_sec", progress.examples_per_sec()},
      {"worker_steps", progress.local_steps()},
      {"step_time_ms",
       {{"pull", per_step_ms(progress.pull_seconds())},
        {"data", per_step_ms(progress.data_seconds())},
        {"compute", per_step_ms(progress.compute_seconds())},
        {"push", per_step_ms(progress.push_seconds())}}},
      {"train_seconds", seconds},
      {"mode", IsSyncMode(config) ? "sync" : "async"},
      // Async: the mean staleness of the pushes the servers admitted
      // (updates applied between a push's pull and its own), since they
      // started; null in sync mode.
      {"async_staleness_mean",
       final_staleness_count > 0
           ? nlohmann::json(final_staleness_sum / static_cast<double>(final_staleness_count))
           : nlohmann::json()},
      {"num_ps", cluster.num_ps()},
      {"num_workers", cluster.num_workers()},
      {"pushes_applied", applied},
      {"gradients_dropped_stale", dropped_stale},
      {"pushes_refused", rejected},
      {"embedding_tables", table_totals},
  };
  RETURN_IF_ERROR(WriteFileAtomically(env, JoinPath(config.output_dir(), "summary.json"),
                                      summary.dump(2) + "\n"));
  LOG_INFO("training finished at step {} in {:.1f}s: eval accuracy {:.4f}, eval loss {:.4f}; "
           "model written to {}",
           final_eval.step, seconds, final_eval.result.accuracy(), final_eval.result.loss,
           model_path);

  absl::Status st = ps.ShutdownAll("training finished");
  if (!st.ok()) LOG_WARN("shutting down parameter servers: {}", st);
  chief->SetState("finished");
  return absl::OkStatus();
}

}  // namespace pstrain
