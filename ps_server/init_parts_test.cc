// An Initialize in parts on its own: the model is whole only when the last
// part is in, whatever their order; a retried part adds nothing; a part of
// another run starts the gathering anew; a partition in two parts is refused.
#include "ps_server/init_parts.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/base/tensor.h"
#include "common/cluster/config.h"

namespace pstrain {
namespace {

// Part `part` of `parts` of run `incarnation`.
InitializeRequest Request(int part, int parts, uint64_t incarnation = 3) {
  auto config = ParseTrainingConfig(R"(
model { mlp { input_dim: 2 num_classes: 2 } }
data { train_images: "x" train_labels: "y" batch_size: 1 }
optimizer { learning_rate: 0.1 }
max_steps: 10
sync {}
)", "test");
  REQUIRE(config.ok());
  InitializeRequest req;
  req.set_incarnation(incarnation);
  *req.mutable_config() = *config;
  req.set_num_workers(2);
  req.set_part(part);
  req.set_num_parts(parts);
  return req;
}

// The part's model as NewServerModel and NewPartition make it, with
// variables `names` (one value each).
std::shared_ptr<ServerModel> Part(const InitializeRequest& req,
                                  const std::vector<std::string>& names) {
  auto model = NewServerModel(req);
  REQUIRE(model.ok());
  for (const std::string& name : names) {
    NamedTensor nt;
    nt.mutable_ref()->set_variable(name);
    ToProto({1}, {1.0f}, nt.mutable_tensor());
    auto p = NewPartition(nt, **model);
    REQUIRE(p.ok());
    (*model)->partitions.emplace(PartitionKey{name, 0}, *std::move(p));
  }
  return *model;
}

// Adds the part; returns whether the model is whole, and the model then.
bool Add(InitParts* parts, const InitializeRequest& req, const std::vector<std::string>& names,
         std::shared_ptr<ServerModel>* whole = nullptr) {
  std::shared_ptr<ServerModel> model = Part(req, names);
  absl::StatusOr<bool> done = parts->Add(req, &model);
  REQUIRE(done.ok());
  if (*done && whole != nullptr) *whole = model;
  return *done;
}

TEST_CASE("init parts: the model is whole when the last part is in, in any order",
          "[ps][init_parts]") {
  InitParts parts;
  CHECK_FALSE(parts.pending());
  CHECK_FALSE(Add(&parts, Request(2, 3), {"c"}));
  CHECK(parts.pending());
  CHECK_FALSE(Add(&parts, Request(0, 3), {"a", "b"}));
  CHECK_FALSE(Add(&parts, Request(2, 3), {"c"}));  // a retry adds nothing
  std::shared_ptr<ServerModel> whole;
  CHECK(Add(&parts, Request(1, 3), {"d"}, &whole));
  CHECK_FALSE(parts.pending());
  REQUIRE(whole != nullptr);
  CHECK(whole->partitions.size() == 4);
  CHECK(whole->num_workers == 2);
}

TEST_CASE("init parts: a part of another run drops the unfinished gathering",
          "[ps][init_parts]") {
  InitParts parts;
  CHECK_FALSE(Add(&parts, Request(0, 2, /*incarnation=*/3), {"a"}));
  // The chief restarted (a new incarnation): its parts start over.
  CHECK_FALSE(Add(&parts, Request(1, 2, /*incarnation=*/4), {"b"}));
  std::shared_ptr<ServerModel> whole;
  CHECK(Add(&parts, Request(0, 2, /*incarnation=*/4), {"a"}, &whole));
  CHECK(whole->partitions.size() == 2);
  // A different number of parts is another gathering too.
  CHECK_FALSE(Add(&parts, Request(0, 2), {"a"}));
  CHECK_FALSE(Add(&parts, Request(0, 3), {"a"}));
  CHECK_FALSE(Add(&parts, Request(1, 3), {"b"}));
  CHECK(Add(&parts, Request(2, 3), {"c"}));
}

TEST_CASE("init parts: a partition sent in two parts is refused", "[ps][init_parts]") {
  InitParts parts;
  CHECK_FALSE(Add(&parts, Request(0, 2), {"a"}));
  std::shared_ptr<ServerModel> again = Part(Request(1, 2), {"b", "a"});
  absl::StatusOr<bool> refused = parts.Add(Request(1, 2), &again);
  REQUIRE_FALSE(refused.ok());
  CHECK(absl::StrContains(refused.status().message(), "a/part0 in two parts"));
  // The refused part did not count: a good one completes the model.
  std::shared_ptr<ServerModel> whole;
  CHECK(Add(&parts, Request(1, 2), {"b"}, &whole));
  CHECK(whole->partitions.size() == 2);
}

}  // namespace
}  // namespace pstrain
