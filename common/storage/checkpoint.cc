#include "common/storage/checkpoint.h"

#include <algorithm>
#include <limits>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/base/crc32c.h"
#include "common/base/status_macros.h"
#include "common/storage/checkpoint_rows.h"
#include "google/protobuf/text_format.h"

namespace pstrain {
namespace {

using checkpoint_internal::kAlign;
using checkpoint_internal::kShardMagic;
using checkpoint_internal::RangeFits;
using checkpoint_internal::SaturatingAdd;

constexpr char kCrcPrefix[] = "crc32c: ";
// Embedding rows read without keeping them all (a restore's check, verify)
// are read this many at a time.
constexpr int64_t kChunkRows = 1 << 16;

int64_t Elements(const google::protobuf::RepeatedField<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The same for a shape from outside: -1 when a dimension is negative or the
// product (in bytes of float32) would overflow.
int64_t CheckedElements(const google::protobuf::RepeatedField<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > (int64_t{1} << 60) / d)) return -1;
    n *= d;
  }
  return n;
}

// Steps, shards, ranges and shapes that make sense, before any byte is read.
absl::Status CheckManifest(const CheckpointManifest& m) {
  if (m.step() < 0) return absl::DataLossError("negative step");
  if (m.num_shards() < 1 || m.num_shards() > 100000) {
    return absl::DataLossError(absl::StrCat("num_shards ", m.num_shards()));
  }
  if (m.shards_size() != m.num_shards()) {
    return absl::DataLossError(
        absl::StrCat(m.shards_size(), " shard files listed for ", m.num_shards(), " shards"));
  }
  for (int s = 0; s < m.shards_size(); ++s) {
    const ShardFile& f = m.shards(s);
    if (f.shard() != s || f.file() != ShardFileName(s, m.num_shards()) || f.bytes() < 8) {
      return absl::DataLossError(absl::StrCat("shard entry ", s, " is wrong: ", f.file()));
    }
  }
  std::map<std::string, const CheckpointVariable*> vars;
  for (const CheckpointVariable& v : m.variables()) {
    if (CheckedElements(v.shape()) < 0) {
      return absl::DataLossError(absl::StrCat(v.name(), ": a negative or overflowing shape"));
    }
    // No model has a variable without elements (a layer has at least one
    // unit and one input): a zero dimension is damage, for verify as for
    // every reader.
    if (CheckedElements(v.shape()) == 0) {
      return absl::DataLossError(absl::StrCat(v.name(), ": a zero dimension (no elements)"));
    }
    if (!vars.emplace(v.name(), &v).second) {
      return absl::DataLossError(absl::StrCat(v.name(), " listed twice"));
    }
  }
  for (const CheckpointTensor& t : m.tensors()) {
    const std::string what = absl::StrCat(t.variable(), "/", t.partition(),
                                          t.slot().empty() ? "" : "/", t.slot());
    if (vars.count(t.variable()) == 0) {
      return absl::DataLossError(absl::StrCat(what, ": not a listed variable"));
    }
    if (t.shard() < 0 || t.shard() >= m.num_shards()) {
      return absl::DataLossError(absl::StrCat(what, ": shard ", t.shard()));
    }
    for (int64_t d : t.shape()) {
      if (d < 0) return absl::DataLossError(absl::StrCat(what, ": negative dimension"));
    }
    const int64_t elements = CheckedElements(t.shape());
    if (elements < 0 || t.length() != elements * static_cast<int64_t>(sizeof(float)) ||
        !RangeFits(t.offset(), t.length(), m.shards(t.shard()).bytes())) {
      return absl::DataLossError(absl::StrCat(what, ": byte range ", t.offset(), "+", t.length(),
                                              " does not fit its shape and shard"));
    }
    if (!t.slot().empty() &&
        std::find(m.slot_names().begin(), m.slot_names().end(), t.slot()) ==
            m.slot_names().end()) {
      return absl::DataLossError(absl::StrCat(what, ": unknown slot"));
    }
  }
  std::map<std::string, const CheckpointTable*> tables;
  for (const CheckpointTable& t : m.tables()) {
    if (t.dim() < 1 || t.dim() > 1000000) {
      return absl::DataLossError(absl::StrCat("table ", t.name(), ": dim ", t.dim()));
    }
    if (!tables.emplace(t.name(), &t).second) {
      return absl::DataLossError(absl::StrCat("table ", t.name(), " listed twice"));
    }
  }
  return checkpoint_internal::CheckRowEntries(m);
}

// Where each variable's partitions sit: values and slots of each, by first row.
struct PartitionEntries {
  const CheckpointTensor* values = nullptr;
  std::map<std::string, const CheckpointTensor*> slots;
};

// Checks that the partitions of every variable cover it exactly, once, and
// that each has its values and every slot. Returns them by first row.
absl::StatusOr<std::map<std::string, std::map<int64_t, PartitionEntries>>> IndexPartitions(
    const CheckpointManifest& m) {
  std::map<std::string, std::map<int64_t, PartitionEntries>> out;
  for (const CheckpointVariable& v : m.variables()) out[v.name()];
  for (const CheckpointTensor& t : m.tensors()) {
    PartitionEntries& e = out[t.variable()][t.first_row()];
    const CheckpointTensor*& slot = t.slot().empty() ? e.values : e.slots[t.slot()];
    if (slot != nullptr) {
      return absl::DataLossError(absl::StrCat(t.variable(), " rows from ", t.first_row(), " ",
                                              t.slot().empty() ? "values" : t.slot(),
                                              " listed twice"));
    }
    slot = &t;
  }
  for (const CheckpointVariable& v : m.variables()) {
    const int64_t rows = v.shape().empty() ? 1 : v.shape(0);
    const int64_t row_elements = v.shape().empty() ? 1 : Elements(v.shape()) / std::max<int64_t>(rows, 1);
    int64_t next = 0;
    for (const auto& [first, e] : out[v.name()]) {
      if (e.values == nullptr) {
        return absl::DataLossError(absl::StrCat(v.name(), " rows from ", first, ": no values"));
      }
      if (first != next) {
        return absl::DataLossError(
            absl::StrCat(v.name(), ": partitions do not cover rows ", next, ".."));
      }
      const int64_t elements = Elements(e.values->shape());
      if (row_elements > 0 && elements % row_elements != 0) {
        return absl::DataLossError(absl::StrCat(v.name(), " rows from ", first, ": bad shape"));
      }
      for (const std::string& s : m.slot_names()) {
        auto it = e.slots.find(s);
        if (it == e.slots.end()) {
          return absl::DataLossError(
              absl::StrCat(v.name(), " rows from ", first, ": no slot ", s));
        }
        if (Elements(it->second->shape()) != elements) {
          return absl::DataLossError(
              absl::StrCat(v.name(), " rows from ", first, ": slot ", s, " has another shape"));
        }
      }
      next += v.shape().empty() ? 1 : (row_elements > 0 ? elements / row_elements : rows);
    }
    if (next != rows && !(rows == 0 && next == 0)) {
      return absl::DataLossError(
          absl::StrCat(v.name(), ": partitions cover ", next, " of ", rows, " rows"));
    }
  }
  return out;
}

}  // namespace

std::string CheckpointDirName(int64_t step) { return absl::StrCat("ckpt-", step); }

int64_t CheckpointStepOf(absl::string_view name) {
  absl::string_view rest = name;
  int64_t step = 0;
  if (!absl::ConsumePrefix(&rest, "ckpt-") || !absl::SimpleAtoi(rest, &step) || step < 0 ||
      CheckpointDirName(step) != name) {
    return -1;
  }
  return step;
}

std::string SiblingCheckpointDir(const std::string& ckpt_dir, int64_t step) {
  std::string dir = ckpt_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return JoinPath(Dirname(dir), CheckpointDirName(step));
}

std::string ShardFileName(int shard, int num_shards) {
  return absl::StrCat("shard-", shard, "-of-", num_shards);
}

absl::StatusOr<std::vector<CheckpointTensor>> WriteShard(
    Env* env, const std::string& ckpt_dir, int shard, int num_shards,
    const std::vector<ShardTensor>& tensors, int64_t* bytes, const std::vector<ShardRows>& rows,
    std::vector<CheckpointRows>* row_entries) {
  RETURN_IF_ERROR(env->CreateDirs(ckpt_dir));
  const std::string path = JoinPath(ckpt_dir, ShardFileName(shard, num_shards));
  std::vector<CheckpointTensor> entries;
  std::vector<CheckpointRows> rows_out;
  int64_t at = 0;
  RETURN_IF_ERROR(WriteFileStreamAtomically(env, path, [&](WritableFile* file) -> absl::Status {
    auto append = [&](absl::string_view data) -> absl::Status {
      RETURN_IF_ERROR(file->Append(data));
      at += static_cast<int64_t>(data.size());
      return absl::OkStatus();
    };
    static const char kZeros[kAlign] = {};
    auto align = [&]() -> absl::Status {
      if (at % kAlign == 0) return absl::OkStatus();
      return append(absl::string_view(kZeros, kAlign - at % kAlign));
    };
    // An aligned range of `n` bytes at `p`, described in `range`.
    auto range = [&](const void* p, int64_t n, ByteRange* r) -> absl::Status {
      RETURN_IF_ERROR(align());
      const absl::string_view data(static_cast<const char*>(p), static_cast<size_t>(n));
      r->set_offset(at);
      r->set_length(n);
      r->set_crc32c(Crc32c(data.data(), data.size()));
      return append(data);
    };
    RETURN_IF_ERROR(append(absl::string_view(kShardMagic, sizeof(kShardMagic))));
    for (const ShardTensor& t : tensors) {
      RETURN_IF_ERROR(align());
      const absl::string_view data(reinterpret_cast<const char*>(t.data),
                                   static_cast<size_t>(t.elements) * sizeof(float));
      CheckpointTensor e;
      e.set_variable(t.variable);
      e.set_partition(t.partition);
      e.set_slot(t.slot);
      for (int64_t d : t.shape) e.add_shape(d);
      e.set_first_row(t.first_row);
      e.set_shard(shard);
      e.set_offset(at);
      e.set_length(static_cast<int64_t>(data.size()));
      e.set_crc32c(Crc32c(data.data(), data.size()));
      e.set_updates(t.updates);
      entries.push_back(std::move(e));
      RETURN_IF_ERROR(append(data));
    }
    for (const ShardRows& r : rows) {
      CheckpointRows e;
      e.set_table(r.table);
      e.set_shard(shard);
      if (r.more != nullptr && r.more->rows() > 0) {
        e.set_rows(r.rows + r.more->rows());
        RETURN_IF_ERROR(checkpoint_internal::WriteRowColumns(file, r, &at, &e));
      } else {
        e.set_rows(r.rows);
        const int64_t n = r.rows, floats = r.rows * r.dim * static_cast<int64_t>(sizeof(float));
        RETURN_IF_ERROR(range(r.ids, n * 8, e.mutable_ids()));
        RETURN_IF_ERROR(range(r.values, floats, e.mutable_values()));
        for (const float* slot : r.slots) RETURN_IF_ERROR(range(slot, floats, e.add_slots()));
        RETURN_IF_ERROR(range(r.updates, n * 8, e.mutable_updates()));
        RETURN_IF_ERROR(range(r.touched, n * 8, e.mutable_touched()));
      }
      if (r.delta) {
        e.set_delta(true);
        e.set_deleted(r.deleted);
        RETURN_IF_ERROR(range(r.deleted_ids, r.deleted * 8, e.mutable_deleted_ids()));
      }
      rows_out.push_back(std::move(e));
    }
    return absl::OkStatus();
  }));
  *bytes = at;
  if (row_entries != nullptr) *row_entries = std::move(rows_out);
  return entries;
}

absl::Status WriteManifest(Env* env, const std::string& ckpt_dir,
                           const CheckpointManifest& manifest) {
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(manifest, &text)) {
    return absl::InternalError("cannot print the manifest");
  }
  absl::StrAppend(&text, kCrcPrefix, absl::StrFormat("%08x", Crc32c(text.data(), text.size())),
                  "\n");
  return WriteFileAtomically(env, JoinPath(ckpt_dir, kManifestFile), text);
}

absl::StatusOr<CheckpointManifest> ReadManifest(Env* env, const std::string& ckpt_dir) {
  const std::string path = JoinPath(ckpt_dir, kManifestFile);
  if (!env->FileExists(path)) {
    return absl::NotFoundError(absl::StrCat(path, ": no manifest (an incomplete checkpoint)"));
  }
  RETURN_IF_ERROR(CheckContainedFile(path, kMaxManifestBytes));
  ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  const size_t line = text.rfind(kCrcPrefix);
  if (line == std::string::npos || (line > 0 && text[line - 1] != '\n') || text.back() != '\n') {
    return absl::DataLossError(absl::StrCat(path, ": no CRC line (truncated?)"));
  }
  uint32_t want = 0;
  const std::string hex = text.substr(line + strlen(kCrcPrefix),
                                      text.size() - 1 - line - strlen(kCrcPrefix));
  if (hex.size() != 8 || !absl::SimpleHexAtoi(hex, &want)) {
    return absl::DataLossError(absl::StrCat(path, ": bad CRC line"));
  }
  if (Crc32c(text.data(), line) != want) {
    return absl::DataLossError(absl::StrCat(path, ": CRC32C mismatch (corrupted)"));
  }
  CheckpointManifest m;
  if (!google::protobuf::TextFormat::ParseFromString(text.substr(0, line), &m)) {
    return absl::DataLossError(absl::StrCat(path, ": not a manifest"));
  }
  if (absl::Status st = CheckManifest(m); !st.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": ", st.message()));
  }
  return m;
}

namespace {

// Reads one tensor into `dst` (its length in bytes) and checks its CRC32C.
absl::Status ReadTensorInto(Env* env, const std::string& ckpt_dir,
                            const CheckpointManifest& manifest, const CheckpointTensor& t,
                            float* dst) {
  const std::string file = manifest.shards(t.shard()).file();
  const std::string what = absl::StrCat(file, ": ", t.variable(), " partition ", t.partition(),
                                        t.slot().empty() ? "" : " slot ", t.slot());
  absl::Status st = env->ReadFileRangeInto(JoinPath(ckpt_dir, file), t.offset(), t.length(),
                                           reinterpret_cast<char*>(dst));
  if (!st.ok()) return absl::DataLossError(absl::StrCat(what, ": ", st.message()));
  if (Crc32c(dst, static_cast<size_t>(t.length())) != t.crc32c()) {
    return absl::DataLossError(absl::StrCat(what, ": CRC32C mismatch (corrupted)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<float>> ReadCheckpointTensor(Env* env, const std::string& ckpt_dir,
                                                        const CheckpointManifest& manifest,
                                                        const CheckpointTensor& t) {
  std::vector<float> out(static_cast<size_t>(t.length()) / sizeof(float));
  RETURN_IF_ERROR(ReadTensorInto(env, ckpt_dir, manifest, t, out.data()));
  return out;
}

namespace {

// Problems of the shard files themselves (missing, wrong size, bad header);
// `ok[s]` says whether shard s can be read at all.
std::vector<std::string> ShardFileProblems(Env* env, const std::string& ckpt_dir,
                                           const CheckpointManifest& m, std::vector<bool>* ok) {
  std::vector<std::string> problems;
  ok->assign(m.num_shards(), true);
  for (const ShardFile& f : m.shards()) {
    const std::string path = JoinPath(ckpt_dir, f.file());
    if (absl::Status st = CheckContainedFile(path, std::numeric_limits<int64_t>::max());
        !st.ok()) {
      problems.push_back(absl::StrCat(f.file(), ": ", st.message()));
      (*ok)[f.shard()] = false;
      continue;
    }
    absl::StatusOr<int64_t> size = env->FileSize(path);
    if (!size.ok()) {
      problems.push_back(absl::StrCat(f.file(), ": ", size.status().message()));
      (*ok)[f.shard()] = false;
      continue;
    }
    if (*size != f.bytes()) {
      problems.push_back(absl::StrCat(f.file(), ": ", *size, " bytes, the manifest says ",
                                      f.bytes(), " (truncated or torn)"));
      (*ok)[f.shard()] = false;  // its ranges were checked against the manifest's size
    }
    absl::StatusOr<std::string> magic = env->ReadFileRange(path, 0, sizeof(kShardMagic));
    if (!magic.ok() || *magic != absl::string_view(kShardMagic, sizeof(kShardMagic))) {
      problems.push_back(absl::StrCat(f.file(), ": not a shard file (bad header)"));
    }
  }
  return problems;
}

}  // namespace

std::vector<std::string> VerifyCheckpoint(Env* env, const std::string& ckpt_dir,
                                          const CheckpointProgress& progress) {
  std::vector<std::string> problems;
  absl::StatusOr<CheckpointManifest> m = ReadManifest(env, ckpt_dir);
  if (!m.ok()) {
    problems.push_back(std::string(m.status().message()));
    return problems;
  }
  // Bytes to check: every tensor and row range the manifest names (summed
  // saturating: the lengths are the manifest's, checked only below).
  auto add = SaturatingAdd;
  int64_t total = 0, done = 0;
  for (const CheckpointTensor& t : m->tensors()) total = add(total, t.length());
  for (const CheckpointRows& r : m->rows()) total = add(total, checkpoint_internal::RowsBytes(r));
  auto checked = [&](int64_t bytes) {
    done = add(done, bytes);
    if (progress) progress(done, total);
  };
  std::vector<bool> shard_ok;
  problems = ShardFileProblems(env, ckpt_dir, *m, &shard_ok);
  for (const CheckpointTensor& t : m->tensors()) {
    if (shard_ok[t.shard()]) {
      absl::StatusOr<std::vector<float>> v = ReadCheckpointTensor(env, ckpt_dir, *m, t);
      if (!v.ok()) problems.push_back(std::string(v.status().message()));
    }
    checked(t.length());
  }
  std::map<std::string, RestoredTable> tables;
  for (const CheckpointTable& t : m->tables()) {
    tables[t.name()].dim = t.dim();
    tables[t.name()].slots.resize(t.slot_names_size());
  }
  std::map<std::string, std::vector<uint64_t>> ids;  // every shard's, per table
  for (const auto& [key, links] : checkpoint_internal::ChainsOf(*m)) {
    const auto& [table, shard] = key;
    if (shard_ok[shard]) {
      // Its chain replayed a chunk at a time, only the ids kept.
      std::vector<uint64_t> shard_ids;
      if (absl::Status st = checkpoint_internal::StreamRowChain(
              env, ckpt_dir, *m, links, tables[table].dim, kChunkRows,
              [&shard_ids](const RestoredTable& t) {
                shard_ids.insert(shard_ids.end(), t.ids.begin(), t.ids.end());
                return absl::OkStatus();
              });
          !st.ok()) {
        problems.push_back(std::string(st.message()));
      } else {
        ids[table].insert(ids[table].end(), shard_ids.begin(), shard_ids.end());
      }
    }
    for (const CheckpointRows* r : links) checked(checkpoint_internal::RowsBytes(*r));
  }
  for (auto& [name, all] : ids) {
    if (absl::Status st = checkpoint_internal::CheckUniqueIds(name, &all); !st.ok()) {
      problems.push_back(std::string(st.message()));
    }
  }
  if (absl::StatusOr<std::map<std::string, std::map<int64_t, PartitionEntries>>> index =
          IndexPartitions(*m);
      !index.ok()) {
    problems.push_back(absl::StrCat(kManifestFile, ": ", index.status().message()));
  }
  return problems;
}

absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(Env* env, const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(dir));
  std::vector<CheckpointInfo> out;
  for (const std::string& name : names) {
    const int64_t step = CheckpointStepOf(name);
    if (step < 0) continue;
    const std::string path = JoinPath(dir, name);
    if (!env->IsDirectory(path)) continue;
    CheckpointInfo info;
    info.step = step;
    info.path = path;
    absl::StatusOr<CheckpointManifest> m = ReadManifest(env, path);
    info.complete = m.ok();
    if (m.ok()) {
      info.unix_time_ms = m->unix_time_ms();
      info.chain.assign(m->chain().begin(), m->chain().end());
    }
    if (absl::StatusOr<std::vector<std::string>> files = env->ListDir(path); files.ok()) {
      for (const std::string& f : *files) {
        info.bytes += env->FileSize(JoinPath(path, f)).value_or(0);
      }
    }
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step < b.step; });
  return out;
}

absl::Status WritePointer(Env* env, const std::string& dir, int64_t latest,
                          const std::vector<int64_t>& kept) {
  std::string text = absl::StrCat("latest: ", CheckpointDirName(latest), "\n");
  for (int64_t s : kept) absl::StrAppend(&text, "kept: ", CheckpointDirName(s), "\n");
  return WriteFileAtomically(env, JoinPath(dir, kPointerFile), text);
}

absl::StatusOr<int64_t> ReadPointer(Env* env, const std::string& dir) {
  const std::string path = JoinPath(dir, kPointerFile);
  if (!env->FileExists(path)) return absl::NotFoundError(absl::StrCat(path, ": none"));
  RETURN_IF_ERROR(CheckContainedFile(path, kMaxPointerBytes));
  ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    int64_t step = 0;
    if (absl::ConsumePrefix(&line, "latest: ckpt-") && absl::SimpleAtoi(line, &step) &&
        step >= 0) {
      return step;
    }
  }
  return absl::DataLossError(absl::StrCat(path, ": no \"latest: ckpt-<step>\" line"));
}

absl::Status CommitAndPrune(Env* env, const std::string& dir, int64_t latest, int keep) {
  ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ListCheckpoints(env, dir));
  std::vector<int64_t> kept;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->step <= latest && it->complete && static_cast<int>(kept.size()) < std::max(keep, 1)) {
      kept.push_back(it->step);
    }
  }
  if (kept.empty() || kept.front() != latest) {
    return absl::FailedPreconditionError(
        absl::StrCat(CheckpointDirName(latest), " in ", dir, " is not complete"));
  }
  std::reverse(kept.begin(), kept.end());
  RETURN_IF_ERROR(WritePointer(env, dir, latest, kept));
  // A kept checkpoint's chain (the earlier ones its rows are read from,
  // complete or not) stays with it.
  std::set<int64_t> needed(kept.begin(), kept.end());
  for (const CheckpointInfo& info : all) {
    if (needed.count(info.step) != 0) needed.insert(info.chain.begin(), info.chain.end());
  }
  absl::Status first_error;
  for (const CheckpointInfo& info : all) {
    if (info.step >= latest || needed.count(info.step) > 0) continue;
    absl::Status st = DeleteRecursively(env, info.path);
    if (!st.ok() && first_error.ok()) first_error = st;
  }
  return first_error;
}

absl::Status SetAsideCheckpointsAfter(Env* env, const std::string& dir, int64_t step,
                                      std::vector<std::string>* moved) {
  if (!env->IsDirectory(dir)) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ListCheckpoints(env, dir));
  std::vector<int64_t> kept;
  for (const CheckpointInfo& info : all) {
    if (info.step <= step) {
      if (info.complete) kept.push_back(info.step);
      continue;
    }
    std::string to = absl::StrCat(info.path, ".rolled-back");
    for (int n = 2; env->FileExists(to); ++n) to = absl::StrCat(info.path, ".rolled-back-", n);
    RETURN_IF_ERROR(env->RenameFile(info.path, to));
    if (moved != nullptr) moved->push_back(to);
  }
  RETURN_IF_ERROR(env->SyncDir(dir));
  if (kept.empty()) {
    const std::string pointer = JoinPath(dir, kPointerFile);
    return env->FileExists(pointer) ? env->DeleteFile(pointer) : absl::OkStatus();
  }
  const int64_t latest = kept.back();
  return WritePointer(env, dir, latest, kept);
}

namespace {

// The path of the newest checkpoint of `dir` for which `problems` says
// nothing ("" = good); each newer one is described in `skipped` with what
// `problems` said. NOT_FOUND when none is good.
absl::StatusOr<std::string> NewestAccepted(
    Env* env, const std::string& dir, std::vector<std::string>* skipped,
    const std::function<std::string(const CheckpointInfo&)>& problems) {
  if (!env->IsDirectory(dir)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint directory ", dir));
  }
  ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ListCheckpoints(env, dir));
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string why = problems(*it);
    if (why.empty()) return it->path;
    if (skipped != nullptr) skipped->push_back(absl::StrCat(CheckpointDirName(it->step), ": ", why));
  }
  return absl::NotFoundError(absl::StrCat("no complete, intact checkpoint in ", dir));
}

}  // namespace

absl::StatusOr<std::string> LatestGoodCheckpoint(Env* env, const std::string& dir,
                                                 std::vector<std::string>* skipped) {
  return NewestAccepted(env, dir, skipped, [env](const CheckpointInfo& c) {
    return absl::StrJoin(VerifyCheckpoint(env, c.path), "; ");
  });
}

absl::StatusOr<RestoredCheckpoint> LoadLatestGoodCheckpoint(Env* env, const std::string& dir,
                                                            std::vector<std::string>* skipped,
                                                            std::string* path,
                                                            const CheckpointProgress& progress,
                                                            bool for_restore) {
  std::optional<RestoredCheckpoint> loaded;
  ASSIGN_OR_RETURN(*path, NewestAccepted(env, dir, skipped, [&](const CheckpointInfo& c) {
                     absl::StatusOr<RestoredCheckpoint> r =
                         for_restore ? LoadCheckpointForRestore(env, c.path, progress)
                                     : LoadCheckpoint(env, c.path, progress);
                     if (!r.ok()) return std::string(r.status().message());
                     loaded = std::move(*r);
                     return std::string();
                   }));
  return std::move(*loaded);
}

namespace {

// What Load reads: the variables' values alone; their optimizer slots and
// the embedding rows too; or the slots, with the rows checked and not kept
// (LoadCheckpointForRestore).
enum class LoadMode { kValues, kState, kStateRowsChecked };

absl::StatusOr<RestoredCheckpoint> Load(Env* env, const std::string& ckpt_dir,
                                        const CheckpointProgress& progress, LoadMode mode) {
  const bool state = mode != LoadMode::kValues;
  RestoredCheckpoint out;
  ASSIGN_OR_RETURN(out.manifest, ReadManifest(env, ckpt_dir));
  const CheckpointManifest& m = out.manifest;
  std::vector<bool> shard_ok;
  if (std::vector<std::string> problems = ShardFileProblems(env, ckpt_dir, m, &shard_ok);
      !problems.empty()) {
    return absl::DataLossError(absl::StrCat(ckpt_dir, ": ", absl::StrJoin(problems, "; ")));
  }
  ASSIGN_OR_RETURN(auto index, IndexPartitions(m));
  // Where each tensor goes: its partition's place in the whole variable.
  std::vector<std::pair<const CheckpointTensor*, float*>> reads;
  for (const CheckpointVariable& v : m.variables()) {
    RestoredVariable& rv = out.variables[v.name()];
    rv.shape.assign(v.shape().begin(), v.shape().end());
    const int64_t total = Elements(v.shape());
    rv.values.resize(total);
    if (state) rv.slots.assign(m.slot_names_size(), std::vector<float>(total));
    int64_t at = 0;
    for (const auto& [first, e] : index[v.name()]) {
      const int64_t n = e.values->length() / static_cast<int64_t>(sizeof(float));
      if (at + n > total) {
        return absl::DataLossError(absl::StrCat(v.name(), ": partitions exceed the variable"));
      }
      reads.emplace_back(e.values, rv.values.data() + at);
      for (int s = 0; state && s < m.slot_names_size(); ++s) {
        reads.emplace_back(e.slots.at(m.slot_names(s)), rv.slots[s].data() + at);
      }
      rv.updates = std::max(rv.updates, e.values->updates());
      at += n;
    }
  }
  // Read straight into place and checked, on up to 8 threads (disjoint
  // destinations; pread and the CRC run in parallel).
  std::atomic<size_t> next{0};
  std::vector<absl::Status> errors(reads.size());
  int64_t total = 0;
  for (const auto& [tensor, dst] : reads) total = SaturatingAdd(total, tensor->length());
  absl::Mutex progress_mu;
  int64_t done = 0;
  auto reader = [&]() {
    for (size_t i = next++; i < reads.size(); i = next++) {
      errors[i] = ReadTensorInto(env, ckpt_dir, m, *reads[i].first, reads[i].second);
      if (progress) {
        absl::MutexLock lock(&progress_mu);
        done = SaturatingAdd(done, reads[i].first->length());
        progress(done, total);
      }
    }
  };
  const size_t threads = std::min<size_t>(
      {size_t{8}, std::max(1u, std::thread::hardware_concurrency()), reads.size()});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(reader);
  reader();
  for (std::thread& t : pool) t.join();
  for (const absl::Status& st : errors) RETURN_IF_ERROR(st);
  if (!state) return out;
  for (const CheckpointTable& t : m.tables()) {
    RestoredTable& rt = out.tables[t.name()];
    rt.dim = t.dim();
    rt.optimizer = t.optimizer();
    rt.slots.resize(t.slot_names_size());
  }
  for (const auto& [key, links] : checkpoint_internal::ChainsOf(m)) {
    if (mode == LoadMode::kStateRowsChecked) {
      RETURN_IF_ERROR(checkpoint_internal::CheckRowChain(
          env, ckpt_dir, m, links, out.tables.at(key.first).dim, kChunkRows));
      continue;
    }
    RETURN_IF_ERROR(checkpoint_internal::ReadRowChain(env, ckpt_dir, m, links,
                                                      &out.tables.at(key.first)));
  }
  for (const auto& [name, t] : out.tables) {
    std::vector<uint64_t> ids = t.ids;
    if (absl::Status st = checkpoint_internal::CheckUniqueIds(name, &ids); !st.ok()) {
      return absl::DataLossError(absl::StrCat(ckpt_dir, ": ", st.message()));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<RestoredCheckpoint> LoadCheckpoint(Env* env, const std::string& ckpt_dir,
                                                  const CheckpointProgress& progress) {
  return Load(env, ckpt_dir, progress, LoadMode::kState);
}

absl::StatusOr<RestoredCheckpoint> LoadCheckpointVariables(Env* env, const std::string& ckpt_dir) {
  return Load(env, ckpt_dir, nullptr, LoadMode::kValues);
}

absl::StatusOr<RestoredCheckpoint> LoadCheckpointForRestore(Env* env, const std::string& ckpt_dir,
                                                            const CheckpointProgress& progress) {
  return Load(env, ckpt_dir, progress, LoadMode::kStateRowsChecked);
}

absl::Status StreamTableRows(Env* env, const std::string& ckpt_dir, const CheckpointManifest& m,
                             const std::string& table, int64_t chunk_rows,
                             const std::function<absl::Status(const RestoredTable&)>& fn,
                             RowColumns read) {
  int dim = 0;
  for (const CheckpointTable& t : m.tables()) {
    if (t.name() == table) dim = t.dim();
  }
  if (dim == 0) {
    return absl::NotFoundError(absl::StrCat(ckpt_dir, ": no embedding table ", table));
  }
  for (const auto& [key, links] : checkpoint_internal::ChainsOf(m)) {
    if (key.first != table) continue;
    RETURN_IF_ERROR(checkpoint_internal::StreamRowChain(
        env, ckpt_dir, m, links, dim, std::max<int64_t>(1, chunk_rows), fn, read));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CountTableRows(Env* env, const std::string& ckpt_dir,
                                       const CheckpointManifest& m, const std::string& table) {
  int64_t n = 0;
  RETURN_IF_ERROR(StreamTableRows(
      env, ckpt_dir, m, table, kChunkRows,
      [&n](const RestoredTable& rows) {
        n += static_cast<int64_t>(rows.ids.size());
        return absl::OkStatus();
      },
      RowColumns::kIds));
  return n;
}

ExportProducer TableColumn(Env* env, const std::string& ckpt_dir, const CheckpointManifest* m,
                           const std::string& table, bool ids) {
  return [=](const std::function<absl::Status(absl::string_view)>& append) {
    return StreamTableRows(
        env, ckpt_dir, *m, table, kChunkRows,
        [&](const RestoredTable& rows) {
          const char* data = ids ? reinterpret_cast<const char*>(rows.ids.data())
                                 : reinterpret_cast<const char*>(rows.values.data());
          const size_t bytes =
              ids ? rows.ids.size() * sizeof(uint64_t) : rows.values.size() * sizeof(float);
          return append(absl::string_view(data, bytes));
        },
        ids ? RowColumns::kIds : RowColumns::kValues);
  };
}

absl::StatusOr<std::map<std::string, TableChanges>> LoadTableChanges(Env* env,
                                                                     const std::string& ckpt_dir,
                                                                     int64_t since,
                                                                     bool full_rows) {
  ASSIGN_OR_RETURN(CheckpointManifest m, ReadManifest(env, ckpt_dir));
  std::vector<bool> shard_ok;
  if (std::vector<std::string> problems = ShardFileProblems(env, ckpt_dir, m, &shard_ok);
      !problems.empty()) {
    return absl::DataLossError(absl::StrCat(ckpt_dir, ": ", absl::StrJoin(problems, "; ")));
  }
  std::map<std::string, TableChanges> out;
  for (const CheckpointTable& t : m.tables()) {
    TableChanges& c = out[t.name()];
    c.full = since < 0;
    c.rows.dim = t.dim();
    c.rows.optimizer = t.optimizer();
    c.rows.slots.resize(t.slot_names_size());
  }
  const checkpoint_internal::RowChains chains = checkpoint_internal::ChainsOf(m);
  // A table is a delta only when every server's chain reaches back to `since`.
  for (const auto& [key, links] : chains) {
    if (checkpoint_internal::FirstLinkStep(m, links) > since) out.at(key.first).full = true;
  }
  for (const auto& [key, links] : chains) {
    TableChanges& c = out.at(key.first);
    if (c.full && !full_rows) continue;
    RETURN_IF_ERROR(c.full ? checkpoint_internal::ReadRowChain(env, ckpt_dir, m, links, &c.rows)
                           : checkpoint_internal::ReadRowChainSince(env, ckpt_dir, m, links,
                                                                    since, &c.rows, &c.deleted));
  }
  for (auto& [name, c] : out) {
    std::vector<uint64_t> ids = c.rows.ids;
    if (absl::Status st = checkpoint_internal::CheckUniqueIds(name, &ids); !st.ok()) {
      return absl::DataLossError(absl::StrCat(ckpt_dir, ": ", st.message()));
    }
    std::sort(c.deleted.begin(), c.deleted.end());
  }
  return out;
}

}  // namespace pstrain
