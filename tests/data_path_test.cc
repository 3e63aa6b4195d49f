// The data path against the real ps_server binary: how many times a tensor
// is copied each way (the servers' and the client's own counters), page
// faults per step in steady state, waiting pulls that hold no thread and
// end the moment their caller gives up, calls in parts and windows, and
// embedding rows over RPC. The same servers under load and abuse:
// tests/overload_test.cc.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "catch2/catch.hpp"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/config.h"
#include "common/base/embedding_ids.h"
#include "common/storage/env.h"
#include "common/rpc/grpc_lifetime.h"
#include "common/cluster/placement.h"
#include "common/client/grpc_ps_client.h"
#include "common/rpc/rpc.h"
#include "tools/subprocess.h"
#include "common/testing/skip.h"
#include "common/rpc/wire_frame.h"
#include "tests/cluster_testlib.h"
#include "tests/data_path_testlib.h"

namespace pstrain {
namespace {

using testing::Buffers;
using testing::ClientGradients;
using testing::kTables;
using testing::MinorFaults;
using testing::Mismatch;
using testing::PullAll;
using testing::Servers;
using testing::SomeIds;
using testing::SyncStep;
using testing::Threads;

TEST_CASE("a sync step copies each tensor once into the server, never out (the last of a "
          "quorum unstaged); pushes leave the worker without a copy", "[data_path]") {
  for (int n : {1, 2}) {
    Servers s(n, absl::StrCat("copies", n));
    auto w0 = s.Worker(0), w1 = s.Worker(1);
    w0->set_chunk_bytes(64 << 10);  // worker 0 moves each partition in its own call
    // Gradients 0.25 and 0.75 average to 0.5; lr 0.5 takes 0.25 per step:
    // exact in float32, so the values prove the math as well as the counts.
    Buffers b0(s.vars, 0.25f), b1(s.vars, 0.75f);
    const int steps = 4;
    for (int step = 0; step < steps; ++step) SyncStep(s, *w0, *w1, b0, b1, step);
    PsClient::PullResult r;
    REQUIRE(w0->PullInto(std::vector<int64_t>(n, steps), absl::Seconds(20), b0.dst(), &r).ok());
    for (const auto& v : b0.params) {
      REQUIRE(Mismatch(v, 1.0f - 0.25f * steps) == "");
    }
    int64_t model_bytes = 0;
    for (const VariableSpec& v : s.vars) model_bytes += v.num_elements() * 4;
    int64_t push_payload = 0, push_copied = 0, push_staged = 0, pull_payload = 0, pull_copied = 0;
    for (int server = 0; server < n; ++server) {
      PsStatusResponse st;
      REQUIRE(s.chief->GetStatus(server, &st).ok());
      push_payload += st.push_payload_bytes();
      push_copied += st.push_copied_bytes();
      push_staged += st.push_staged_bytes();
      pull_payload += st.pull_payload_bytes();
      pull_copied += st.pull_copied_bytes();
    }
    INFO("servers " << n);
    CHECK(push_payload == 2 * steps * model_bytes);
    // One copy in: worker 0's gradients, which come first, into its staging
    // buffers; worker 1's, which complete each quorum, into L1 chunks as
    // they are applied.
    CHECK(push_copied == push_payload);
    CHECK(push_staged == steps * model_bytes);
    CHECK(pull_payload == (2 * steps + 1) * model_bytes);
    CHECK(pull_copied == 0);  // sent from the version buffers themselves
    // The client: pushes from the gradient block, pulls copied once into place.
    CHECK(w0->counters().push_payload_bytes == steps * model_bytes);
    CHECK(w0->counters().push_copied_bytes == 0);
    CHECK(w0->counters().pull_copied_bytes == w0->counters().pull_payload_bytes);
    CHECK(w0->counters().pull_payload_bytes == (steps + 1) * model_bytes);
  }
}

// This process's established TCP connections to local port `port`: its
// sockets (/proc/self/fd) matched by inode against /proc/net/tcp's and
// tcp6's entries (gRPC dials IPv4 from IPv6 sockets, v4-mapped) whose remote
// port is `port` and whose state is ESTABLISHED (01).
int ConnectionsTo(int port) {
  std::vector<std::string> inodes;
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), link_ec).string();
    if (!link_ec && target.rfind("socket:[", 0) == 0) {
      inodes.push_back(target.substr(8, target.size() - 9));
    }
  }
  int count = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      const int remote_port = std::stoi(remote.substr(remote.find(':') + 1), nullptr, 16);
      if (remote_port == port && state == "01" &&
          std::find(inodes.begin(), inodes.end(), inode) != inodes.end()) {
        ++count;
      }
    }
  }
  return count;
}

TEST_CASE("a worker's calls to a server take turns over rpc.connections_per_server TCP "
          "connections, and a step's values stay exact", "[data_path]") {
  for (int connections : {1, 4}) {
    INFO("connections per server " << connections);
    // w in 8 partitions of 64 KiB, each pulled and pushed in a call of its own.
    Servers s(1, absl::StrCat("connections", connections), {}, 64 << 10);
    auto w0 = s.Worker(0), w1 = s.Worker(1);
    w0->set_chunk_bytes(64 << 10);
    w0->set_connections_per_server(connections);
    CHECK(w0->connections_per_server() == connections);
    Buffers b0(s.vars, 0.25f), b1(s.vars, 0.75f);
    const int steps = 4;
    for (int step = 0; step < steps; ++step) SyncStep(s, *w0, *w1, b0, b1, step);
    PsClient::PullResult r;
    REQUIRE(w0->PullInto({steps}, absl::Seconds(20), b0.dst(), &r).ok());
    for (const auto& v : b0.params) {
      REQUIRE(Mismatch(v, 1.0f - 0.25f * steps) == "");
    }
    // A gRPC channel connects at its first call, so each connection open
    // carried calls. The chief and worker 1 share the first (gRPC shares a
    // connection between a process's channels of the same arguments).
    const std::string address = s.cluster->address(kPsJob, 0);
    const int port = std::stoi(address.substr(address.rfind(':') + 1));
    CHECK(ConnectionsTo(port) == connections);
  }
}

TEST_CASE("sync: the next step's pull goes out with the push; each partition comes back once "
          "applied, before the step completes, and the pull is not made again",
          "[data_path][sync]") {
  // One server, one worker, "w" and "b" each in a call of its own.
  Servers s(1, "prefetch", {}, 0, "", /*workers=*/1);
  auto w0 = s.Worker(0);
  w0->set_chunk_bytes(64 << 10);
  const auto& vars = s.placement->variables();
  REQUIRE(vars.size() == 2);
  const size_t w_index = vars[0].spec.name == "w" ? 0 : 1;
  const int64_t w_bytes = 512 * 256 * 4;
  int64_t model_bytes = 0;
  for (const VariableSpec& v : s.vars) model_bytes += v.num_elements() * 4;
  auto status = [&s]() {
    PsStatusResponse st;
    REQUIRE(s.chief->GetStatus(0, &st).ok());
    return st;
  };
  Buffers b(s.vars, 0.5f);
  PsClient::PullResult r;
  REQUIRE(w0->PullInto({0}, absl::Seconds(20), b.dst(), &r).ok());
  const int64_t pulled_before = status().pull_payload_bytes();
  auto w0_push = w0->StartPush({0}, b.src());
  REQUIRE(w0_push.ok());
  w0->PrefetchPull({1}, absl::Seconds(20));
  REQUIRE((*w0_push)->Ready(w_index, w_index + 1).ok());
  // "w" is applied; the step waits for "b". The server sends "w" now.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  PsStatusResponse st = status();
  while (st.pull_payload_bytes() < pulled_before + w_bytes && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
    st = status();
  }
  CHECK(st.pull_payload_bytes() == pulled_before + w_bytes);
  CHECK(st.version() == 0);
  std::vector<PushOutcome> out;
  REQUIRE((*w0_push)->Wait(&out).ok());
  CHECK(out[0] == APPLIED);
  // The next pull takes the prefetched replies: no call is made again.
  REQUIRE(w0->PullInto({1}, absl::Seconds(20), b.dst(), &r).ok());
  CHECK(r.versions == std::vector<int64_t>{1});
  for (const auto& v : b.params) {
    REQUIRE(Mismatch(v, 0.75f) == "");  // 1 - 0.5 * 0.5
  }
  CHECK(status().pull_payload_bytes() == pulled_before + model_bytes);
  // A prefetch for another version is dropped (its parked calls cancelled),
  // and the pull is made as asked.
  w0->PrefetchPull({5}, absl::Seconds(20));
  REQUIRE(w0->PullInto({1}, absl::Seconds(20), b.dst(), &r).ok());
  CHECK(r.versions == std::vector<int64_t>{1});
  CHECK(status().pull_payload_bytes() == pulled_before + 2 * model_bytes);
  // A client destroyed with a prefetch parked ends it at once.
  w0->PrefetchPull({9}, absl::Seconds(60));
  const absl::Time t0 = absl::Now();
  w0.reset();
  CHECK(absl::Now() - t0 < absl::Seconds(5));
}

TEST_CASE("sync with a backup worker: a late worker's prefetched pull is made again when the "
          "servers went on without it", "[data_path][sync]") {
  Servers s(1, "prefetch_late", {}, 0,
            "optimizer { learning_rate: 0.5 } sync { replicas_to_aggregate: 1 }", 2);
  auto fast = s.Worker(0), late = s.Worker(1);
  Buffers bf(s.vars, 0.5f), bl(s.vars, 0.5f);
  PsClient::PullResult r;
  REQUIRE(late->PullInto({0}, absl::Seconds(20), bl.dst(), &r).ok());
  auto late_push = late->StartPush({0}, bl.src());
  REQUIRE(late_push.ok());
  late->PrefetchPull({1}, absl::Seconds(20));
  // Meanwhile the fast worker alone completes steps 0 and 1.
  std::vector<PushOutcome> out;
  for (int64_t step : {0, 1}) {
    REQUIRE(fast->PullInto({step}, absl::Seconds(20), bf.dst(), &r).ok());
    REQUIRE(fast->PushFrom({step}, bf.src(), &out).ok());
    REQUIRE(out[0] == APPLIED);
  }
  REQUIRE((*late_push)->Wait(&out).ok());
  CHECK(out[0] == DROPPED_STALE);
  // Its prefetched pull was answered at version 1; the server is at 2.
  REQUIRE(late->PullInto({1}, absl::Seconds(20), bl.dst(), &r).ok());
  CHECK(r.versions == std::vector<int64_t>{2});
  CHECK(bl.params[1][0] == bf.params[1][0] - 0.25f);  // the fast worker's step 1 applied
}

TEST_CASE("bfloat16 on the wire: half the bytes each way, float32 on the server",
          "[data_path][bfloat16]") {
  Servers s(2, "bf16");
  auto w0 = s.Worker(0), w1 = s.Worker(1);
  w0->set_wire_dtype(DT_BFLOAT16);
  w1->set_wire_dtype(DT_BFLOAT16);
  // 0.25 + 2^-10 is not a bfloat16 (8 bits of mantissa): it rounds to 0.25,
  // and 0.75 is exact, so each step takes exactly 0.25 as in float32.
  Buffers b0(s.vars, 0.25f + 1.0f / 1024), b1(s.vars, 0.75f);
  const int steps = 3;
  for (int step = 0; step < steps; ++step) SyncStep(s, *w0, *w1, b0, b1, step);
  PsClient::PullResult r;
  REQUIRE(w0->PullInto({steps, steps}, absl::Seconds(20), b0.dst(), &r).ok());
  for (const auto& v : b0.params) {
    REQUIRE(Mismatch(v, 1.0f - 0.25f * steps) == "");
  }
  int64_t elements = 0;
  for (const VariableSpec& v : s.vars) elements += v.num_elements();
  int64_t push_payload = 0, pull_payload = 0, pull_copied = 0;
  for (int server = 0; server < 2; ++server) {
    PsStatusResponse st;
    REQUIRE(s.chief->GetStatus(server, &st).ok());
    push_payload += st.push_payload_bytes();
    pull_payload += st.pull_payload_bytes();
    pull_copied += st.pull_copied_bytes();
  }
  CHECK(push_payload == 2 * steps * elements * 2);
  CHECK(pull_payload == (2 * steps + 1) * elements * 2);
  CHECK(pull_copied == 0);  // the rounding is made once per version, then sent in place
  CHECK(w0->counters().push_payload_bytes == steps * elements * 2);
  // The chief's float32 pull still sees full precision.
  Buffers exact(s.vars, 0);
  REQUIRE(s.chief->PullInto({}, absl::Seconds(20), exact.dst(), &r).ok());
  CHECK(exact.params[0][0] == 1.0f - 0.25f * steps);
}

TEST_CASE("a share of several partitions is installed in parts and trains", "[data_path]") {
  // 12 MiB in 4 MiB partitions: each server's Initialize arrives in parts.
  Servers s(1, "init_parts", {{"big", {3072, 1024}}, {"b", {1024}}}, 4 << 20);
  REQUIRE(s.placement->Find("big")->partitions.size() == 3);
  auto w0 = s.Worker(0), w1 = s.Worker(1);
  w0->set_chunk_bytes(4 << 20);
  w1->set_chunk_bytes(4 << 20);
  Buffers b0(s.vars, 0.25f), b1(s.vars, 0.75f);
  for (int step = 0; step < 2; ++step) SyncStep(s, *w0, *w1, b0, b1, step);
  PsClient::PullResult r;
  REQUIRE(w0->PullInto({2}, absl::Seconds(20), b0.dst(), &r).ok());
  for (const auto& v : b0.params) {
    REQUIRE(Mismatch(v, 0.5f) == "");
  }
  auto log = Env::Default()->ReadFile(JoinPath(s.dir, "ps0.log"));
  REQUIRE(log.ok());
  CHECK(log->find("Initialize refused") == std::string::npos);
}

TEST_CASE("steady state: a server takes almost no page faults per step", "[data_path]") {
  if (testing::kSanitized) {
    // The sanitizers' allocators replace the real one (ASan quarantines freed
    // memory and hands out fresh pages): the property is the real allocator's
    // (common/runtime/allocator.h), not measurable here.
    testing::SkipCase("real-allocator",
                      "under a sanitizer: page faults measure the real allocator");
    return;
  }
  Servers s(1, "faults");
  auto w0 = s.Worker(0), w1 = s.Worker(1);
  Buffers b0(s.vars, 1e-3f), b1(s.vars, 2e-3f);
  int64_t step = 0;
  // Buffers reach their sizes, and gRPC's thread pool and each thread's heap
  // arena their working set (a thread started late, under load, faults in
  // its stack and arena: one-off faults a short window would count per step).
  for (; step < 30; ++step) SyncStep(s, *w0, *w1, b0, b1, step);
  const int pid = s.procs[0]->pid();
  const int64_t before = MinorFaults(pid);
  const int steps = 60;
  for (int i = 0; i < steps; ++i, ++step) SyncStep(s, *w0, *w1, b0, b1, step);
  const int64_t faults = MinorFaults(pid) - before;
  // A fresh 516 KiB buffer per tensor per step would fault in ~129 pages for
  // each of the 2 pushes, 2 pulls and the apply: ~650 a step. Measured: 0.3-6
  // (~50 before the daemons kept freed heap for reuse).
  const double per_step = static_cast<double>(faults) / steps;
  INFO("minor faults per step: " << per_step);
  CHECK(per_step < 30);
}

TEST_CASE("waiting pulls hold no server thread and end when their callers give up",
          "[data_path]") {
  Servers s(1, "parked");
  const int pid = s.procs[0]->pid();
  const int threads_before = Threads(pid);
  auto channel = CreateChannel(s.cluster->address(kPsJob, 0));
  grpc::GenericStub raw(channel);
  PullRequest req;
  req.set_incarnation(4242);
  req.set_worker(0);
  req.set_min_version(1000);  // never reached
  req.set_timeout_ms(600000);
  const grpc::ByteBuffer request = SerializeMessage(req);
  constexpr int kPulls = 200;
  absl::Mutex mu;
  int done = 0, deadline_exceeded = 0;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<grpc::ByteBuffer> responses(kPulls);
  for (int i = 0; i < kPulls; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    SetDeadline(contexts.back().get(), absl::Seconds(3));
  }
  const absl::Time start = absl::Now();
  for (int i = 0; i < kPulls; ++i) {
    raw.UnaryCall(contexts[i].get(), "/pstrain.PsService/Pull", grpc::StubOptions(), &request,
                  &responses[i], [&](grpc::Status st) {
                    absl::MutexLock lock(&mu);
                    ++done;
                    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) ++deadline_exceeded;
                  });
  }
  absl::SleepFor(absl::Seconds(1));  // all parked on the server by now
  const int threads_parked = Threads(pid);
  {
    absl::MutexLock lock(&mu);
    CHECK(done == 0);
    auto all = [&done]() { return done == kPulls; };
    REQUIRE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(20)));
  }
  const absl::Duration took = absl::Now() - start;
  CHECK(deadline_exceeded == kPulls);
  CHECK(took < absl::Seconds(10));
  INFO("threads before " << threads_before << ", with " << kPulls << " pulls parked "
                         << threads_parked);
  CHECK(threads_parked - threads_before < 20);
  // The server still answers at once, and a real step still works.
  auto w0 = s.Worker(0), w1 = s.Worker(1);
  Buffers b0(s.vars, 0.5f), b1(s.vars, 0.5f);
  SyncStep(s, *w0, *w1, b0, b1, 0);
  PsStatusResponse st;
  REQUIRE(s.chief->GetStatus(0, &st).ok());
  CHECK(st.version() == 1);
}

TEST_CASE("async: a server's share over the message cap travels in calls of whole partitions, "
          "applied as they come; each push is one update", "[data_path][async][limits]") {
  // 260 MiB on one server, over gRPC's 256 MiB cap, in 4 MiB partitions.
  const std::vector<VariableSpec> vars = {{"w", {65536, 1040}}};
  Servers s(1, "big_share", vars, 4 << 20, "optimizer { learning_rate: 1 } async {}");
  REQUIRE(s.placement->server_bytes()[0] > kMaxMessageBytes);
  Buffers b(s.vars, 0.25f);
  // In one message it is refused by size, and changes nothing.
  {
    auto whole = s.Worker(0);
    std::vector<PushOutcome> out;
    absl::Status st = whole->PushFrom({0}, b.src(), &out);
    INFO(st.ToString());
    CHECK(absl::IsResourceExhausted(st));
  }
  // In parts: two workers' pushes, each counted once.
  for (int w = 0; w < 2; ++w) {
    auto c = s.Worker(w);
    c->set_chunk_bytes(4 << 20);
    c->set_mixed_versions(true);
    if (testing::kSanitized) {
      // A bound, not a speed check: each of the 65 parts is applied in its
      // own call as it arrives, and under TSan on a slow 2-core machine the
      // push passed the client's 20 s (2026-11-27).
      c->set_push_timeout(absl::Seconds(300));
    }
    PsClient::PullResult r;
    REQUIRE(c->PullInto({}, absl::Seconds(20), b.dst(), &r).ok());
    CHECK(r.versions[0] == w);
    std::vector<PushOutcome> out;
    absl::Status st = c->PushFrom(r.versions, b.src(), &out);
    INFO(st.ToString());
    REQUIRE(st.ok());
    CHECK(out[0] == APPLIED);
  }
  PsStatusResponse st;
  REQUIRE(s.chief->GetStatus(0, &st).ok());
  CHECK(st.version() == 2);
  CHECK(st.pushes_applied() == 2);
  // Each part applied from gRPC's buffers as it came: each byte copied once
  // (into L1 chunks on its way to the optimizer), none held.
  CHECK(st.push_payload_bytes() == 2 * s.placement->server_bytes()[0]);
  CHECK(st.push_copied_bytes() == st.push_payload_bytes());
  // The chief reads it in calls of up to 64 MiB: 1 - 2 x 0.25 everywhere.
  s.chief->set_chunk_bytes(64 << 20);
  s.chief->set_mixed_versions(true);
  PsClient::PullResult r;
  REQUIRE(s.chief->PullInto({}, absl::Seconds(20), b.dst(), &r).ok());
  CHECK(r.versions[0] == 2);
  int64_t wrong = 0;
  for (float v : b.params[0]) wrong += v != 0.5f;
  CHECK(wrong == 0);
}

TEST_CASE("a worker keeps at most rpc.calls_in_flight calls per server each way: a parked pull "
          "of 9 calls beside a push of 9 fits --max_concurrent_calls=4",
          "[data_path][limits]") {
  // One server, one sync worker, "w" in 8 partitions of 64 KiB and "b":
  // a pull or a push is 9 calls of 64 KiB.
  Servers s(1, "window", {}, 64 << 10, "", /*workers=*/1, {"--max_concurrent_calls=4"});
  auto w0 = s.Worker(0);
  w0->set_chunk_bytes(64 << 10);
  w0->set_calls_in_flight(2);
  Buffers b(s.vars, 0.5f);
  PsClient::PullResult r;
  REQUIRE(w0->PullInto({0}, absl::Seconds(20), b.dst(), &r).ok());
  float expected = 1.0f;
  for (int64_t step = 0; step < 3; ++step) {
    // The next pull parks 2 calls (the rest wait in the client) while the
    // push goes out 2 calls at a time; each partition's pull is answered
    // as soon as it is applied, which lets the next one in.
    auto w0_push = w0->StartPush({step}, b.src());
    REQUIRE(w0_push.ok());
    w0->PrefetchPull({step + 1}, absl::Seconds(20));
    std::vector<PushOutcome> out;
    absl::Status pushed = (*w0_push)->Wait(&out);
    INFO(pushed.ToString());
    REQUIRE(pushed.ok());
    CHECK(out[0] == APPLIED);
    REQUIRE(w0->PullInto({step + 1}, absl::Seconds(20), b.dst(), &r).ok());
    CHECK(r.versions == std::vector<int64_t>{step + 1});
    expected -= 0.25f;  // lr 0.5 x gradient 0.5
    for (const auto& v : b.params) {
      REQUIRE(Mismatch(v, expected) == "");
    }
  }
  // At least 7 of each prefetch's 9 calls waited in the client (they park).
  CHECK(w0->calls_waited() >= 3 * 7);
  // Waits until the server serves `calls` data calls.
  auto serving = [&s](int calls) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    PsStatusResponse st;
    do {
      REQUIRE(s.chief->GetStatus(0, &st).ok());
      if (st.data_calls() == calls) return true;
      absl::SleepFor(absl::Milliseconds(5));
    } while (absl::Now() < deadline);
    return false;
  };
  REQUIRE(serving(0));

  // The same step without the window: the parked pull takes the server's
  // 4 places and the push is refused.
  auto unbounded = s.Worker(0);
  unbounded->set_chunk_bytes(64 << 10);
  unbounded->set_calls_in_flight(0);
  auto unbounded_push = unbounded->StartPush({3}, b.src());
  REQUIRE(unbounded_push.ok());
  unbounded->PrefetchPull({4}, absl::Seconds(20));
  REQUIRE(serving(4));  // 4 parked, 5 refused
  std::vector<PushOutcome> out;
  absl::Status refused = (*unbounded_push)->Wait(&out);
  CHECK(absl::IsResourceExhausted(refused));
  CHECK(refused.message().find("--max_concurrent_calls") != std::string::npos);
  CHECK(unbounded->calls_waited() == 0);
  unbounded.reset();  // cancels its parked pulls
  REQUIRE(serving(0));

  // A client destroyed with its pull parked and 8 calls waiting behind it
  // ends them all at once: none of them is started.
  auto one = s.Worker(0);
  one->set_chunk_bytes(64 << 10);
  one->set_calls_in_flight(1);
  one->PrefetchPull({99}, absl::Seconds(60));
  REQUIRE(serving(1));
  CHECK(one->calls_waited() == 8);
  const absl::Time t0 = absl::Now();
  one.reset();
  CHECK(absl::Now() - t0 < absl::Seconds(5));
  CHECK(serving(0));
  PsStatusResponse st;
  REQUIRE(s.chief->GetStatus(0, &st).ok());
  CHECK(st.version() == 3);
  CHECK(st.pushes_rejected() == 0);
}

TEST_CASE("a sync step with a dead worker: with min_replicas it goes on at the deadline; "
          "without, it fails there naming the worker", "[data_path][deadline]") {
  for (int min_replicas : {1, 0}) {
    INFO("min_replicas " << min_replicas);
    Servers s(2, absl::StrCat("dead_worker", min_replicas), {}, 0,
              absl::StrCat("optimizer { learning_rate: 0.5 } sync { step_deadline_ms: 300",
                           min_replicas > 0 ? " min_replicas: 1" : "", " }"));
    // Worker 1 never pushes (it is dead); worker 0 pushes 0.5 everywhere.
    auto w0 = s.Worker(0);
    Buffers b0(s.vars, 0.5f);
    std::vector<PushOutcome> out;
    const absl::Time start = absl::Now();
    REQUIRE(w0->PushFrom({0, 0}, b0.src(), &out).ok());
    PsClient::PullResult r;
    absl::Status st = w0->PullInto({1, 1}, absl::Seconds(20), b0.dst(), &r);
    const absl::Duration waited = absl::Now() - start;
    INFO(st.ToString());
    CHECK(waited < absl::Seconds(10));  // the deadline, not the 20 s the pull allows
    if (min_replicas > 0) {
      REQUIRE(st.ok());
      CHECK(waited >= absl::Milliseconds(290));
      CHECK(r.versions == std::vector<int64_t>{1, 1});
      for (const auto& v : b0.params) {
        REQUIRE(Mismatch(v, 0.75f) == "");  // 1 - 0.5 * 0.5, from worker 0 alone
      }
    } else {
      CHECK(absl::IsDeadlineExceeded(st));
      CHECK(st.message().find("sync step 0 failed") != std::string::npos);
      CHECK(st.message().find("waiting on worker(s) 1") != std::string::npos);
    }
  }
}

// Embedding rows over RPC, against real servers (kTables).

TEST_CASE("embedding rows over RPC: the same ids give the same rows on 1 or 2 servers, in any "
          "order", "[data_path][embedding]") {
  const std::vector<uint64_t> ids = SomeIds(300, 5);
  std::vector<uint64_t> reversed(ids.rbegin(), ids.rend());
  Servers one(1, "rows1", {}, 0, absl::StrCat("optimizer { learning_rate: 0.5 } ", kTables));
  Servers two(2, "rows2", {}, 0, absl::StrCat("optimizer { learning_rate: 0.5 } ", kTables));
  std::vector<float> a(300 * 4), b(300 * 4);
  REQUIRE(one.Worker(0)->PullRows("ads", 4, ids, 0, absl::Seconds(5), a.data()).ok());
  REQUIRE(two.Worker(1)->PullRows("ads", 4, reversed, 0, absl::Seconds(5), b.data()).ok());
  for (int i = 0; i < 300; ++i) {
    std::vector<float> want(4);
    InitialRow(TableSeed(0, "ads"), ids[i], 4, 0.5f, want.data());  // default scale 1/sqrt(4)
    CHECK(std::equal(want.begin(), want.end(), a.begin() + i * 4));
    CHECK(std::equal(want.begin(), want.end(), b.begin() + (299 - i) * 4));
  }
  // Each server reports its share of the rows and their bytes.
  int64_t rows = 0;
  for (int s = 0; s < 2; ++s) {
    PsStatusResponse st;
    REQUIRE(two.chief->GetStatus(s, &st).ok());
    REQUIRE(st.tables_size() == 2);
    CHECK(st.tables(0).name() == "ads");
    CHECK(st.tables(0).rows() > 100);
    CHECK(st.tables(0).bytes() == st.tables(0).rows() * 4 * 4);  // SGD: no slots
    rows += st.tables(0).rows();
  }
  CHECK(rows == 300);
  // Refused: an unknown table, ids out of a fixed table's range, bytes that
  // are not whole ids or rows. Nothing changes.
  auto w = two.Worker(0);
  CHECK(absl::IsNotFound(w->PullRows("nope", 4, ids, 0, absl::Seconds(5), a.data())));
  const std::vector<uint64_t> out_of_range = {3, 1000};
  std::vector<float> g(2 * 2, 1.0f);
  std::vector<PushOutcome> outcomes;
  CHECK(absl::IsOutOfRange(w->PullRows("slots", 2, out_of_range, 0, absl::Seconds(5), g.data())));
  CHECK(absl::IsOutOfRange(w->PushRows("slots", 2, out_of_range, g.data(), {0, 0}, &outcomes)));
  // Rows of width 2 for a table of width 4 (the buffer holds them all: the
  // 4 floats of `g` were read past their end, found by --config=asan).
  std::vector<float> narrow(ids.size() * 2, 1.0f);
  CHECK(absl::IsInvalidArgument(w->PushRows("ads", 2, ids, narrow.data(), {0, 0}, &outcomes)));
  std::vector<float> after(300 * 4);
  REQUIRE(w->PullRows("ads", 4, reversed, 0, absl::Seconds(5), after.data()).ok());
  CHECK(after == b);
}

TEST_CASE("several tables' rows in one round trip: as each table's own pull and push",
          "[data_path][embedding]") {
  const std::vector<uint64_t> ads = SomeIds(300, 6);
  std::vector<uint64_t> slots;
  for (uint64_t i = 0; i < 100; ++i) slots.push_back(i * 7 % 1000);
  const std::string config = absl::StrCat("optimizer { learning_rate: 0.5 } ", kTables);
  Servers together(2, "tables_together", {}, 0, config);
  Servers apart(2, "tables_apart", {}, 0, config);
  auto w = together.Worker(0);
  auto v = apart.Worker(0);
  std::vector<float> ads_rows(300 * 4), slot_rows(100 * 2), want_ads(300 * 4), want_slots(100 * 2);
  auto tables = [&](float* a, float* b) {
    return std::vector<PsClient::TableRows>{{"ads", 4, ads, a}, {"slots", 2, slots, b}};
  };
  REQUIRE(w->PullTables(tables(ads_rows.data(), slot_rows.data()), 0, absl::Seconds(5)).ok());
  REQUIRE(v->PullRows("ads", 4, ads, 0, absl::Seconds(5), want_ads.data()).ok());
  REQUIRE(v->PullRows("slots", 2, slots, 0, absl::Seconds(5), want_slots.data()).ok());
  CHECK(ads_rows == want_ads);
  CHECK(slot_rows == want_slots);
  // Gradients of both tables in one push; the same pushed a table at a time.
  std::vector<float> ads_grads(300 * 4), slot_grads(100 * 2, 0.25f);
  for (size_t i = 0; i < ads_grads.size(); ++i) ads_grads[i] = 0.1f * static_cast<float>(i % 7);
  std::vector<std::vector<PushOutcome>> outcomes;
  REQUIRE(w->PushTables(tables(ads_grads.data(), slot_grads.data()), {0, 0}, &outcomes).ok());
  REQUIRE(outcomes.size() == 2);
  CHECK(outcomes[0].size() == 2);
  std::vector<PushOutcome> one;
  REQUIRE(v->PushRows("ads", 4, ads, ads_grads.data(), {0, 0}, &one).ok());
  CHECK(one == outcomes[0]);
  REQUIRE(v->PushRows("slots", 2, slots, slot_grads.data(), {0, 0}, &one).ok());
  CHECK(one == outcomes[1]);
  REQUIRE(w->PullTables(tables(ads_rows.data(), slot_rows.data()), 0, absl::Seconds(5)).ok());
  REQUIRE(v->PullRows("ads", 4, ads, 0, absl::Seconds(5), want_ads.data()).ok());
  REQUIRE(v->PullRows("slots", 2, slots, 0, absl::Seconds(5), want_slots.data()).ok());
  CHECK(ads_rows == want_ads);
  CHECK(slot_rows == want_slots);
  // A table the servers do not have fails the call, naming it.
  std::vector<float> none(300 * 4);
  absl::Status refused = w->PullTables(
      {PsClient::TableRows{"ads", 4, ads, ads_rows.data()}, {"nope", 4, ads, none.data()}}, 0,
      absl::Seconds(5));
  CHECK(absl::IsNotFound(refused));
  CHECK(refused.message().find("PullRows nope from ps:") != std::string::npos);
}

TEST_CASE("embedding rows in sync mode: averaged over the step's workers, duplicates summed",
          "[data_path][embedding]") {
  Servers s(2, "rows_sync", {}, 0,
            absl::StrCat("optimizer { learning_rate: 0.5 } sync {} ", kTables));
  auto w0 = s.Worker(0), w1 = s.Worker(1);
  const std::vector<uint64_t> ids = SomeIds(50, 9);
  std::vector<float> start(50 * 4);
  REQUIRE(w0->PullRows("ads", 4, ids, 0, absl::Seconds(5), start.data()).ok());
  // Worker 0 sends every id twice (gradient 1 each: summed to 2), worker 1
  // once with gradient 2: the mean is 2, at lr 0.5 each row moves by -1.
  std::vector<uint64_t> twice = ids;
  twice.insert(twice.end(), ids.begin(), ids.end());
  const std::vector<float> ones(100 * 4, 1.0f), twos(50 * 4, 2.0f);
  std::vector<PushOutcome> out;
  REQUIRE(w0->PushRows("ads", 4, twice, ones.data(), {0, 0}, &out).ok());
  for (PushOutcome o : out) CHECK(o == ACCUMULATED);
  REQUIRE(w1->PushRows("ads", 4, ids, twos.data(), {0, 0}, &out).ok());
  // Not applied before the step completes.
  std::vector<float> rows(50 * 4);
  REQUIRE(w0->PullRows("ads", 4, ids, 0, absl::Seconds(5), rows.data()).ok());
  CHECK(rows == start);
  // A row pull for step 1, made before the step completes, waits for it
  // (parked on the servers) and is served by the dense pushes completing it.
  int64_t version = 0;
  absl::Status parked;
  std::vector<float> waited(50 * 4);
  // On a client of its own: a GrpcPsClient is used by one thread at a time, and
  // this thread pushes with w0 meanwhile.
  auto w0_rows = s.Worker(0);
  std::thread waiter([&] {
    parked = w0_rows->PullRows("ads", 4, ids, 1, absl::Seconds(20), waited.data(), &version);
  });
  absl::SleepFor(absl::Milliseconds(300));
  Buffers b0(s.vars, 0.0f), b1(s.vars, 0.0f);
  REQUIRE(w0->PushFrom({0, 0}, b0.src(), &out).ok());
  REQUIRE(w1->PushFrom({0, 0}, b1.src(), &out).ok());
  waiter.join();
  REQUIRE(parked.ok());
  CHECK(version == 1);
  for (size_t i = 0; i < waited.size(); ++i) REQUIRE(waited[i] == start[i] - 1.0f);
  REQUIRE(w0->PullRows("ads", 4, ids, 1, absl::Seconds(5), rows.data(), &version).ok());
  CHECK(version == 1);
  CHECK(rows == waited);
  // A straggler's rows for the passed step are dropped as stale.
  REQUIRE(w1->PushRows("ads", 4, ids, twos.data(), {0, 0}, &out).ok());
  for (PushOutcome o : out) {
    if (o != PUSH_OUTCOME_UNSPECIFIED) CHECK(o == DROPPED_STALE);
  }
}

}  // namespace
}  // namespace pstrain
