#include "ps_server/parameter_server.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "catch2/catch.hpp"
#include "common/config.h"

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
  (*opt)->Apply(absl::MakeSpan(p), g, &slots, 1);
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

TEST_CASE("sync: a waiting pull wakes when the step completes", "[ps][sync]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(true), 2)).ok());
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  std::thread late([&ps] {
    PushResponse r2;
    REQUIRE(ps.Push(Grad(1, 0, {1, 1, 1, 1}), &r2).ok());
  });
  PullRequest wait;
  wait.set_incarnation(kIncarnation);
  wait.set_worker(0);
  wait.set_min_version(1);
  wait.set_timeout_ms(10000);
  PullResponse pr;
  CHECK(ps.Pull(wait, &pr).ok());
  CHECK(pr.version() == 1);
  late.join();
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
  CHECK(ps.counters().pushes_rejected == 9);
  CHECK(ps.counters().pushes_applied == 0);
  // And the server still works.
  CHECK(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);
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
  for (int w = 0; w < 8; ++w) {
    clients.emplace_back([&ps, w] {
      for (int i = 0; i < 200; ++i) {
        PushResponse r;
        absl::Status st = ps.Push(Grad(w, 0, {1, 2, -1, 0.5f}), &r);
        if (!st.ok()) FAIL(st.ToString());
      }
    });
  }
  for (auto& t : clients) t.join();
  int64_t version;
  CHECK(PullW(ps, &version) == std::vector<float>{-1600, -3200, 1600, -800});
  CHECK(version == 1600);
}

}  // namespace
}  // namespace pstrain
