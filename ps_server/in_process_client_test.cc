// InProcessPsClient: the PsClient interface over ParameterServer objects,
// as the trainer's and the driver's unit tests use it.
#include "ps_server/in_process_client.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/cluster/config.h"

namespace pstrain {
namespace {

constexpr uint64_t kRun = 0x5eed;

TrainingConfig Config(bool sync, int replicas) {
  auto c = ParseTrainingConfig(R"(
model { mlp { input_dim: 2 num_classes: 2 } }
data { train_images: "x" train_labels: "y" batch_size: 1 }
optimizer { learning_rate: 0.5 }
max_steps: 1000
)",
                               "test");
  REQUIRE(c.ok());
  if (sync) {
    c->mutable_sync()->set_replicas_to_aggregate(replicas);
  } else {
    c->mutable_async();
  }
  return *c;
}

// Two servers holding w (8 x 2, in two partitions, one on each) and b.
struct Cluster {
  explicit Cluster(const TrainingConfig& config, int workers = 2) : config(config) {
    auto p = Placement::Compute({{"w", {8, 2}}, {"b", {2}}}, 2, 32, 32);
    REQUIRE(p.ok());
    placement = *p;
    for (auto& s : servers) s = std::make_unique<ParameterServer>();
    chief = Client(-1);
    init = {Tensor({8, 2}), Tensor({2})};
    for (int64_t i = 0; i < 16; ++i) init[0].values()[i] = static_cast<float>(i);
    init[1].values()[0] = 100;
    init[1].values()[1] = 200;
    REQUIRE(chief->InitializeAll(config, 1, workers, 0, init, absl::Seconds(1)).ok());
  }
  std::unique_ptr<InProcessPsClient> Client(int worker) {
    auto c = std::make_unique<InProcessPsClient>(
        std::vector<ParameterServer*>{servers[0].get(), servers[1].get()}, &placement, worker);
    c->set_incarnation(kRun);
    return c;
  }
  std::vector<Tensor> Pull(std::vector<int64_t> min_versions = {}) {
    std::vector<Tensor> params;
    PsClient::PullResult r;
    REQUIRE(chief->PullAll(min_versions, absl::Seconds(5), &params, &r).ok());
    return params;
  }

  TrainingConfig config;
  Placement placement;
  std::unique_ptr<ParameterServer> servers[2];
  std::unique_ptr<InProcessPsClient> chief;
  std::vector<Tensor> init;
};

std::vector<Tensor> Filled(float v) {
  std::vector<Tensor> g = {Tensor({8, 2}), Tensor({2})};
  for (Tensor& t : g) {
    for (int64_t i = 0; i < t.num_elements(); ++i) t.values()[i] = v;
  }
  return g;
}

std::vector<const float*> Sources(const std::vector<Tensor>& g) {
  return {g[0].data(), g[1].data()};
}

TEST_CASE("the placement splits w over both servers", "[in_process]") {
  Cluster c(Config(true, 2));
  REQUIRE(c.placement.Find("w")->partitions.size() == 2);
  CHECK(c.placement.Find("w")->partitions[0].server != c.placement.Find("w")->partitions[1].server);
}

TEST_CASE("a sync step of two in-process workers: the mean applied on both servers",
          "[in_process]") {
  Cluster c(Config(true, 2));
  auto w0 = c.Client(0), w1 = c.Client(1);
  std::vector<Tensor> p0, p1;
  PsClient::PullResult r0, r1;
  REQUIRE(w0->PullAll({0, 0}, absl::Seconds(5), &p0, &r0).ok());
  REQUIRE(w1->PullAll({0, 0}, absl::Seconds(5), &p1, &r1).ok());
  CHECK(p0[0].values() == c.init[0].values());
  CHECK(p0[1].values() == c.init[1].values());
  CHECK(r0.versions == std::vector<int64_t>{0, 0});
  CHECK(!r0.finished);

  std::vector<PushOutcome> out0, out1;
  REQUIRE(w0->PushAll({0, 0}, Filled(1), &out0).ok());
  CHECK(out0 == std::vector<PushOutcome>{ACCUMULATED, ACCUMULATED});
  REQUIRE(w1->PushAll({0, 0}, Filled(3), &out1).ok());
  CHECK(out1 == std::vector<PushOutcome>{APPLIED, APPLIED});

  // SGD at 0.5 of the mean gradient, 2.
  PsClient::PullResult r;
  REQUIRE(w0->PullAll({1, 1}, absl::Seconds(5), &p0, &r).ok());
  CHECK(r.versions == std::vector<int64_t>{1, 1});
  for (int64_t i = 0; i < 16; ++i) CHECK(p0[0].values()[i] == c.init[0].values()[i] - 1);
  CHECK(p0[1].values()[1] == 199);
  CHECK(w0->counters().push_payload_bytes == 18 * 4);
  CHECK(w0->counters().pull_payload_bytes == 2 * 18 * 4);
}

TEST_CASE("a push handle: parts as they are ready, one push at a time, abandoned when dropped",
          "[in_process]") {
  Cluster c(Config(true, 1), /*workers=*/1);
  auto w = c.Client(0);
  const std::vector<Tensor> g = Filled(2);
  {
    auto dropped = w->StartPush({0, 0}, Sources(g));
    REQUIRE(dropped.ok());
    auto second = w->StartPush({0, 0}, Sources(g));
    CHECK(absl::IsFailedPrecondition(second.status()));
  }  // abandoned before any part left: nothing sent
  CHECK(c.Pull()[0].values() == c.init[0].values());

  auto push = w->StartPush({0, 0}, Sources(g));
  REQUIRE(push.ok());
  REQUIRE((*push)->Ready(1, 2).ok());  // b first, as the backward pass has it
  // Applied, but a sync server publishes its partitions with the step.
  CHECK(c.Pull()[1].values()[0] == 100);
  CHECK(absl::IsInvalidArgument((*push)->Ready(1, 3)));
  std::vector<PushOutcome> out;
  REQUIRE((*push)->Wait(&out).ok());
  CHECK(out == std::vector<PushOutcome>{APPLIED, APPLIED});
  CHECK(absl::IsFailedPrecondition((*push)->Wait(&out)));
  const std::vector<Tensor> after = c.Pull({1, 1});
  for (int64_t i = 0; i < 16; ++i) CHECK(after[0].values()[i] == c.init[0].values()[i] - 1);
  CHECK(w->StartPush({1, 1}, Sources(g)).ok());
}

TEST_CASE("a push's sources named later: each read when its variable starts", "[in_process]") {
  Cluster c(Config(true, 1), /*workers=*/1);
  auto w = c.Client(0);
  const std::vector<Tensor> g = Filled(2), other = Filled(5);
  auto push = w->StartPush({0, 0}, {nullptr, nullptr});
  REQUIRE(push.ok());
  (*push)->SetSource(1, other[1].data());
  REQUIRE((*push)->Ready(1, 2).ok());
  (*push)->SetSource(1, g[1].data());  // started: keeps its own
  (*push)->SetSource(0, g[0].data());
  std::vector<PushOutcome> out;
  REQUIRE((*push)->Wait(&out).ok());
  const std::vector<Tensor> after = c.Pull({1, 1});
  // SGD at 0.5: w by the gradient named last (2), b by the one named first (5).
  for (int64_t i = 0; i < 16; ++i) CHECK(after[0].values()[i] == c.init[0].values()[i] - 1);
  CHECK(after[1].values()[0] == c.init[1].values()[0] - 2.5f);
}

TEST_CASE("a push handle that outlives its client is detached: it sends nothing more",
          "[in_process]") {
  Cluster c(Config(true, 1), /*workers=*/1);
  auto w = c.Client(0);
  const std::vector<Tensor> g = Filled(2);
  auto push = w->StartPush({0, 0}, Sources(g));
  REQUIRE(push.ok());
  w.reset();  // the caller's bug; ASan watches the handle's next calls
  std::vector<PushOutcome> out;
  CHECK(absl::IsFailedPrecondition((*push)->Ready(0, 1)));
  CHECK(absl::IsFailedPrecondition((*push)->Wait(&out)));
  push->reset();
  CHECK(c.Pull()[0].values() == c.init[0].values());
}

TEST_CASE("a prefetched pull parks until the step is applied and serves the next PullInto",
          "[in_process]") {
  Cluster c(Config(true, 2));
  auto w0 = c.Client(0), w1 = c.Client(1);
  w0->PrefetchPull({1, 1}, absl::Seconds(5));
  std::vector<PushOutcome> out;
  REQUIRE(w0->PushAll({0, 0}, Filled(1), &out).ok());
  REQUIRE(w1->PushAll({0, 0}, Filled(1), &out).ok());
  std::vector<Tensor> p;
  PsClient::PullResult r;
  REQUIRE(w0->PullAll({1, 1}, absl::Seconds(5), &p, &r).ok());
  CHECK(w0->counters().prefetched_pulls == 1);
  CHECK(r.versions == std::vector<int64_t>{1, 1});
  CHECK(p[0].values()[0] == -0.5f);

  // One for other versions is dropped, and the pull made as asked.
  w0->PrefetchPull({7, 7}, absl::Seconds(5));
  REQUIRE(w0->PullAll({1, 1}, absl::Seconds(5), &p, &r).ok());
  CHECK(w0->counters().prefetched_pulls == 1);
}

TEST_CASE("async: each push applied on arrival, its count of own pushes in the replies",
          "[in_process]") {
  Cluster c(Config(false, 0), /*workers=*/1);
  auto w = c.Client(0);
  std::vector<PushOutcome> out;
  REQUIRE(w->PushAll({0, 0}, Filled(1), &out).ok());
  CHECK(out == std::vector<PushOutcome>{APPLIED, APPLIED});
  CHECK(w->own_pushes() == std::vector<int64_t>{1, 1});
  // The next pull waits for the second push the servers count of it.
  w->PrefetchPull({}, absl::Seconds(5), {2, 2});
  REQUIRE(w->PushAll({1, 1}, Filled(1), &out).ok());
  std::vector<Tensor> p;
  PsClient::PullResult r;
  REQUIRE(w->PullAll({}, absl::Seconds(5), &p, &r).ok());
  CHECK(w->counters().prefetched_pulls == 1);
  CHECK(r.versions == std::vector<int64_t>{2, 2});
  CHECK(p[1].values()[0] == 100 - 1);
}

TEST_CASE("the servers' refusals and waits come back named, the model unchanged",
          "[in_process]") {
  Cluster c(Config(true, 2));
  auto w = c.Client(0);
  std::vector<Tensor> p;
  PsClient::PullResult r;
  absl::Status late = w->PullAll({3, 3}, absl::Milliseconds(50), &p, &r);
  CHECK(absl::IsDeadlineExceeded(late));
  CHECK(absl::StrContains(late.message(), "(in-process)"));

  std::vector<PushOutcome> out;
  absl::Status ahead = w->PushAll({5, 5}, Filled(1), &out);
  CHECK(!ahead.ok());
  CHECK(absl::StrContains(ahead.message(), "Push to ps:"));
  CHECK(!w->PushAll({0}, Filled(1), &out).ok());  // a step per server
  CHECK(c.Pull()[0].values() == c.init[0].values());

  auto stranger = c.Client(0);
  stranger->set_incarnation(kRun + 1);
  CHECK(absl::IsFailedPrecondition(stranger->ShutdownAll("not mine")));
  PsStatusResponse status;
  REQUIRE(w->GetStatus(1, &status).ok());
  CHECK(status.initialized());
  REQUIRE(c.chief->ShutdownAll("done").ok());
  CHECK(absl::IsUnavailable(w->PullAll({}, absl::Seconds(1), &p, &r)));
}

TEST_CASE("rows: loaded, pulled from the server that holds each id, pushed back", "[in_process]") {
  TrainingConfig config = Config(false, 0);
  EmbeddingTableConfig* t = config.add_embedding_tables();
  t->set_name("t");
  t->set_dim(2);
  REQUIRE(ValidateAndFillDefaults(&config, "test").ok());
  Cluster c(config, /*workers=*/1);
  auto w = c.Client(0);
  const std::vector<uint64_t> ids = {1, 2, 3, 4, 5};
  const std::vector<float> values = {1, 1, 2, 2, 3, 3, 4, 4, 5, 5};
  REQUIRE(c.chief->LoadRows("t", 2, ids, values.data(), {}, {}, {}).ok());
  const std::vector<uint64_t> asked = {5, 1, 5, 3};
  std::vector<float> rows(asked.size() * 2);
  REQUIRE(w->PullRows("t", 2, asked, 0, absl::Seconds(1), rows.data()).ok());
  CHECK(rows == std::vector<float>{5, 5, 1, 1, 5, 5, 3, 3});

  // Duplicates summed: id 5 moves by 0.5 x (1 + 1).
  const std::vector<float> grads(asked.size() * 2, 1.0f);
  std::vector<PushOutcome> out;
  REQUIRE(w->PushRows("t", 2, asked, grads.data(), {0, 0}, &out).ok());
  REQUIRE(w->PullRows("t", 2, asked, 0, absl::Seconds(1), rows.data()).ok());
  CHECK(rows == std::vector<float>{4, 4, 0.5, 0.5, 4, 4, 2.5, 2.5});
  absl::Status unknown = w->PullRows("u", 2, asked, 0, absl::Seconds(1), rows.data());
  CHECK(!unknown.ok());
  CHECK(absl::StrContains(unknown.message(), "PullRows u from ps:"));
}

}  // namespace
}  // namespace pstrain
