#include "chief/serving_snapshot.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/storage/checkpoint.h"
#include "common/storage/tensor_export.h"

namespace pstrain {
namespace {

constexpr char kLatest[] = "latest";

std::string SnapshotName(int64_t step) { return absl::StrCat("step-", step); }

// The step of a "step-<n>" name, or -1.
int64_t SnapshotStep(absl::string_view name) {
  absl::string_view number = name;
  int64_t step = -1;
  if (!absl::ConsumePrefix(&number, "step-") || !absl::SimpleAtoi(number, &step) || step < 0 ||
      SnapshotName(step) != name) {
    return -1;
  }
  return step;
}

// The latest snapshot: its step and its checkpoint's time (-1s when none
// or unreadable: the next snapshot is then full).
struct Latest {
  int64_t step = -1;
  int64_t checkpoint_time_ms = -1;
};

Latest ReadLatest(Env* env, const std::string& serving_dir) {
  Latest latest;
  absl::StatusOr<std::string> text = env->ReadFile(JoinPath(serving_dir, kLatest));
  if (!text.ok()) return latest;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "latest: ")) latest.step = SnapshotStep(line);
    if (absl::ConsumePrefix(&line, "checkpoint_time_ms: ")) {
      if (!absl::SimpleAtoi(line, &latest.checkpoint_time_ms)) latest.checkpoint_time_ms = -1;
    }
  }
  return latest;
}

// The step whose snapshot the tables may be deltas on: the latest one, if
// it is of the very checkpoint of that step beside `ckpt_dir` (its manifest
// of the same time) and that checkpoint is in `chain`; else -1.
int64_t BaseStep(Env* env, const std::string& serving_dir, const std::string& ckpt_dir,
                 const CheckpointManifest& m) {
  const Latest latest = ReadLatest(env, serving_dir);
  if (latest.step < 0 || latest.step >= m.step() ||
      std::find(m.chain().begin(), m.chain().end(), latest.step) == m.chain().end() ||
      !env->IsDirectory(JoinPath(serving_dir, SnapshotName(latest.step)))) {
    return -1;
  }
  absl::StatusOr<CheckpointManifest> base =
      ReadManifest(env, SiblingCheckpointDir(ckpt_dir, latest.step));
  if (!base.ok() || base->unix_time_ms() != latest.checkpoint_time_ms) return -1;
  return latest.step;
}

}  // namespace

absl::Status WriteServingSnapshot(Env* env, const std::string& serving_dir,
                                  const std::string& ckpt_dir, int64_t step) {
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(RestoredCheckpoint vars, LoadCheckpointVariables(env, ckpt_dir));
  const CheckpointManifest& m = vars.manifest;
  if (m.step() != step) {
    return absl::InternalError(absl::StrCat(ckpt_dir, " is of step ", m.step(), ", not ", step));
  }
  RETURN_IF_ERROR(env->CreateDirs(serving_dir));
  const int64_t base = BaseStep(env, serving_dir, ckpt_dir, m);
  // A full table's rows are streamed as they are written (it may be larger
  // than memory); a delta's are read whole.
  ASSIGN_OR_RETURN(auto tables, LoadTableChanges(env, ckpt_dir, base, /*full_rows=*/false));
  const std::string name = SnapshotName(step);
  const std::string dir = JoinPath(serving_dir, name);
  const std::string tmp = dir + ".tmp";
  if (env->FileExists(tmp)) RETURN_IF_ERROR(DeleteRecursively(env, tmp));
  RETURN_IF_ERROR(env->CreateDirs(tmp));

  std::vector<ExportTensor> dense;
  for (const CheckpointVariable& v : m.variables()) {
    const RestoredVariable& rv = vars.variables.at(v.name());
    dense.push_back({v.name(), rv.shape, rv.values.data(), ExportDtype::kFloat32});
  }
  RETURN_IF_ERROR(WriteSafetensors(env, JoinPath(tmp, "model.safetensors"), dense,
                                   {{"step", absl::StrCat(step)}}));
  bool all_full = true;
  int64_t rows = 0, deleted = 0;
  for (const auto& [table, c] : tables) {
    all_full = all_full && c.full;
    deleted += static_cast<int64_t>(c.deleted.size());
    int64_t n = static_cast<int64_t>(c.rows.ids.size());
    std::map<std::string, std::string> meta = {
        {"kind", c.full ? "full" : "delta"}, {"step", absl::StrCat(step)}, {"table", table}};
    if (!c.full) meta["base"] = SnapshotName(base);
    ExportTensor ids{"ids", {n}, c.rows.ids.data(), ExportDtype::kUint64};
    ExportTensor values{"values", {n, c.rows.dim}, c.rows.values.data(), ExportDtype::kFloat32};
    if (c.full) {
      // Counted, then its ids, then its values, each a chunk at a time.
      ASSIGN_OR_RETURN(n, CountTableRows(env, ckpt_dir, m, table));
      ids.shape = {n};
      values.shape = {n, c.rows.dim};
      ids.produce = TableColumn(env, ckpt_dir, &m, table, /*ids=*/true);
      values.produce = TableColumn(env, ckpt_dir, &m, table, /*ids=*/false);
    }
    rows += n;
    RETURN_IF_ERROR(WriteSafetensors(
        env, JoinPath(tmp, absl::StrCat("table-", table, ".safetensors")),
        {ids, values,
         {"deleted", {static_cast<int64_t>(c.deleted.size())}, c.deleted.data(),
          ExportDtype::kUint64}},
        meta));
  }
  if (env->FileExists(dir)) RETURN_IF_ERROR(DeleteRecursively(env, dir));  // an abandoned one's
  RETURN_IF_ERROR(env->RenameFile(tmp, dir));
  RETURN_IF_ERROR(env->SyncDir(serving_dir));
  RETURN_IF_ERROR(WriteFileAtomically(
      env, JoinPath(serving_dir, kLatest),
      absl::StrCat("latest: ", name, "\ncheckpoint_time_ms: ", m.unix_time_ms(), "\n")));
  // A snapshot whose tables are all full needs none before it; none after
  // it belongs to this timeline.
  if (all_full) {
    ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(serving_dir));
    for (const std::string& n : names) {
      const int64_t s = SnapshotStep(n);
      if (s >= 0 && s != step) RETURN_IF_ERROR(DeleteRecursively(env, JoinPath(serving_dir, n)));
    }
  }
  LOG_INFO("serving snapshot {}: {} dense variable(s), {} table row(s) {}{} in {:.3f} s", dir,
           dense.size(), rows,
           all_full ? "in full" : absl::StrCat("changed since ", SnapshotName(base)),
           deleted > 0 ? absl::StrCat(", ", deleted, " dropped") : "",
           absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace pstrain
