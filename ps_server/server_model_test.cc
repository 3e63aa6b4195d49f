// The parameter server's data model on its own: what NewServerModel and
// NewPartition accept and refuse, and the version-buffer protocol (a spare
// is never one a pull still reads; bfloat16 roundings cached per version).
#include "ps_server/server_model.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/base/bfloat16.h"
#include "common/base/tensor.h"
#include "common/cluster/config.h"

namespace pstrain {
namespace {

TrainingConfig Config(const std::string& mode) {
  auto c = ParseTrainingConfig(R"(
model { mlp { input_dim: 2 num_classes: 2 } }
data { train_images: "x" train_labels: "y" batch_size: 4 }
optimizer { learning_rate: 0.1 adam {} }
max_steps: 100
)" + mode,
                               "test");
  REQUIRE(c.ok());
  return *c;
}

InitializeRequest Request(const TrainingConfig& config, int workers) {
  InitializeRequest req;
  req.set_incarnation(5);
  *req.mutable_config() = config;
  req.set_num_workers(workers);
  return req;
}

NamedTensor Variable(const std::string& name, std::vector<float> values) {
  NamedTensor nt;
  nt.mutable_ref()->set_variable(name);
  ToProto({static_cast<int64_t>(values.size())}, values, nt.mutable_tensor());
  return nt;
}

std::string Refusal(const absl::Status& st) {
  REQUIRE_FALSE(st.ok());
  return std::string(st.message());
}

TEST_CASE("server model: the run's settings come from the request and its config", "[ps][model]") {
  auto sync = NewServerModel(Request(
      Config("sync { replicas_to_aggregate: 3 min_replicas: 2 step_deadline_ms: 250 }"), 4));
  REQUIRE(sync.ok());
  CHECK((*sync)->sync);
  CHECK((*sync)->num_workers == 4);
  CHECK((*sync)->replicas_to_aggregate == 3);
  CHECK((*sync)->min_replicas == 2);
  CHECK((*sync)->step_deadline == absl::Milliseconds(250));
  CHECK((*sync)->max_steps == 100);
  CHECK((*sync)->partitions.empty());
  CHECK((*sync)->checkpoint_dir.empty());

  auto async = NewServerModel(
      Request(Config("async { staleness_bound: 2 staleness_scaled_learning_rate: true }"), 3));
  REQUIRE(async.ok());
  CHECK_FALSE((*async)->sync);
  CHECK((*async)->staleness_bound == 2);
  CHECK((*async)->staleness_scaled_lr);
  // A push's parts are held for the worker's whole push deadline.
  CHECK((*async)->held_push_ttl > absl::ZeroDuration());
  CHECK((*async)->held_push_ttl < absl::InfiniteDuration());
}

TEST_CASE("server model: embedding tables get their own optimizer and per-worker staging",
          "[ps][model]") {
  TrainingConfig config = Config(R"(
sync {}
embedding_tables { name: "users" dim: 4 num_rows: 10 optimizer { learning_rate: 0.5 adagrad {} } }
embedding_tables { name: "items" dim: 2 }
)");
  auto model = NewServerModel(Request(config, 2));
  REQUIRE(model.ok());
  REQUIRE((*model)->tables.size() == 2);
  const ServerModel::Table& users = *(*model)->tables.at("users");
  CHECK(users.rows->dim() == 4);
  CHECK(users.staged_ids.size() == 2);
  CHECK(users.optimizer_kind != (*model)->tables.at("items")->optimizer_kind);
}

TEST_CASE("server model: a request that does not fit is refused, naming the field", "[ps][model]") {
  InitializeRequest no_run = Request(Config("sync {}"), 2);
  no_run.set_incarnation(0);
  CHECK(absl::StrContains(Refusal(NewServerModel(no_run).status()), "incarnation"));
  CHECK(absl::StrContains(Refusal(NewServerModel(Request(Config("sync {}"), 0)).status()),
                          "num_workers"));
  CHECK(absl::StrContains(
      Refusal(NewServerModel(Request(Config("sync { replicas_to_aggregate: 3 }"), 2)).status()),
      "replicas_to_aggregate 3 exceeds the 2 workers"));
  CHECK(absl::StrContains(
      Refusal(NewServerModel(Request(Config("sync { min_replicas: 3 step_deadline_ms: 100 }"), 2))
                  .status()),
      "min_replicas 3 exceeds the 2 gradients"));
  InitializeRequest part = Request(Config("sync {}"), 2);
  part.set_num_parts(2);
  part.set_part(2);
  CHECK(absl::StrContains(Refusal(NewServerModel(part).status()), "part 2 of 2"));
  InitializeRequest shard = Request(Config("sync {} checkpoint { dir: \"/tmp/x\" }"), 2);
  shard.set_num_servers(2);
  shard.set_server_index(2);
  CHECK(absl::StrContains(Refusal(NewServerModel(shard).status()), "server 2 of 2"));
}

TEST_CASE(
    "server model: a partition holds its values, fresh or restored slots, and staging "
    "for each sync worker",
    "[ps][model]") {
  auto model = NewServerModel(Request(Config("sync {}"), 3));
  REQUIRE(model.ok());
  auto p = NewPartition(Variable("w", {1, 2, 3}), **model);
  REQUIRE(p.ok());
  CHECK((*p)->key == PartitionKey{"w", 0});
  CHECK((*p)->size == 3);
  CHECK((*p)->staging.size() == 3);
  {
    absl::MutexLock lock(&(*p)->mu);
    CHECK(*(*p)->current == std::vector<float>{1, 2, 3});
  }
  {
    absl::MutexLock lock(&(*p)->apply_mu);
    CHECK((*p)->slots.size() == 2);  // Adam's m and v, zero
    CHECK((*p)->slots[0] == std::vector<float>(3, 0.0f));
    CHECK((*p)->updates == 0);
  }

  NamedTensor restored = Variable("w", {1, 2, 3});
  ToProto({3}, {0.5f, 0.5f, 0.5f}, restored.add_slots());
  ToProto({3}, {0.25f, 0.25f, 0.25f}, restored.add_slots());
  restored.set_updates(7);
  auto r = NewPartition(restored, **model);
  REQUIRE(r.ok());
  absl::MutexLock lock(&(*r)->apply_mu);
  CHECK((*r)->slots[1] == std::vector<float>(3, 0.25f));
  CHECK((*r)->updates == 7);
}

TEST_CASE("server model: a partition that is not finite, or whose slots do not fit, is refused",
          "[ps][model]") {
  auto model = NewServerModel(Request(Config("sync {}"), 1));
  REQUIRE(model.ok());
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(absl::StrContains(Refusal(NewPartition(Variable("w", {1, inf}), **model).status()),
                          "w/part0 not finite"));
  CHECK(absl::StrContains(Refusal(NewPartition(Variable("", {1}), **model).status()),
                          "empty variable name"));
  NamedTensor one_slot = Variable("w", {1, 2});
  ToProto({2}, {0, 0}, one_slot.add_slots());
  CHECK(absl::StrContains(Refusal(NewPartition(one_slot, **model).status()),
                          "1 slots, the optimizer has 2"));
  NamedTensor short_slot = Variable("w", {1, 2});
  ToProto({1}, {0}, short_slot.add_slots());
  ToProto({2}, {0, 0}, short_slot.add_slots());
  CHECK(absl::StrContains(Refusal(NewPartition(short_slot, **model).status()),
                          "slot 0 is not 2 finite values"));
  NamedTensor negative = Variable("w", {1, 2});
  negative.set_updates(-1);
  CHECK(absl::StrContains(Refusal(NewPartition(negative, **model).status()), "negative updates"));
}

TEST_CASE("server model: a spare buffer is never one a pull still holds", "[ps][model]") {
  auto model = NewServerModel(Request(Config("async {}"), 1));
  REQUIRE(model.ok());
  auto made = NewPartition(Variable("w", {1, 2}), **model);
  REQUIRE(made.ok());
  PartitionState& p = **made;
  absl::MutexLock lock(&p.mu);
  std::shared_ptr<const std::vector<float>> pulled = p.current;  // a pull in flight
  PartitionState::Buffer next = p.TakeSpareLocked();
  CHECK(next != p.current);
  (*next) = {3, 4};
  p.PublishLocked(next);
  CHECK(p.current == next);
  CHECK(p.spares.size() == 1);
  // The old version is still read: the next update gets a new buffer.
  PartitionState::Buffer third = p.TakeSpareLocked();
  CHECK(third.get() != pulled.get());
  CHECK(*pulled == std::vector<float>{1, 2});
  p.PublishLocked(third);
  // Once the pull drops it, it is reused instead of allocating.
  const std::vector<float>* old = pulled.get();
  pulled.reset();
  PartitionState::Buffer reused = p.TakeSpareLocked();
  CHECK(reused.get() == old);
}

TEST_CASE("server model: a version's bfloat16 rounding is converted once and shared",
          "[ps][model]") {
  auto model = NewServerModel(Request(Config("async {}"), 1));
  REQUIRE(model.ok());
  auto made = NewPartition(Variable("w", {1.0f, 1.00390625f, -2.5f}), **model);
  REQUIRE(made.ok());
  PartitionState& p = **made;
  std::shared_ptr<const std::vector<float>> v1;
  {
    absl::MutexLock lock(&p.mu);
    v1 = p.current;
  }
  auto a = p.Bfloat16Of(v1);
  auto b = p.Bfloat16Of(v1);
  CHECK(a == b);  // one conversion, shared
  std::vector<uint16_t> expected(3);
  FloatsToBfloat16(v1->data(), 3, expected.data());
  CHECK(*a == expected);
  // A newer version: the old one's rounding stands (its buffer is not
  // rewritten while a pull holds it); the new one is converted and cached.
  std::shared_ptr<const std::vector<float>> v2;
  {
    absl::MutexLock lock(&p.mu);
    PartitionState::Buffer next = p.TakeSpareLocked();
    *next = {4, 5, 6};
    p.PublishLocked(next);
    v2 = p.current;
  }
  CHECK(p.Bfloat16Of(v1) == a);
  auto d = p.Bfloat16Of(v2);
  CHECK(d != a);
  CHECK(p.Bfloat16Of(v2) == d);
  std::vector<uint16_t> expected2(3);
  FloatsToBfloat16(v2->data(), 3, expected2.data());
  CHECK(*d == expected2);
  // The cache follows the current version: an old one is converted anew,
  // never into a buffer a pull still holds.
  auto e = p.Bfloat16Of(v1);
  CHECK(e != a);
  CHECK(e != d);
  CHECK(*e == expected);
  CHECK(*a == expected);
}

}  // namespace
}  // namespace pstrain
