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

namespace pstrain {
namespace {

constexpr uint64_t kIncarnation = 77;

TrainingConfig BaseConfig(bool sync, int replicas = 0, int staleness = 0, float lr = 0.5f) {
  auto c = ParseTrainingConfig(R"(
model { mlp { input_dim: 2 num_classes: 2 } }
data { train_images: "x" train_labels: "y" batch_size: 1 }
optimizer { learning_rate: 0.1 }
max_steps: 1000
)", "test");
  REQUIRE(c.ok());
  c->mutable_optimizer()->set_learning_rate(lr);
  if (sync) {
    c->mutable_sync()->set_replicas_to_aggregate(replicas);
  } else {
    c->mutable_async()->set_staleness_bound(staleness);
  }
  return *c;
}

InitializeRequest InitRequest(const TrainingConfig& config, int workers,
                              std::vector<float> w = {1, 2, 3, 4}) {
  InitializeRequest req;
  req.set_incarnation(kIncarnation);
  *req.mutable_config() = config;
  req.set_num_workers(workers);
  NamedTensor* nt = req.add_variables();
  nt->mutable_ref()->set_variable("w");
  ToProto({2, 2}, w, nt->mutable_tensor());
  return req;
}

PushRequest Grad(int worker, int64_t step, std::vector<float> g, std::string var = "w",
                 std::vector<int64_t> shape = {2, 2}) {
  PushRequest req;
  req.set_incarnation(kIncarnation);
  req.set_worker(worker);
  req.set_step(step);
  NamedTensor* nt = req.add_gradients();
  nt->mutable_ref()->set_variable(var);
  ToProto(shape, g, nt->mutable_tensor());
  return req;
}

// A push with no gradients (to a server that holds no partition).
PushRequest EmptyPush(int worker, int64_t step) {
  PushRequest req = Grad(worker, step, {});
  req.clear_gradients();
  return req;
}

std::vector<float> PullW(ParameterServer& ps, int64_t* version = nullptr) {
  PullRequest req;
  req.set_incarnation(kIncarnation);
  req.set_worker(-1);
  PullResponse resp;
  REQUIRE(ps.Pull(req, &resp).ok());
  if (version) *version = resp.version();
  auto t = FromProto(resp.tensors(0).tensor());
  REQUIRE(t.ok());
  return t->values();
}

TEST_CASE("SGD applies params -= lr * grad", "[optimizer]") {
  OptimizerConfig c;
  c.set_learning_rate(0.1f);
  c.mutable_sgd();
  auto opt = CreateOptimizer(c);
  REQUIRE(opt.ok());
  std::vector<float> p = {1.0f, -2.0f};
  std::vector<float> g = {10.0f, 0.5f};
  OptimizerSlots slots;
  UpdateInfo u;
  u.learning_rate = 0.1f;
  (*opt)->Apply(absl::MakeSpan(p), g, &slots, u);
  CHECK(p[0] == Approx(0.0f).margin(1e-7));
  CHECK(p[1] == Approx(-2.05f));
  c.set_learning_rate(0);
  CHECK_FALSE(CreateOptimizer(c).ok());
}

TEST_CASE("sync: the update waits for the quorum and applies the average", "[ps][sync]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(true), 2)).ok());
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == ACCUMULATED);

  PullRequest wait;
  wait.set_incarnation(kIncarnation);
  wait.set_worker(0);
  wait.set_min_version(1);
  wait.set_timeout_ms(30);
  PullResponse pr;
  absl::Status st = ps.Pull(wait, &pr);
  CHECK(absl::IsDeadlineExceeded(st));
  CHECK(std::string(st.message()).find("waiting on worker(s) 1") != std::string::npos);

  REQUIRE(ps.Push(Grad(1, 0, {3, 3, 3, 3}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  CHECK(r.version() == 1);
  REQUIRE(ps.Pull(wait, &pr).ok());
  CHECK(pr.version() == 1);
  // mean gradient 2, lr 0.5
  CHECK(PullW(ps) == std::vector<float>{0, 1, 2, 3});
}

TEST_CASE("a restarted worker's session: its repeat of the open step is taken once, its "
          "earlier process is refused",
          "[ps][sync][recovery]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(true), 2)).ok());
  auto rejected = [&ps](ParameterServer::Rejection r) {
    return ps.counters().rejected[static_cast<size_t>(r)];
  };
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  REQUIRE(ps.Push(Grad(1, 0, {3, 3, 3, 3}), &r).ok());  // step 0 done
  REQUIRE(ps.Push(Grad(1, 1, {2, 2, 2, 2}), &r).ok());  // worker 1's process 0, then killed
  CHECK(r.outcome() == ACCUMULATED);
  // The same process again: a duplicate, as ever.
  CHECK(absl::IsInvalidArgument(ps.Push(Grad(1, 1, {2, 2, 2, 2}), &r)));
  CHECK(rejected(ParameterServer::Rejection::kDuplicate) == 1);
  // Its restart (session 1) repeats step 1: taken once, not refused.
  PushRequest again = Grad(1, 1, {2, 2, 2, 2});
  again.set_session(1);
  REQUIRE(ps.Push(again, &r).ok());
  CHECK(r.outcome() == ACCUMULATED);
  CHECK(rejected(ParameterServer::Rejection::kDuplicate) == 1);
  // The earlier process, had it lived on, is refused from now on.
  absl::Status old = ps.Push(Grad(1, 1, {9, 9, 9, 9}), &r);
  CHECK(absl::IsFailedPrecondition(old));
  CHECK(std::string(old.message()).find("superseded by session 1") != std::string::npos);
  CHECK(rejected(ParameterServer::Rejection::kSuperseded) == 1);
  PushRequest negative = Grad(1, 1, {2, 2, 2, 2});
  negative.set_session(-1);
  CHECK(absl::IsInvalidArgument(ps.Push(negative, &r)));
  // A restart's status read claims its session (before it pushes): an
  // older claim is refused like an older push.
  PsStatusResponse claimed;
  CHECK(absl::IsInvalidArgument(ps.GetStatus(7, 1, &claimed)));
  CHECK(absl::IsFailedPrecondition(ps.GetStatus(1, 0, &claimed)));
  REQUIRE(ps.GetStatus(1, 1, &claimed).ok());
  CHECK(claimed.version() == 1);
  CHECK(claimed.workers_size() == 2);
  // Worker 0 completes step 1 with worker 1's gradient counted once:
  // w = {0,1,2,3} after step 0 (mean 2, lr 0.5); step 1's mean is 1.5.
  REQUIRE(ps.Push(Grad(0, 1, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  CHECK(PullW(ps) == std::vector<float>{-0.75f, 0.25f, 1.25f, 2.25f});
  // After the step it opened, session 1's duplicates are duplicates again.
  PushRequest next = Grad(1, 2, {1, 1, 1, 1});
  next.set_session(1);
  next.set_cursor_epoch(3);
  next.set_cursor_position(64);
  REQUIRE(ps.Push(next, &r).ok());
  CHECK(absl::IsInvalidArgument(ps.Push(next, &r)));
  // GetStatus says where worker 1's data stood after the last step it
  // pushed to was completed (not before).
  PsStatusResponse status;
  ps.GetStatus(&status);
  REQUIRE(status.workers_size() == 2);
  CHECK(status.workers(1).cursor_epoch() == 0);
  REQUIRE(ps.Push(Grad(0, 2, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  status.Clear();
  ps.GetStatus(&status);
  CHECK(status.workers(1).has_cursor());
  CHECK(status.workers(1).cursor_epoch() == 3);
  CHECK(status.workers(1).cursor_position() == 64);
}

TEST_CASE("sync: a waiting pull wakes when the step completes", "[ps][sync]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(true), 2)).ok());
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  // Catch2 asserts from the test's thread only: the push's status is kept.
  absl::Status late_status;
  std::thread late([&ps, &late_status] {
    PushResponse r2;
    late_status = ps.Push(Grad(1, 0, {1, 1, 1, 1}), &r2);
  });
  PullRequest wait;
  wait.set_incarnation(kIncarnation);
  wait.set_worker(0);
  wait.set_min_version(1);
  wait.set_timeout_ms(10000);
  PullResponse pr;
  const absl::Status pulled = ps.Pull(wait, &pr);
  late.join();
  CHECK(late_status.ok());
  CHECK(pulled.ok());
  CHECK(pr.version() == 1);
}

TEST_CASE("sync: gradients are summed in worker-index order, whatever the arrival order",
          "[ps][sync]") {
  // In float32, (1e8 + -1e8) + 1 = 1 but (1 + 1e8) + -1e8 = 0.
  auto run = [](std::vector<int> order) {
    ParameterServer ps;
    REQUIRE(ps.Initialize(InitRequest(BaseConfig(true, 0, 0, 1.0f), 3, {0, 0, 0, 0})).ok());
    const float g[3] = {1e8f, -1e8f, 1.0f};
    for (int w : order) {
      PushResponse r;
      REQUIRE(ps.Push(Grad(w, 0, {g[w], g[w], g[w], g[w]}), &r).ok());
    }
    return PullW(ps);
  };
  std::vector<float> a = run({0, 1, 2});
  std::vector<float> b = run({2, 0, 1});
  std::vector<float> c = run({1, 2, 0});
  CHECK(std::memcmp(a.data(), b.data(), 16) == 0);
  CHECK(std::memcmp(a.data(), c.data(), 16) == 0);
  CHECK(a[0] == -1.0f / 3.0f);
}

TEST_CASE("sync: stale gradients are dropped and counted; backup workers", "[ps][sync]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(true, /*replicas=*/2), 3)).ok());
  PushResponse r;
  REQUIRE(ps.Push(Grad(2, 0, {1, 1, 1, 1}), &r).ok());
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);  // 2 of 3 suffice
  std::vector<float> after = PullW(ps);
  REQUIRE(ps.Push(Grad(1, 0, {100, 100, 100, 100}), &r).ok());  // the straggler
  CHECK(r.outcome() == DROPPED_STALE);
  CHECK(PullW(ps) == after);
  CHECK(ps.counters().gradients_dropped_stale == 1);
  CHECK(ps.counters().pushes_applied == 2);
}

TEST_CASE("async: each push is applied on arrival", "[ps][async]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(false), 2)).ok());
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {2, 2, 2, 2}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  REQUIRE(ps.Push(Grad(1, 0, {2, 2, 2, 2}), &r).ok());  // computed from version 0: still applied
  CHECK(r.version() == 2);
  CHECK(PullW(ps) == std::vector<float>{-1, 0, 1, 2});
}

TEST_CASE("async: a staleness bound holds back a worker that runs ahead", "[ps][async]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(false, 0, /*staleness=*/1), 2)).ok());
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {0, 0, 0, 0}), &r).ok());
  REQUIRE(ps.Push(Grad(0, 1, {0, 0, 0, 0}), &r).ok());
  PullRequest pull;
  pull.set_incarnation(kIncarnation);
  pull.set_worker(0);
  pull.set_timeout_ms(30);
  PullResponse pr;
  absl::Status st = ps.Pull(pull, &pr);
  CHECK(absl::IsDeadlineExceeded(st));  // 2 ahead of worker 1, bound 1
  REQUIRE(ps.Push(Grad(1, 0, {0, 0, 0, 0}), &r).ok());
  CHECK(ps.Pull(pull, &pr).ok());
}

TEST_CASE("async: a pull sent with a push is answered once that push is applied",
          "[ps][async]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(false), 2)).ok());
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {2, 2, 2, 2}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  CHECK(r.own_pushes() == 1);  // worker 0's pushes applied here
  REQUIRE(ps.Push(Grad(1, 1, {2, 2, 2, 2}), &r).ok());
  CHECK(r.own_pushes() == 1);  // worker 1's
  // Worker 0's next pull, asking for its second push: another worker's push
  // does not answer it, nor does the deadline pass unnoticed.
  PullRequest pull;
  pull.set_incarnation(kIncarnation);
  pull.set_worker(0);
  pull.set_min_own_pushes(2);
  pull.set_timeout_ms(30);
  PullResponse pr;
  const absl::Status late = ps.Pull(pull, &pr);
  CHECK(absl::IsDeadlineExceeded(late));
  CHECK(absl::StrContains(late.message(), "after its push 2 (1 applied)"));
  REQUIRE(ps.Push(Grad(1, 2, {2, 2, 2, 2}), &r).ok());
  CHECK(absl::IsDeadlineExceeded(ps.Pull(pull, &pr)));
  // Parked, it is answered by worker 0's own push, with that push in it.
  pull.set_timeout_ms(10000);
  absl::Status pulled;
  std::thread waiter([&ps, &pull, &pr, &pulled] { pulled = ps.Pull(pull, &pr); });
  absl::SleepFor(absl::Milliseconds(50));
  REQUIRE(ps.Push(Grad(0, 3, {2, 2, 2, 2}), &r).ok());
  waiter.join();
  CHECK(r.own_pushes() == 2);
  CHECK(pulled.ok());
  CHECK(pr.version() == 4);
  // Answered at once once applied; never more than the push in flight.
  CHECK(ps.Pull(pull, &pr).ok());
  pull.set_min_own_pushes(4);  // two pushes ahead of what worker 0 has sent
  CHECK(absl::IsInvalidArgument(ps.Pull(pull, &pr)));
  pull.set_min_own_pushes(-1);
  CHECK(absl::IsInvalidArgument(ps.Pull(pull, &pr)));
  pull.set_min_own_pushes(1);
  pull.set_worker(-1);  // the chief pushes nothing
  CHECK(absl::IsInvalidArgument(ps.Pull(pull, &pr)));
  // Sync servers count steps, not a worker's pushes.
  ParameterServer sync;
  REQUIRE(sync.Initialize(InitRequest(BaseConfig(true), 2)).ok());
  pull.set_worker(0);
  CHECK(absl::IsInvalidArgument(sync.Pull(pull, &pr)));
}

TEST_CASE("bad pushes are refused and leave the model bit-identical", "[ps][validation]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(true, 1), 2)).ok());
  const std::vector<float> before = PullW(ps);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  PushResponse r;

  CHECK(absl::IsInvalidArgument(ps.Push(Grad(0, 0, {1, 1, 1, 1}, "nope"), &r)));
  CHECK(absl::IsInvalidArgument(ps.Push(Grad(0, 0, {1, 1, 1}, "w", {3}), &r)));
  CHECK(absl::IsInvalidArgument(ps.Push(Grad(0, 0, {1, nan, 1, 1}), &r)));
  CHECK(absl::IsInvalidArgument(ps.Push(Grad(0, 0, {1, 1, inf, 1}), &r)));
  CHECK(absl::IsInvalidArgument(ps.Push(Grad(5, 0, {1, 1, 1, 1}), &r)));
  CHECK(absl::IsFailedPrecondition(ps.Push(Grad(0, 9, {1, 1, 1, 1}), &r)));  // future step
  CHECK(absl::IsInvalidArgument(ps.Push(Grad(0, -5, {1, 1, 1, 1}), &r)));    // no step is < 0
  PushRequest other_run = Grad(0, 0, {1, 1, 1, 1});
  other_run.set_incarnation(kIncarnation + 1);
  CHECK(absl::IsFailedPrecondition(ps.Push(other_run, &r)));
  PushRequest dup = Grad(0, 0, {1, 1, 1, 1});
  *dup.add_gradients() = dup.gradients(0);
  CHECK(absl::IsInvalidArgument(ps.Push(dup, &r)));
  PushRequest short_bytes = Grad(0, 0, {1, 1, 1, 1});
  short_bytes.mutable_gradients(0)->mutable_tensor()->mutable_content()->resize(7);
  CHECK(absl::IsInvalidArgument(ps.Push(short_bytes, &r)));

  const std::vector<float> after = PullW(ps);
  CHECK(std::memcmp(before.data(), after.data(), before.size() * 4) == 0);
  CHECK(ps.counters().pushes_rejected == 10);
  CHECK(ps.counters().pushes_applied == 0);
  // Each refusal is counted under its reason (pstrain_ps_pushes_rejected_total{reason}).
  auto rejected = [&ps](ParameterServer::Rejection r) {
    return ps.counters().rejected[static_cast<size_t>(r)];
  };
  CHECK(rejected(ParameterServer::Rejection::kShape) == 4);  // name, shape, duplicate, bytes
  CHECK(rejected(ParameterServer::Rejection::kNonFinite) == 2);
  CHECK(rejected(ParameterServer::Rejection::kWorker) == 1);
  CHECK(rejected(ParameterServer::Rejection::kAhead) == 1);
  CHECK(rejected(ParameterServer::Rejection::kIncarnation) == 1);
  CHECK(rejected(ParameterServer::Rejection::kMalformed) == 1);
  CHECK(rejected(ParameterServer::Rejection::kDuplicate) == 0);
  // And the server still works.
  CHECK(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);
}

TEST_CASE("initialized again (a rollback, or a new run): a task still on the replaced "
          "incarnation is told so, by name", "[ps][validation]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(true, 1), 2)).ok());
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  // A task of some other run, before any replacement: the old message.
  PushRequest stranger = Grad(0, 0, {1, 1, 1, 1});
  stranger.set_incarnation(kIncarnation + 7);
  absl::Status st = ps.Push(stranger, &r);
  CHECK(absl::IsFailedPrecondition(st));
  CHECK(absl::StrContains(st.message(), "(a task from an earlier run?)"));
  // Its chief initializes it again (as a rollback does, from a checkpoint).
  InitializeRequest again = InitRequest(BaseConfig(true, 1), 2, {5, 6, 7, 8});
  again.set_incarnation(kIncarnation + 1);
  REQUIRE(ps.Initialize(again).ok());
  // A worker still on the old incarnation learns what happened; nothing
  // changes.
  st = ps.Push(Grad(1, 0, {1, 1, 1, 1}), &r);
  INFO(st.message());
  CHECK(absl::IsFailedPrecondition(st));
  CHECK(absl::StrContains(st.message(),
                          absl::StrCat("request from cluster incarnation ", kIncarnation,
                                       ", whose state this server dropped 0 s ago when its "
                                       "chief initialized it again for incarnation ",
                                       kIncarnation + 1,
                                       " (a rollback, or a new run): register with the chief "
                                       "again")));
  PullRequest pull;
  pull.set_incarnation(kIncarnation + 1);
  pull.set_worker(-1);
  PullResponse pr;
  REQUIRE(ps.Pull(pull, &pr).ok());
  CHECK(pr.version() == 0);
  auto w = FromProto(pr.tensors(0).tensor());
  REQUIRE(w.ok());
  CHECK(w->values() == std::vector<float>{5, 6, 7, 8});
  // A task of a third incarnation still gets the general message.
  st = ps.Push(stranger, &r);
  CHECK(absl::StrContains(st.message(), "(a task from an earlier run?)"));
}

TEST_CASE("requests before Initialize are UNAVAILABLE; bad Initialize is refused", "[ps]") {
  ParameterServer ps;
  PushResponse r;
  CHECK(absl::IsUnavailable(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r)));
  InitializeRequest bad = InitRequest(BaseConfig(true, 3), 2);  // replicas > workers
  CHECK(absl::IsInvalidArgument(ps.Initialize(bad)));
  InitializeRequest nan_init = InitRequest(BaseConfig(true), 2, {1, std::nanf(""), 0, 0});
  CHECK(absl::IsInvalidArgument(ps.Initialize(nan_init)));
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(true), 2)).ok());
  CHECK(absl::IsAlreadyExists(ps.Initialize(InitRequest(BaseConfig(true), 2))));
}

TEST_CASE("max_steps: pushes after the last step change nothing", "[ps]") {
  TrainingConfig c = BaseConfig(false);
  c.set_max_steps(1);
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(c, 1)).ok());
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  std::vector<float> w = PullW(ps);
  REQUIRE(ps.Push(Grad(0, 1, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == FINISHED);
  CHECK(PullW(ps) == w);
}

TEST_CASE("no lost updates: 8 concurrent clients x 200 async pushes", "[ps][async][concurrency]") {
  ParameterServer ps;
  TrainingConfig config = BaseConfig(false, 0, 0, 1.0f);
  config.set_max_steps(1000000);
  REQUIRE(ps.Initialize(InitRequest(config, 8, {0, 0, 0, 0})).ok());
  std::vector<std::thread> clients;
  std::vector<absl::Status> failures(8);  // asserted on the test's thread
  for (int w = 0; w < 8; ++w) {
    clients.emplace_back([&ps, &failures, w] {
      for (int i = 0; i < 200 && failures[w].ok(); ++i) {
        PushResponse r;
        failures[w] = ps.Push(Grad(w, 0, {1, 2, -1, 0.5f}), &r);
      }
    });
  }
  for (auto& t : clients) t.join();
  for (const absl::Status& st : failures) CHECK(st.ok());
  int64_t version;
  CHECK(PullW(ps, &version) == std::vector<float>{-1600, -3200, 1600, -800});
  CHECK(version == 1600);
}

// The push as a frame would carry it: the header without contents, the
// payload cut into pieces of 1..13 bytes at a 3-byte offset, so floats start
// at every alignment and straddle pieces.
struct Framed {
  PushRequest header;
  std::string bytes;
  SegmentedBytes payload;
};
Framed Frame(const PushRequest& request, uint32_t seed) {
  Framed f;
  f.header = request;
  f.bytes = "xyz";
  for (NamedTensor& nt : *f.header.mutable_gradients()) {
    f.bytes += nt.tensor().content();
    nt.mutable_tensor()->clear_content();
  }
  size_t at = 3;
  while (at < f.bytes.size()) {
    const size_t n = std::min<size_t>(1 + (seed = seed * 1103515245u + 12345u) % 13,
                                      f.bytes.size() - at);
    f.payload.Append(absl::string_view(f.bytes).substr(at, n));
    at += n;
  }
  return f;
}

TEST_CASE("frames: pushes read in place from scattered pieces give the same bits", "[ps][frame]") {
  for (bool sync : {true, false}) {
    ParameterServer a, b;
    std::vector<float> init(64 * 3), g0(64 * 3), g1(64 * 3);
    for (size_t i = 0; i < init.size(); ++i) {
      init[i] = 0.01f * static_cast<float>(i);
      g0[i] = std::sin(static_cast<float>(i));
      g1[i] = std::cos(static_cast<float>(i)) * 3.0f;
    }
    for (ParameterServer* ps : {&a, &b}) {
      InitializeRequest req = InitRequest(BaseConfig(sync), 2);
      req.mutable_variables(0)->clear_tensor();
      ToProto({64, 3}, init, req.mutable_variables(0)->mutable_tensor());
      REQUIRE(ps->Initialize(req).ok());
    }
    for (int step = 0; step < 3; ++step) {
      for (int w : {1, 0}) {
        PushRequest req = Grad(w, sync ? step : 0, w ? g1 : g0, "w", {64, 3});
        PushResponse ra, rb;
        REQUIRE(a.Push(req, &ra).ok());
        Framed f = Frame(req, 17u * step + w);
        REQUIRE(f.payload.num_segments() > 50);
        REQUIRE(b.Push(f.header, f.payload, &rb).ok());
        CHECK(ra.outcome() == rb.outcome());
      }
    }
    std::vector<float> wa = PullW(a), wb = PullW(b);
    CHECK(std::memcmp(wa.data(), wb.data(), wa.size() * 4) == 0);
    CHECK(wa != init);
  }
}

TEST_CASE("frames: a payload that disagrees with its header is refused", "[ps][frame]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(false), 2)).ok());
  const std::vector<float> before = PullW(ps);
  PushResponse r;
  Framed f = Frame(Grad(0, 0, {1, 1, 1, 1}), 1);
  std::string shorter = f.bytes.substr(3, 15), longer = f.bytes.substr(3) + "abcd";
  CHECK(absl::IsInvalidArgument(ps.Push(f.header, SegmentedBytes(shorter), &r)));
  CHECK(absl::IsInvalidArgument(ps.Push(f.header, SegmentedBytes(longer), &r)));
  PushRequest with_content = Grad(0, 0, {1, 1, 1, 1});  // contents belong in the payload
  CHECK(absl::IsInvalidArgument(ps.Push(with_content, f.payload, &r)));
  std::vector<float> nan_grad = {1, 1, 1, std::nanf("")};
  Framed bad = Frame(Grad(0, 0, nan_grad), 2);
  CHECK(absl::IsInvalidArgument(ps.Push(bad.header, bad.payload, &r)));
  const std::vector<float> after = PullW(ps);
  CHECK(std::memcmp(before.data(), after.data(), 16) == 0);
  CHECK(ps.counters().pushes_rejected == 4);
  REQUIRE(ps.Push(f.header, f.payload, &r).ok());
  CHECK(r.outcome() == APPLIED);
}

// Two workers, SGD at rate 1, two partitions: w [2, 2] and b [2], zeros.
InitializeRequest TwoPartitionInit(bool sync) {
  InitializeRequest req = InitRequest(BaseConfig(sync, 0, 0, 1.0f), 2, {0, 0, 0, 0});
  NamedTensor* v = req.add_variables();
  v->mutable_ref()->set_variable("b");
  ToProto({2}, {0, 0}, v->mutable_tensor());
  return req;
}

TEST_CASE("sync: the gradient that completes a quorum is applied from the received bytes, "
          "unstaged; a NaN one is refused and changes nothing", "[ps][sync][frame]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (bool framed : {false, true}) {
    INFO("framed " << framed);
    ParameterServer ps;
    std::vector<float> init(64 * 3, 1.0f), g0(64 * 3), g1(64 * 3), bad(64 * 3, 0.5f);
    for (size_t i = 0; i < init.size(); ++i) {
      g0[i] = std::sin(static_cast<float>(i));
      g1[i] = std::cos(static_cast<float>(i)) * 3.0f;
    }
    bad[100] = nan;
    InitializeRequest init_req = InitRequest(BaseConfig(true, 0, 0, 0.5f), 2);
    init_req.mutable_variables(0)->clear_tensor();
    ToProto({64, 3}, init, init_req.mutable_variables(0)->mutable_tensor());
    REQUIRE(ps.Initialize(init_req).ok());
    auto push = [&](int w, const std::vector<float>& g, PushResponse* r) {
      PushRequest req = Grad(w, 0, g, "w", {64, 3});
      if (!framed) return ps.Push(req, r);
      Framed f = Frame(req, 5u + w);
      return ps.Push(f.header, f.payload, r);
    };
    PushResponse r;
    REQUIRE(push(1, g1, &r).ok());  // staged
    CHECK(r.outcome() == ACCUMULATED);
    CHECK(ps.counters().push_staged_bytes == 64 * 3 * 4);
    CHECK(absl::IsInvalidArgument(push(0, bad, &r)));  // would complete it: refused
    CHECK(PullW(ps) == init);
    REQUIRE(push(0, g0, &r).ok());  // completes it, read in place
    CHECK(r.outcome() == APPLIED);
    CHECK(ps.counters().push_staged_bytes == 64 * 3 * 4);
    CHECK(ps.counters().push_copied_bytes == 2 * 64 * 3 * 4);
    const std::vector<float> got = PullW(ps);
    for (size_t i = 0; i < init.size(); ++i) {
      const float mean = (g0[i] + g1[i]) / 2.0f;  // worker-index order
      REQUIRE(got[i] == init[i] - 0.5f * mean);
    }
  }
}

TEST_CASE("sync per partition: a step split over several pushes per worker, in any order",
          "[ps][sync]") {
  // Two partitions; each worker sends them as separate pushes. The step
  // completes, and the version moves, only once both partitions have both
  // workers' gradients; the result equals one push per worker.
  auto init = [] { return TwoPartitionInit(true); };
  auto both = [](int w, std::vector<float> gw, std::vector<float> gb) {
    PushRequest req = Grad(w, 0, gw);
    NamedTensor* nt = req.add_gradients();
    nt->mutable_ref()->set_variable("b");
    ToProto({2}, gb, nt->mutable_tensor());
    return req;
  };
  auto only_b = [&both](int w, std::vector<float> gb) {
    PushRequest req = both(w, {}, gb);
    req.mutable_gradients()->DeleteSubrange(0, 1);
    return req;
  };
  ParameterServer whole, split;
  REQUIRE(whole.Initialize(init()).ok());
  REQUIRE(split.Initialize(init()).ok());
  PushResponse r;
  REQUIRE(whole.Push(both(0, {1, 2, 3, 4}, {5, 6}), &r).ok());
  REQUIRE(whole.Push(both(1, {3, 2, 1, 0}, {7, 8}), &r).ok());
  CHECK(r.outcome() == APPLIED);

  REQUIRE(split.Push(only_b(1, {7, 8}), &r).ok());
  CHECK(r.outcome() == ACCUMULATED);
  REQUIRE(split.Push(Grad(0, 0, {1, 2, 3, 4}), &r).ok());
  CHECK(r.outcome() == ACCUMULATED);
  REQUIRE(split.Push(only_b(0, {5, 6}), &r).ok());  // b is complete, w is not
  CHECK(r.outcome() == ACCUMULATED);
  CHECK(r.version() == 0);
  CHECK(absl::IsInvalidArgument(split.Push(only_b(0, {5, 6}), &r)));  // b twice from worker 0
  REQUIRE(split.Push(Grad(1, 0, {3, 2, 1, 0}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  CHECK(r.version() == 1);
  auto all = [](ParameterServer& ps) {
    PullRequest req;
    req.set_incarnation(kIncarnation);
    req.set_worker(-1);
    PullResponse resp;
    REQUIRE(ps.Pull(req, &resp).ok());
    std::vector<std::vector<float>> out;
    for (const NamedTensor& nt : resp.tensors()) out.push_back(FromProto(nt.tensor())->values());
    return out;
  };
  CHECK(all(split) == all(whole));
  CHECK(all(split) == std::vector<std::vector<float>>{{-6, -7}, {-2, -2, -2, -2}});  // b, w
}

TEST_CASE("async: a push in parts is applied part by part as they arrive, and counted as one "
          "update by the part that completes it", "[ps][async]") {
  // Two partitions (w and b), SGD at rate 1; worker 0 sends each push as
  // two parts.
  auto init = [] { return TwoPartitionInit(false); };
  auto part = [](int w, int64_t step, int k, int n, const std::string& var,
                 std::vector<float> g) {
    PushRequest req = Grad(w, step, std::move(g), var,
                           var == "w" ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{2});
    req.set_part(k);
    req.set_num_parts(n);
    return req;
  };
  auto values = [](ParameterServer& ps, int64_t* version) {
    PullRequest req;
    req.set_incarnation(kIncarnation);
    req.set_worker(-1);
    PullResponse resp;
    REQUIRE(ps.Pull(req, &resp).ok());
    *version = resp.version();
    std::vector<std::vector<float>> out;
    for (const NamedTensor& nt : resp.tensors()) out.push_back(FromProto(nt.tensor())->values());
    return out;  // b, w
  };
  ParameterServer ps;
  REQUIRE(ps.Initialize(init()).ok());
  PushResponse r;
  int64_t version = -1;
  // The second part first: applied to its partition, answered HELD, the
  // version unmoved (the push is not complete).
  REQUIRE(ps.Push(part(0, 0, 1, 2, "b", {5, 6}), &r).ok());
  CHECK(r.outcome() == HELD);
  CHECK(values(ps, &version) == std::vector<std::vector<float>>{{-5, -6}, {0, 0, 0, 0}});
  CHECK(version == 0);
  // A part sent twice, or a partition in two parts, is refused.
  CHECK(absl::IsInvalidArgument(ps.Push(part(0, 0, 1, 2, "w", {1, 1, 1, 1}), &r)));
  CHECK(absl::IsInvalidArgument(ps.Push(part(0, 0, 0, 2, "b", {5, 6}), &r)));
  // Another worker's whole push goes through meanwhile.
  REQUIRE(ps.Push(Grad(1, 0, {10, 10, 10, 10}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  // The last part completes the push: one update, however many parts.
  REQUIRE(ps.Push(part(0, 0, 0, 2, "w", {1, 2, 3, 4}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  CHECK(r.version() == 2);
  CHECK(r.own_pushes() == 1);
  CHECK(values(ps, &version) ==
        std::vector<std::vector<float>>{{-5, -6}, {-11, -12, -13, -14}});
  PsStatusResponse st;
  ps.GetStatus(&st);
  CHECK(st.pushes_applied() == 2);
  // A part of the complete push sent again is refused, changing nothing.
  CHECK(absl::IsInvalidArgument(ps.Push(part(0, 0, 0, 2, "w", {1, 2, 3, 4}), &r)));
  // A push whose parts never all came is dropped by the worker's next one;
  // its part that came stays applied (each partition's update is whole),
  // and it is never counted.
  REQUIRE(ps.Push(part(0, 1, 0, 2, "w", {100, 100, 100, 100}), &r).ok());
  CHECK(r.outcome() == HELD);
  REQUIRE(ps.Push(part(0, 2, 1, 2, "b", {1, 1}), &r).ok());  // step 2: another push
  CHECK(r.outcome() == HELD);
  // A late part of the dropped push is refused and drops nothing.
  CHECK(absl::IsFailedPrecondition(ps.Push(part(0, 1, 1, 2, "b", {9, 9}), &r)));
  REQUIRE(ps.Push(part(0, 2, 0, 2, "w", {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  CHECK(values(ps, &version) ==
        std::vector<std::vector<float>>{{-6, -7}, {-112, -113, -114, -115}});
  CHECK(version == 3);
  // A part with a NaN is refused, changing nothing, and drops its push: its
  // parts still to come are refused, and the push is never counted.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  REQUIRE(ps.Push(part(1, 2, 1, 2, "b", {1, 1}), &r).ok());
  CHECK(r.outcome() == HELD);
  CHECK(absl::IsInvalidArgument(ps.Push(part(1, 2, 0, 2, "w", {1, nan, 1, 1}), &r)));
  CHECK_FALSE(ps.Push(part(1, 2, 0, 2, "w", {1, 1, 1, 1}), &r).ok());  // sent again
  CHECK(values(ps, &version) ==
        std::vector<std::vector<float>>{{-7, -8}, {-112, -113, -114, -115}});
  CHECK(version == 3);
  REQUIRE(ps.Push(part(1, 3, 0, 2, "w", {1, 1, 1, 1}), &r).ok());  // its next push goes on
  REQUIRE(ps.Push(part(1, 3, 1, 2, "b", {1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  CHECK(values(ps, &version) ==
        std::vector<std::vector<float>>{{-8, -9}, {-113, -114, -115, -116}});
  CHECK(version == 4);
  // Part numbers outside the push, more parts than partitions, and an empty
  // part are malformed; none changes anything.
  CHECK(absl::IsInvalidArgument(ps.Push(part(0, 5, 2, 2, "w", {1, 1, 1, 1}), &r)));
  CHECK(absl::IsInvalidArgument(ps.Push(part(0, 5, 0, 3, "w", {1, 1, 1, 1}), &r)));
  CHECK(absl::IsInvalidArgument(ps.Push(part(0, 5, -1, 2, "w", {1, 1, 1, 1}), &r)));
  PushRequest empty = part(0, 5, 0, 2, "w", {1, 1, 1, 1});
  empty.clear_gradients();
  CHECK(absl::IsInvalidArgument(ps.Push(empty, &r)));
  CHECK(values(ps, &version) ==
        std::vector<std::vector<float>>{{-8, -9}, {-113, -114, -115, -116}});
  CHECK(version == 4);
}

TEST_CASE("async: two pushes in parts for the same step are told apart by their push_seq",
          "[ps][async]") {
  // rpc.async_prefetch: a worker may compute two steps from one version, so
  // two of its pushes carry the same step. Each is its own update, and a
  // late part of the first is refused once the second has begun.
  ParameterServer ps;
  REQUIRE(ps.Initialize(TwoPartitionInit(false)).ok());
  auto part = [](uint64_t seq, int k, const std::string& var, std::vector<float> g) {
    PushRequest req = Grad(0, 0, std::move(g), var,
                           var == "w" ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{2});
    req.set_part(k);
    req.set_num_parts(2);
    req.set_push_seq(seq);
    return req;
  };
  PushResponse r;
  REQUIRE(ps.Push(part(1, 0, "w", {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == HELD);
  REQUIRE(ps.Push(part(1, 1, "b", {1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  CHECK(r.version() == 1);
  // The next push, from the same version: not "part 0 sent twice".
  REQUIRE(ps.Push(part(2, 0, "w", {2, 2, 2, 2}), &r).ok());
  CHECK(r.outcome() == HELD);
  // A part of push 1 sent again now is refused and drops nothing.
  CHECK(absl::IsFailedPrecondition(ps.Push(part(1, 1, "b", {9, 9}), &r)));
  REQUIRE(ps.Push(part(2, 1, "b", {2, 2}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  CHECK(r.version() == 2);
  CHECK(r.own_pushes() == 2);
  PsStatusResponse st;
  ps.GetStatus(&st);
  CHECK(st.pushes_applied() == 2);
  // The second was computed from version 0 with version 1 in: 1 stale.
  CHECK(st.staleness_count() == 2);
  CHECK(st.staleness_sum() == 1.0);
  // And its parts, sent again, are refused.
  CHECK(absl::IsInvalidArgument(ps.Push(part(2, 0, "w", {2, 2, 2, 2}), &r)));
  int64_t version = -1;
  PullW(ps, &version);
  CHECK(version == 2);
}

TEST_CASE("async: a push whose parts stop coming is dropped at the worker's push deadline",
          "[ps][async]") {
  // The deadline: rpc.step_timeout_ms + rpc.rpc_timeout_ms, 150 ms here.
  InitializeRequest init = TwoPartitionInit(false);
  init.mutable_config()->mutable_rpc()->set_step_timeout_ms(100);
  init.mutable_config()->mutable_rpc()->set_rpc_timeout_ms(50);
  ParameterServer ps;
  REQUIRE(ps.Initialize(init).ok());
  auto part = [](int w, int64_t step, int k, const std::string& var, std::vector<float> g) {
    PushRequest req = Grad(w, step, std::move(g), var,
                           var == "w" ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{2});
    req.set_part(k);
    req.set_num_parts(2);
    return req;
  };
  PushResponse r;
  // Held within the deadline: the push completes as usual.
  REQUIRE(ps.Push(part(0, 0, 0, "w", {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == HELD);
  REQUIRE(ps.Push(part(0, 0, 1, "b", {1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  // Worker 0 dies with one part in (applied): at the next part the server
  // takes after the deadline (here another worker's), its push is dropped,
  // never counted; a checkpoint's cut no longer waits for it.
  REQUIRE(ps.Push(part(0, 1, 0, "w", {100, 100, 100, 100}), &r).ok());
  CHECK(r.outcome() == HELD);
  absl::SleepFor(absl::Milliseconds(400));
  REQUIRE(ps.Push(part(1, 0, 0, "w", {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == HELD);
  PsStatusResponse st;
  ps.GetStatus(&st);
  CHECK(st.held_pushes_expired() == 1);
  // A part of the dropped push arriving after all is refused.
  CHECK(absl::IsFailedPrecondition(ps.Push(part(0, 1, 1, "b", {100, 100}), &r)));
  ps.GetStatus(&st);
  CHECK(st.pushes_applied() == 1);
  CHECK(st.version() == 1);
  // Worker 1's push, within its deadline, completes.
  REQUIRE(ps.Push(part(1, 0, 1, "b", {1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  ps.GetStatus(&st);
  CHECK(st.version() == 2);
  CHECK(st.held_pushes_expired() == 1);
}

TEST_CASE("sync: a server holding no partition completes each step on the quorum",
          "[ps][sync]") {
  ParameterServer ps;
  InitializeRequest req = InitRequest(BaseConfig(true), 2);
  req.clear_variables();
  REQUIRE(ps.Initialize(req).ok());
  PushRequest empty = EmptyPush(0, 0);
  PushResponse r;
  REQUIRE(ps.Push(empty, &r).ok());
  CHECK(r.outcome() == ACCUMULATED);
  CHECK(absl::IsInvalidArgument(ps.Push(empty, &r)));
  empty.set_worker(1);
  REQUIRE(ps.Push(empty, &r).ok());
  CHECK(r.outcome() == APPLIED);
  CHECK(r.version() == 1);
}

TEST_CASE("Initialize in parts installs the model when the last part is in", "[ps]") {
  ParameterServer ps;
  InitializeRequest whole = InitRequest(BaseConfig(true), 1);
  NamedTensor* b = whole.add_variables();
  b->mutable_ref()->set_variable("b");
  ToProto({2}, {7, 8}, b->mutable_tensor());
  InitializeRequest part0 = whole, part1 = whole;
  part0.mutable_variables()->DeleteSubrange(1, 1);  // w
  part1.mutable_variables()->DeleteSubrange(0, 1);  // b
  part0.set_num_parts(2);
  part1.set_num_parts(2);
  part1.set_part(1);
  REQUIRE(ps.Initialize(part1).ok());
  PushResponse r;
  CHECK(absl::IsUnavailable(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r)));  // not installed yet
  REQUIRE(ps.Initialize(part1).ok());  // a retried part is harmless
  InitializeRequest clash = part0;
  clash.set_part(0);
  *clash.add_variables() = part1.variables(0);  // b again, in another part
  CHECK(absl::IsInvalidArgument(ps.Initialize(clash)));
  InitializeRequest bad_part = part0;
  bad_part.set_part(2);
  CHECK(absl::IsInvalidArgument(ps.Initialize(bad_part)));
  REQUIRE(ps.Initialize(part0).ok());
  CHECK(absl::IsAlreadyExists(ps.Initialize(part0)));
  CHECK(PullW(ps) == std::vector<float>{7, 8});  // b sorts first
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == ACCUMULATED);  // w applied; b still open (no gradient for it)
}

TEST_CASE("bfloat16: rounding to nearest even, saturation, NaN and Inf", "[bfloat16]") {
  CHECK(FloatToBfloat16(1.0f) == 0x3f80);
  CHECK(Bfloat16ToFloat(0x3f80) == 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to even (1).
  CHECK(FloatToBfloat16(1.0f + 1.0f / 256) == 0x3f80);
  CHECK(FloatToBfloat16(1.0f + 3.0f / 256) == 0x3f82);
  CHECK(FloatToBfloat16(-2.5f) == 0xc020);
  CHECK(FloatToBfloat16(std::numeric_limits<float>::max()) == 0x7f7f);  // saturates, stays finite
  CHECK(FloatToBfloat16(-std::numeric_limits<float>::max()) == 0xff7f);
  CHECK(FloatToBfloat16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(std::isnan(Bfloat16ToFloat(FloatToBfloat16(std::nanf("")))));
  const uint16_t values[3] = {0x3f80, 0x7f80, 0x0000};
  CHECK_FALSE(AllFiniteBfloat16(reinterpret_cast<const char*>(values), 3));
  CHECK(AllFiniteBfloat16(reinterpret_cast<const char*>(values), 1));
}

TEST_CASE("a bfloat16 push applies its rounded values; a NaN one is refused", "[ps][bfloat16]") {
  for (bool sync : {true, false}) {
    ParameterServer ps;
    REQUIRE(ps.Initialize(InitRequest(BaseConfig(sync, 1, 0, 1.0f), 1, {0, 0, 0, 0})).ok());
    const std::vector<float> g = {1.0f + 1.0f / 256, 0.3f, -7.0f, 1e-3f};
    PushRequest req = Grad(0, 0, {});
    TensorProto* t = req.mutable_gradients(0)->mutable_tensor();
    t->set_dtype(DT_BFLOAT16);
    t->clear_content();
    for (float v : g) {
      const uint16_t b = FloatToBfloat16(v);
      t->mutable_content()->append(reinterpret_cast<const char*>(&b), 2);
    }
    t->clear_shape();
    t->add_shape(2);
    t->add_shape(2);
    Framed f = Frame(req, 5);
    PushResponse r;
    REQUIRE(ps.Push(f.header, f.payload, &r).ok());
    std::vector<float> w = PullW(ps);
    for (size_t i = 0; i < g.size(); ++i) CHECK(w[i] == -Bfloat16ToFloat(FloatToBfloat16(g[i])));
    const uint16_t nan = 0x7fc0;
    t->mutable_content()->replace(2, 2, reinterpret_cast<const char*>(&nan), 2);
    req.set_step(sync ? 1 : 0);
    CHECK(absl::IsInvalidArgument(ps.Push(req, &r)));
    CHECK(PullW(ps) == w);
  }
}

TEST_CASE("a pull's buffers never change under it; spare buffers are reused", "[ps][snapshot]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(false, 0, 0, 1.0f), 1, {0, 0, 0, 0})).ok());
  PullRequest req;
  req.set_incarnation(kIncarnation);
  req.set_worker(-1);
  ParameterServer::PullReply held;
  ps.StartPull(req, [&held](absl::Status st, ParameterServer::PullReply r) {
    REQUIRE(st.ok());
    held = std::move(r);
  });
  REQUIRE(held.tensors.size() == 1);
  const float* first = held.tensors[0].values->data();
  PushResponse r;
  for (int i = 0; i < 5; ++i) REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  // The held reply still reads version 0; the server moved on beside it.
  CHECK(*held.tensors[0].values == std::vector<float>{0, 0, 0, 0});
  CHECK(PullW(ps) == std::vector<float>{-5, -5, -5, -5});
  // Released, its buffer goes back into rotation: no buffer is allocated
  // per update, two alternate.
  held = ParameterServer::PullReply();
  std::set<const float*> seen;
  for (int i = 0; i < 6; ++i) {
    REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
    ps.StartPull(req, [&seen](absl::Status st, ParameterServer::PullReply r) {
      REQUIRE(st.ok());
      seen.insert(r.tensors[0].values->data());
    });
  }
  CHECK(seen.size() <= 3);
  CHECK(first != nullptr);
}

TEST_CASE("bfloat16 pulls never get the rounding of a recycled buffer's earlier contents",
          "[ps][bfloat16]") {
  // Async, two workers' worth of pushes between this caller's pulls: the
  // buffer pulled at version 0 is current again at version 2, rewritten.
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(false, 0, 0, 1.0f), 2, {0, 0, 0, 0})).ok());
  PullRequest req;
  req.set_incarnation(kIncarnation);
  req.set_worker(-1);
  req.set_wire_dtype(DT_BFLOAT16);
  auto pull_bf16 = [&ps, &req]() {
    std::vector<float> out;
    ps.StartPull(req, [&out](absl::Status st, ParameterServer::PullReply r) {
      REQUIRE(st.ok());
      REQUIRE(r.tensors.size() == 1);
      REQUIRE(r.tensors[0].bfloat16 != nullptr);
      for (uint16_t b : *r.tensors[0].bfloat16) out.push_back(Bfloat16ToFloat(b));
    });
    return out;
  };
  CHECK(pull_bf16() == std::vector<float>{0, 0, 0, 0});
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  REQUIRE(ps.Push(Grad(1, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(PullW(ps) == std::vector<float>{-2, -2, -2, -2});
  CHECK(pull_bf16() == std::vector<float>{-2, -2, -2, -2});
  for (int i = 0; i < 3; ++i) REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(pull_bf16() == std::vector<float>{-5, -5, -5, -5});
}

TEST_CASE("sync: a pull of the next version gets its partitions as soon as they are applied",
          "[ps][sync][pull]") {
  // Two partitions ("w" and "v"), one worker: "w"'s gradient closes "w"
  // while "v" still waits for its own.
  auto init = [](int64_t max_steps) {
    TrainingConfig config = BaseConfig(true, 1, 0, 1.0f);
    config.set_max_steps(max_steps);
    InitializeRequest req = InitRequest(config, 1, {0, 0, 0, 0});
    NamedTensor* v = req.add_variables();
    v->mutable_ref()->set_variable("v");
    ToProto({2}, std::vector<float>{10, 10}, v->mutable_tensor());
    return req;
  };
  auto pull = [](const std::string& variable, int64_t min_version) {
    PullRequest req;
    req.set_incarnation(kIncarnation);
    req.set_worker(0);
    req.set_min_version(min_version);
    req.set_timeout_ms(60000);
    if (!variable.empty()) req.add_refs()->set_variable(variable);
    return req;
  };
  struct Got {
    bool done = false;
    absl::Status status;
    ParameterServer::PullReply reply;
  };
  auto start = [](ParameterServer& ps, const PullRequest& req, Got* got) {
    ps.StartPull(req, [got](absl::Status st, ParameterServer::PullReply r) {
      got->done = true;
      got->status = std::move(st);
      got->reply = std::move(r);
    });
  };
  ParameterServer ps;
  REQUIRE(ps.Initialize(init(1000)).ok());
  Got w_next, v_next, all_next, w_now;
  start(ps, pull("w", 1), &w_next);  // parked before the gradient comes
  start(ps, pull("v", 1), &v_next);
  start(ps, pull("", 1), &all_next);
  CHECK(!w_next.done);
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}, "w"), &r).ok());
  CHECK(r.outcome() == ACCUMULATED);  // the step waits for "v"
  // "w" is final for version 1: its parked pull is answered now.
  REQUIRE(w_next.done);
  REQUIRE(w_next.status.ok());
  CHECK(w_next.reply.version == 1);
  CHECK(!w_next.reply.finished);
  REQUIRE(w_next.reply.tensors.size() == 1);
  CHECK(*w_next.reply.tensors[0].values == std::vector<float>{-1, -1, -1, -1});
  CHECK(!v_next.done);
  CHECK(!all_next.done);  // names "v" too
  // A pull arriving now gets it at once; one of the current version still
  // reads version 0.
  Got w_again;
  start(ps, pull("w", 1), &w_again);
  CHECK(w_again.done);
  CHECK(w_again.reply.version == 1);
  start(ps, pull("w", 0), &w_now);
  REQUIRE(w_now.done);
  CHECK(w_now.reply.version == 0);
  CHECK(*w_now.reply.tensors[0].values == std::vector<float>{0, 0, 0, 0});
  REQUIRE(ps.Push(Grad(0, 0, {1, 1}, "v", {2}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  REQUIRE(v_next.done);
  CHECK(v_next.reply.version == 1);
  CHECK(*v_next.reply.tensors[0].values == std::vector<float>{9, 9});
  REQUIRE(all_next.done);
  CHECK(all_next.reply.tensors.size() == 2);
  // The buffer served early is the one published.
  Got w_after;
  start(ps, pull("w", 1), &w_after);
  REQUIRE(w_after.done);
  CHECK(w_after.reply.tensors[0].values == w_next.reply.tensors[0].values);

  // The run's last step is never served early: its pulls say it finished.
  ParameterServer last;
  REQUIRE(last.Initialize(init(1)).ok());
  Got w_last;
  start(last, pull("w", 1), &w_last);
  REQUIRE(last.Push(Grad(0, 0, {1, 1, 1, 1}, "w"), &r).ok());
  CHECK(!w_last.done);
  REQUIRE(last.Push(Grad(0, 0, {1, 1}, "v", {2}), &r).ok());
  REQUIRE(w_last.done);
  CHECK(w_last.reply.finished);
  CHECK(w_last.reply.version == 1);
}

TEST_CASE("a parked pull ends at once on cancel, at its deadline, or on shutdown", "[ps][pull]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(true), 2)).ok());
  PullRequest req;
  req.set_incarnation(kIncarnation);
  req.set_worker(0);
  req.set_min_version(5);
  req.set_timeout_ms(60000);
  absl::Status got = absl::UnknownError("not yet");
  const uint64_t id = ps.StartPull(req, [&got](absl::Status st, ParameterServer::PullReply) {
    got = st;
  });
  REQUIRE(id != 0);
  CHECK(got.code() == absl::StatusCode::kUnknown);  // parked
  ps.CancelPull(id);
  CHECK(absl::IsCancelled(got));
  ps.CancelPull(id);  // a second cancel is a no-op

  absl::Notification timed_out;
  req.set_timeout_ms(20);
  ps.StartPull(req, [&](absl::Status st, ParameterServer::PullReply) {
    CHECK(absl::IsDeadlineExceeded(st));
    timed_out.Notify();
  });
  CHECK(timed_out.WaitForNotificationWithTimeout(absl::Seconds(10)));

  req.set_timeout_ms(60000);
  ps.StartPull(req, [&got](absl::Status st, ParameterServer::PullReply) { got = st; });
  ps.Shutdown();
  CHECK(absl::IsUnavailable(got));
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// Pulls "w" as worker 0, waiting for `min_version` up to `timeout_ms`.
absl::Status PullAt(ParameterServer& ps, int64_t min_version, int64_t timeout_ms,
                    std::vector<float>* w = nullptr) {
  PullRequest req;
  req.set_incarnation(kIncarnation);
  req.set_worker(0);
  req.set_min_version(min_version);
  req.set_timeout_ms(timeout_ms);
  PullResponse resp;
  absl::Status st = ps.Pull(req, &resp);
  if (st.ok() && w != nullptr) *w = FromProto(resp.tensors(0).tensor())->values();
  return st;
}

TEST_CASE("sync deadline: with min_replicas a step goes on short at its deadline",
          "[ps][sync][deadline]") {
  // 3 workers, a quorum of all 3, at least 2 after 150 ms.
  TrainingConfig config = BaseConfig(true, 0, 0, 1.0f);
  config.mutable_sync()->set_step_deadline_ms(150);
  config.mutable_sync()->set_min_replicas(2);
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(config, 3, {0, 0, 0, 0})).ok());
  PushResponse r;
  const absl::Time start = absl::Now();
  REQUIRE(ps.Push(Grad(0, 0, {1, 2, 3, 4}), &r).ok());
  REQUIRE(ps.Push(Grad(2, 0, {3, 2, 1, 0}), &r).ok());
  CHECK(r.outcome() == ACCUMULATED);
  std::vector<float> w;
  REQUIRE(PullAt(ps, 1, 10000, &w).ok());
  const absl::Duration waited = absl::Now() - start;
  CHECK(waited >= absl::Milliseconds(140));
  CHECK(waited < absl::Seconds(5));
  CHECK(w == std::vector<float>{-2, -2, -2, -2});  // the mean of the two that came
  // The straggler's gradient for the passed step is dropped, not applied.
  REQUIRE(ps.Push(Grad(1, 0, {100, 100, 100, 100}), &r).ok());
  CHECK(r.outcome() == DROPPED_STALE);
  // The next step's clock starts with its own first gradient: a full quorum
  // completes it at once.
  for (int wk : {0, 1, 2}) REQUIRE(ps.Push(Grad(wk, 1, {3, 3, 3, 3}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  REQUIRE(PullAt(ps, 2, 1000, &w).ok());
  CHECK(w == std::vector<float>{-5, -5, -5, -5});
  auto c = ps.counters();
  CHECK(c.pushes_applied == 2 + 3);
}

TEST_CASE("sync deadline: without enough gradients the step fails, naming the missing workers",
          "[ps][sync][deadline]") {
  for (int min_replicas : {0, 2}) {  // 0: the full quorum of 2
    INFO("min_replicas " << min_replicas);
    TrainingConfig config = BaseConfig(true, 0, 0, 1.0f);
    config.mutable_sync()->set_step_deadline_ms(100);
    config.mutable_sync()->set_min_replicas(min_replicas);
    ParameterServer ps;
    REQUIRE(ps.Initialize(InitRequest(config, 2, {0, 0, 0, 0})).ok());
    PushResponse r;
    REQUIRE(ps.Push(Grad(0, 0, {1, 2, 3, 4}), &r).ok());
    const absl::Time start = absl::Now();
    absl::Status st = PullAt(ps, 1, 20000);
    CHECK(absl::Now() - start < absl::Seconds(5));  // at the deadline, not the pull's timeout
    CHECK(absl::IsDeadlineExceeded(st));
    CHECK(st.message().find("sync step 0 failed") != std::string::npos);
    CHECK(st.message().find("1 of the 2 gradients") != std::string::npos);
    CHECK(st.message().find("waiting on worker(s) 1") != std::string::npos);
    // The model is unchanged and readable at its version; the run is over:
    // later pushes and pulls of the failed step get the same error.
    std::vector<float> w;
    REQUIRE(PullAt(ps, 0, 100, &w).ok());
    CHECK(w == std::vector<float>{0, 0, 0, 0});
    CHECK(absl::IsDeadlineExceeded(ps.Push(Grad(1, 0, {1, 1, 1, 1}), &r)));
    CHECK(absl::IsDeadlineExceeded(PullAt(ps, 1, 100)));
  }
}

TEST_CASE("sync deadline on a server holding no partition", "[ps][sync][deadline]") {
  TrainingConfig config = BaseConfig(true, 0, 0, 1.0f);
  config.mutable_sync()->set_step_deadline_ms(100);
  config.mutable_sync()->set_min_replicas(1);
  ParameterServer ps;
  InitializeRequest req = InitRequest(config, 2);
  req.clear_variables();
  REQUIRE(ps.Initialize(req).ok());
  PushRequest empty = EmptyPush(0, 0);
  PushResponse r;
  REQUIRE(ps.Push(empty, &r).ok());
  CHECK(r.outcome() == ACCUMULATED);
  PullRequest pull;
  pull.set_incarnation(kIncarnation);
  pull.set_worker(0);
  pull.set_min_version(1);
  pull.set_timeout_ms(5000);
  PullResponse resp;
  REQUIRE(ps.Pull(pull, &resp).ok());
  CHECK(resp.version() == 1);
}

TEST_CASE("the server clips by value and schedules the learning rate", "[ps][optimizer]") {
  // Sync, one worker: lr 1 warmed up over 2 steps (0.5, then 1), each
  // element of the gradient clipped into [-1, 1].
  TrainingConfig config = BaseConfig(true, 0, 0, 1.0f);
  config.mutable_optimizer()->set_clip_value(1.0f);
  config.mutable_optimizer()->mutable_schedule()->set_warmup_steps(2);
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(config, 1, {0, 0, 0, 0})).ok());
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {10, -10, 0.5f, 0}), &r).ok());
  CHECK(PullW(ps) == std::vector<float>{-0.5f, 0.5f, -0.25f, 0});
  REQUIRE(ps.Push(Grad(0, 1, {10, -10, 0.5f, 0}), &r).ok());
  CHECK(PullW(ps) == std::vector<float>{-1.5f, 1.5f, -0.75f, 0});

  // Two workers: the mean is clipped, not each gradient.
  TrainingConfig two = BaseConfig(true, 0, 0, 1.0f);
  two.mutable_optimizer()->set_clip_value(1.0f);
  ParameterServer ps2;
  REQUIRE(ps2.Initialize(InitRequest(two, 2, {0, 0, 0, 0})).ok());
  REQUIRE(ps2.Push(Grad(0, 0, {3, -3, 0.5f, 1}), &r).ok());
  REQUIRE(ps2.Push(Grad(1, 0, {-2, 1, 0.5f, 0}), &r).ok());
  CHECK(PullW(ps2) == std::vector<float>{-0.5f, 1, -0.5f, -0.5f});
}

TEST_CASE("async: staleness-aware learning rate divides by the staleness", "[ps][async]") {
  TrainingConfig config = BaseConfig(false, 0, 0, 1.0f);
  config.mutable_async()->set_staleness_scaled_learning_rate(true);
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(config, 2, {0, 0, 0, 0})).ok());
  PushResponse r;
  // All computed from version 0: staleness 0, 1, 2, 4 (update 1, 2, 3, 5).
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());  // lr 1
  CHECK(PullW(ps) == std::vector<float>{-1, -1, -1, -1});
  REQUIRE(ps.Push(Grad(1, 0, {1, 1, 1, 1}), &r).ok());  // staleness 1: lr 1
  CHECK(PullW(ps) == std::vector<float>{-2, -2, -2, -2});
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());  // staleness 2: lr 1/2
  CHECK(PullW(ps) == std::vector<float>{-2.5f, -2.5f, -2.5f, -2.5f});
  REQUIRE(ps.Push(Grad(1, 3, {1, 1, 1, 1}), &r).ok());  // fresh: lr 1
  CHECK(PullW(ps) == std::vector<float>{-3.5f, -3.5f, -3.5f, -3.5f});
  REQUIRE(ps.Push(Grad(0, 0, {4, 4, 4, 4}), &r).ok());  // staleness 4: lr 1/4
  CHECK(PullW(ps) == std::vector<float>{-4.5f, -4.5f, -4.5f, -4.5f});
  // The staleness histogram saw 0, 1, 2, 0, 4 (buckets le 0, 1, 2, 3, 4, ...).
  const Histogram::Snapshot h = ps.staleness().Read();
  REQUIRE(h.cumulative.size() >= 5);
  CHECK(std::vector<uint64_t>(h.cumulative.begin(), h.cumulative.begin() + 5) ==
        std::vector<uint64_t>{2, 3, 4, 4, 5});
  CHECK(h.cumulative.back() == 5);
  CHECK(h.sum == 7);
  PsStatusResponse status;
  ps.GetStatus(&status);  // what the chief's TensorBoard points are made of
  CHECK(status.staleness_count() == 5);
  CHECK(status.staleness_sum() == 7);
  CHECK(status.learning_rate() == 1.0f);
  // Per partition: 5 pushes and 5 pulls of 16 bytes each, and some apply time.
  const std::vector<ParameterServer::PartitionStats> parts = ps.partition_stats();
  REQUIRE(parts.size() == 1);
  CHECK(parts[0].variable == "w");
  CHECK(parts[0].pushes == 5);
  CHECK(parts[0].pulls == 5);
  CHECK(parts[0].push_bytes == 80);
  CHECK(parts[0].pull_bytes == 80);
  CHECK(parts[0].apply_seconds > 0);
  CHECK(ps.apply_seconds().Read().cumulative.back() == 5);
}

TEST_CASE("sync: the quorum wait runs from a step's first gradient to its completion",
          "[ps][sync][metrics]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(true, 2), 2)).ok());
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  absl::SleepFor(absl::Milliseconds(60));
  REQUIRE(ps.Push(Grad(1, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  REQUIRE(ps.Push(Grad(0, 1, {1, 1, 1, 1}), &r).ok());
  REQUIRE(ps.Push(Grad(1, 1, {1, 1, 1, 1}), &r).ok());
  const Histogram::Snapshot h = ps.quorum_wait_seconds().Read();
  CHECK(h.cumulative.back() == 2);
  CHECK(h.sum >= 0.06);
  CHECK(h.sum < 30);
  // One apply per step (one partition), and the step's gradients counted once each.
  CHECK(ps.apply_seconds().Read().cumulative.back() == 2);
  CHECK(ps.partition_stats().at(0).pushes == 4);
}

TEST_CASE("server-side Adam keeps its slots per partition across steps", "[ps][optimizer]") {
  // The server's three updates equal the optimizer's own on the averaged
  // gradient with counts 1, 2, 3; a second partition pushed only at step 2
  // counts its own updates (its first gets Adam's full first step).
  TrainingConfig config = BaseConfig(false, 0, 0, 0.01f);
  config.mutable_optimizer()->mutable_adam();
  REQUIRE(ValidateAndFillDefaults(&config, "test").ok());
  InitializeRequest req = InitRequest(config, 1, {1, 2, 3, 4});
  NamedTensor* b = req.add_variables();
  b->mutable_ref()->set_variable("b");
  ToProto({2}, {0, 0}, b->mutable_tensor());
  ParameterServer ps;
  absl::Status init = ps.Initialize(req);
  INFO(init.ToString());
  REQUIRE(init.ok());
  auto opt = CreateOptimizer(config.optimizer());
  REQUIRE(opt.ok());
  std::vector<float> want = {1, 2, 3, 4};
  OptimizerSlots slots;
  (*opt)->InitSlots(4, &slots);
  PushResponse r;
  for (int t = 0; t < 3; ++t) {
    const std::vector<float> g = {0.5f * t + 0.1f, -1, 2, 0.25f};
    REQUIRE(ps.Push(Grad(0, t, g), &r).ok());
    UpdateInfo u;
    u.learning_rate = 0.01f;
    u.count = t + 1;
    (*opt)->Apply(absl::MakeSpan(want), g, &slots, u);
  }
  PushRequest only_b = Grad(0, 3, {5, -5}, "b", {2});
  REQUIRE(ps.Push(only_b, &r).ok());
  PullRequest pull;
  pull.set_incarnation(kIncarnation);
  pull.set_worker(-1);
  PullResponse resp;
  REQUIRE(ps.Pull(pull, &resp).ok());
  std::map<std::string, std::vector<float>> got;
  for (const NamedTensor& nt : resp.tensors()) {
    got[nt.ref().variable()] = FromProto(nt.tensor())->values();
  }
  CHECK(got["w"] == want);
  REQUIRE(got["b"].size() == 2);
  CHECK(got["b"][0] == Approx(-0.01f).epsilon(1e-4));
  CHECK(got["b"][1] == Approx(0.01f).epsilon(1e-4));
}

TEST_CASE("Initialize refuses min_replicas above the quorum", "[ps][sync][deadline]") {
  TrainingConfig config = BaseConfig(true, 2, 0, 1.0f);
  config.mutable_sync()->set_step_deadline_ms(100);
  config.mutable_sync()->set_min_replicas(3);
  ParameterServer ps;
  CHECK(absl::IsInvalidArgument(ps.Initialize(InitRequest(config, 4))));
}

}  // namespace
}  // namespace pstrain

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

namespace pstrain {
namespace {

TEST_CASE("sync: the server says which workers the open step waits for", "[ps][sync][metrics]") {
  ParameterServer ps;
  CHECK(ps.SyncWaitingOn().empty());  // not initialised
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(true, 0, 0, 1.0f), 2, {0, 0, 0, 0})).ok());
  CHECK(ps.SyncWaitingOn() == std::vector<bool>{true, true});
  PushResponse r;
  REQUIRE(ps.Push(Grad(1, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == ACCUMULATED);
  CHECK(ps.SyncWaitingOn() == std::vector<bool>{true, false});
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  CHECK(ps.SyncWaitingOn() == std::vector<bool>{true, true});  // the next step

  ParameterServer async;
  REQUIRE(async.Initialize(InitRequest(BaseConfig(false), 2)).ok());
  CHECK(async.SyncWaitingOn().empty());
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// An async config with an embedding table "t" of width 2.
TrainingConfig TableConfig(float lr = 0.5f) {
  TrainingConfig config = BaseConfig(/*sync=*/false, 0, 0, lr);
  EmbeddingTableConfig* t = config.add_embedding_tables();
  t->set_name("t");
  t->set_dim(2);
  REQUIRE(ValidateAndFillDefaults(&config, "test").ok());
  return config;
}

TEST_CASE("row requests naming no ids are answered, changing nothing", "[ps][embedding]") {
  // ps_request_fuzzer found memcpy from an empty request (null) under UBSan.
  const TrainingConfig config = TableConfig();
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(config, 1)).ok());
  PullRowsRequest pull;
  pull.set_incarnation(kIncarnation);
  pull.set_worker(0);
  pull.set_table("t");
  PullRowsResponse rows;
  REQUIRE(ps.PullRows(pull, &rows).ok());
  CHECK(rows.rows().empty());
  PushRowsRequest push;
  push.set_incarnation(kIncarnation);
  push.set_worker(0);
  push.set_table("t");
  PushRowsResponse pushed;
  CHECK(ps.PushRows(push, &pushed).ok());
  PsStatusResponse status;
  ps.GetStatus(&status);
  REQUIRE(status.tables_size() == 1);
  CHECK(status.tables(0).rows() == 0);
}

TEST_CASE("a row push frame that disagrees with its header is refused, changing nothing",
          "[ps][embedding][frame]") {
  const TrainingConfig config = TableConfig(1.0f);
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(config, 1)).ok());
  const uint64_t ids[2] = {5, 6};
  const float grads[4] = {1, 2, 3, 4};
  const std::string id_bytes(reinterpret_cast<const char*>(ids), sizeof(ids));
  const std::string grad_bytes(reinterpret_cast<const char*>(grads), sizeof(grads));
  PushRowsRequest header;
  header.set_incarnation(kIncarnation);
  header.set_worker(0);
  header.set_table("t");
  header.set_num_ids(2);
  auto push = [&ps](const PushRowsRequest& h, const std::string& payload_bytes) {
    SegmentedBytes payload(payload_bytes);
    PushRowsResponse r;
    return ps.PushRows(h, payload, &r);
  };
  auto rejected = [&ps](ParameterServer::Rejection r) {
    return ps.counters().rejected[static_cast<size_t>(r)];
  };
  PullRowsRequest probe;
  probe.set_incarnation(kIncarnation);
  probe.set_worker(0);
  probe.set_table("t");
  probe.set_ids(id_bytes);
  PullRowsResponse before, after;
  REQUIRE(ps.PullRows(probe, &before).ok());

  PushRowsRequest negative = header;
  negative.set_num_ids(-1);
  CHECK(absl::IsInvalidArgument(push(negative, id_bytes + grad_bytes)));
  PushRowsRequest inline_ids = header;
  inline_ids.set_ids(id_bytes);
  CHECK(absl::IsInvalidArgument(push(inline_ids, id_bytes + grad_bytes)));
  CHECK(absl::IsInvalidArgument(push(header, id_bytes.substr(0, 12))));  // short of its ids
  CHECK(rejected(ParameterServer::Rejection::kMalformed) == 3);
  PushRowsRequest huge = header;
  huge.set_num_ids(int64_t{1} << 40);
  CHECK(absl::IsInvalidArgument(push(huge, id_bytes + grad_bytes)));
  CHECK(rejected(ParameterServer::Rejection::kSize) == 1);
  CHECK(absl::IsInvalidArgument(push(header, id_bytes + grad_bytes.substr(0, 12))));  // short
  CHECK(absl::IsInvalidArgument(push(header, id_bytes + grad_bytes + "xxxx")));       // long
  CHECK(rejected(ParameterServer::Rejection::kShape) == 2);
  REQUIRE(ps.PullRows(probe, &after).ok());
  CHECK(after.rows() == before.rows());
  // The frame as it should be applies: rows -= gradients (learning rate 1).
  CHECK(push(header, id_bytes + grad_bytes).ok());
  REQUIRE(ps.PullRows(probe, &after).ok());
  std::vector<float> b(4), a(4);
  std::memcpy(b.data(), before.rows().data(), 16);
  std::memcpy(a.data(), after.rows().data(), 16);
  for (int i = 0; i < 4; ++i) CHECK(a[i] == b[i] - grads[i]);
}

}  // namespace
}  // namespace pstrain
