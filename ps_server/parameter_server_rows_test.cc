// ParameterServer: embedding row requests at the server's edge.
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
