// Tables with a memory budget: the disk tier's records, rows moved out and
// back without a bit changed (a run with a tier against the same run
// without), what a full disk does (rows stay in memory), and what a failing
// or damaged disk does (a clear error that fails the table, never other
// values).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/base/embedding_ids.h"
#include "common/storage/env.h"
#include "common/storage/fault_env.h"
#include "common/testing/temp_dir.h"
#include "google/protobuf/text_format.h"
#include "ps_server/embedding_table.h"
#include "ps_server/row_tier.h"

namespace pstrain {
namespace {

constexpr int kDim = 4;

std::unique_ptr<Optimizer> Adam() {
  OptimizerConfig c;
  REQUIRE(google::protobuf::TextFormat::ParseFromString("learning_rate: 0.05 adam {}", &c));
  auto opt = CreateOptimizer(c);
  REQUIRE(opt.ok());
  return std::move(*opt);
}

EmbeddingTable::Options Options(int64_t memory_rows, Env* env = nullptr) {
  EmbeddingTable::Options o;
  o.name = "t";
  o.dim = kDim;
  o.init_scale = 0.5f;
  o.seed = TableSeed(5, "t");
  o.expire_after_steps = 40;
  o.memory_rows = memory_rows;
  o.env = env;
  if (memory_rows > 0) o.tier_prefix = testing::NewTempDir("tier") + "/t";
  return o;
}

std::unique_ptr<EmbeddingTable> Make(const EmbeddingTable::Options& o, const Optimizer* opt) {
  auto t = EmbeddingTable::Create(o, opt);
  REQUIRE(t.ok());
  return std::move(*t);
}

// A file of this process still open though unlinked, by its path.
int ReopenUnlinked(const std::string& path) {
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && absl::StartsWith(target, path) && absl::StrContains(target, "(deleted)")) {
      return ::open(fd.path().c_str(), O_RDWR);
    }
  }
  return -1;
}

void CheckSame(const EmbeddingTable::Rows& a, const EmbeddingTable::Rows& b) {
  REQUIRE(a.ids == b.ids);
  CHECK(a.values == b.values);
  CHECK(a.slots == b.slots);
  CHECK(a.updates == b.updates);
  CHECK(a.touched == b.touched);
  CHECK(a.deleted == b.deleted);
}

// `rows` sorted by id (a cut's order is the shards' and the file's).
EmbeddingTable::Rows SortById(const EmbeddingTable::Rows& rows) {
  std::vector<size_t> order(rows.ids.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&rows](size_t a, size_t b) { return rows.ids[a] < rows.ids[b]; });
  EmbeddingTable::Rows out;
  out.slots.resize(rows.slots.size());
  for (size_t i : order) {
    out.ids.push_back(rows.ids[i]);
    out.values.insert(out.values.end(), rows.values.begin() + i * kDim,
                      rows.values.begin() + (i + 1) * kDim);
    for (size_t k = 0; k < rows.slots.size(); ++k) {
      out.slots[k].insert(out.slots[k].end(), rows.slots[k].begin() + i * kDim,
                          rows.slots[k].begin() + (i + 1) * kDim);
    }
    out.updates.push_back(rows.updates[i]);
    out.touched.push_back(rows.touched[i]);
  }
  out.deleted = rows.deleted;
  std::sort(out.deleted.begin(), out.deleted.end());
  return out;
}

// A cut's rows, those on disk read as a shard's writer reads them (chunks
// of 100 rows), sorted by id; or the first error.
absl::StatusOr<EmbeddingTable::Rows> Drain(EmbeddingTable::SavedRows cut) {
  EmbeddingTable::Rows all = std::move(cut.rows);
  if (cut.on_disk != nullptr) {
    const size_t have = all.ids.size(), n = static_cast<size_t>(cut.on_disk->rows());
    all.ids.resize(have + n);
    all.values.resize((have + n) * kDim);
    for (auto& slot : all.slots) slot.resize((have + n) * kDim);
    all.updates.resize(have + n);
    all.touched.resize(have + n);
    for (size_t at = have; at < have + n; at += 100) {
      const size_t m = std::min<size_t>(100, have + n - at);
      std::vector<float*> slots;
      for (auto& slot : all.slots) slots.push_back(slot.data() + at * kDim);
      absl::Status st =
          cut.on_disk->Next(static_cast<int64_t>(m), all.ids.data() + at,
                            all.values.data() + at * kDim, slots, all.updates.data() + at,
                            all.touched.data() + at);
      if (!st.ok()) return st;
    }
  }
  return SortById(all);
}

TEST_CASE("the disk tier gives back each row as written and refuses a damaged record",
          "[embedding][tier]") {
  const std::string path = testing::NewTempDir("rows") + "/r";
  auto tier = RowTier::Open(Env::Default(), path, 3, 2);
  REQUIRE(tier.ok());
  CHECK_FALSE(Env::Default()->FileExists(path));  // unlinked once open
  RowTier& t = **tier;
  const int64_t per_segment = RowTier::kSegmentBytes / t.record_bytes();
  const int64_t segment = per_segment * t.record_bytes();
  // Row i: values {i, i+1, i+2}, slots {2i, ...} and {-i, ...}, count i.
  auto put = [&t](uint64_t i) {
    const float f = static_cast<float>(i);
    const std::vector<float> v = {f, f + 1, f + 2}, m = {2 * f, 2 * f, 2 * f}, s = {-f, -f, -f};
    return t.Put(i, v.data(), {m.data(), s.data()}, static_cast<int64_t>(i), 1000 + i, 7);
  };
  auto check = [&t](uint64_t i) {
    std::vector<float> v(3), m(3), s(3);
    int64_t updates = -1;
    REQUIRE(t.Get(i, v.data(), {m.data(), s.data()}, &updates).ok());
    const float f = static_cast<float>(i);
    CHECK(v == std::vector<float>{f, f + 1, f + 2});
    CHECK(m == std::vector<float>{2 * f, 2 * f, 2 * f});
    CHECK(s == std::vector<float>{-f, -f, -f});
    CHECK(updates == static_cast<int64_t>(i));
    CHECK(t.Find(i)->touched == static_cast<int64_t>(1000 + i));
    CHECK(t.Find(i)->generation == 7);
  };
  // Three segments and a bit: rows in written segments and in the open one.
  const uint64_t n = static_cast<uint64_t>(3 * per_segment + 10);
  for (uint64_t i = 0; i < n; ++i) REQUIRE(put(i).ok());
  CHECK(put(5).code() == absl::StatusCode::kInternal);  // already there
  CHECK(t.size() == n);
  CHECK(t.file_bytes() == 4 * segment);
  for (uint64_t i = 0; i < n; i += 7) check(i);
  check(n - 1);

  // A segment whose rows are all gone is reused whole: the file does not grow.
  for (int64_t i = 0; i < per_segment; ++i) REQUIRE(t.Erase(static_cast<uint64_t>(i)));
  CHECK_FALSE(t.Erase(0));
  for (uint64_t i = n; i < n + static_cast<uint64_t>(per_segment); ++i) REQUIRE(put(i).ok());
  CHECK(t.file_bytes() == 4 * segment);
  // Garbage past half the file: the emptiest segment's live rows move into
  // the open one, so the file stays within about twice the rows it holds.
  for (uint64_t i = static_cast<uint64_t>(per_segment); i < n; ++i) {
    if (i % 4 != 0) REQUIRE(t.Erase(i));
  }
  uint64_t next = n + static_cast<uint64_t>(per_segment);
  std::vector<uint64_t> live;
  for (const auto& [id, entry] : t.entries()) live.push_back(id);
  std::sort(live.begin(), live.end());
  std::mt19937_64 rng(3);
  for (int round = 0; round < 40; ++round) {
    for (int64_t k = 0; k < per_segment / 2; ++k) {
      REQUIRE(put(next).ok());
      live.push_back(next++);
    }
    // Rows read back anywhere (erased from the tier, as a table does).
    for (int64_t k = 0; k < per_segment / 2; ++k) {
      const size_t at = rng() % live.size();
      REQUIRE(t.Erase(live[at]));
      live[at] = live.back();
      live.pop_back();
    }
  }
  CHECK(t.size() == live.size());
  INFO("rows " << t.size() << ", file " << t.file_bytes() / segment << " segments");
  // (21,840 rows were put: without reuse, 21 segments.)
  CHECK(t.file_bytes() <= 2 * static_cast<int64_t>(t.size()) * t.record_bytes() + 4 * segment);
  for (const auto& [id, entry] : t.entries()) {
    (void)entry;
    if (id % 97 == 0) check(id);
  }

  // One bit flipped in a value of a row in a written segment (through the
  // open, unlinked file).
  uint64_t victim = 0;
  for (const auto& [id, entry] : t.entries()) {
    if (entry.place / per_segment != t.Find(next - 1)->place / per_segment) victim = id;
  }
  REQUIRE(victim != 0);
  const int fd = ReopenUnlinked(path);
  REQUIRE(fd >= 0);
  const off_t at = static_cast<off_t>(t.Find(victim)->place) * t.record_bytes() + 24 + 4;
  char byte = 0;
  REQUIRE(::pread(fd, &byte, 1, at) == 1);
  byte ^= 0x10;
  REQUIRE(::pwrite(fd, &byte, 1, at) == 1);
  ::close(fd);
  std::vector<float> v(3), m(3), s(3);
  int64_t updates = 0;
  const absl::Status damaged = t.Get(victim, v.data(), {m.data(), s.data()}, &updates);
  CHECK(damaged.code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(damaged.message(), absl::StrCat("row ", victim)));
}

// The same lookups, updates, imports, expiry and delta saves on a table
// holding 10% of its rows in memory and on one holding all of them.
TEST_CASE("a table over its memory budget trains bitwise as one without", "[embedding][tier]") {
  auto adam = Adam();
  constexpr int kIds = 3000;
  // Serial reads (from the page cache) or in parallel (as from a disk).
  EmbeddingTable::Options o = Options(kIds / 10);
  o.parallel_read_ns = GENERATE(10000, 0);
  auto tiered = Make(o, adam.get());
  auto whole = Make(Options(0), adam.get());
  std::mt19937_64 rng(7);
  // Zipf-like: a few ids are hot, most are rare.
  auto draw = [&rng]() {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return static_cast<uint64_t>(std::pow(static_cast<double>(kIds), u)) * 2654435761u;
  };
  uint32_t saved = 0;
  // A checkpoint's cut of the tiered table, read 10 steps later (as a
  // shard's writer reads it while training goes on and rows move), and the
  // rows the table without a tier had at the cut.
  std::optional<EmbeddingTable::SavedRows> cut;
  EmbeddingTable::Rows at_cut;
  int cuts = 0;
  for (int64_t step = 1; step <= 120; ++step) {
    if (cut.has_value() && step % 25 == 10) {
      auto got = Drain(std::move(*cut));
      cut.reset();
      REQUIRE(got.ok());
      CheckSame(*got, SortById(at_cut));
      ++cuts;
    }
    std::vector<uint64_t> ids(256);
    for (uint64_t& id : ids) id = draw();
    std::vector<float> a(ids.size() * kDim), b(ids.size() * kDim);
    REQUIRE(tiered->Lookup(ids, step, a.data()).ok());
    REQUIRE(whole->Lookup(ids, step, b.data()).ok());
    REQUIRE(a == b);
    std::vector<float> grads(ids.size() * kDim);
    for (float& g : grads) g = std::uniform_real_distribution<float>(-1, 1)(rng);
    REQUIRE(tiered->ApplyGradients(ids, grads.data(), 0.5f, 0.05f, 0.8f, step).ok());
    REQUIRE(whole->ApplyGradients(ids, grads.data(), 0.5f, 0.05f, 0.8f, step).ok());
    if (step % 25 == 0) {
      // A checkpoint's cut: the rows changed since the last one.
      const uint32_t g1 = tiered->EndGeneration(), g2 = whole->EndGeneration();
      REQUIRE(g1 == g2);
      if (saved > 0) {
        auto da = tiered->ExportChangedRows(saved), db = whole->ExportChangedRows(saved);
        REQUIRE(da.ok());
        REQUIRE(db.ok());
        CheckSame(*da, *db);
      }
      // Every row at 50 and 100, else a delta on the save before.
      const uint32_t after = step % 50 == 0 ? 0 : saved;
      auto c = tiered->CutRows(after);
      REQUIRE(c.ok());
      CHECK((c->on_disk != nullptr && c->on_disk->rows() > 0));
      cut = std::move(*c);
      at_cut = (after == 0 ? whole->ExportRows() : whole->ExportChangedRows(after)).value();
      saved = g1;
    }
    if (step % 30 == 0) {
      // Rows set from outside (a checkpoint's), some of them on disk.
      std::vector<uint64_t> load = {draw(), draw(), 99};
      std::vector<float> values(load.size() * kDim, 0.25f);
      OptimizerSlots slots(2, std::vector<float>(load.size() * kDim, 0.5f));
      REQUIRE(tiered->ImportRows(load, values.data(), slots, {3, 3, 3}, {step, step, step}).ok());
      REQUIRE(whole->ImportRows(load, values.data(), slots, {3, 3, 3}, {step, step, step}).ok());
    }
    CHECK(tiered->Expire(step) == whole->Expire(step));
  }
  CHECK(cuts == 4);
  auto ra = tiered->ExportRows(), rb = whole->ExportRows();
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  CheckSame(*ra, *rb);
  // A reader outside training (Peek) and ReadRow see rows where they lie.
  std::vector<float> pa(ra->ids.size() * kDim), pb(ra->ids.size() * kDim);
  REQUIRE(tiered->Peek(ra->ids, pa.data()).ok());
  REQUIRE(whole->Peek(ra->ids, pb.data()).ok());
  CHECK(pa == pb);
  const EmbeddingTable::Stats st = tiered->stats(), ref = whole->stats();
  CHECK(st.rows == ref.rows);
  CHECK(st.rows_expired == ref.rows_expired);
  CHECK(st.rows_expired > 0);
  INFO("rows " << st.rows << ", on disk " << st.rows_on_disk);
  CHECK(st.rows - st.rows_on_disk <= 16 * ((kIds / 10 + 15) / 16));
  CHECK(st.rows_on_disk > st.rows / 2);
  CHECK(st.disk_reads > 0);
  CHECK(st.disk_writes >= st.rows_on_disk);
  CHECK(st.disk_bytes >= st.rows_on_disk * (24 + 3 * kDim * 4));
  CHECK(st.disk_write_errors == 0);
  CHECK(tiered->failure().ok());
  std::vector<float> va, vb;
  OptimizerSlots sa, sb;
  int64_t ua = 0, ub = 0;
  for (size_t i = 0; i < ra->ids.size(); i += 97) {
    REQUIRE(tiered->ReadRow(ra->ids[i], &va, &sa, &ua));
    REQUIRE(whole->ReadRow(ra->ids[i], &vb, &sb, &ub));
    CHECK(va == vb);
    CHECK(sa == sb);
    CHECK(ua == ub);
  }
}

TEST_CASE("a save of every row that would not fit in memory is refused, the table unchanged",
          "[embedding][tier]") {
  auto adam = Adam();
  EmbeddingTable::Options o = Options(50);
  o.max_export_bytes = 1000 * (3 * kDim * 4 + 24);  // 1,000 rows
  auto t = Make(o, adam.get());
  std::vector<uint64_t> ids(999);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  std::vector<float> out(ids.size() * kDim);
  REQUIRE(t->Lookup(ids, 1, out.data()).ok());
  const uint32_t generation = t->EndGeneration();
  REQUIRE(t->ExportRows().ok());
  const uint64_t two[] = {5000, 5001};
  REQUIRE(t->Lookup(two, 2, out.data()).ok());
  const absl::Status refused = t->ExportRows().status();
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(refused.message(), "table t: a save of every row copies them"));
  CHECK(absl::StrContains(refused.message(), "1001 rows"));
  // Only the copy was refused: a delta and the table itself go on.
  CHECK(t->failure().ok());
  auto delta = t->ExportChangedRows(generation);
  REQUIRE(delta.ok());
  CHECK(delta->ids.size() == 2);
  // A checkpoint's cut copies only the rows in memory: every row is saved.
  auto cut = t->CutRows(0);
  REQUIRE(cut.ok());
  auto all = Drain(std::move(*cut));
  REQUIRE(all.ok());
  REQUIRE(all->ids.size() == 1001);
  std::vector<float> peeked(all->ids.size() * kDim);
  REQUIRE(t->Peek(all->ids, peeked.data()).ok());
  CHECK(all->values == peeked);
  REQUIRE(t->Lookup(ids, 3, out.data()).ok());
  // One that would not fit even so is refused, the table unchanged.
  EmbeddingTable::Options tiny = Options(50);
  tiny.max_export_bytes = 2000;
  auto u = Make(tiny, adam.get());
  REQUIRE(u->Lookup(ids, 1, out.data()).ok());
  const absl::Status cut_refused = u->CutRows(0).status();
  CHECK(cut_refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(cut_refused.message(), "the places of those on disk"));
  CHECK(u->failure().ok());
}

TEST_CASE("a cut's rows on disk read while every row moves read as they were at the cut",
          "[embedding][tier]") {
  auto adam = Adam();
  EmbeddingTable::Options o = Options(160);
  o.expire_after_steps = 0;
  auto tiered = Make(o, adam.get());
  o.memory_rows = 0;
  auto whole = Make(o, adam.get());
  // 5,000 rows a shard: several segments each, nearly all on disk.
  std::vector<uint64_t> ids(16 * 5000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = MixId(i);
  std::vector<float> grads(ids.size() * kDim, 0.25f), out(ids.size() * kDim);
  REQUIRE(tiered->ApplyGradients(ids, grads.data(), 1, 0.05f, 0, 1).ok());
  REQUIRE(whole->ApplyGradients(ids, grads.data(), 1, 0.05f, 0, 1).ok());
  REQUIRE(tiered->stats().disk_bytes >= 16 * 4 * RowTier::kSegmentBytes);
  auto cut = tiered->CutRows(0);
  REQUIRE(cut.ok());
  const EmbeddingTable::Rows want = SortById(whole->ExportRows().value());
  // Every row read back and moved out again, twice, and updated: without
  // the pin, segments emptied by the reads would be reused and compacted
  // under the cut's records.
  const int64_t bytes = tiered->stats().disk_bytes;
  for (int64_t step = 2; step <= 4; ++step) {
    std::shuffle(ids.begin(), ids.end(), std::mt19937_64(step));
    REQUIRE(tiered->Lookup(ids, step, out.data()).ok());
    REQUIRE(tiered->ApplyGradients(ids, grads.data(), 1, 0.05f, 0, step).ok());
  }
  CHECK(tiered->stats().disk_bytes > bytes);  // new records in new segments
  auto got = Drain(std::move(*cut));
  REQUIRE(got.ok());
  CheckSame(*got, want);
  // Unpinned, the tier reuses what the reads emptied: the file grows no more.
  const int64_t after_cut = tiered->stats().disk_bytes;
  for (int64_t step = 5; step <= 7; ++step) {
    REQUIRE(tiered->Lookup(ids, step, out.data()).ok());
  }
  CHECK(tiered->stats().disk_bytes == after_cut);
}

TEST_CASE("a cut's rows on disk the disk cannot give back fail the save, not the table",
          "[embedding][tier][faults]") {
  auto adam = Adam();
  FaultEnv faults(Env::Default());
  auto t = Make(Options(32, &faults), adam.get());
  std::vector<uint64_t> ids(16 * 2000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  std::vector<float> out(ids.size() * kDim);
  REQUIRE(t->Lookup(ids, 1, out.data()).ok());
  auto cut = t->CutRows(0);
  REQUIRE(cut.ok());
  faults.FailReadsFrom(0);
  const absl::Status read = Drain(std::move(*cut)).status();
  CHECK(read.code() == absl::StatusCode::kInternal);
  CHECK(absl::StrContains(read.message(), "Input/output error"));
  faults.FailReadsFrom(-1);
  CHECK(t->failure().ok());
  auto again = t->CutRows(0);
  REQUIRE(again.ok());
  auto all = Drain(std::move(*again));
  REQUIRE(all.ok());
  CHECK(all->ids.size() == ids.size());
}

TEST_CASE("rows a full disk refuses stay in memory, counted, and lose nothing",
          "[embedding][tier][faults]") {
  auto adam = Adam();
  FaultEnv faults(Env::Default());
  auto tiered = Make(Options(64, &faults), adam.get());
  auto whole = Make(Options(0), adam.get());
  // Each shard's first segment, then half of one (a torn write).
  faults.SetDiskSpace(16 * RowTier::kSegmentBytes + RowTier::kSegmentBytes / 2);
  const int64_t per_segment = RowTier::kSegmentBytes / (24 + 3 * kDim * 4);
  std::vector<uint64_t> ids(static_cast<size_t>(16 * 3 * per_segment));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i * 7919;
  std::vector<float> grads(ids.size() * kDim, 0.125f), out(ids.size() * kDim);
  for (int64_t step = 1; step <= 3; ++step) {
    REQUIRE(tiered->ApplyGradients(ids, grads.data(), 1, 0.05f, 0, step).ok());
    REQUIRE(whole->ApplyGradients(ids, grads.data(), 1, 0.05f, 0, step).ok());
    REQUIRE(tiered->Lookup(ids, step, out.data()).ok());
  }
  const EmbeddingTable::Stats st = tiered->stats();
  INFO("on disk " << st.rows_on_disk << " of " << st.rows);
  CHECK(st.rows == static_cast<int64_t>(ids.size()));
  CHECK(st.rows_on_disk <= 16 * 2 * per_segment);  // a segment written, one open
  CHECK(st.rows - st.rows_on_disk > static_cast<int64_t>(ids.size()) / 3);  // kept
  CHECK(st.disk_write_errors > 0);
  CHECK(tiered->failure().ok());
  auto ra = tiered->ExportRows(), rb = whole->ExportRows();
  REQUIRE(ra.ok());
  CheckSame(*ra, *rb);
}

TEST_CASE("a disk that cannot give a row back fails the table with a clear error",
          "[embedding][tier][faults]") {
  auto adam = Adam();
  FaultEnv faults(Env::Default());
  auto t = Make(Options(32, &faults), adam.get());
  // Rows in written segments (each shard's open one holds 910).
  std::vector<uint64_t> ids(16 * 2000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  std::vector<float> out(ids.size() * kDim);
  REQUIRE(t->Lookup(ids, 1, out.data()).ok());
  REQUIRE(t->stats().rows_on_disk >= 30000);
  faults.FailReadsFrom(0);
  const absl::Status read = t->Lookup(ids, 2, out.data());
  CHECK(read.code() == absl::StatusCode::kInternal);
  CHECK(absl::StrContains(read.message(), "Input/output error"));
  CHECK(absl::StrContains(read.message(), "table t"));
  CHECK(absl::StrContains(read.message(), "restart the server from a checkpoint"));
  // Every later call says so, even for rows in memory, and so does a save.
  faults.FailReadsFrom(-1);
  const uint64_t one[] = {ids[0]};
  CHECK(t->Lookup(one, 3, out.data()).message() == read.message());
  std::vector<float> grads(kDim, 1.0f);
  CHECK(t->ApplyGradients(one, grads.data(), 1, 0.05f, 0, 3).message() == read.message());
  CHECK(t->ExportRows().status().message() == read.message());
  CHECK(t->failure().message() == read.message());
}

TEST_CASE("threads looking up and updating a table over its budget lose no update",
          "[embedding][tier][concurrency]") {
  OptimizerConfig c;
  REQUIRE(google::protobuf::TextFormat::ParseFromString("learning_rate: 1 sgd {}", &c));
  auto sgd = CreateOptimizer(c);
  REQUIRE(sgd.ok());
  EmbeddingTable::Options o = Options(100);
  o.expire_after_steps = 0;
  o.init_scale = 0;
  o.parallel_read_ns = 0;  // the read pool's threads too
  auto t = Make(o, sgd->get());
  // Each thread updates its own 500 ids 40 times, by -1 each time, in
  // batches that also look up the other threads' ids.
  constexpr int kThreads = 4, kIds = 500, kRounds = 40;
  std::vector<std::thread> threads;
  std::atomic<int> failed{0};  // (Catch's assertions are not thread-safe)
  for (int w = 0; w < kThreads; ++w) {
    threads.emplace_back([&t, &failed, w] {
      std::vector<uint64_t> own(kIds), all(kThreads * kIds);
      for (int i = 0; i < kIds; ++i) own[i] = static_cast<uint64_t>(w * kIds + i);
      for (size_t i = 0; i < all.size(); ++i) all[i] = i;
      std::vector<float> grads(own.size() * kDim, 1.0f), out(all.size() * kDim);
      for (int r = 0; r < kRounds; ++r) {
        if (!t->Lookup(all, r, out.data()).ok()) ++failed;
        if (!t->ApplyGradients(own, grads.data(), 1, 1, 0, r).ok()) ++failed;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(failed == 0);
  auto rows = t->ExportRows();
  REQUIRE(rows.ok());
  REQUIRE(rows->ids.size() == kThreads * kIds);
  for (float v : rows->values) REQUIRE(v == -static_cast<float>(kRounds));
  for (int64_t u : rows->updates) REQUIRE(u == kRounds);
  CHECK(t->stats().rows_on_disk >= kThreads * kIds - 100 - 16);
  CHECK(t->stats().disk_reads > 0);
}

}  // namespace
}  // namespace pstrain
