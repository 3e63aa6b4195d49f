#include "common/storage/checkpoint.h"


#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/testing/temp_dir.h"
#include "common/storage/env.h"
#include "common/storage/fault_env.h"

namespace pstrain {
namespace {

std::vector<float> Iota(int64_t n, float start) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = start + 0.25f * static_cast<float>(i);
  return v;
}

// A model of two variables: "w" [6, 3] split into rows [0, 4) on shard 0 and
// [4, 6) on shard 1, and "b" [3] whole on shard 1; Adam-like slots m and v.
struct Fixture {
  std::vector<float> w = Iota(18, -2.0f), b = Iota(3, 5.0f);
  std::vector<float> w_m = Iota(18, 0.5f), w_v = Iota(18, 1.5f);
  std::vector<float> b_m = Iota(3, -0.5f), b_v = Iota(3, 7.0f);
};

ShardTensor Part(const std::string& var, int partition, const std::string& slot,
                 std::vector<int64_t> shape, int64_t first_row, const float* data,
                 int64_t elements) {
  ShardTensor t;
  t.variable = var;
  t.partition = partition;
  t.slot = slot;
  t.shape = std::move(shape);
  t.first_row = first_row;
  t.updates = 7 + partition;
  t.data = data;
  t.elements = elements;
  return t;
}

// Saves the fixture as checkpoint `step` under `dir` through `env` as the
// servers and the chief do: both shards, the manifest, then (keep > 0) the
// pointer and pruning. The first error ends it.
absl::Status SaveFixture(Env* env, const Fixture& f, const std::string& dir, int64_t step,
                         int keep) {
  const std::string ckpt = JoinPath(dir, CheckpointDirName(step));
  std::vector<ShardTensor> s0 = {
      Part("w", 0, "", {4, 3}, 0, f.w.data(), 12),
      Part("w", 0, "m", {4, 3}, 0, f.w_m.data(), 12),
      Part("w", 0, "v", {4, 3}, 0, f.w_v.data(), 12),
  };
  std::vector<ShardTensor> s1 = {
      Part("w", 1, "", {2, 3}, 4, f.w.data() + 12, 6),
      Part("w", 1, "m", {2, 3}, 4, f.w_m.data() + 12, 6),
      Part("w", 1, "v", {2, 3}, 4, f.w_v.data() + 12, 6),
      Part("b", 0, "", {3}, 0, f.b.data(), 3),
      Part("b", 0, "m", {3}, 0, f.b_m.data(), 3),
      Part("b", 0, "v", {3}, 0, f.b_v.data(), 3),
  };
  CheckpointManifest m;
  m.set_step(step);
  m.set_config_fingerprint(0xabcdef);
  m.set_num_shards(2);
  m.set_num_workers(2);
  m.set_optimizer("adam");
  m.add_slot_names("m");
  m.add_slot_names("v");
  m.set_unix_time_ms(1700000000000);
  CheckpointVariable* w = m.add_variables();
  w->set_name("w");
  w->add_shape(6);
  w->add_shape(3);
  CheckpointVariable* b = m.add_variables();
  b->set_name("b");
  b->add_shape(3);
  int shard = 0;
  for (const auto* tensors : {&s0, &s1}) {
    int64_t bytes = 0;
    auto entries = WriteShard(env, ckpt, shard, 2, *tensors, &bytes);
    if (!entries.ok()) return entries.status();
    for (CheckpointTensor& e : *entries) *m.add_tensors() = e;
    ShardFile* sf = m.add_shards();
    sf->set_shard(shard);
    sf->set_file(ShardFileName(shard, 2));
    sf->set_bytes(bytes);
    ++shard;
  }
  WorkerCursor* c = m.add_cursors();
  c->set_worker(1);
  c->set_epoch(2);
  c->set_position(64);
  absl::Status st = WriteManifest(env, ckpt, m);
  if (!st.ok() || keep <= 0) return st;
  return CommitAndPrune(env, dir, step, keep);
}

// Writes the fixture as checkpoint `step` under `dir`; returns its path.
std::string WriteFixture(const Fixture& f, const std::string& dir, int64_t step) {
  REQUIRE(SaveFixture(Env::Default(), f, dir, step, /*keep=*/0).ok());
  return JoinPath(dir, CheckpointDirName(step));
}

bool Same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

void FlipByte(const std::string& path, int64_t at) {
  auto bytes = Env::Default()->ReadFile(path);
  REQUIRE(bytes.ok());
  REQUIRE(at < static_cast<int64_t>(bytes->size()));
  (*bytes)[at] ^= 0x01;
  REQUIRE(Env::Default()->WriteFile(path, *bytes, false).ok());
}

void CopyTree(const std::string& from, const std::string& to) {
  Env* env = Env::Default();
  REQUIRE(env->CreateDirs(to).ok());
  auto names = env->ListDir(from);
  REQUIRE(names.ok());
  for (const std::string& n : *names) {
    auto bytes = env->ReadFile(JoinPath(from, n));
    REQUIRE(bytes.ok());
    REQUIRE(env->WriteFile(JoinPath(to, n), *bytes, false).ok());
  }
}

TEST_CASE("a sharded checkpoint reads back whole variables and slots, bitwise", "[checkpoint]") {
  const Fixture f;
  const std::string ckpt = WriteFixture(f, testing::NewTempDir("roundtrip"), 100);
  CHECK(VerifyCheckpoint(Env::Default(), ckpt).empty());
  // The load reports its progress, one call per tensor, up to all of it.
  std::vector<std::pair<int64_t, int64_t>> progress;
  auto c = LoadCheckpoint(Env::Default(), ckpt, [&progress](int64_t done, int64_t total) {
    progress.emplace_back(done, total);
  });
  REQUIRE(c.ok());
  REQUIRE(progress.size() == static_cast<size_t>(c->manifest.tensors_size()));
  for (size_t i = 1; i < progress.size(); ++i) CHECK(progress[i].first > progress[i - 1].first);
  CHECK(progress.back().first == progress.back().second);
  CHECK(progress.back().second > 0);
  CHECK(c->manifest.step() == 100);
  CHECK(c->manifest.cursors(0).position() == 64);
  const RestoredVariable& w = c->variables.at("w");
  CHECK(w.shape == std::vector<int64_t>{6, 3});
  CHECK(Same(w.values, f.w));
  REQUIRE(w.slots.size() == 2);
  CHECK(Same(w.slots[0], f.w_m));
  CHECK(Same(w.slots[1], f.w_v));
  CHECK(w.updates == 8);  // the larger of its partitions' counts (7, 8)
  const RestoredVariable& b = c->variables.at("b");
  CHECK(Same(b.values, f.b));
  CHECK(Same(b.slots[0], f.b_m));
  CHECK(Same(b.slots[1], f.b_v));
  // Tensors start at 64-byte aligned offsets after the 8-byte header.
  for (const CheckpointTensor& t : c->manifest.tensors()) CHECK(t.offset() % 64 == 0);
}

TEST_CASE("verify finds every damaged region and load refuses it", "[checkpoint][faults]") {
  const Fixture f;
  const std::string dir = testing::NewTempDir("corpus");
  const std::string good = WriteFixture(f, dir, 100);
  auto manifest = ReadManifest(Env::Default(), good);
  REQUIRE(manifest.ok());
  struct Damage {
    std::string what;
    std::function<void(const std::string&)> apply;
  };
  std::vector<Damage> corpus;
  for (int s = 0; s < 2; ++s) {
    const std::string shard = ShardFileName(s, 2);
    corpus.push_back({shard + " header", [shard](const std::string& c) {
                        FlipByte(JoinPath(c, shard), 3);
                      }});
    corpus.push_back({shard + " truncated", [shard](const std::string& c) {
                        auto bytes = Env::Default()->ReadFile(JoinPath(c, shard));
                        REQUIRE(bytes.ok());
                        REQUIRE(Env::Default()
                                    ->WriteFile(JoinPath(c, shard),
                                                bytes->substr(0, bytes->size() - 5), false)
                                    .ok());
                      }});
    corpus.push_back({shard + " deleted", [shard](const std::string& c) {
                        REQUIRE(Env::Default()->DeleteFile(JoinPath(c, shard)).ok());
                      }});
  }
  for (const CheckpointTensor& t : manifest->tensors()) {
    const std::string file = ShardFileName(t.shard(), 2);
    const int64_t at = t.offset() + t.length() / 2;
    corpus.push_back({absl::StrCat(t.variable(), "/", t.partition(), "/", t.slot(), " bytes"),
                      [file, at](const std::string& c) { FlipByte(JoinPath(c, file), at); }});
  }
  corpus.push_back({"manifest text", [](const std::string& c) {
                      FlipByte(JoinPath(c, kManifestFile), 10);
                    }});
  corpus.push_back({"manifest CRC line", [](const std::string& c) {
                      auto bytes = Env::Default()->ReadFile(JoinPath(c, kManifestFile));
                      REQUIRE(bytes.ok());
                      FlipByte(JoinPath(c, kManifestFile), bytes->size() - 3);
                    }});
  corpus.push_back({"manifest deleted", [](const std::string& c) {
                      REQUIRE(Env::Default()->DeleteFile(JoinPath(c, kManifestFile)).ok());
                    }});
  int n = 0;
  for (const Damage& d : corpus) {
    INFO(d.what);
    const std::string copy = JoinPath(dir, absl::StrCat("damaged-", n++));
    CopyTree(good, copy);
    REQUIRE(VerifyCheckpoint(Env::Default(), copy).empty());
    d.apply(copy);
    CHECK_FALSE(VerifyCheckpoint(Env::Default(), copy).empty());
    CHECK_FALSE(LoadCheckpoint(Env::Default(), copy).ok());
  }
  CHECK(n == 18);  // 6 per-shard damages, 9 tensors, 3 manifest damages

  // The pointer file: garbage is an error, never a step.
  REQUIRE(Env::Default()->WriteFile(JoinPath(dir, kPointerFile), "latest: ckpt-x\n", false).ok());
  CHECK_FALSE(ReadPointer(Env::Default(), dir).ok());
}

TEST_CASE("a manifest with a gap, an overlap or a missing slot is refused", "[checkpoint]") {
  const Fixture f;
  const std::string dir = testing::NewTempDir("shapes");
  const std::string good = WriteFixture(f, dir, 100);
  auto m = ReadManifest(Env::Default(), good);
  REQUIRE(m.ok());
  auto rewrite = [&](const std::string& name, const std::function<void(CheckpointManifest*)>& edit) {
    const std::string copy = JoinPath(dir, name);
    CopyTree(good, copy);
    CheckpointManifest bad = *m;
    edit(&bad);
    REQUIRE(WriteManifest(Env::Default(), copy, bad).ok());  // a valid CRC over a bad layout
    return copy;
  };
  const std::string gap = rewrite("gap", [](CheckpointManifest* x) {
    for (CheckpointTensor& t : *x->mutable_tensors()) {
      if (t.variable() == "w" && t.partition() == 1) t.set_first_row(5);
    }
  });
  const std::string overlap = rewrite("overlap", [](CheckpointManifest* x) {
    for (CheckpointTensor& t : *x->mutable_tensors()) {
      if (t.variable() == "w" && t.partition() == 1) t.set_first_row(0);
    }
  });
  const std::string no_slot = rewrite("no_slot", [](CheckpointManifest* x) {
    auto* ts = x->mutable_tensors();
    for (int i = 0; i < ts->size(); ++i) {
      if (ts->Get(i).variable() == "b" && ts->Get(i).slot() == "v") {
        ts->DeleteSubrange(i, 1);
        break;
      }
    }
  });
  for (const std::string& c : {gap, overlap, no_slot}) {
    INFO(c);
    CHECK_FALSE(VerifyCheckpoint(Env::Default(), c).empty());
    CHECK_FALSE(LoadCheckpoint(Env::Default(), c).ok());
  }
}

TEST_CASE("the newest good checkpoint is found past damaged and incomplete ones",
          "[checkpoint][faults]") {
  const Fixture f;
  const std::string dir = testing::NewTempDir("latest");
  WriteFixture(f, dir, 100);
  const std::string c200 = WriteFixture(f, dir, 200);
  const std::string c300 = WriteFixture(f, dir, 300);
  const std::string c400 = WriteFixture(f, dir, 400);
  auto m = ReadManifest(Env::Default(), c300);
  REQUIRE(m.ok());
  FlipByte(JoinPath(c300, ShardFileName(0, 2)), m->tensors(0).offset() + 1);
  REQUIRE(Env::Default()->DeleteFile(JoinPath(c400, kManifestFile)).ok());
  std::vector<std::string> skipped;
  auto latest = LatestGoodCheckpoint(Env::Default(), dir, &skipped);
  REQUIRE(latest.ok());
  CHECK(*latest == c200);
  REQUIRE(skipped.size() == 2);
  CHECK(skipped[0].rfind("ckpt-400: ", 0) == 0);
  CHECK(skipped[0].find("no manifest") != std::string::npos);
  CHECK(skipped[1].rfind("ckpt-300: ", 0) == 0);
  CHECK(skipped[1].find("CRC32C mismatch") != std::string::npos);
  CHECK(LatestGoodCheckpoint(Env::Default(), JoinPath(dir, "none"), nullptr).status().code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("committing keeps the newest complete ones and deletes the rest", "[checkpoint]") {
  const Fixture f;
  const std::string dir = testing::NewTempDir("prune");
  Env* env = Env::Default();
  REQUIRE(env->CreateDirs(JoinPath(dir, "ckpt-50")).ok());  // a save that never completed
  for (int64_t s : {100, 200, 300}) WriteFixture(f, dir, s);
  REQUIRE(env->CreateDirs(JoinPath(dir, "ckpt-400")).ok());  // one under way
  REQUIRE(CommitAndPrune(env, dir, 300, 2).ok());
  CHECK_FALSE(env->FileExists(JoinPath(dir, "ckpt-50")));
  CHECK_FALSE(env->FileExists(JoinPath(dir, "ckpt-100")));
  CHECK(env->FileExists(JoinPath(dir, "ckpt-200")));
  CHECK(env->FileExists(JoinPath(dir, "ckpt-300")));
  CHECK(env->FileExists(JoinPath(dir, "ckpt-400")));  // newer than the one committed
  auto latest = ReadPointer(env, dir);
  REQUIRE(latest.ok());
  CHECK(*latest == 300);
  auto pointer = env->ReadFile(JoinPath(dir, kPointerFile));
  REQUIRE(pointer.ok());
  CHECK(*pointer == "latest: ckpt-300\nkept: ckpt-200\nkept: ckpt-300\n");
  // An incomplete checkpoint is never committed, and nothing is deleted.
  CHECK_FALSE(CommitAndPrune(env, dir, 400, 2).ok());
  CHECK(env->FileExists(JoinPath(dir, "ckpt-200")));
  CHECK(*ReadPointer(env, dir) == 300);
}

TEST_CASE("a rollback sets the checkpoints past its step aside, out of a resume's sight",
          "[checkpoint]") {
  const Fixture f;
  const std::string dir = testing::NewTempDir("set_aside");
  Env* env = Env::Default();
  for (int64_t s : {100, 200, 300}) REQUIRE(SaveFixture(env, f, dir, s, /*keep=*/10).ok());
  REQUIRE(env->CreateDirs(JoinPath(dir, "ckpt-400")).ok());  // one under way
  std::vector<std::string> moved;
  REQUIRE(SetAsideCheckpointsAfter(env, dir, 100, &moved).ok());
  CHECK(moved == std::vector<std::string>{JoinPath(dir, "ckpt-200.rolled-back"),
                                          JoinPath(dir, "ckpt-300.rolled-back"),
                                          JoinPath(dir, "ckpt-400.rolled-back")});
  auto all = ListCheckpoints(env, dir);
  REQUIRE(all.ok());
  REQUIRE(all->size() == 1);
  CHECK((*all)[0].step == 100);
  CHECK(*ReadPointer(env, dir) == 100);
  auto latest = LatestGoodCheckpoint(env, dir, nullptr);
  REQUIRE(latest.ok());
  CHECK(*latest == JoinPath(dir, "ckpt-100"));
  // The set-aside ones are kept whole, for inspection.
  CHECK(VerifyCheckpoint(env, JoinPath(dir, "ckpt-300.rolled-back")).empty());
  // The new timeline saves 200 again, and rolls back past it once more.
  REQUIRE(SaveFixture(env, f, dir, 200, 10).ok());
  moved.clear();
  REQUIRE(SetAsideCheckpointsAfter(env, dir, 150, &moved).ok());
  CHECK(moved == std::vector<std::string>{JoinPath(dir, "ckpt-200.rolled-back-2")});
  // Back before every checkpoint: no pointer is left to name one.
  moved.clear();
  REQUIRE(SetAsideCheckpointsAfter(env, dir, 0, &moved).ok());
  CHECK(moved.size() == 1);
  CHECK(absl::IsNotFound(ReadPointer(env, dir).status()));
  CHECK(absl::IsNotFound(LatestGoodCheckpoint(env, dir, nullptr).status()));
  // A directory that does not exist has nothing to set aside.
  CHECK(SetAsideCheckpointsAfter(env, JoinPath(dir, "none"), 0, &moved).ok());
}

TEST_CASE("checkpoints are listed by step; other names are ignored", "[checkpoint]") {
  const Fixture f;
  const std::string dir = testing::NewTempDir("list");
  Env* env = Env::Default();
  WriteFixture(f, dir, 20);
  WriteFixture(f, dir, 3);
  REQUIRE(env->CreateDirs(JoinPath(dir, "ckpt-7")).ok());
  for (const char* other : {"ckpt-x", "ckpt-007", "ckpt-", "model"}) {
    REQUIRE(env->CreateDirs(JoinPath(dir, other)).ok());
  }
  REQUIRE(env->WriteFile(JoinPath(dir, "ckpt-9"), "a file", false).ok());
  auto all = ListCheckpoints(env, dir);
  REQUIRE(all.ok());
  REQUIRE(all->size() == 3);
  CHECK((*all)[0].step == 3);
  CHECK((*all)[0].complete);
  CHECK((*all)[0].bytes > 0);
  CHECK((*all)[0].unix_time_ms == 1700000000000);
  CHECK((*all)[1].step == 7);
  CHECK_FALSE((*all)[1].complete);
  CHECK((*all)[2].step == 20);
}

TEST_CASE("Env writes in pieces and reads ranges", "[checkpoint][env]") {
  Env* env = Env::Default();
  const std::string path = JoinPath(testing::NewTempDir("env"), "f");
  auto file = env->NewWritableFile(path);
  REQUIRE(file.ok());
  REQUIRE((*file)->Append("hello, ").ok());
  REQUIRE((*file)->Append("world").ok());
  REQUIRE((*file)->Sync().ok());
  REQUIRE((*file)->Close().ok());
  CHECK((*file)->Append("x").code() == absl::StatusCode::kFailedPrecondition);
  CHECK(*env->FileSize(path) == 12);
  CHECK(*env->ReadFileRange(path, 7, 5) == "world");
  CHECK(env->ReadFileRange(path, 10, 5).status().code() == absl::StatusCode::kOutOfRange);
  CHECK(env->ReadFileRange(JoinPath(path, "no"), 0, 1).status().code() !=
        absl::StatusCode::kOk);
  const std::string tree = testing::NewTempDir("tree");
  REQUIRE(env->CreateDirs(JoinPath(tree, "a/b")).ok());
  REQUIRE(env->WriteFile(JoinPath(tree, "a/b/c"), "x", false).ok());
  REQUIRE(DeleteRecursively(env, tree).ok());
  CHECK_FALSE(env->FileExists(tree));
}

TEST_CASE("Env reads and writes in place, and FaultEnv fails them", "[checkpoint][env]") {
  const std::string path = JoinPath(testing::NewTempDir("rw"), "f");
  auto file = Env::Default()->NewRandomRWFile(path);
  REQUIRE(file.ok());
  REQUIRE((*file)->Write(4, "5678").ok());
  REQUIRE((*file)->Write(0, "1234").ok());
  REQUIRE((*file)->Write(2, "ab").ok());
  char buf[8];
  REQUIRE((*file)->Read(0, 8, buf).ok());
  CHECK(std::string(buf, 8) == "12ab5678");
  CHECK((*file)->Read(6, 4, buf).code() == absl::StatusCode::kOutOfRange);

  FaultEnv faults(Env::Default());
  auto torn = faults.NewRandomRWFile(path);  // truncates
  REQUIRE(torn.ok());
  faults.SetDiskSpace(6);
  REQUIRE((*torn)->Write(0, "abcd").ok());
  CHECK((*torn)->Write(4, "efgh").code() == absl::StatusCode::kResourceExhausted);
  REQUIRE((*torn)->Read(0, 6, buf).ok());  // the two bytes that fit
  CHECK(std::string(buf, 6) == "abcdef");
  faults.FailReadsFrom(1);
  CHECK((*torn)->Read(0, 2, buf).ok());
  const absl::Status failed = (*torn)->Read(0, 2, buf);
  CHECK(failed.code() == absl::StatusCode::kInternal);
  CHECK(absl::StrContains(failed.message(), "Input/output error"));
}

// After a fault, what a restart finds: the newest good checkpoint is `a` or
// `b` (never anything damaged), it loads the fixture bitwise, and the
// pointer names a good one.
int64_t CheckRecoverable(const Fixture& f, const std::string& dir, int64_t a, int64_t b) {
  Env* env = Env::Default();
  std::vector<std::string> skipped;
  auto latest = LatestGoodCheckpoint(env, dir, &skipped);
  REQUIRE(latest.ok());
  auto c = LoadCheckpoint(env, *latest);
  REQUIRE(c.ok());
  const int64_t step = c->manifest.step();
  CHECK((step == a || step == b));
  CHECK(Same(c->variables.at("w").values, f.w));
  CHECK(Same(c->variables.at("b").slots[1], f.b_v));
  auto pointer = ReadPointer(env, dir);
  REQUIRE(pointer.ok());
  CHECK(VerifyCheckpoint(env, JoinPath(dir, CheckpointDirName(*pointer))).empty());
  return step;
}

TEST_CASE("a save cut off by a crash at any operation never leaves a checkpoint that loads wrong",
          "[checkpoint][faults]") {
  const Fixture f;
  // How many mutating operations a whole save of step 2 takes.
  int64_t total = 0;
  {
    const std::string dir = testing::NewTempDir("crash-count");
    REQUIRE(SaveFixture(Env::Default(), f, dir, 1, 1).ok());
    FaultEnv env(Env::Default());
    REQUIRE(SaveFixture(&env, f, dir, 2, 1).ok());
    total = env.operations();
  }
  REQUIRE(total > 20);
  int newer = 0;
  for (int64_t k = 0; k <= total; ++k) {
    INFO("crash at operation " << k << " of " << total);
    const std::string dir = testing::NewTempDir("crash");
    REQUIRE(SaveFixture(Env::Default(), f, dir, 1, /*keep=*/1).ok());
    FaultEnv env(Env::Default());
    env.CrashAtOperation(k);
    const absl::Status st = SaveFixture(&env, f, dir, 2, /*keep=*/1);
    CHECK(st.ok() == (k == total));
    CHECK(env.crashed() == (k < total));
    // keep 1: ckpt-1 may go only once ckpt-2 is complete.
    if (CheckRecoverable(f, dir, 1, 2) == 2) ++newer;
    // Back up: the next save (step 3) completes and clears what the crash left.
    REQUIRE(SaveFixture(Env::Default(), f, dir, 3, /*keep=*/1).ok());
    CHECK(CheckRecoverable(f, dir, 3, 3) == 3);
    auto names = Env::Default()->ListDir(dir);
    REQUIRE(names.ok());
    CHECK(*names == std::vector<std::string>{"checkpoint", "ckpt-3"});
  }
  // Crashes after the manifest's rename have step 2; earlier ones step 1.
  CHECK(newer > 0);
  CHECK(newer < total);
}

TEST_CASE("a full disk fails the save with its reason and leaves the previous checkpoint",
          "[checkpoint][faults]") {
  const Fixture f;
  int64_t total = 0;
  {
    const std::string dir = testing::NewTempDir("full-count");
    REQUIRE(SaveFixture(Env::Default(), f, dir, 1, 1).ok());
    FaultEnv env(Env::Default());
    REQUIRE(SaveFixture(&env, f, dir, 2, 1).ok());
    total = env.bytes_written();
  }
  REQUIRE(total > 1000);
  for (int64_t space : {int64_t{0}, int64_t{7}, total / 8, total / 4, total / 2, total * 3 / 4,
                        total - 1}) {
    INFO("disk space " << space << " bytes");
    const std::string dir = testing::NewTempDir("full");
    REQUIRE(SaveFixture(Env::Default(), f, dir, 1, /*keep=*/1).ok());
    FaultEnv env(Env::Default());
    env.SetDiskSpace(space);
    const absl::Status st = SaveFixture(&env, f, dir, 2, /*keep=*/1);
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == absl::StatusCode::kResourceExhausted);
    CHECK(st.message().find("No space left on device") != std::string::npos);
    // Out of space on the pointer alone, ckpt-2 is complete; either way
    // ckpt-1 is still there, whole.
    CheckRecoverable(f, dir, 1, 2);
    CHECK(VerifyCheckpoint(Env::Default(), JoinPath(dir, "ckpt-1")).empty());
    // No temp file is left behind in the half-written checkpoint.
    auto names = Env::Default()->ListDir(JoinPath(dir, "ckpt-2"));
    if (names.ok()) {
      for (const std::string& n : *names) CHECK(n.find(".tmp") == std::string::npos);
    }
  }
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// Embedding rows of table "ads" (dim 2, slots m and v): 3 rows on shard 0,
// 2 on shard 1, beside one dense variable "w" [2] on shard 0.
struct RowsFixture {
  std::vector<uint64_t> ids0 = {7, 1ull << 63, 42}, ids1 = {5, 99};
  std::vector<float> v0 = Iota(6, 1), m0 = Iota(6, 2), s0 = Iota(6, 3);
  std::vector<float> v1 = Iota(4, -1), m1 = Iota(4, -2), s1 = Iota(4, -3);
  std::vector<int64_t> u0 = {1, 2, 3}, t0 = {10, 20, 30}, u1 = {4, 5}, t1 = {40, 50};
  std::vector<float> w = {0.5f, -0.5f};
};

std::string WriteRowsFixture(const RowsFixture& f, const std::string& dir) {
  Env* env = Env::Default();
  const std::string ckpt = JoinPath(dir, CheckpointDirName(9));
  CheckpointManifest m;
  m.set_step(9);
  m.set_num_shards(2);
  m.set_optimizer("adam");
  m.add_slot_names("m");
  m.add_slot_names("v");
  CheckpointVariable* v = m.add_variables();
  v->set_name("w");
  v->add_shape(2);
  CheckpointTable* t = m.add_tables();
  t->set_name("ads");
  t->set_dim(2);
  t->set_optimizer("adam");
  t->add_slot_names("m");
  t->add_slot_names("v");
  const std::vector<float> zeros(2);
  for (int shard = 0; shard < 2; ++shard) {
    std::vector<ShardTensor> tensors;
    if (shard == 0) {
      tensors = {Part("w", 0, "", {2}, 0, f.w.data(), 2), Part("w", 0, "m", {2}, 0, zeros.data(), 2),
                 Part("w", 0, "v", {2}, 0, zeros.data(), 2)};
    }
    ShardRows r;
    r.table = "ads";
    r.dim = 2;
    r.rows = shard == 0 ? 3 : 2;
    r.ids = shard == 0 ? f.ids0.data() : f.ids1.data();
    r.values = shard == 0 ? f.v0.data() : f.v1.data();
    r.slots = {shard == 0 ? f.m0.data() : f.m1.data(), shard == 0 ? f.s0.data() : f.s1.data()};
    r.updates = shard == 0 ? f.u0.data() : f.u1.data();
    r.touched = shard == 0 ? f.t0.data() : f.t1.data();
    int64_t bytes = 0;
    std::vector<CheckpointRows> rows;
    auto entries = WriteShard(env, ckpt, shard, 2, tensors, &bytes, {r}, &rows);
    REQUIRE(entries.ok());
    for (CheckpointTensor& e : *entries) *m.add_tensors() = e;
    for (CheckpointRows& e : rows) *m.add_rows() = e;
    ShardFile* sf = m.add_shards();
    sf->set_shard(shard);
    sf->set_file(ShardFileName(shard, 2));
    sf->set_bytes(bytes);
  }
  REQUIRE(WriteManifest(env, ckpt, m).ok());
  return ckpt;
}

template <typename T>
std::vector<T> Cat(const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<T> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

TEST_CASE("embedding rows are saved per shard and read back whole, bitwise", "[checkpoint][rows]") {
  const RowsFixture f;
  const std::string ckpt = WriteRowsFixture(f, testing::NewTempDir("rows"));
  // Verification reports its progress over every tensor and row range, up
  // to all of the bytes the manifest names.
  std::vector<std::pair<int64_t, int64_t>> progress;
  CHECK(VerifyCheckpoint(Env::Default(), ckpt, [&progress](int64_t done, int64_t total) {
          progress.emplace_back(done, total);
        }).empty());
  auto manifest = ReadManifest(Env::Default(), ckpt);
  REQUIRE(manifest.ok());
  REQUIRE(progress.size() ==
          static_cast<size_t>(manifest->tensors_size() + manifest->rows_size()));
  CHECK(manifest->rows_size() > 0);
  for (size_t i = 1; i < progress.size(); ++i) CHECK(progress[i].first > progress[i - 1].first);
  CHECK(progress.back().first == progress.back().second);
  int64_t shard_bytes = 0;
  for (const ShardFile& sf : manifest->shards()) shard_bytes += sf.bytes();
  CHECK(progress.back().second > 0);
  CHECK(progress.back().second <= shard_bytes);
  auto c = LoadCheckpoint(Env::Default(), ckpt);
  REQUIRE(c.ok());
  REQUIRE(c->tables.count("ads") == 1);
  const RestoredTable& t = c->tables.at("ads");
  CHECK(t.dim == 2);
  CHECK(t.ids == Cat(f.ids0, f.ids1));
  CHECK(Same(t.values, Cat(f.v0, f.v1)));
  REQUIRE(t.slots.size() == 2);
  CHECK(Same(t.slots[0], Cat(f.m0, f.m1)));
  CHECK(Same(t.slots[1], Cat(f.s0, f.s1)));
  CHECK(t.updates == Cat(f.u0, f.u1));
  CHECK(t.touched == Cat(f.t0, f.t1));
  CHECK(Same(c->variables.at("w").values, f.w));
}

TEST_CASE("damaged rows are found by verify and refused by load", "[checkpoint][rows][faults]") {
  const RowsFixture f;
  const std::string dir = testing::NewTempDir("rows-damaged");
  const std::string good = WriteRowsFixture(f, JoinPath(dir, "good"));
  auto m = ReadManifest(Env::Default(), good);
  REQUIRE(m.ok());
  int region = 0;
  for (const CheckpointRows& r : m->rows()) {
    std::vector<ByteRange> ranges = {r.ids(), r.values(), r.updates(), r.touched()};
    ranges.insert(ranges.end(), r.slots().begin(), r.slots().end());
    for (const ByteRange& b : ranges) {
      INFO("shard " << r.shard() << " range at " << b.offset());
      const std::string copy = JoinPath(dir, absl::StrCat("copy", region++));
      CopyTree(good, copy);
      FlipByte(JoinPath(copy, ShardFileName(r.shard(), 2)), b.offset() + b.length() / 2);
      const std::vector<std::string> problems = VerifyCheckpoint(Env::Default(), copy);
      REQUIRE(problems.size() == 1);
      CHECK(problems[0].find("table ads") != std::string::npos);
      CHECK(problems[0].find("CRC32C mismatch") != std::string::npos);
      CHECK_FALSE(LoadCheckpoint(Env::Default(), copy).ok());
    }
  }
  CHECK(region == 12);
  // A manifest whose rows disagree with their table, or repeat an id.
  auto edit = [&](const std::string& name, const std::function<void(CheckpointManifest*)>& f2) {
    const std::string copy = JoinPath(dir, name);
    CopyTree(good, copy);
    CheckpointManifest bad = *m;
    f2(&bad);
    REQUIRE(WriteManifest(Env::Default(), copy, bad).ok());
    return copy;
  };
  CHECK_FALSE(ReadManifest(Env::Default(), edit("slots", [](CheckpointManifest* b) {
                b->mutable_rows(0)->mutable_slots()->RemoveLast();
              })).ok());
  CHECK_FALSE(ReadManifest(Env::Default(), edit("count", [](CheckpointManifest* b) {
                b->mutable_rows(1)->set_rows(3);
              })).ok());
  CHECK_FALSE(ReadManifest(Env::Default(), edit("table", [](CheckpointManifest* b) {
                b->mutable_rows(1)->set_table("clicks");
              })).ok());
  CHECK_FALSE(ReadManifest(Env::Default(), edit("repeat", [](CheckpointManifest* b) {
                b->mutable_rows(1)->set_shard(0);
              })).ok());
  // Ranges that overflow int64 are refused before any allocation.
  CHECK_FALSE(ReadManifest(Env::Default(), edit("overflow", [](CheckpointManifest* b) {
                b->mutable_rows(0)->mutable_ids()->set_offset(INT64_MAX - 8);
              })).ok());
  CHECK_FALSE(ReadManifest(Env::Default(), edit("overflow-tensor", [](CheckpointManifest* b) {
                b->mutable_tensors(0)->set_offset(INT64_MAX - 2);
              })).ok());
  CHECK_FALSE(ReadManifest(Env::Default(), edit("huge-shape", [](CheckpointManifest* b) {
                b->mutable_variables(0)->set_shape(0, int64_t{1} << 62);
              })).ok());
  // The same id in two shards' rows is refused on load.
  {
    RowsFixture dup;
    dup.ids1[0] = dup.ids0[2];
    const std::string ckpt = WriteRowsFixture(dup, JoinPath(dir, "dup"));
    const std::vector<std::string> problems = VerifyCheckpoint(Env::Default(), ckpt);
    REQUIRE(problems.size() == 1);
    CHECK(problems[0] == "table ads: id 42 is in two shards");
    auto c = LoadCheckpoint(Env::Default(), ckpt);
    REQUIRE_FALSE(c.ok());
    CHECK(std::string(c.status().message()).find("id 42 is in two shards") != std::string::npos);
  }
}

}  // namespace
}  // namespace pstrain
