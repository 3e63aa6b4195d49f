// ParameterServer: sync and async aggregation, sessions, refusals, frames and
// pushes in parts.
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

TEST_CASE("a gradient over the optimizer's bound is refused, counted and named; off by default",
          "[ps][validation]") {
  // w = {1, 2, 3, 4}: its L2 norm is sqrt(30) = 5.477, so the bound
  // 1 + 2 x 5.477 is 11.95.
  for (const bool sync : {true, false}) {
    INFO((sync ? "sync" : "async"));
    TrainingConfig config = BaseConfig(sync, 1);
    config.mutable_optimizer()->set_max_gradient_norm(1);
    config.mutable_optimizer()->set_max_relative_gradient_norm(2);
    ParameterServer ps;
    REQUIRE(ps.Initialize(InitRequest(config, 1)).ok());
    const std::vector<float> before = PullW(ps);
    PushResponse r;
    absl::Status refused = ps.Push(Grad(0, 0, {10, 10, 0, 0}), &r);  // norm 14.14
    CHECK(absl::IsInvalidArgument(refused));
    CHECK(std::string(refused.message()) ==
          "gradient for w/part0 has L2 norm 14.1421, above the bound 11.9545 "
          "(optimizer.max_gradient_norm + max_relative_gradient_norm x its values' norm)");
    CHECK(ps.counters().rejected[static_cast<size_t>(ParameterServer::Rejection::kOverBound)] ==
          1);
    CHECK(std::strcmp(ParameterServer::RejectionName(ParameterServer::Rejection::kOverBound),
                      "gradient_bound") == 0);
    const std::vector<float> after = PullW(ps);
    CHECK(std::memcmp(before.data(), after.data(), before.size() * 4) == 0);
    CHECK(ps.counters().pushes_applied == 0);
    // Within the bound (norm 10): applied.
    REQUIRE(ps.Push(Grad(0, 0, {10, 0, 0, 0}), &r).ok());
    CHECK(r.outcome() == APPLIED);
    CHECK(PullW(ps) == std::vector<float>{-4, 2, 3, 4});  // lr 0.5
  }
  // Sync with two workers: the first push is staged (not applied from the
  // received bytes); the second's refusal changes neither it nor the step,
  // which goes on with the second's next push.
  {
    TrainingConfig config = BaseConfig(true, 2);
    config.mutable_optimizer()->set_max_gradient_norm(1);
    config.mutable_optimizer()->set_max_relative_gradient_norm(2);
    ParameterServer ps;
    REQUIRE(ps.Initialize(InitRequest(config, 2)).ok());
    PushResponse r;
    REQUIRE(ps.Push(Grad(0, 0, {2, 0, 0, 0}), &r).ok());
    CHECK(r.outcome() == ACCUMULATED);
    CHECK(absl::IsInvalidArgument(ps.Push(Grad(1, 0, {0, 0, 20, 0}), &r)));
    CHECK(PullW(ps) == std::vector<float>{1, 2, 3, 4});
    REQUIRE(ps.Push(Grad(1, 0, {0, 0, 2, 0}), &r).ok());
    CHECK(r.outcome() == APPLIED);
    CHECK(PullW(ps) == std::vector<float>{0.5f, 2, 2.5f, 4});  // mean {1, 0, 1, 0}, lr 0.5
  }
  // The absolute part alone; and no bound at all takes anything finite.
  TrainingConfig absolute = BaseConfig(true, 1);
  absolute.mutable_optimizer()->set_max_gradient_norm(3);
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(absolute, 1)).ok());
  PushResponse r;
  CHECK(absl::IsInvalidArgument(ps.Push(Grad(0, 0, {3, 3, 0, 0}), &r)));  // 4.24
  CHECK(ps.Push(Grad(0, 0, {2, 2, 0, 0}), &r).ok());                       // 2.83
  ParameterServer open;
  REQUIRE(open.Initialize(InitRequest(BaseConfig(true, 1), 1)).ok());
  CHECK(open.Push(Grad(0, 0, {-3e37f, 3e37f, 0, 0}), &r).ok());
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

}  // namespace
}  // namespace pstrain
