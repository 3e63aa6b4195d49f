#include "common/storage/checkpoint_rows.h"

#include <algorithm>
#include <limits>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/base/crc32c.h"
#include "common/base/status_macros.h"

namespace pstrain {
namespace checkpoint_internal {
namespace {

constexpr int64_t kMaxRows = int64_t{1} << 40;

// The step a link's checkpoint name stands for; -1 when it is not one
// (canonical: nothing else may lead a reader elsewhere).
int64_t LinkStep(const std::string& name) { return CheckpointStepOf(name); }

// Where a link's bytes are: its shard file, opened checked.
struct LinkFile {
  std::string path;
  std::string name;  // for messages: "shard-0-of-2" or "ckpt-100/shard-0-of-2"
  int64_t bytes = 0;
};

absl::StatusOr<LinkFile> OpenLink(Env* env, const std::string& ckpt_dir,
                                  const CheckpointManifest& m, const CheckpointRows& r) {
  LinkFile f;
  const std::string file = ShardFileName(r.shard(), m.num_shards());
  if (r.checkpoint().empty()) {
    f.path = JoinPath(ckpt_dir, file);
    f.name = file;
  } else {
    f.path = JoinPath(SiblingCheckpointDir(ckpt_dir, LinkStep(r.checkpoint())), file);
    f.name = JoinPath(r.checkpoint(), file);
  }
  auto lost = [&f, &r](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(
        f.name, ": ", why,
        r.checkpoint().empty()
            ? ""
            : " (a link of this checkpoint's embedding rows: it must stay beside it)"));
  };
  if (absl::Status st = CheckContainedFile(f.path, std::numeric_limits<int64_t>::max());
      !st.ok()) {
    return lost(st.message());
  }
  absl::StatusOr<int64_t> size = env->FileSize(f.path);
  if (!size.ok()) return lost(size.status().message());
  f.bytes = *size;
  absl::StatusOr<std::string> magic = env->ReadFileRange(f.path, 0, sizeof(kShardMagic));
  if (!magic.ok() || *magic != absl::string_view(kShardMagic, sizeof(kShardMagic))) {
    return lost("not a shard file (bad header)");
  }
  return f;
}

// Reads `range` of `f` into `dst` and checks its CRC32C.
absl::Status ReadRange(Env* env, const LinkFile& f, const ByteRange& range,
                       const std::string& what, void* dst) {
  if (!RangeFits(range.offset(), range.length(), f.bytes)) {
    return absl::DataLossError(absl::StrCat(f.name, ": ", what, ": byte range ", range.offset(),
                                            "+", range.length(), " past the file's ", f.bytes,
                                            " bytes (truncated or torn)"));
  }
  absl::Status st = env->ReadFileRangeInto(f.path, range.offset(), range.length(),
                                           static_cast<char*>(dst));
  if (!st.ok()) return absl::DataLossError(absl::StrCat(f.name, ": ", what, ": ", st.message()));
  if (Crc32c(dst, static_cast<size_t>(range.length())) != range.crc32c()) {
    return absl::DataLossError(absl::StrCat(f.name, ": ", what, ": CRC32C mismatch (corrupted)"));
  }
  return absl::OkStatus();
}

// Every range of link `r` lies in its file: checked before anything is
// sized from its counts (a link's ranges were not checked against its
// file's size with the manifest).
absl::Status CheckLinkRanges(const LinkFile& f, const CheckpointRows& r) {
  std::vector<ByteRange> ranges = {r.ids(), r.values(), r.updates(), r.touched()};
  ranges.insert(ranges.end(), r.slots().begin(), r.slots().end());
  if (r.delta()) ranges.push_back(r.deleted_ids());
  for (const ByteRange& b : ranges) {
    if (!RangeFits(b.offset(), b.length(), f.bytes)) {
      return absl::DataLossError(absl::StrCat(f.name, ": table ", r.table(), ": byte range ",
                                              b.offset(), "+", b.length(), " past the file's ",
                                              f.bytes, " bytes (truncated or torn)"));
    }
  }
  return absl::OkStatus();
}

// Appends link `r`'s rows to `t` (every range read and checked).
absl::Status ReadLinkRows(Env* env, const LinkFile& f, const CheckpointRows& r, RestoredTable* t) {
  RETURN_IF_ERROR(CheckLinkRanges(f, r));
  const size_t n = static_cast<size_t>(r.rows()), at = t->ids.size();
  const std::string what = absl::StrCat("table ", r.table());
  t->ids.resize(at + n);
  t->values.resize((at + n) * t->dim);
  t->updates.resize(at + n);
  t->touched.resize(at + n);
  RETURN_IF_ERROR(ReadRange(env, f, r.ids(), what + " ids", t->ids.data() + at));
  RETURN_IF_ERROR(
      ReadRange(env, f, r.values(), what + " values", t->values.data() + at * t->dim));
  for (int s = 0; s < r.slots_size(); ++s) {
    t->slots[s].resize((at + n) * t->dim);
    RETURN_IF_ERROR(ReadRange(env, f, r.slots(s), absl::StrCat(what, " slot ", s),
                              t->slots[s].data() + at * t->dim));
  }
  RETURN_IF_ERROR(ReadRange(env, f, r.updates(), what + " updates", t->updates.data() + at));
  RETURN_IF_ERROR(ReadRange(env, f, r.touched(), what + " touched", t->touched.data() + at));
  return absl::OkStatus();
}

// Row `from` of `src` into row `to` of `dst` (the same dim and slots).
void CopyRow(const RestoredTable& src, size_t from, RestoredTable* dst, size_t to) {
  const size_t dim = static_cast<size_t>(src.dim);
  dst->ids[to] = src.ids[from];
  // (A chunk read for its ids alone, or ids and values, has no others.)
  if (src.values.empty()) return;
  std::copy_n(src.values.begin() + from * dim, dim, dst->values.begin() + to * dim);
  for (size_t k = 0; k < src.slots.size(); ++k) {
    std::copy_n(src.slots[k].begin() + from * dim, dim, dst->slots[k].begin() + to * dim);
  }
  if (src.updates.empty()) return;
  dst->updates[to] = src.updates[from];
  dst->touched[to] = src.touched[from];
}

// `t`'s columns (those of `columns` only) sized for `n` rows.
void ResizeRows(RestoredTable* t, size_t n, RowColumns columns = RowColumns::kAll) {
  t->ids.resize(n);
  if (columns == RowColumns::kIds) return;
  t->values.resize(n * t->dim);
  if (columns == RowColumns::kValues) return;
  for (auto& slot : t->slots) slot.resize(n * t->dim);
  t->updates.resize(n);
  t->touched.resize(n);
}

}  // namespace

absl::Status WriteRowColumns(WritableFile* file, const ShardRows& r, int64_t* at,
                             CheckpointRows* e) {
  const int64_t n = r.rows + r.more->rows();
  const int64_t floats = int64_t{4} * r.dim;
  const size_t num_slots = r.slots.size();
  std::vector<int64_t> width = {8, floats};
  std::vector<const void*> memory = {r.ids, r.values};
  std::vector<ByteRange*> ranges = {e->mutable_ids(), e->mutable_values()};
  for (const float* slot : r.slots) {
    width.push_back(floats);
    memory.push_back(slot);
    ranges.push_back(e->add_slots());
  }
  width.insert(width.end(), {8, 8});
  memory.insert(memory.end(), {r.updates, r.touched});
  ranges.push_back(e->mutable_updates());
  ranges.push_back(e->mutable_touched());
  const size_t columns = width.size();
  std::vector<int64_t> offset(columns);
  std::vector<uint32_t> crc(columns, 0);
  int64_t end = *at;
  for (size_t c = 0; c < columns; ++c) {
    end = (end + kAlign - 1) / kAlign * kAlign;
    offset[c] = end;
    end += n * width[c];
  }
  // Rows [first, first + count) of column c, from `data`.
  auto put = [&](size_t c, int64_t first, int64_t count, const void* data) -> absl::Status {
    const absl::string_view bytes(static_cast<const char*>(data),
                                  static_cast<size_t>(count * width[c]));
    crc[c] = Crc32cExtend(crc[c], bytes.data(), bytes.size());
    return file->WriteAt(offset[c] + first * width[c], bytes);
  };
  if (r.rows > 0) {
    for (size_t c = 0; c < columns; ++c) RETURN_IF_ERROR(put(c, 0, r.rows, memory[c]));
  }
  int64_t row_bytes = 0;
  for (int64_t w : width) row_bytes += w;
  const int64_t chunk = std::max<int64_t>(1, (int64_t{4} << 20) / row_bytes);
  std::vector<std::vector<char>> buffers(columns);
  for (size_t c = 0; c < columns; ++c) {
    buffers[c].resize(static_cast<size_t>(std::min(chunk, n) * width[c]));
  }
  std::vector<float*> slots(num_slots);
  for (size_t k = 0; k < num_slots; ++k) slots[k] = reinterpret_cast<float*>(buffers[2 + k].data());
  for (int64_t done = r.rows; done < n;) {
    const int64_t m = std::min(chunk, n - done);
    RETURN_IF_ERROR(r.more->Next(m, reinterpret_cast<uint64_t*>(buffers[0].data()),
                                 reinterpret_cast<float*>(buffers[1].data()), slots,
                                 reinterpret_cast<int64_t*>(buffers[columns - 2].data()),
                                 reinterpret_cast<int64_t*>(buffers[columns - 1].data())));
    for (size_t c = 0; c < columns; ++c) RETURN_IF_ERROR(put(c, done, m, buffers[c].data()));
    done += m;
  }
  for (size_t c = 0; c < columns; ++c) {
    ranges[c]->set_offset(offset[c]);
    ranges[c]->set_length(n * width[c]);
    ranges[c]->set_crc32c(crc[c]);
  }
  *at = end;
  return absl::OkStatus();
}

int64_t SaturatingAdd(int64_t a, int64_t b) {
  b = std::max<int64_t>(b, 0);
  return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max() : a + b;
}

bool RangeFits(int64_t offset, int64_t length, int64_t shard_bytes) {
  return length >= 0 && offset >= static_cast<int64_t>(sizeof(kShardMagic)) &&
         offset <= shard_bytes && length <= shard_bytes - offset;
}

absl::Status CheckRowEntries(const CheckpointManifest& m) {
  std::map<std::string, const CheckpointTable*> tables;
  for (const CheckpointTable& t : m.tables()) tables.emplace(t.name(), &t);
  std::set<int64_t> chain;
  for (int64_t s : m.chain()) {
    if (s < 0 || s >= m.step() || (!chain.empty() && s <= *chain.rbegin())) {
      return absl::DataLossError(absl::StrCat(
          "chain: step ", s, " is not ascending or not before this checkpoint's"));
    }
    chain.insert(s);
  }
  std::set<int64_t> named;
  std::map<std::pair<std::string, int>, int64_t> last;  // (table, shard): the last link's step
  for (const CheckpointRows& r : m.rows()) {
    const std::string what = absl::StrCat("table ", r.table(), " rows of shard ", r.shard(),
                                          r.checkpoint().empty() ? "" : " in ", r.checkpoint());
    auto t = tables.find(r.table());
    if (t == tables.end()) return absl::DataLossError(absl::StrCat(what, ": not a listed table"));
    if (r.shard() < 0 || r.shard() >= m.num_shards() || r.rows() < 0 || r.rows() > kMaxRows ||
        r.deleted() < 0 || r.deleted() > kMaxRows) {
      return absl::DataLossError(absl::StrCat(what, ": bad shard or count"));
    }
    if (r.slots_size() != t->second->slot_names_size()) {
      return absl::DataLossError(absl::StrCat(what, ": ", r.slots_size(), " slots, the table has ",
                                              t->second->slot_names_size()));
    }
    int64_t step = m.step();
    if (!r.checkpoint().empty()) {
      step = LinkStep(r.checkpoint());
      if (step < 0 || chain.count(step) == 0) {
        return absl::DataLossError(absl::StrCat(what, ": not a checkpoint of the chain"));
      }
      named.insert(step);
    }
    auto [it, first] = last.try_emplace({r.table(), r.shard()}, step);
    if (first && r.delta()) {
      return absl::DataLossError(absl::StrCat(what, ": a delta with no full save before it"));
    }
    if (!first && !r.delta()) {
      return absl::DataLossError(absl::StrCat(what, ": a second full save, or a repeat"));
    }
    if (!first && step <= it->second) {
      return absl::DataLossError(absl::StrCat(what, ": links out of step order"));
    }
    it->second = step;
    if (!r.delta() && (r.deleted() != 0 || r.deleted_ids().length() != 0)) {
      return absl::DataLossError(absl::StrCat(what, ": dropped ids in a full save"));
    }
    const int64_t floats = r.rows() * t->second->dim() * static_cast<int64_t>(sizeof(float));
    // This checkpoint's own ranges lie in its shard file; a link's are
    // checked against its file when read.
    const int64_t shard_bytes = r.checkpoint().empty() ? m.shards(r.shard()).bytes()
                                                       : std::numeric_limits<int64_t>::max();
    auto fits = [&](const ByteRange& b, int64_t want) {
      return b.length() == want && RangeFits(b.offset(), b.length(), shard_bytes);
    };
    bool ok = fits(r.ids(), r.rows() * 8) && fits(r.values(), floats) &&
              fits(r.updates(), r.rows() * 8) && fits(r.touched(), r.rows() * 8);
    for (const ByteRange& b : r.slots()) ok = ok && fits(b, floats);
    if (r.delta()) ok = ok && fits(r.deleted_ids(), r.deleted() * 8);
    if (!ok) {
      return absl::DataLossError(
          absl::StrCat(what, ": a byte range does not fit its row count and shard"));
    }
  }
  for (const auto& [key, step] : last) {
    if (step != m.step()) {
      return absl::DataLossError(absl::StrCat("table ", key.first, " rows of shard ", key.second,
                                              ": no link of this checkpoint's own"));
    }
  }
  if (named != chain) {
    return absl::DataLossError("chain: lists a checkpoint no rows are read from");
  }
  return absl::OkStatus();
}

RowChains ChainsOf(const CheckpointManifest& m) {
  RowChains chains;
  for (const CheckpointRows& r : m.rows()) chains[{r.table(), r.shard()}].push_back(&r);
  return chains;
}

int64_t RowsBytes(const CheckpointRows& r) {
  int64_t b = 0;
  for (int64_t n : {r.ids().length(), r.values().length(), r.updates().length(),
                    r.touched().length(), r.deleted_ids().length()}) {
    b = SaturatingAdd(b, n);
  }
  for (const ByteRange& s : r.slots()) b = SaturatingAdd(b, s.length());
  return b;
}

absl::Status CheckUniqueIds(const std::string& table, std::vector<uint64_t>* ids) {
  std::sort(ids->begin(), ids->end());
  auto dup = std::adjacent_find(ids->begin(), ids->end());
  if (dup == ids->end()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("table ", table, ": id ", *dup, " is in two shards"));
}

namespace {

// A table being replayed: its rows and where each id's row is.
struct Replay {
  RestoredTable rows;
  absl::flat_hash_map<uint64_t, size_t> at;
  // With `track_gone`: the ids dropped and not back since the replay began.
  bool track_gone = false;
  absl::flat_hash_set<uint64_t> gone;
};

absl::Status TwiceInOneSave(const LinkFile& f, const CheckpointRows& r, uint64_t id) {
  return absl::DataLossError(
      absl::StrCat(f.name, ": table ", r.table(), ": id ", id, " twice in one save"));
}

// Applies delta link `r`: its dropped rows leave (the last row takes the
// place of each), then its changed rows replace theirs or join.
absl::Status ApplyDelta(Env* env, const std::string& ckpt_dir, const CheckpointManifest& m,
                        const CheckpointRows& r, Replay* replay) {
  RestoredTable& cur = replay->rows;
  ASSIGN_OR_RETURN(LinkFile f, OpenLink(env, ckpt_dir, m, r));
  RestoredTable delta;
  delta.dim = cur.dim;
  delta.slots.resize(cur.slots.size());
  RETURN_IF_ERROR(ReadLinkRows(env, f, r, &delta));
  std::vector<uint64_t> deleted(static_cast<size_t>(r.deleted()));
  RETURN_IF_ERROR(ReadRange(env, f, r.deleted_ids(),
                            absl::StrCat("table ", r.table(), " dropped ids"), deleted.data()));
  for (uint64_t id : deleted) {
    if (replay->track_gone) replay->gone.insert(id);
    auto it = replay->at.find(id);
    if (it == replay->at.end()) continue;  // created and dropped between two saves
    const size_t pos = it->second, last = cur.ids.size() - 1;
    replay->at.erase(it);
    if (pos != last) {
      CopyRow(cur, last, &cur, pos);
      replay->at[cur.ids[pos]] = pos;
    }
    ResizeRows(&cur, last);
  }
  std::vector<uint64_t> sorted = delta.ids;
  std::sort(sorted.begin(), sorted.end());
  if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end()) {
    return TwiceInOneSave(f, r, *dup);
  }
  for (size_t i = 0; i < delta.ids.size(); ++i) {
    if (replay->track_gone) replay->gone.erase(delta.ids[i]);
    auto [it, fresh] = replay->at.try_emplace(delta.ids[i], cur.ids.size());
    if (fresh) ResizeRows(&cur, cur.ids.size() + 1);
    CopyRow(delta, i, &cur, it->second);
  }
  return absl::OkStatus();
}

// Appends `rows` to `out`.
void AppendRows(const RestoredTable& rows, RestoredTable* out) {
  const size_t base = out->ids.size();
  ResizeRows(out, base + rows.ids.size());
  for (size_t i = 0; i < rows.ids.size(); ++i) CopyRow(rows, i, out, base + i);
}

// The step of the checkpoint that holds link `r` of `m`.
int64_t StepOf(const CheckpointManifest& m, const CheckpointRows& r) {
  return r.checkpoint().empty() ? m.step() : LinkStep(r.checkpoint());
}

}  // namespace

absl::Status ReadRowChain(Env* env, const std::string& ckpt_dir, const CheckpointManifest& m,
                          const std::vector<const CheckpointRows*>& links, RestoredTable* out) {
  if (links.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(LinkFile first, OpenLink(env, ckpt_dir, m, *links[0]));
  if (links.size() == 1) return ReadLinkRows(env, first, *links[0], out);  // a full save
  Replay replay;
  replay.rows.dim = out->dim;
  replay.rows.slots.resize(out->slots.size());
  RETURN_IF_ERROR(ReadLinkRows(env, first, *links[0], &replay.rows));
  replay.at.reserve(replay.rows.ids.size());
  for (size_t i = 0; i < replay.rows.ids.size(); ++i) {
    if (!replay.at.emplace(replay.rows.ids[i], i).second) {
      return TwiceInOneSave(first, *links[0], replay.rows.ids[i]);
    }
  }
  for (size_t l = 1; l < links.size(); ++l) {
    RETURN_IF_ERROR(ApplyDelta(env, ckpt_dir, m, *links[l], &replay));
  }
  AppendRows(replay.rows, out);
  return absl::OkStatus();
}

namespace {

// Link `r`'s rows (the columns of `read`) read a chunk of `chunk_rows` at a
// time, each column's CRC32C extended as it is read and checked at its end.
// With `fn`: the rows whose id is not in `skip` (all without it) are given
// to fn, and, with `seen`, every id of the link is added to it. Its dropped
// ids, when `seen`, are added after.
absl::Status StreamLink(Env* env, const std::string& ckpt_dir, const CheckpointManifest& m,
                        const CheckpointRows& r, int dim, int64_t chunk_rows, RowColumns read,
                        const absl::flat_hash_set<uint64_t>* skip,
                        absl::flat_hash_set<uint64_t>* seen, const RowChunkFn& fn) {
  ASSIGN_OR_RETURN(LinkFile f, OpenLink(env, ckpt_dir, m, r));
  RETURN_IF_ERROR(CheckLinkRanges(f, r));
  const std::string what = absl::StrCat("table ", r.table());
  const int64_t floats = int64_t{4} * dim;
  std::vector<const ByteRange*> ranges = {&r.ids()};
  std::vector<int64_t> width = {8};
  std::vector<std::string> names = {what + " ids"};
  if (read != RowColumns::kIds) {
    ranges.push_back(&r.values());
    width.push_back(floats);
    names.push_back(what + " values");
  }
  if (read == RowColumns::kAll) {
    for (int k = 0; k < r.slots_size(); ++k) {
      ranges.push_back(&r.slots(k));
      width.push_back(floats);
      names.push_back(absl::StrCat(what, " slot ", k));
    }
    ranges.insert(ranges.end(), {&r.updates(), &r.touched()});
    width.insert(width.end(), {8, 8});
    names.insert(names.end(), {what + " updates", what + " touched"});
  }
  const size_t columns = ranges.size();
  std::vector<uint32_t> crc(columns, 0);
  const int64_t n = r.rows();
  // At most 64 MiB a chunk, whatever the manifest's dim.
  int64_t row_bytes = 0;
  for (int64_t w : width) row_bytes += w;
  chunk_rows = std::clamp<int64_t>((int64_t{64} << 20) / row_bytes, 1, chunk_rows);
  RestoredTable chunk;
  chunk.dim = dim;
  if (read == RowColumns::kAll) chunk.slots.resize(static_cast<size_t>(r.slots_size()));
  for (int64_t begin = 0; begin < n; begin += chunk_rows) {
    const int64_t count = std::min(chunk_rows, n - begin);
    ResizeRows(&chunk, static_cast<size_t>(count), read);
    std::vector<char*> dst = {reinterpret_cast<char*>(chunk.ids.data())};
    if (read != RowColumns::kIds) dst.push_back(reinterpret_cast<char*>(chunk.values.data()));
    if (read == RowColumns::kAll) {
      for (auto& slot : chunk.slots) dst.push_back(reinterpret_cast<char*>(slot.data()));
      dst.push_back(reinterpret_cast<char*>(chunk.updates.data()));
      dst.push_back(reinterpret_cast<char*>(chunk.touched.data()));
    }
    for (size_t c = 0; c < columns; ++c) {
      const int64_t bytes = count * width[c];
      if (absl::Status st = env->ReadFileRangeInto(f.path, ranges[c]->offset() + begin * width[c],
                                                   bytes, dst[c]);
          !st.ok()) {
        return absl::DataLossError(absl::StrCat(f.name, ": ", names[c], ": ", st.message()));
      }
      crc[c] = Crc32cExtend(crc[c], dst[c], static_cast<size_t>(bytes));
    }
    if (!fn) continue;
    // The rows a later link holds or dropped are not given.
    size_t kept = 0;
    for (size_t i = 0; i < chunk.ids.size(); ++i) {
      const uint64_t id = chunk.ids[i];
      const bool later = skip != nullptr && skip->contains(id);
      if (seen != nullptr) seen->insert(id);
      if (later) continue;
      if (kept != i) CopyRow(chunk, i, &chunk, kept);
      ++kept;
    }
    ResizeRows(&chunk, kept, read);
    if (kept > 0) RETURN_IF_ERROR(fn(chunk));
  }
  for (size_t c = 0; c < columns; ++c) {
    if (crc[c] != ranges[c]->crc32c()) {
      return absl::DataLossError(
          absl::StrCat(f.name, ": ", names[c], ": CRC32C mismatch (corrupted)"));
    }
  }
  if (r.delta()) {
    std::vector<uint64_t> deleted(static_cast<size_t>(r.deleted()));
    RETURN_IF_ERROR(ReadRange(env, f, r.deleted_ids(), what + " dropped ids", deleted.data()));
    if (seen != nullptr) seen->insert(deleted.begin(), deleted.end());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRowChain(Env* env, const std::string& ckpt_dir, const CheckpointManifest& m,
                           const std::vector<const CheckpointRows*>& links, int dim,
                           int64_t chunk_rows) {
  for (const CheckpointRows* r : links) {
    RETURN_IF_ERROR(StreamLink(env, ckpt_dir, m, *r, dim, chunk_rows, RowColumns::kAll, nullptr,
                               nullptr, nullptr));
  }
  return absl::OkStatus();
}

absl::Status StreamRowChain(Env* env, const std::string& ckpt_dir, const CheckpointManifest& m,
                            const std::vector<const CheckpointRows*>& links, int dim,
                            int64_t chunk_rows, const RowChunkFn& fn, RowColumns read) {
  // From the last link back: each row is given from the last link that
  // holds it, unless a later one dropped it; the full save's ids are never
  // kept.
  absl::flat_hash_set<uint64_t> later;
  for (size_t l = links.size(); l-- > 0;) {
    RETURN_IF_ERROR(StreamLink(env, ckpt_dir, m, *links[l], dim, chunk_rows, read, &later,
                               l > 0 ? &later : nullptr, fn));
  }
  return absl::OkStatus();
}

int64_t FirstLinkStep(const CheckpointManifest& m,
                      const std::vector<const CheckpointRows*>& links) {
  return links.empty() ? m.step() : StepOf(m, *links[0]);
}

absl::Status ReadRowChainSince(Env* env, const std::string& ckpt_dir,
                               const CheckpointManifest& m,
                               const std::vector<const CheckpointRows*>& links, int64_t since,
                               RestoredTable* out, std::vector<uint64_t>* deleted) {
  if (since < FirstLinkStep(m, links)) {
    return absl::InternalError("ReadRowChainSince: the chain does not reach back that far");
  }
  Replay replay;
  replay.rows.dim = out->dim;
  replay.rows.slots.resize(out->slots.size());
  replay.track_gone = true;
  for (const CheckpointRows* r : links) {
    if (StepOf(m, *r) > since) RETURN_IF_ERROR(ApplyDelta(env, ckpt_dir, m, *r, &replay));
  }
  AppendRows(replay.rows, out);
  const size_t at = deleted->size();
  deleted->insert(deleted->end(), replay.gone.begin(), replay.gone.end());
  std::sort(deleted->begin() + at, deleted->end());
  return absl::OkStatus();
}

}  // namespace checkpoint_internal
}  // namespace pstrain
