// Tables with a memory budget: the disk tier's records, rows moved out and
// back without a bit changed (a run with a tier against the same run
// without), what a full disk does (rows stay in memory), and what a failing
// or damaged disk does (a clear error that fails the table, never other
// values).
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
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

TEST_CASE("the disk tier gives back each row as written and refuses a damaged record",
          "[embedding][tier]") {
  const std::string path = testing::NewTempDir("rows") + "/r";
  auto tier = RowTier::Open(Env::Default(), path, 3, 2);
  REQUIRE(tier.ok());
  CHECK_FALSE(Env::Default()->FileExists(path));  // unlinked once open
  RowTier& t = **tier;
  const std::vector<float> v = {1, 2, 3}, m = {4, 5, 6}, s2 = {7, 8, 9};
  REQUIRE(t.Put(10, v.data(), {m.data(), s2.data()}, 3, 17, 2).ok());
  REQUIRE(t.Put(11, m.data(), {s2.data(), v.data()}, 1, 18, 2).ok());
  CHECK(t.Put(10, v.data(), {m.data(), s2.data()}, 3, 17, 2).code() ==
        absl::StatusCode::kInternal);
  CHECK(t.size() == 2);
  CHECK(t.file_bytes() == 2 * t.record_bytes());
  CHECK(t.Find(10)->touched == 17);
  std::vector<float> gv(3), gm(3), gs(3);
  int64_t updates = 0;
  REQUIRE(t.Get(10, gv.data(), {gm.data(), gs.data()}, &updates).ok());
  CHECK(gv == v);
  CHECK(gm == m);
  CHECK(gs == s2);
  CHECK(updates == 3);
  // A place freed is taken by the next row: the file does not grow.
  REQUIRE(t.Erase(10));
  CHECK_FALSE(t.Erase(10));
  REQUIRE(t.Put(12, v.data(), {v.data(), v.data()}, 0, 0, 1).ok());
  CHECK(t.file_bytes() == 2 * t.record_bytes());

  // One bit flipped in a value (through the open, unlinked file).
  const int fd = ReopenUnlinked(path);
  REQUIRE(fd >= 0);
  const off_t at = static_cast<off_t>(t.Find(11)->place) * t.record_bytes() + 24 + 4;
  char byte = 0;
  REQUIRE(::pread(fd, &byte, 1, at) == 1);
  byte ^= 0x10;
  REQUIRE(::pwrite(fd, &byte, 1, at) == 1);
  ::close(fd);
  const absl::Status damaged = t.Get(11, gv.data(), {gm.data(), gs.data()}, &updates);
  CHECK(damaged.code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(damaged.message(), "row 11"));
  REQUIRE(t.Get(12, gv.data(), {gm.data(), gs.data()}, &updates).ok());
}

// The same lookups, updates, imports, expiry and delta saves on a table
// holding 10% of its rows in memory and on one holding all of them.
TEST_CASE("a table over its memory budget trains bitwise as one without", "[embedding][tier]") {
  auto adam = Adam();
  constexpr int kIds = 3000;
  auto tiered = Make(Options(kIds / 10), adam.get());
  auto whole = Make(Options(0), adam.get());
  std::mt19937_64 rng(7);
  // Zipf-like: a few ids are hot, most are rare.
  auto draw = [&rng]() {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return static_cast<uint64_t>(std::pow(static_cast<double>(kIds), u)) * 2654435761u;
  };
  uint32_t saved = 0;
  for (int64_t step = 1; step <= 120; ++step) {
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

TEST_CASE("rows a full disk refuses stay in memory, counted, and lose nothing",
          "[embedding][tier][faults]") {
  auto adam = Adam();
  FaultEnv faults(Env::Default());
  auto tiered = Make(Options(64, &faults), adam.get());
  auto whole = Make(Options(0), adam.get());
  faults.SetDiskSpace(100 * (24 + 3 * kDim * 4) + 10);  // 100 rows, then a torn one
  std::vector<uint64_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i * 7919;
  std::vector<float> grads(ids.size() * kDim, 0.125f), out(ids.size() * kDim);
  for (int64_t step = 1; step <= 3; ++step) {
    REQUIRE(tiered->ApplyGradients(ids, grads.data(), 1, 0.05f, 0, step).ok());
    REQUIRE(whole->ApplyGradients(ids, grads.data(), 1, 0.05f, 0, step).ok());
    REQUIRE(tiered->Lookup(ids, step, out.data()).ok());
  }
  const EmbeddingTable::Stats st = tiered->stats();
  CHECK(st.rows == 1000);
  CHECK(st.rows_on_disk <= 100);
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
  std::vector<uint64_t> ids(500);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  std::vector<float> out(ids.size() * kDim);
  REQUIRE(t->Lookup(ids, 1, out.data()).ok());
  REQUIRE(t->stats().rows_on_disk >= 400);
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

}  // namespace
}  // namespace pstrain
