// The snapshotter on its own: a cut references the current version and
// copies the slots; the writer writes it while the caller goes on; GetShard's
// wait ends with the shard, its error, the run's failure, a new run, a
// shutdown or its deadline; scheduled cuts are bounded.
#include "ps_server/snapshotter.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/base/tensor.h"
#include "common/cluster/config.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"

namespace pstrain {
namespace {

constexpr uint64_t kRun = 9;

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = JoinPath(tmp != nullptr ? tmp : "/tmp", name);
  (void)DeleteRecursively(Env::Default(), dir);
  return dir;
}

// One server of one, momentum (one slot), with w = {1, 2, 3} written to `dir`.
std::shared_ptr<ServerModel> Model(const std::string& dir) {
  auto config = ParseTrainingConfig(R"(
model { mlp { input_dim: 2 num_classes: 2 } }
data { train_images: "x" train_labels: "y" batch_size: 1 }
optimizer { learning_rate: 0.1 momentum {} }
max_steps: 10
sync {}
)",
                                    "test");
  REQUIRE(config.ok());
  config->mutable_checkpoint()->set_dir(dir);
  InitializeRequest req;
  req.set_incarnation(kRun);
  *req.mutable_config() = *config;
  req.set_num_workers(2);
  req.set_num_servers(1);
  req.set_server_index(0);
  auto model = NewServerModel(req);
  REQUIRE(model.ok());
  NamedTensor w;
  w.mutable_ref()->set_variable("w");
  ToProto({3}, {1, 2, 3}, w.mutable_tensor());
  auto p = NewPartition(w, **model);
  REQUIRE(p.ok());
  (*model)->partitions.emplace(PartitionKey{"w", 0}, *std::move(p));
  return *model;
}

std::vector<float> ValuesIn(const std::string& ckpt, const GetShardResponse& shard) {
  for (const CheckpointTensor& t : shard.tensors()) {
    if (t.variable() != "w" || !t.slot().empty()) continue;
    auto bytes =
        Env::Default()->ReadFileRange(JoinPath(ckpt, shard.file()), t.offset(), t.length());
    REQUIRE(bytes.ok());
    std::vector<float> out(bytes->size() / 4);
    std::memcpy(out.data(), bytes->data(), bytes->size());
    return out;
  }
  FAIL("no tensor w in the shard");
  return {};
}

TEST_CASE("snapshotter: a cut takes the current version by reference and the slots by copy",
          "[ps][snapshot]") {
  auto model = Model(TestDir("cut_refs"));
  PartitionState& p = *model->partitions.begin()->second;
  std::vector<StepCursor> cursors(2);
  cursors[1] = {true, 3, 17};
  std::unique_ptr<ShardSnapshot> cut = CutShard(*model, 4, kRun, cursors);
  REQUIRE(cut->parts.size() == 1);
  {
    absl::MutexLock lock(&p.mu);
    CHECK(cut->parts[0].values == p.current);  // no copy of the values
  }
  {
    absl::MutexLock lock(&p.apply_mu);
    p.slots[0][0] = 42;  // an update after the cut does not reach it
  }
  CHECK(cut->parts[0].slots[0][0] == 0);
  CHECK(cut->slot_names.size() == 1);
  CHECK(cut->step == 4);
  CHECK(absl::EndsWith(cut->dir, "ckpt-4"));
  REQUIRE(cut->cursors.size() == 1);  // only the worker whose cursor is set
  CHECK(cut->cursors[0].worker() == 1);
  CHECK(cut->cursors[0].position() == 17);
}

TEST_CASE("snapshotter: the writer writes a queued cut, and GetShard's wait gets it",
          "[ps][snapshot]") {
  const std::string dir = TestDir("writes");
  auto model = Model(dir);
  Snapshotter snapshots;
  snapshots.Reset(kRun);
  CHECK_FALSE(snapshots.Taken(2));
  snapshots.Enqueue(CutShard(*model, 2, kRun, {}));
  // Taken while queued, while written and once written (a retried async
  // Snapshot is answered, not cut twice): TSan's slower runs caught the
  // writer between the queue and the outcomes, where it was not.
  CHECK(snapshots.Taken(2));
  for (int i = 0; i < 1000; ++i) CHECK(snapshots.Taken(2));
  auto shard = snapshots.Await(kRun, 2, absl::Seconds(30));
  CHECK(snapshots.Taken(2));
  REQUIRE(shard.ok());
  CHECK(shard->bytes() > 0);
  CHECK(ValuesIn(JoinPath(dir, "ckpt-2"), *shard) == std::vector<float>{1, 2, 3});
  const Snapshotter::Stats stats = snapshots.stats();
  CHECK(stats.written == 1);
  CHECK(stats.failed == 0);
  CHECK(stats.bytes == shard->bytes());
  CHECK(stats.last_success_unix > 0);
}

TEST_CASE("snapshotter: a step older than the outcomes kept is NOT_FOUND at once, not a wait",
          "[ps][snapshot]") {
  // A chief more than kKeepOutcomes checkpoints behind its servers (fast
  // steps, small checkpoint.every_steps) waited its whole timeout for each
  // such step: found by tests/driver_test's restore mid-run.
  const std::string dir = TestDir("forgotten");
  auto model = Model(dir);
  Snapshotter snapshots;
  snapshots.Reset(kRun);
  const int64_t cuts = Snapshotter::kKeepOutcomes + 3;
  for (int64_t step = 1; step <= cuts; ++step) {
    snapshots.Enqueue(CutShard(*model, step, kRun, {}));
  }
  REQUIRE(snapshots.Await(kRun, cuts, absl::Seconds(30)).ok());
  const absl::Time start = absl::Now();
  bool timed_out = true;
  auto old = snapshots.Await(kRun, 2, absl::Seconds(30), &timed_out);
  CHECK(absl::IsNotFound(old.status()));
  CHECK_FALSE(timed_out);
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK(absl::StrContains(old.status().message(), "keeps its newest 16"));
  CHECK(snapshots.Await(kRun, 4, absl::ZeroDuration()).ok());  // the oldest kept
  // A new run forgets nothing yet: its step 2 is waited for.
  snapshots.Reset(kRun + 1);
  auto next = snapshots.Await(kRun + 1, 2, absl::Milliseconds(10), &timed_out);
  CHECK(timed_out);
}

TEST_CASE("snapshotter: a shard that cannot be written is an error GetShard returns",
          "[ps][snapshot]") {
  const std::string base = TestDir("unwritable");
  REQUIRE(Env::Default()->CreateDirs(base).ok());
  const std::string file = JoinPath(base, "a_file");
  REQUIRE(Env::Default()->WriteFile(file, "x", false).ok());
  auto model = Model(JoinPath(file, "under_a_file"));
  Snapshotter snapshots;
  snapshots.Reset(kRun);
  snapshots.Enqueue(CutShard(*model, 1, kRun, {}));
  auto shard = snapshots.Await(kRun, 1, absl::Seconds(30));
  CHECK_FALSE(shard.ok());
  CHECK_FALSE(absl::IsDeadlineExceeded(shard.status()));
  CHECK(snapshots.stats().failed == 1);
}

TEST_CASE(
    "snapshotter: GetShard's wait ends at its deadline, at a failed run, a new run and a "
    "shutdown",
    "[ps][snapshot]") {
  Snapshotter snapshots;
  snapshots.Reset(kRun);
  auto late = snapshots.Await(kRun, 5, absl::Milliseconds(20));
  CHECK(absl::IsDeadlineExceeded(late.status()));
  CHECK(absl::StrContains(late.status().message(), "no shard for step 5"));

  // A sync step failed at version 3: steps after it never come, steps up to
  // it still may (their cut may be queued).
  snapshots.FailAfter(3, absl::DeadlineExceededError("sync step 3 failed"));
  auto failed = snapshots.Await(kRun, 4, absl::Seconds(30));
  CHECK(failed.status().message() == "sync step 3 failed");
  CHECK(absl::IsDeadlineExceeded(snapshots.Await(kRun, 3, absl::Milliseconds(20)).status()));

  // A wait of the run before ends when another run takes over.
  snapshots.Reset(kRun);
  std::thread reset([&snapshots] {
    absl::SleepFor(absl::Milliseconds(50));
    snapshots.Reset(kRun + 1);
  });
  auto replaced = snapshots.Await(kRun, 4, absl::Seconds(30));
  reset.join();
  CHECK(absl::IsFailedPrecondition(replaced.status()));

  std::thread close([&snapshots] {
    absl::SleepFor(absl::Milliseconds(50));
    snapshots.Close();
  });
  auto closed = snapshots.Await(kRun + 1, 4, absl::Seconds(30));
  close.join();
  CHECK(absl::IsUnavailable(closed.status()));
}

TEST_CASE("snapshotter: only the wait's own deadline is reported as timed out",
          "[ps][snapshot]") {
  Snapshotter snapshots;
  snapshots.Reset(kRun);
  bool timed_out = false;
  CHECK(absl::IsDeadlineExceeded(
      snapshots.Await(kRun, 1, absl::Milliseconds(10), &timed_out).status()));
  CHECK(timed_out);
  // A failed step's error is DEADLINE_EXCEEDED too, and is returned as it is.
  snapshots.FailAfter(0, absl::DeadlineExceededError("sync step 0 failed"));
  auto failed = snapshots.Await(kRun, 1, absl::Seconds(30), &timed_out);
  CHECK(failed.status().message() == "sync step 0 failed");
  CHECK_FALSE(timed_out);
  // The version moved after the failure (a step that was applying
  // completed): its shard may still come, the next ones not.
  snapshots.FailAfter(1, absl::DeadlineExceededError("sync step 0 failed"));
  CHECK(absl::IsDeadlineExceeded(
      snapshots.Await(kRun, 1, absl::Milliseconds(10), &timed_out).status()));
  CHECK(timed_out);
}

TEST_CASE("snapshotter: once stopped, nothing queued is written and waits end",
          "[ps][snapshot]") {
  const std::string dir = TestDir("stopped");
  auto model = Model(dir);
  Snapshotter snapshots;
  snapshots.Reset(kRun);
  snapshots.Stop();
  snapshots.Enqueue(CutShard(*model, 2, kRun, {}));
  CHECK(absl::IsUnavailable(snapshots.Await(kRun, 2, absl::Seconds(30)).status()));
  absl::SleepFor(absl::Milliseconds(50));
  CHECK(snapshots.stats().written == 0);
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(dir, "ckpt-2")));
}

TEST_CASE("snapshotter: a shard of the run before is not this run's", "[ps][snapshot]") {
  const std::string dir = TestDir("stale_run");
  auto model = Model(dir);
  Snapshotter snapshots;
  snapshots.Reset(kRun);
  snapshots.Enqueue(CutShard(*model, 2, kRun, {}));
  REQUIRE(snapshots.Await(kRun, 2, absl::Seconds(30)).ok());
  snapshots.Reset(kRun + 1);
  CHECK_FALSE(snapshots.Taken(2));
  CHECK(absl::IsDeadlineExceeded(snapshots.Await(kRun + 1, 2, absl::Milliseconds(20)).status()));
}

TEST_CASE("snapshotter: cuts the chief schedules are taken once, and at most 64 wait",
          "[ps][snapshot]") {
  Snapshotter snapshots;
  snapshots.Reset(kRun);
  REQUIRE(snapshots.Schedule(5).ok());
  REQUIRE(snapshots.Schedule(7).ok());
  CHECK_FALSE(snapshots.TakeScheduled(4));
  CHECK(snapshots.TakeScheduled(5));
  CHECK_FALSE(snapshots.TakeScheduled(5));
  CHECK(snapshots.TakeScheduled(7));
  for (int i = 0; i < 64; ++i) REQUIRE(snapshots.Schedule(100 + i).ok());
  CHECK(absl::IsResourceExhausted(snapshots.Schedule(200)));
  // Reaching a later version forgets the ones before it.
  CHECK_FALSE(snapshots.TakeScheduled(1000));
  CHECK(snapshots.Schedule(2000).ok());
}

// The model of Model(), with an embedding table "t" of 2 floats (SGD).
void AddTable(ServerModel* model) {
  auto table = std::make_unique<ServerModel::Table>();
  OptimizerConfig sgd;
  sgd.set_learning_rate(1);
  sgd.mutable_sgd();
  auto opt = CreateOptimizer(sgd);
  REQUIRE(opt.ok());
  table->optimizer = std::move(*opt);
  table->optimizer_kind = "sgd";
  EmbeddingTable::Options o;
  o.name = "t";
  o.dim = 2;
  table->rows = std::make_unique<EmbeddingTable>(o, table->optimizer.get());
  model->tables.emplace("t", std::move(table));
}

// Looks up `ids` in table "t" (creating them) at `step`.
void Touch(ServerModel* model, std::vector<uint64_t> ids, int64_t step) {
  std::vector<float> out(ids.size() * 2);
  REQUIRE(model->tables.at("t")->rows->Lookup(ids, step, out.data()).ok());
}

TEST_CASE("snapshotter: rows are saved in full every full_every cuts, deltas between; a "
          "failed write breaks the chain", "[ps][snapshot][incremental]") {
  const std::string dir = TestDir("chain");
  auto model = Model(dir);
  AddTable(model.get());
  Snapshotter snapshots;
  snapshots.Reset(kRun);
  auto cut = [&](int64_t step) {
    snapshots.Enqueue(CutShard(*model, step, kRun, {}, snapshots.PlanRows(step, 3, 10)));
    auto shard = snapshots.Await(kRun, step, absl::Seconds(30));
    REQUIRE(shard.ok());
    return *shard;
  };
  Touch(model.get(), {1, 2, 3}, 0);
  GetShardResponse s1 = cut(1);
  REQUIRE(s1.rows_size() == 1);
  CHECK_FALSE(s1.rows(0).delta());
  CHECK(s1.rows(0).rows() == 3);
  Touch(model.get(), {2}, 1);
  GetShardResponse s2 = cut(2);
  REQUIRE(s2.rows_size() == 2);  // the full save at 1, then its own
  CHECK(s2.rows(0).checkpoint() == "ckpt-1");
  CHECK_FALSE(s2.rows(0).delta());
  CHECK(s2.rows(1).checkpoint().empty());
  CHECK(s2.rows(1).delta());
  CHECK(s2.rows(1).rows() == 1);
  GetShardResponse s3 = cut(3);  // nothing changed: an empty delta
  REQUIRE(s3.rows_size() == 3);
  CHECK(s3.rows(1).checkpoint() == "ckpt-2");
  CHECK(s3.rows(2).rows() == 0);
  GetShardResponse s4 = cut(4);  // three links: full again
  REQUIRE(s4.rows_size() == 1);
  CHECK_FALSE(s4.rows(0).delta());
  CHECK(s4.rows(0).rows() == 3);
  CHECK(snapshots.PlanRows(10, 3, 10).base_step == -1);  // the run's last stands alone
  CHECK(snapshots.PlanRows(5, 3, 10).base_step == 4);
  CHECK(snapshots.PlanRows(5, 0, 10).base_step == -1);  // full_every 0: always full
  // Written outside the checkpoint directory (a file in the way): the
  // write fails, the delta on it fails too, and the cut after is full.
  const std::string blocked = JoinPath(dir, CheckpointDirName(5));
  REQUIRE(Env::Default()->WriteFile(blocked, "in the way", false).ok());
  std::unique_ptr<ShardSnapshot> cut5 =
      CutShard(*model, 5, kRun, {}, snapshots.PlanRows(5, 3, 10));
  // Cut 6 planned as a delta on 5 before 5's write fails (planned after it
  // fails, it is full: the writer may be that quick).
  RowsPlan on5;
  on5.base_step = 5;
  for (const ShardSnapshot::TableRows& t : cut5->tables) {
    on5.base_generations[t.table] = t.generation;
  }
  snapshots.Enqueue(std::move(cut5));
  snapshots.Enqueue(CutShard(*model, 6, kRun, {}, on5));
  CHECK_FALSE(snapshots.Await(kRun, 5, absl::Seconds(30)).ok());
  auto s6 = snapshots.Await(kRun, 6, absl::Seconds(30));
  REQUIRE_FALSE(s6.ok());
  CHECK(absl::StrContains(s6.status().message(), "a delta on step 5, whose shard was not written"));
  CHECK(snapshots.PlanRows(7, 3, 10).base_step == -1);
  GetShardResponse s7 = cut(7);
  REQUIRE(s7.rows_size() == 1);
  CHECK(s7.rows(0).rows() == 3);
  CHECK(snapshots.PlanRows(8, 3, 10).base_step == 7);
  // A new run starts its chain afresh.
  snapshots.Reset(kRun + 1);
  CHECK(snapshots.PlanRows(8, 3, 10).base_step == -1);
}

}  // namespace
}  // namespace pstrain
