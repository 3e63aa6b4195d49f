#include "common/client/ps_requests.h"

#include <cstring>

#include "catch2/catch.hpp"
#include "common/base/embedding_ids.h"

namespace pstrain {
namespace {

// Two variables over 2 servers: w (64 x 4, split into partitions of 256
// bytes: 4 of 16 rows) and b (4, whole, on one server).
Placement TwoServers() {
  auto p = Placement::Compute({{"w", {64, 4}}, {"b", {4}}}, 2, 256, 256);
  REQUIRE(p.ok());
  return *p;
}

int64_t Bytes(const PartitionGroup& g, const Placement& p) {
  int64_t bytes = 0;
  for (const auto& [v, part] : g.parts) {
    bytes += part->num_rows() * p.variables()[v].spec.row_elements() * 4;
  }
  return bytes;
}

TEST_CASE("partitions are grouped per server into calls of whole partitions") {
  const Placement p = TwoServers();
  int64_t partitions = 0;
  for (const auto& vp : p.variables()) partitions += static_cast<int64_t>(vp.partitions.size());

  // One call per server: every partition once, each on its server.
  std::vector<PartitionGroup> one = GroupPartitions(p, AllVariables(p), 0, 4, false);
  CHECK(one.size() == 2);
  int64_t seen = 0;
  for (const PartitionGroup& g : one) {
    for (const auto& [v, part] : g.parts) CHECK(part->server == g.server);
    seen += static_cast<int64_t>(g.parts.size());
  }
  CHECK(seen == partitions);

  // Calls of up to 300 bytes: a 256-byte partition each, whole.
  std::vector<PartitionGroup> chunked = GroupPartitions(p, AllVariables(p), 300, 4, false);
  CHECK(chunked.size() > one.size());
  for (const PartitionGroup& g : chunked) CHECK((Bytes(g, p) <= 300 || g.parts.size() == 1));

  // Only b: the server without it gets an empty call with every_server.
  std::vector<PartitionGroup> b_only = GroupPartitions(p, {1}, 0, 4, true);
  REQUIRE(b_only.size() == 2);
  CHECK(b_only[0].parts.size() + b_only[1].parts.size() == 1);
}

TEST_CASE("Initialize is cut into numbered parts per server, carrying every partition once") {
  const Placement p = TwoServers();
  std::vector<Tensor> params = {Tensor({64, 4}), Tensor({4})};
  for (int64_t i = 0; i < 256; ++i) params[0].values()[i] = static_cast<float>(i);
  TrainingConfig config;
  auto calls = InitializeRequests(p, 7, config, 99, 3, 5, params, nullptr, 300);
  REQUIRE(calls.ok());
  REQUIRE(calls->size() > 0);
  std::vector<int> parts(2, 0);
  int64_t floats = 0;
  for (size_t r = 0; r < calls->size(); ++r) {
    const InitializeRequest req = calls->Request(r);
    CHECK(req.incarnation() == 7);
    CHECK(req.config_fingerprint() == 99);
    CHECK(req.num_workers() == 3);
    CHECK(req.start_step() == 5);
    CHECK(req.server_index() == calls->server(r));
    CHECK(req.part() == parts[calls->server(r)]++);
    for (const NamedTensor& nt : req.variables()) {
      floats += static_cast<int64_t>(nt.tensor().content().size() / 4);
      if (nt.ref().variable() == "w") {
        // The partition's rows of w, in place.
        const Partition& part = p.Find("w")->partitions[nt.ref().partition()];
        float first;
        std::memcpy(&first, nt.tensor().content().data(), 4);
        CHECK(first == static_cast<float>(part.row_begin * 4));
      }
    }
  }
  for (size_t r = 0; r < calls->size(); ++r) {
    CHECK(calls->Request(r).num_parts() == parts[calls->server(r)]);
  }
  CHECK(floats == 256 + 4);

  // Params that do not match the placement are refused.
  CHECK(!InitializeRequests(p, 7, config, 99, 3, 5, {params[0]}, nullptr, 300).ok());
}

TEST_CASE("ids go to the server that holds them, in their order") {
  const std::vector<uint64_t> ids = {5, 17, 5, 1u << 20, 3, 99};
  auto by = RowsByServer(ids, 3);
  size_t total = 0;
  for (int s = 0; s < 3; ++s) {
    for (uint32_t i : by[s]) CHECK(ServerForId(ids[i], 3) == s);
    total += by[s].size();
    const std::string bytes = IdBytes(ids, by[s]);
    REQUIRE(bytes.size() == by[s].size() * 8);
    for (size_t k = 0; k < by[s].size(); ++k) {
      uint64_t id;
      std::memcpy(&id, bytes.data() + 8 * k, 8);
      CHECK(id == ids[by[s][k]]);
    }
  }
  CHECK(total == ids.size());
  for (int s : ServersWithRows(by)) CHECK(!by[s].empty());
}

TEST_CASE("LoadRows requests carry each id's row, slots and counts, split at about 4 MiB") {
  const int dim = 1024;  // 4 KiB a row: about 1,000 rows a request
  std::vector<uint64_t> ids(2500);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  std::vector<float> values(ids.size() * dim), slot(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<float>(i / dim);
    slot[i] = -values[i];
  }
  std::vector<int64_t> updates(ids.size(), 3);
  auto calls = LoadRowsRequests(1, 2, "t", dim, ids, values.data(), {slot.data()}, updates, {});
  CHECK(calls.size() >= 4);
  size_t rows = 0;
  for (const auto& [s, req] : calls) {
    const size_t n = req.ids().size() / 8;
    rows += n;
    CHECK(req.values().size() == n * dim * 4);
    CHECK(req.values().size() <= (size_t{4} << 20));
    REQUIRE(req.slots_size() == 1);
    CHECK(req.updates().size() == n * 8);
    CHECK(req.touched().empty());
    for (size_t k = 0; k < n; ++k) {
      uint64_t id;
      float v, sl;
      std::memcpy(&id, req.ids().data() + 8 * k, 8);
      std::memcpy(&v, req.values().data() + 4 * k * dim, 4);
      std::memcpy(&sl, req.slots(0).data() + 4 * k * dim, 4);
      CHECK(ServerForId(id, 2) == s);
      CHECK(v == static_cast<float>(id));
      CHECK(sl == -static_cast<float>(id));
    }
  }
  CHECK(rows == ids.size());
}

TEST_CASE("a pull's replies are taken once each, from their server, with their shape") {
  const Placement p = TwoServers();
  auto name = [](int s) { return "ps:" + std::to_string(s); };
  PsClient::PullResult result;
  PullAssembly assembly(p, 2, &result);
  CHECK(result.versions == std::vector<int64_t>{-1, -1});
  const VariablePlacement& w = *p.Find("w");
  const VariablePlacement& b = *p.Find("b");
  const int ws = w.partitions[0].server;
  CHECK(absl::IsDataLoss(assembly.Take(1 - ws, "w", 0, 128, name).status()));  // not its server
  CHECK(absl::IsDataLoss(assembly.Take(ws, "w", 0, 127, name).status()));      // short
  CHECK(absl::IsDataLoss(assembly.Take(ws, "v", 0, 128, name).status()));      // unknown
  auto part = assembly.Take(ws, "w", 0, w.partitions[0].num_rows() * 4, name);
  REQUIRE(part.ok());
  CHECK(part->variable == 0);
  CHECK(part->partition == &w.partitions[0]);
  CHECK(absl::IsDataLoss(assembly.Take(ws, "w", 0, 128, name).status()));  // twice
  CHECK(absl::IsDataLoss(assembly.Complete()));
  for (size_t k = 1; k < w.partitions.size(); ++k) {
    const Partition& wp = w.partitions[k];
    REQUIRE(assembly.Take(wp.server, "w", static_cast<int>(k), wp.num_rows() * 4, name).ok());
  }
  REQUIRE(assembly.Take(b.partitions[0].server, "b", 0, 4, name).ok());
  CHECK(assembly.Complete().ok());
}

TEST_CASE("a push's replies merge into one outcome per server") {
  auto reply = [](PushOutcome o, int64_t version, int64_t own = 0) {
    PushResponse r;
    r.set_outcome(o);
    r.set_version(version);
    r.set_own_pushes(own);
    return r;
  };
  auto name = [](int s) { return "ps:" + std::to_string(s); };
  PushReplies replies(3);
  replies.Add(0, reply(ACCUMULATED, 4));
  replies.Add(0, reply(APPLIED, 5, 2));  // a later call completed the step
  replies.Add(0, reply(ACCUMULATED, 4));
  replies.Add(1, reply(DROPPED_STALE, 9));
  replies.Add(2, reply(HELD, 3));
  replies.Add(2, reply(APPLIED, 3, 7));  // the part that completed the push
  std::vector<PushOutcome> out;
  REQUIRE(replies.Outcomes(name, &out).ok());
  CHECK(out == std::vector<PushOutcome>{APPLIED, DROPPED_STALE, APPLIED});
  CHECK(replies.versions() == std::vector<int64_t>{5, 9, 3});
  CHECK(replies.own_pushes() == std::vector<int64_t>{2, -1, 7});

  // Every part held, none applied: the server dropped the push.
  PushReplies dropped(1);
  dropped.Add(0, reply(HELD, 1));
  absl::Status st = dropped.Outcomes(name, &out);
  CHECK(absl::IsAborted(st));
  CHECK(st.message().find("ps:0") != std::string::npos);
}

}  // namespace
}  // namespace pstrain
