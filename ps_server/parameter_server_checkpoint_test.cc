// ParameterServer: checkpoint cuts, sync and async, and GetShard.
#include "ps_server/parameter_server.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

#include "catch2/catch.hpp"
#include "common/base/bfloat16.h"
#include "common/storage/checkpoint.h"
#include "common/cluster/config.h"
#include "common/storage/env.h"
#include "ps_server/parameter_server_testing.h"

namespace pstrain {
namespace {

// The floats of one tensor of a written shard.
std::vector<float> ShardTensorValues(const std::string& ckpt, const GetShardResponse& shard,
                                     const std::string& variable) {
  for (const CheckpointTensor& t : shard.tensors()) {
    if (t.variable() != variable || !t.slot().empty()) continue;
    auto bytes = Env::Default()->ReadFileRange(JoinPath(ckpt, shard.file()), t.offset(),
                                               t.length());
    REQUIRE(bytes.ok());
    std::vector<float> out(bytes->size() / 4);
    std::memcpy(out.data(), bytes->data(), bytes->size());
    return out;
  }
  FAIL("no tensor " << variable);
  return {};
}

// Async, one server of one, `workers` workers: w (2 x 2) and b (2), zeros.
InitializeRequest AsyncShardInit(const TrainingConfig& config, int workers) {
  InitializeRequest init = InitRequest(config, workers, {0, 0, 0, 0});
  NamedTensor* b = init.add_variables();
  b->mutable_ref()->set_variable("b");
  ToProto({2}, {0, 0}, b->mutable_tensor());
  init.set_num_servers(1);
  init.set_server_index(0);
  return init;
}

TEST_CASE("async checkpoints: a cut waits for a push in parts to complete or be dropped, so none "
          "falls inside it", "[ps][async][checkpoint]") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = JoinPath(tmp != nullptr ? tmp : "/tmp", "async_cut_parts");
  (void)DeleteRecursively(Env::Default(), dir);
  TrainingConfig config = BaseConfig(false, 0, 0, 1.0f);
  config.mutable_checkpoint()->set_dir(dir);
  // A push's parts may come for 2.5 s (the worker's push deadline).
  config.mutable_rpc()->set_step_timeout_ms(2000);
  config.mutable_rpc()->set_rpc_timeout_ms(500);
  ParameterServer ps;
  REQUIRE(ps.Initialize(AsyncShardInit(config, 2)).ok());
  auto part = [](int k, const std::string& var, std::vector<float> g, int64_t step = 0,
                 int32_t session = 0) {
    PushRequest req = Grad(0, step, std::move(g), var,
                           var == "w" ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{2});
    req.set_part(k);
    req.set_num_parts(2);
    req.set_session(session);
    return req;
  };
  auto cut = [&ps](int64_t step, int64_t timeout_ms, SnapshotResponse* response) {
    SnapshotRequest req;
    req.set_incarnation(kIncarnation);
    req.set_step(step);
    req.set_timeout_ms(timeout_ms);
    return ps.Snapshot(req, response);
  };
  PushResponse r;
  REQUIRE(ps.Push(part(0, "w", {1, 1, 1, 1}), &r).ok());  // applied, the push open
  CHECK(r.outcome() == HELD);
  SnapshotResponse response;
  CHECK(absl::IsDeadlineExceeded(cut(1, 200, &response)));
  absl::Status waited;
  std::thread cutter([&] { waited = cut(1, 10000, &response); });
  absl::SleepFor(absl::Milliseconds(100));
  REQUIRE(ps.Push(part(1, "b", {1, 1}), &r).ok());  // not held by the cut: completes it
  CHECK(r.outcome() == APPLIED);
  cutter.join();
  REQUIRE(waited.ok());
  CHECK(response.version() == 1);
  GetShardRequest get;
  get.set_incarnation(kIncarnation);
  get.set_step(1);
  get.set_timeout_ms(10000);
  GetShardResponse shard;
  REQUIRE(ps.GetShard(get, &shard).ok());
  const std::string ckpt = JoinPath(dir, CheckpointDirName(1));
  CHECK(ShardTensorValues(ckpt, shard, "w") == std::vector<float>{-1, -1, -1, -1});
  CHECK(ShardTensorValues(ckpt, shard, "b") == std::vector<float>{-1, -1});

  // The worker restarts mid-push: its new process's claim drops the open
  // push (its part in stays applied, uncounted), and a cut goes at once.
  REQUIRE(ps.Push(part(0, "w", {1, 1, 1, 1}, 1), &r).ok());
  CHECK(r.outcome() == HELD);
  PsStatusResponse st;
  REQUIRE(ps.GetStatus(0, /*session=*/1, &st).ok());
  absl::Time start = absl::Now();
  REQUIRE(cut(2, 1000, &response).ok());
  CHECK(absl::Now() - start < absl::Milliseconds(500));
  CHECK(response.version() == 1);
  CHECK(absl::IsFailedPrecondition(ps.Push(part(1, "b", {1, 1}, 1), &r)));  // the old process's
  get.set_step(2);
  REQUIRE(ps.GetShard(get, &shard).ok());
  CHECK(ShardTensorValues(JoinPath(dir, CheckpointDirName(2)), shard, "w") ==
        std::vector<float>{-2, -2, -2, -2});

  // A push whose parts stop coming is dropped at the worker's push deadline
  // (2.5 s) by the server's timer, with no other call to look: the cut
  // waiting for it goes then.
  REQUIRE(ps.Push(part(0, "w", {1, 1, 1, 1}, 1, 1), &r).ok());
  CHECK(r.outcome() == HELD);
  start = absl::Now();
  REQUIRE(cut(3, 10000, &response).ok());
  const absl::Duration waited_for = absl::Now() - start;
  INFO(absl::FormatDuration(waited_for));
  CHECK(waited_for > absl::Milliseconds(1500));
  CHECK(waited_for < absl::Seconds(8));
  CHECK(response.version() == 1);
  ps.GetStatus(&st);
  CHECK(st.held_pushes_expired() == 1);
  CHECK(st.pushes_applied() == 1);
}

TEST_CASE("async checkpoints: each cut holds pushes, so all partitions are at one version",
          "[ps][async][checkpoint]") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = JoinPath(tmp != nullptr ? tmp : "/tmp", "async_cut");
  (void)DeleteRecursively(Env::Default(), dir);
  TrainingConfig config = BaseConfig(false, 0, 0, 1.0f);
  config.set_max_steps(1000000);
  config.mutable_checkpoint()->set_dir(dir);
  ParameterServer ps;
  REQUIRE(ps.Initialize(AsyncShardInit(config, 4)).ok());

  // Four workers push 1s to both variables (each its own push per variable
  // would be two pushes; one push carries both, applied partition by
  // partition), with their data cursor at the push count.
  std::atomic<bool> stop{false};
  absl::Mutex error_mu;
  std::string error;  // the first push that failed (Catch2 asserts on this thread only)
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      for (int i = 1; !stop.load(); ++i) {
        PushRequest req = Grad(w, 0, {1, 1, 1, 1});
        NamedTensor* nt = req.add_gradients();
        nt->mutable_ref()->set_variable("b");
        ToProto({2}, {1, 1}, nt->mutable_tensor());
        req.set_cursor_epoch(0);
        req.set_cursor_position(i);
        PushResponse r;
        absl::Status st = ps.Push(req, &r);
        if (!st.ok()) {
          absl::MutexLock lock(&error_mu);
          if (error.empty()) error = st.ToString();
          return;
        }
      }
    });
  }
  // Joins the pushers on every way out of this test.
  struct Joiner {
    std::atomic<bool>* stop;
    std::vector<std::thread>* threads;
    ~Joiner() {
      *stop = true;
      for (std::thread& t : *threads) {
        if (t.joinable()) t.join();
      }
    }
  } joiner{&stop, &workers};
  int64_t last = -1;
  for (int64_t step = 1; step <= 20; ++step) {
    absl::SleepFor(absl::Milliseconds(2));
    SnapshotRequest req;
    req.set_incarnation(kIncarnation);
    req.set_step(step);
    req.set_timeout_ms(10000);
    SnapshotResponse cut;
    REQUIRE(ps.Snapshot(req, &cut).ok());
    GetShardRequest get;
    get.set_incarnation(kIncarnation);
    get.set_step(step);
    get.set_timeout_ms(10000);
    GetShardResponse shard;
    REQUIRE(ps.GetShard(get, &shard).ok());
    const std::string ckpt = JoinPath(dir, CheckpointDirName(step));
    // Every element of both partitions was updated by the same pushes.
    const float n = -static_cast<float>(cut.version());
    INFO("cut " << step << " at version " << cut.version());
    CHECK(ShardTensorValues(ckpt, shard, "w") == std::vector<float>{n, n, n, n});
    CHECK(ShardTensorValues(ckpt, shard, "b") == std::vector<float>{n, n});
    CHECK(cut.version() >= last);
    last = cut.version();
    // Each worker's cursor is that of a push the cut includes, and they add
    // up to the version (every push of a worker is counted once).
    int64_t sum = 0;
    for (const WorkerCursor& c : shard.cursors()) sum += c.position();
    CHECK(sum == cut.version());
    // Asked again, the same cut is not taken twice.
    SnapshotResponse again;
    REQUIRE(ps.Snapshot(req, &again).ok());
  }
  stop = true;
  for (std::thread& t : workers) t.join();
  absl::MutexLock lock(&error_mu);
  CHECK(error.empty());
  CHECK(last > 0);
}

TEST_CASE("sync: a cut asked for a step ahead is taken at that step's boundary",
          "[ps][sync][checkpoint]") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = JoinPath(tmp != nullptr ? tmp : "/tmp", "sync_cut");
  (void)DeleteRecursively(Env::Default(), dir);
  TrainingConfig sync = BaseConfig(true, 1, 0, 1.0f);
  sync.mutable_checkpoint()->set_dir(dir);  // every_steps 0: only max_steps and asked ones
  InitializeRequest init = InitRequest(sync, 1, {0, 0, 0, 0});
  init.set_num_servers(1);
  init.set_server_index(0);
  ParameterServer ps;
  REQUIRE(ps.Initialize(init).ok());
  auto ask = [&ps](int64_t step) {
    SnapshotRequest req;
    req.set_incarnation(kIncarnation);
    req.set_step(step);
    SnapshotResponse cut;
    return ps.Snapshot(req, &cut);
  };
  CHECK(ask(0).code() == absl::StatusCode::kOutOfRange);  // not ahead
  CHECK(ask(5000).code() == absl::StatusCode::kInvalidArgument);  // past max_steps
  REQUIRE(ask(3).ok());
  for (int64_t step = 0; step < 5; ++step) {
    PushResponse r;
    REQUIRE(ps.Push(Grad(0, step, {1, 1, 1, 1}), &r).ok());
  }
  CHECK(ask(2).code() == absl::StatusCode::kOutOfRange);  // passed
  GetShardRequest get;
  get.set_incarnation(kIncarnation);
  get.set_step(3);
  get.set_timeout_ms(5000);
  GetShardResponse shard;
  REQUIRE(ps.GetShard(get, &shard).ok());
  CHECK(ShardTensorValues(JoinPath(dir, "ckpt-3"), shard, "w") ==
        std::vector<float>{-3, -3, -3, -3});
  // Nothing was cut at the steps nobody asked for.
  CHECK_FALSE(Env::Default()->IsDirectory(JoinPath(dir, "ckpt-2")));
  CHECK_FALSE(Env::Default()->IsDirectory(JoinPath(dir, "ckpt-4")));
}

}  // namespace
}  // namespace pstrain
