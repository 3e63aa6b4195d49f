// Incremental rows (checkpoint.full_every): a server's rows as a chain of a
// full save and deltas in earlier checkpoints' shard files, replayed on
// load, or streamed a chunk at a time for a restore; a shard's columns
// filled from rows read as they are written; verify naming a missing or
// damaged link; pruning that keeps a kept checkpoint's chain; and manifests
// whose chains make no sense refused.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "catch2/catch.hpp"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"
#include "common/testing/temp_dir.h"

namespace pstrain {
namespace {

constexpr int kDim = 2;

// One link of one server's chain: the rows it holds (each value derived
// from the id and the link's step) and, for a delta, the ids dropped.
struct Link {
  int64_t step = 0;
  bool delta = false;
  std::vector<uint64_t> ids;
  std::vector<uint64_t> deleted;
};

float ValueOf(uint64_t id, int64_t step, int k) {
  return static_cast<float>(id) + static_cast<float>(step) / 1000 + static_cast<float>(k) / 10;
}

// Writes `link` as checkpoint ckpt-<step> of one server under `dir`, its
// manifest listing `chain` (the links before it, as a chief lists them) and
// then its own; appends its own entry (named) to `chain`.
void WriteLink(const std::string& dir, const Link& link, std::vector<CheckpointRows>* chain) {
  const size_t n = link.ids.size();
  std::vector<float> values(n * kDim), m(n * kDim), v(n * kDim);
  for (size_t i = 0; i < n; ++i) {
    for (int k = 0; k < kDim; ++k) {
      values[i * kDim + k] = ValueOf(link.ids[i], link.step, k);
      m[i * kDim + k] = 2 * values[i * kDim + k];
      v[i * kDim + k] = 3 * values[i * kDim + k];
    }
  }
  const std::vector<int64_t> updates(n, link.step), touched(n, link.step + 1);
  ShardRows r;
  r.table = "ads";
  r.dim = kDim;
  r.rows = static_cast<int64_t>(n);
  r.ids = link.ids.data();
  r.values = values.data();
  r.slots = {m.data(), v.data()};
  r.updates = updates.data();
  r.touched = touched.data();
  r.delta = link.delta;
  r.deleted = static_cast<int64_t>(link.deleted.size());
  r.deleted_ids = link.deleted.data();
  const std::string ckpt = JoinPath(dir, CheckpointDirName(link.step));
  int64_t bytes = 0;
  std::vector<CheckpointRows> own;
  REQUIRE(WriteShard(Env::Default(), ckpt, 0, 1, {}, &bytes, {r}, &own).ok());
  CheckpointManifest mf;
  mf.set_step(link.step);
  mf.set_num_shards(1);
  mf.set_num_workers(1);
  mf.set_optimizer("adam");
  ShardFile* f = mf.add_shards();
  f->set_shard(0);
  f->set_file(ShardFileName(0, 1));
  f->set_bytes(bytes);
  CheckpointTable* t = mf.add_tables();
  t->set_name("ads");
  t->set_dim(kDim);
  t->set_optimizer("adam");
  t->add_slot_names("m");
  t->add_slot_names("v");
  if (!link.delta) chain->clear();
  for (const CheckpointRows& c : *chain) {
    *mf.add_rows() = c;
    REQUIRE(c.checkpoint().rfind("ckpt-", 0) == 0);
    mf.add_chain(std::stoll(c.checkpoint().substr(5)));
  }
  *mf.add_rows() = own[0];
  REQUIRE(WriteManifest(Env::Default(), ckpt, mf).ok());
  own[0].set_checkpoint(CheckpointDirName(link.step));
  chain->push_back(own[0]);
}

// ckpt-10: rows 1..4 in full; ckpt-20: 2 and 5 changed, 3 dropped;
// ckpt-30: 3 back, 1 dropped (and 9, created and dropped between saves);
// ckpt-40: in full again. Returns the directory.
std::string WriteChain(const std::string& name) {
  const std::string dir = testing::NewTempDir(name);
  std::vector<CheckpointRows> chain;
  WriteLink(dir, {10, false, {1, 2, 3, 4}, {}}, &chain);
  WriteLink(dir, {20, true, {5, 2}, {3}}, &chain);
  WriteLink(dir, {30, true, {3}, {1, 9}}, &chain);
  return dir;
}

// id -> the step of the link its row came from; every value, slot, count
// and step checked against it.
std::map<uint64_t, int64_t> RowsOf(const RestoredCheckpoint& c) {
  const RestoredTable& t = c.tables.at("ads");
  std::map<uint64_t, int64_t> out;
  for (size_t i = 0; i < t.ids.size(); ++i) {
    const int64_t step = t.updates[i];
    for (int k = 0; k < kDim; ++k) {
      CHECK(t.values[i * kDim + k] == ValueOf(t.ids[i], step, k));
      CHECK(t.slots[0][i * kDim + k] == 2 * ValueOf(t.ids[i], step, k));
      CHECK(t.slots[1][i * kDim + k] == 3 * ValueOf(t.ids[i], step, k));
    }
    CHECK(t.touched[i] == step + 1);
    CHECK(out.emplace(t.ids[i], step).second);
  }
  return out;
}

TEST_CASE("a chain of a full save and deltas loads as the rows the server held",
          "[checkpoint][rows][incremental]") {
  const std::string dir = WriteChain("chain");
  for (int64_t step : {10, 20, 30}) {
    CHECK(VerifyCheckpoint(Env::Default(), JoinPath(dir, CheckpointDirName(step))).empty());
  }
  auto c10 = LoadCheckpoint(Env::Default(), JoinPath(dir, "ckpt-10"));
  auto c20 = LoadCheckpoint(Env::Default(), JoinPath(dir, "ckpt-20"));
  auto c30 = LoadCheckpoint(Env::Default(), JoinPath(dir, "ckpt-30"));
  REQUIRE(c10.ok());
  REQUIRE(c20.ok());
  REQUIRE(c30.ok());
  CHECK(RowsOf(*c10) == std::map<uint64_t, int64_t>{{1, 10}, {2, 10}, {3, 10}, {4, 10}});
  CHECK(RowsOf(*c20) == std::map<uint64_t, int64_t>{{1, 10}, {2, 20}, {4, 10}, {5, 20}});
  CHECK(RowsOf(*c30) == std::map<uint64_t, int64_t>{{2, 20}, {3, 30}, {4, 10}, {5, 20}});
  CHECK(std::vector<int64_t>(c30->manifest.chain().begin(), c30->manifest.chain().end()) ==
        std::vector<int64_t>{10, 20});
  auto list = ListCheckpoints(Env::Default(), dir);
  REQUIRE(list.ok());
  REQUIRE(list->size() == 3);
  CHECK(list->back().chain == std::vector<int64_t>{10, 20});
}

// Rows [from, to) of columns held in memory, handed out a chunk at a time
// (a table's rows on disk, as a server's writer reads them); fails once
// `fail_after` rows were given, when set.
class VectorSource : public RowSource {
 public:
  VectorSource(const std::vector<uint64_t>& ids, const std::vector<float>& values,
               const std::vector<std::vector<float>>& slots, const std::vector<int64_t>& updates,
               const std::vector<int64_t>& touched, size_t from, int64_t fail_after = -1)
      : ids_(ids), values_(values), slots_(slots), updates_(updates), touched_(touched),
        first_(from), next_(from), fail_after_(fail_after) {}
  int64_t rows() const override { return static_cast<int64_t>(ids_.size() - first_); }
  absl::Status Next(int64_t n, uint64_t* ids, float* values, const std::vector<float*>& slots,
                    int64_t* updates, int64_t* touched) override {
    if (fail_after_ >= 0 && given_ + n > fail_after_) {
      return absl::DataLossError("row 12345 is damaged");
    }
    const size_t k = static_cast<size_t>(n);
    std::copy_n(ids_.begin() + next_, k, ids);
    std::copy_n(values_.begin() + next_ * kDim, k * kDim, values);
    for (size_t s = 0; s < slots.size(); ++s) {
      std::copy_n(slots_[s].begin() + next_ * kDim, k * kDim, slots[s]);
    }
    std::copy_n(updates_.begin() + next_, k, updates);
    std::copy_n(touched_.begin() + next_, k, touched);
    next_ += k;
    given_ += n;
    ++chunks_;
    return absl::OkStatus();
  }
  int chunks() const { return chunks_; }

 private:
  const std::vector<uint64_t>& ids_;
  const std::vector<float>& values_;
  const std::vector<std::vector<float>>& slots_;
  const std::vector<int64_t>& updates_;
  const std::vector<int64_t>& touched_;
  const size_t first_;
  size_t next_;
  const int64_t fail_after_;
  int64_t given_ = 0;
  int chunks_ = 0;
};

TEST_CASE("rows read a chunk at a time as the shard is written make the same file as rows in "
          "memory",
          "[checkpoint][rows][tier]") {
  // 200,000 rows of 48 bytes: several of the writer's 4 MiB chunks.
  constexpr size_t kRows = 200000, kInMemory = 1234;
  std::vector<uint64_t> ids(kRows), deleted = {7, 8, 9};
  std::vector<float> values(kRows * kDim);
  std::vector<std::vector<float>> slots(2, std::vector<float>(kRows * kDim));
  std::vector<int64_t> updates(kRows), touched(kRows);
  for (size_t i = 0; i < kRows; ++i) {
    ids[i] = i * 2654435761u + 11;
    updates[i] = static_cast<int64_t>(i % 97);
    touched[i] = static_cast<int64_t>(i / 3);
    for (int k = 0; k < kDim; ++k) {
      values[i * kDim + k] = ValueOf(ids[i], 5, k);
      slots[0][i * kDim + k] = 2 * values[i * kDim + k];
      slots[1][i * kDim + k] = -values[i * kDim + k];
    }
  }
  ShardRows r;
  r.table = "ads";
  r.dim = kDim;
  r.ids = ids.data();
  r.values = values.data();
  r.slots = {slots[0].data(), slots[1].data()};
  r.updates = updates.data();
  r.touched = touched.data();
  r.delta = true;
  r.deleted = static_cast<int64_t>(deleted.size());
  r.deleted_ids = deleted.data();
  const std::string dir = testing::NewTempDir("streamed");
  // Every row from memory, and the first kInMemory from memory, the rest
  // from the source: the same bytes and the same entries.
  ShardTensor tensor;
  const std::vector<float> dense = {1, 2, 3};
  tensor.variable = "w";
  tensor.shape = {3};
  tensor.data = dense.data();
  tensor.elements = 3;
  r.rows = static_cast<int64_t>(kRows);
  int64_t whole_bytes = 0, streamed_bytes = 0;
  std::vector<CheckpointRows> whole, streamed;
  REQUIRE(WriteShard(Env::Default(), JoinPath(dir, "whole"), 0, 1, {tensor}, &whole_bytes, {r},
                     &whole)
              .ok());
  VectorSource source(ids, values, slots, updates, touched, kInMemory);
  r.rows = static_cast<int64_t>(kInMemory);
  r.more = &source;
  REQUIRE(WriteShard(Env::Default(), JoinPath(dir, "streamed"), 0, 1, {tensor}, &streamed_bytes,
                     {r}, &streamed)
              .ok());
  CHECK(source.chunks() > 1);
  CHECK(streamed_bytes == whole_bytes);
  REQUIRE(streamed.size() == 1);
  CHECK(streamed[0].DebugString() == whole[0].DebugString());
  CHECK(streamed[0].rows() == static_cast<int64_t>(kRows));
  CHECK(Env::Default()->ReadFile(JoinPath(dir, "streamed/shard-0-of-1")).value() ==
        Env::Default()->ReadFile(JoinPath(dir, "whole/shard-0-of-1")).value());

  // A row the source cannot give fails the shard, and leaves no file.
  VectorSource failing(ids, values, slots, updates, touched, kInMemory, 100000);
  r.more = &failing;
  const absl::Status st = WriteShard(Env::Default(), JoinPath(dir, "failed"), 0, 1, {tensor},
                                     &streamed_bytes, {r}, &streamed)
                              .status();
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK(st.message() == "row 12345 is damaged");
  CHECK(Env::Default()->ListDir(JoinPath(dir, "failed")).value().empty());
}

// Checkpoint `ckpt`'s table "ads" as a restore streams it, `chunk_rows` at
// a time, gathered.
RestoredCheckpoint Streamed(const std::string& ckpt, int64_t chunk_rows) {
  auto m = ReadManifest(Env::Default(), ckpt);
  REQUIRE(m.ok());
  RestoredCheckpoint c;
  RestoredTable& all = c.tables["ads"];
  all.slots.resize(2);
  int chunks = 0;
  REQUIRE(StreamTableRows(Env::Default(), ckpt, *m, "ads", chunk_rows,
                          [&](const RestoredTable& t) {
                            CHECK(t.dim == kDim);
                            CHECK(static_cast<int64_t>(t.ids.size()) <= chunk_rows);
                            all.ids.insert(all.ids.end(), t.ids.begin(), t.ids.end());
                            all.values.insert(all.values.end(), t.values.begin(), t.values.end());
                            for (size_t k = 0; k < 2; ++k) {
                              all.slots[k].insert(all.slots[k].end(), t.slots[k].begin(),
                                                  t.slots[k].end());
                            }
                            all.updates.insert(all.updates.end(), t.updates.begin(),
                                               t.updates.end());
                            all.touched.insert(all.touched.end(), t.touched.begin(),
                                               t.touched.end());
                            ++chunks;
                            return absl::OkStatus();
                          })
              .ok());
  CHECK(chunks >= 1);
  return c;
}

TEST_CASE("a restore streams a chain's rows a chunk at a time, as the chain replays them",
          "[checkpoint][rows][incremental]") {
  const std::string dir = WriteChain("chain-streamed");
  for (int64_t step : {10, 20, 30}) {
    const std::string ckpt = JoinPath(dir, CheckpointDirName(step));
    auto whole = LoadCheckpoint(Env::Default(), ckpt);
    REQUIRE(whole.ok());
    // Read for a restore: checked, the rows not kept.
    auto checked = LoadCheckpointForRestore(Env::Default(), ckpt);
    REQUIRE(checked.ok());
    CHECK(checked->tables.at("ads").dim == kDim);
    CHECK(checked->tables.at("ads").slots.size() == 2);
    CHECK(checked->tables.at("ads").ids.empty());
    for (int64_t chunk : {1, 3, 1000}) {
      INFO("step " << step << ", chunks of " << chunk);
      CHECK(RowsOf(Streamed(ckpt, chunk)) == RowsOf(*whole));
    }
  }
  // The ids alone, or the ids and values: the same rows in the same order,
  // the other columns not read.
  for (int64_t step : {10, 30}) {
    const std::string ckpt = JoinPath(dir, CheckpointDirName(step));
    const RestoredCheckpoint all = Streamed(ckpt, 3);
    auto mc = ReadManifest(Env::Default(), ckpt);
    REQUIRE(mc.ok());
    for (RowColumns read : {RowColumns::kIds, RowColumns::kValues}) {
      std::vector<uint64_t> ids;
      std::vector<float> values;
      REQUIRE(StreamTableRows(
                  Env::Default(), ckpt, *mc, "ads", 3,
                  [&](const RestoredTable& t) {
                    CHECK(t.slots.empty());
                    CHECK(t.updates.empty());
                    CHECK(t.values.size() == (read == RowColumns::kIds ? 0 : t.ids.size() * kDim));
                    ids.insert(ids.end(), t.ids.begin(), t.ids.end());
                    values.insert(values.end(), t.values.begin(), t.values.end());
                    return absl::OkStatus();
                  },
                  read)
                  .ok());
      CHECK(ids == all.tables.at("ads").ids);
      if (read == RowColumns::kValues) CHECK(values == all.tables.at("ads").values);
    }
    auto counted = CountTableRows(Env::Default(), ckpt, *mc, "ads");
    REQUIRE(counted.ok());
    CHECK(*counted == static_cast<int64_t>(all.tables.at("ads").ids.size()));
  }
  auto m = ReadManifest(Env::Default(), JoinPath(dir, "ckpt-30"));
  REQUIRE(m.ok());
  CHECK(StreamTableRows(Env::Default(), JoinPath(dir, "ckpt-30"), *m, "clicks", 10,
                        [](const RestoredTable&) { return absl::OkStatus(); })
            .code() == absl::StatusCode::kNotFound);
  // An error from the receiver stops the stream with it.
  int calls = 0;
  CHECK(StreamTableRows(Env::Default(), JoinPath(dir, "ckpt-30"), *m, "ads", 1,
                        [&calls](const RestoredTable&) {
                          ++calls;
                          return absl::UnavailableError("server gone");
                        })
            .message() == "server gone");
  CHECK(calls == 1);
}

TEST_CASE("pruning keeps a kept checkpoint's chain, complete or not, and no more",
          "[checkpoint][rows][incremental]") {
  const std::string dir = WriteChain("chain-prune");
  // ckpt-20 as if its commit had failed: no manifest, still a link of 30.
  REQUIRE(Env::Default()->DeleteFile(JoinPath(dir, "ckpt-20/manifest")).ok());
  REQUIRE(Env::Default()->CreateDirs(JoinPath(dir, "ckpt-25")).ok());  // incomplete, no link
  REQUIRE(CommitAndPrune(Env::Default(), dir, 30, 1).ok());
  CHECK(Env::Default()->IsDirectory(JoinPath(dir, "ckpt-10")));
  CHECK(Env::Default()->IsDirectory(JoinPath(dir, "ckpt-20")));
  CHECK_FALSE(Env::Default()->IsDirectory(JoinPath(dir, "ckpt-25")));
  CHECK(VerifyCheckpoint(Env::Default(), JoinPath(dir, "ckpt-30")).empty());
  // A full save at 40: the old chain goes.
  std::vector<CheckpointRows> chain;
  WriteLink(dir, {40, false, {7}, {}}, &chain);
  REQUIRE(CommitAndPrune(Env::Default(), dir, 40, 1).ok());
  auto list = ListCheckpoints(Env::Default(), dir);
  REQUIRE(list.ok());
  REQUIRE(list->size() == 1);
  CHECK(list->front().step == 40);
}

TEST_CASE("a missing or damaged link is named, and the newest good checkpoint restores",
          "[checkpoint][rows][incremental][faults]") {
  {
    const std::string dir = WriteChain("chain-missing");
    REQUIRE(DeleteRecursively(Env::Default(), JoinPath(dir, "ckpt-20")).ok());
    const std::vector<std::string> problems =
        VerifyCheckpoint(Env::Default(), JoinPath(dir, "ckpt-30"));
    REQUIRE(problems.size() == 1);
    CHECK(problems[0].find("ckpt-20/shard-0-of-1: ") == 0);
    CHECK(problems[0].find("it must stay beside it") != std::string::npos);
    std::vector<std::string> skipped;
    std::string path;
    auto c = LoadLatestGoodCheckpoint(Env::Default(), dir, &skipped, &path);
    REQUIRE(c.ok());
    CHECK(path == JoinPath(dir, "ckpt-10"));
    REQUIRE(skipped.size() == 1);
    CHECK(skipped[0].find("ckpt-30: ") == 0);
  }
  {
    const std::string dir = WriteChain("chain-damaged");
    auto m = ReadManifest(Env::Default(), JoinPath(dir, "ckpt-30"));
    REQUIRE(m.ok());
    const CheckpointRows& own = m->rows(m->rows_size() - 1);
    REQUIRE(own.deleted() == 2);
    const std::string shard = JoinPath(dir, "ckpt-30/shard-0-of-1");
    auto bytes = Env::Default()->ReadFile(shard);
    REQUIRE(bytes.ok());
    (*bytes)[own.deleted_ids().offset() + 3] ^= 1;
    REQUIRE(Env::Default()->WriteFile(shard, *bytes, false).ok());
    const std::vector<std::string> problems =
        VerifyCheckpoint(Env::Default(), JoinPath(dir, "ckpt-30"));
    REQUIRE(problems.size() == 1);
    CHECK(problems[0] == "shard-0-of-1: table ads dropped ids: CRC32C mismatch (corrupted)");
    // A link cut short (torn) is found by its ranges, before any read.
    const std::string link = JoinPath(dir, "ckpt-10/shard-0-of-1");
    auto whole = Env::Default()->ReadFile(link);
    REQUIRE(whole.ok());
    REQUIRE(Env::Default()->WriteFile(link, whole->substr(0, whole->size() - 8), false).ok());
    const std::string torn =
        absl::StrJoin(VerifyCheckpoint(Env::Default(), JoinPath(dir, "ckpt-20")), "; ");
    CHECK(torn.find("ckpt-10/shard-0-of-1: table ads") != std::string::npos);
    CHECK(torn.find("truncated or torn") != std::string::npos);
  }
  {
    // A restore's read finds a damaged link, in its dropped ids or a row
    // column, before any row is given, and goes back to a good checkpoint.
    const std::string dir = WriteChain("chain-restore-damaged");
    auto m = ReadManifest(Env::Default(), JoinPath(dir, "ckpt-30"));
    REQUIRE(m.ok());
    const CheckpointRows& own = m->rows(m->rows_size() - 1);
    const std::string shard = JoinPath(dir, "ckpt-30/shard-0-of-1");
    auto bytes = Env::Default()->ReadFile(shard);
    REQUIRE(bytes.ok());
    (*bytes)[own.deleted_ids().offset() + 3] ^= 1;
    REQUIRE(Env::Default()->WriteFile(shard, *bytes, false).ok());
    CHECK(LoadCheckpointForRestore(Env::Default(), JoinPath(dir, "ckpt-30")).status().message() ==
          "shard-0-of-1: table ads dropped ids: CRC32C mismatch (corrupted)");
    const std::string first = JoinPath(dir, "ckpt-20/shard-0-of-1");
    auto m20 = ReadManifest(Env::Default(), JoinPath(dir, "ckpt-20"));
    REQUIRE(m20.ok());
    auto first_bytes = Env::Default()->ReadFile(first);
    REQUIRE(first_bytes.ok());
    (*first_bytes)[m20->rows(m20->rows_size() - 1).values().offset() + 5] ^= 4;
    REQUIRE(Env::Default()->WriteFile(first, *first_bytes, false).ok());
    CHECK(LoadCheckpointForRestore(Env::Default(), JoinPath(dir, "ckpt-20")).status().message() ==
          "shard-0-of-1: table ads values: CRC32C mismatch (corrupted)");
    std::vector<std::string> skipped;
    std::string path;
    auto c = LoadLatestGoodCheckpoint(Env::Default(), dir, &skipped, &path, nullptr,
                                      /*for_restore=*/true);
    REQUIRE(c.ok());
    CHECK(path == JoinPath(dir, "ckpt-10"));
    CHECK(skipped.size() == 2);
  }
}

TEST_CASE("a table's changes since an earlier checkpoint of its chain, or all its rows",
          "[checkpoint][rows][incremental]") {
  const std::string dir = WriteChain("chain-since");
  const std::string ckpt = JoinPath(dir, "ckpt-30");
  auto ids = [](const TableChanges& c) {
    std::vector<uint64_t> out = c.rows.ids;
    std::sort(out.begin(), out.end());
    return out;
  };
  auto since20 = LoadTableChanges(Env::Default(), ckpt, 20);
  REQUIRE(since20.ok());
  const TableChanges& a = since20->at("ads");
  CHECK_FALSE(a.full);
  CHECK(ids(a) == std::vector<uint64_t>{3});
  CHECK(a.deleted == std::vector<uint64_t>{1, 9});  // 9: created and dropped in between
  auto since10 = LoadTableChanges(Env::Default(), ckpt, 10);
  REQUIRE(since10.ok());
  const TableChanges& b = since10->at("ads");
  CHECK_FALSE(b.full);
  CHECK(ids(b) == std::vector<uint64_t>{2, 3, 5});  // 3 dropped at 20, back at 30
  CHECK(b.deleted == std::vector<uint64_t>{1, 9});
  RestoredCheckpoint as_read;
  as_read.tables["ads"] = b.rows;
  CHECK(RowsOf(as_read) == std::map<uint64_t, int64_t>{{2, 20}, {3, 30}, {5, 20}});
  for (int64_t since : {-1, 5}) {  // before the chain's full save: every row
    auto all = LoadTableChanges(Env::Default(), ckpt, since);
    REQUIRE(all.ok());
    CHECK(all->at("ads").full);
    CHECK(ids(all->at("ads")) == std::vector<uint64_t>{2, 3, 4, 5});
    CHECK(all->at("ads").deleted.empty());
  }
  auto vars = LoadCheckpointVariables(Env::Default(), ckpt);
  REQUIRE(vars.ok());
  CHECK(vars->tables.empty());
  CHECK(vars->manifest.step() == 30);
}

TEST_CASE("a manifest whose chain makes no sense is refused before any read",
          "[checkpoint][rows][incremental]") {
  const std::string dir = WriteChain("chain-bad");
  const std::string ckpt = JoinPath(dir, "ckpt-30");
  auto good = ReadManifest(Env::Default(), ckpt);
  REQUIRE(good.ok());
  REQUIRE(good->rows_size() == 3);
  auto refused = [&](const std::string& why, const std::function<void(CheckpointManifest*)>& f) {
    INFO(why);
    CheckpointManifest bad = *good;
    f(&bad);
    REQUIRE(WriteManifest(Env::Default(), ckpt, bad).ok());
    auto m = ReadManifest(Env::Default(), ckpt);
    CHECK(m.status().code() == absl::StatusCode::kDataLoss);
    return std::string(m.status().message());
  };
  CHECK(refused("no full save", [](CheckpointManifest* m) {
          m->mutable_rows()->DeleteSubrange(0, 1);
          m->clear_chain();
          m->add_chain(20);
        }).find("a delta with no full save before it") != std::string::npos);
  CHECK(refused("a link outside the chain", [](CheckpointManifest* m) {
          m->mutable_rows(1)->set_checkpoint("ckpt-15");
        }).find("not a checkpoint of the chain") != std::string::npos);
  CHECK(refused("a path for a name", [](CheckpointManifest* m) {
          m->mutable_rows(1)->set_checkpoint("../ckpt-20");
        }).find("not a checkpoint of the chain") != std::string::npos);
  CHECK(refused("a chain step no link reads", [](CheckpointManifest* m) {
          m->add_chain(25);
        }).find("chain: lists a checkpoint no rows are read from") != std::string::npos);
  CHECK(refused("a chain after this step", [](CheckpointManifest* m) {
          m->add_chain(35);
        }).find("not before this checkpoint's") != std::string::npos);
  CHECK(refused("links out of order", [](CheckpointManifest* m) {
          m->mutable_rows()->SwapElements(1, 2);
        }).find("out of step order") != std::string::npos);
  CHECK(refused("no link of its own", [](CheckpointManifest* m) {
          m->mutable_rows()->RemoveLast();
        }).find("no link of this checkpoint's own") != std::string::npos);
  CHECK(refused("drops in a full save", [](CheckpointManifest* m) {
          m->mutable_rows(0)->set_deleted(1);
        }).find("dropped ids in a full save") != std::string::npos);
  CHECK(refused("a second full save", [](CheckpointManifest* m) {
          m->mutable_rows(2)->set_delta(false);
          m->mutable_rows(2)->set_deleted(0);
          m->mutable_rows(2)->clear_deleted_ids();
        }).find("a second full save") != std::string::npos);
  CHECK(refused("dropped ids that do not fit", [](CheckpointManifest* m) {
          m->mutable_rows(2)->set_deleted(3);
        }).find("does not fit") != std::string::npos);
}

}  // namespace
}  // namespace pstrain
