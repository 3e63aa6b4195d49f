// The data path against the real ps_server binary: how many times a tensor
// is copied each way (the servers' and the client's own counters), page
// faults per step in steady state, and waiting pulls that hold no thread and
// end the moment their caller gives up.
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

namespace pstrain {
namespace {

// "" when every element of `v` is `want`, else the first that is not: one
// assertion per tensor. Catch's JUnit reporter (Bazel's) keeps every
// assertion it is given, and one per element of a 12 MiB tensor took a case
// from 7 s to 57 s under TSan.
std::string Mismatch(const std::vector<float>& v, float want) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!(v[i] == want)) {
      return absl::StrFormat("element %d of %d is %.9g, not %.9g", i, v.size(), v[i], want);
    }
  }
  return "";
}

// Minor page faults of a process so far (/proc/<pid>/stat field 10).
int64_t MinorFaults(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name, which ends with the last ')'.
  std::istringstream rest(text.substr(text.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 10; ++i) rest >> field;
  return std::stoll(field);
}

int Threads(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// 1 or 2 ps_server processes with 2 sync workers' worth of variables:
// w [512, 256] (512 KiB) and b [256], placed by the real placement.
struct Servers {
  std::string dir;
  std::optional<ClusterSpec> cluster;
  std::vector<std::unique_ptr<Subprocess>> procs;
  std::optional<Placement> placement;
  std::vector<VariableSpec> vars = {{"w", {512, 256}}, {"b", {256}}};
  std::unique_ptr<GrpcPsClient> chief;

  // `settings`: text-format lines added to the training config (the
  // optimizer, the mode); `workers`: how many the servers expect;
  // `server_flags`: added to every ps_server's command line.
  explicit Servers(int n, const std::string& name, std::vector<VariableSpec> variables = {},
                   int64_t partition_max_bytes = 0, const std::string& settings = "",
                   int workers = 2, const std::vector<std::string>& server_flags = {}) {
    // This process's clients come and go with each case: without the hold,
    // the last one's going away runs gRPC's global shutdown, which can wait
    // ~10 s for an executor thread (common/rpc/grpc_lifetime.h; it did in the
    // in-flight memory case: 18.7 s with it, 8.1 s without).
    KeepGrpcUntilExit();
    if (!variables.empty()) vars = std::move(variables);
    dir = testing::FreshTempDir(name);
    auto spec = ClusterSpec::FromFile(testing::WriteClusterSpec(dir, n, workers));
    REQUIRE(spec.ok());
    cluster = *spec;
    for (int s = 0; s < n; ++s) {
      SpawnOptions so;
      so.argv = {testing::Binary("ps_server/ps_server"),
                 "--cluster_spec=" + JoinPath(dir, "cluster.json"), absl::StrCat("--task=", s)};
      so.argv.insert(so.argv.end(), server_flags.begin(), server_flags.end());
      so.output_file = JoinPath(dir, absl::StrCat("ps", s, ".log"));
      auto p = Subprocess::Spawn(so);
      REQUIRE(p.ok());
      procs.push_back(std::move(*p));
    }
    auto pl = Placement::Compute(vars, n, 64 << 10, partition_max_bytes);
    REQUIRE(pl.ok());
    placement = std::move(*pl);
    auto config = ParseTrainingConfig(absl::StrCat(R"(
model { mlp { input_dim: 2 num_classes: 2 } }
data { train_images: "x" train_labels: "y" batch_size: 1 }
max_steps: 100000
)", settings.empty() ? "optimizer { learning_rate: 0.5 }" : settings), "test");
    REQUIRE(config.ok());
    chief = std::make_unique<GrpcPsClient>(*cluster, &*placement, -1, absl::Seconds(20));
    chief->set_incarnation(4242);
    std::vector<Tensor> init;
    for (const VariableSpec& v : vars) {
      init.emplace_back(v.shape, std::vector<float>(v.num_elements(), 1.0f));
    }
    REQUIRE(chief->InitializeAll(*config, 7, workers, 0, init, absl::Seconds(30)).ok());
  }

  std::unique_ptr<GrpcPsClient> Worker(int w) {
    auto c = std::make_unique<GrpcPsClient>(*cluster, &*placement, w, absl::Seconds(20));
    c->set_incarnation(4242);
    return c;
  }
};

// Full-size host buffers of every variable for one worker.
struct Buffers {
  std::vector<std::vector<float>> params, grads;
  explicit Buffers(const std::vector<VariableSpec>& vars, float g) {
    for (const VariableSpec& v : vars) {
      params.emplace_back(v.num_elements());
      grads.emplace_back(v.num_elements(), g);
    }
  }
  std::vector<float*> dst() {
    std::vector<float*> p;
    for (auto& v : params) p.push_back(v.data());
    return p;
  }
  std::vector<const float*> src() {
    std::vector<const float*> p;
    for (auto& v : grads) p.push_back(v.data());
    return p;
  }
};

// Client k's gradients in the no-lost-update and load cases: k + 1 +
// (element mod 3) in every element of every variable.
Buffers ClientGradients(const std::vector<VariableSpec>& vars, int k) {
  Buffers b(vars, 0);
  for (auto& g : b.grads) {
    for (size_t j = 0; j < g.size(); ++j) g[j] = static_cast<float>(k + 1 + j % 3);
  }
  return b;
}

// One sync step driven from this thread: both workers pull the step, then
// push (the second push completes it).
void SyncStep(Servers& s, GrpcPsClient& w0, GrpcPsClient& w1, Buffers& b0, Buffers& b1, int64_t step) {
  const std::vector<int64_t> at(s.cluster->num_ps(), step);
  PsClient::PullResult r0, r1;
  REQUIRE(w0.PullInto(at, absl::Seconds(20), b0.dst(), &r0).ok());
  REQUIRE(w1.PullInto(at, absl::Seconds(20), b1.dst(), &r1).ok());
  std::vector<PushOutcome> out;
  REQUIRE(w0.PushFrom(at, b0.src(), &out).ok());
  REQUIRE(w1.PushFrom(at, b1.src(), &out).ok());
  for (PushOutcome o : out) REQUIRE(o == APPLIED);
}

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

// Two embedding tables, for the training config.
constexpr char kTables[] =
    "embedding_tables { name: \"ads\" dim: 4 } "
    "embedding_tables { name: \"slots\" dim: 2 num_rows: 1000 init_scale: 0 } ";

// Every partition's values, by variable, as the chief pulls them.
std::vector<std::vector<float>> PullAll(Servers& s) {
  Buffers b(s.vars, 0);
  PsClient::PullResult r;
  REQUIRE(s.chief->PullInto({}, absl::Seconds(20), b.dst(), &r).ok());
  return b.params;
}

TEST_CASE("no lost update: 8 clients x 200 concurrent async pushes to 2 servers, each applied "
          "exactly once", "[data_path][concurrency]") {
  // SGD at learning rate 1 on values that stay exact in float32: client k
  // pushes k + 1 + (element mod 3) to every element 200 times, so element j
  // ends at 1 - 200 * (36 + 8 * (j mod 3)) on whichever server holds it.
  constexpr int kClients = 8, kPushes = 200;
  Servers s(2, "lost_update", {}, 0, "optimizer { learning_rate: 1 } async {}", kClients);
  std::vector<std::thread> clients;
  std::vector<absl::Status> failures(kClients);
  for (int k = 0; k < kClients; ++k) {
    clients.emplace_back([&s, &failures, k] {
      std::unique_ptr<GrpcPsClient> c = s.Worker(k);
      Buffers b = ClientGradients(s.vars, k);
      std::vector<PushOutcome> out;
      for (int i = 0; i < kPushes && failures[k].ok(); ++i) {
        failures[k] = c->PushFrom(std::vector<int64_t>(2, 0), b.src(), &out);
        for (PushOutcome o : out) {
          if (failures[k].ok() && o != APPLIED) failures[k] = absl::InternalError("not applied");
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  for (const absl::Status& st : failures) CHECK(st.ok());
  const std::vector<std::vector<float>> got = PullAll(s);
  for (size_t v = 0; v < got.size(); ++v) {
    int64_t wrong = 0;
    for (size_t j = 0; j < got[v].size(); ++j) {
      wrong += got[v][j] != 1.0f - kPushes * (36.0f + 8.0f * static_cast<float>(j % 3));
    }
    CHECK(wrong == 0);
  }
  // Both servers hold a share, and each applied every push once.
  for (int server = 0; server < 2; ++server) {
    PsStatusResponse st;
    REQUIRE(s.chief->GetStatus(server, &st).ok());
    CHECK(st.pushes_applied() == kClients * kPushes);
    CHECK(st.version() == kClients * kPushes);
    CHECK(st.pushes_rejected() == 0);
  }
}

// Resident memory of a process in bytes (/proc/<pid>/status VmRSS).
int64_t ResidentBytes(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// What an HTTP/2 client sends first on a connection.
constexpr char kHttp2Preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// A TCP connection to a server's port that sends `bytes` and then nothing.
int RawConnect(const std::string& address, const std::string& bytes) {
  const HostPort hp = *ParseHostPort(address);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(hp.port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  if (!bytes.empty()) (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  return fd;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

TEST_CASE("load: 32 async clients against 2 servers lose no update while malformed, oversized, "
          "truncated and stalled calls are refused beside them",
          "[data_path][concurrency][load]") {
  // As in the 8-client case: SGD at learning rate 1, client k pushes
  // k + 1 + (element mod 3) everywhere, so element j ends at
  // 1 - sum_k pushes_k * (k + 1 + j mod 3), exact in float32 (at most 2,000
  // pushes per client keeps every partial sum an integer below 2^24). Each
  // client pushes while the abuse goes on, and at least 50 times.
  constexpr int kClients = 32, kMinPushes = 50, kMaxPushes = 2000;
  Servers s(2, "load_async", {{"w", {128, 64}}, {"b", {64}}}, 0,
            "optimizer { learning_rate: 1 } async {}", kClients);
  const int ps0 = s.procs[0]->pid();
  const int threads_before = Threads(ps0);
  std::vector<int> pushes(kClients, 0);
  std::vector<std::vector<double>> latency_ms(kClients);
  std::vector<absl::Status> failures(kClients);
  std::atomic<bool> abuse_done{false}, load_done{false};
  // ps:0's threads and resident memory at their highest while it all runs.
  int threads_max = 0;
  int64_t rss_max = 0;
  std::thread sampler([&] {
    while (!load_done.load()) {
      threads_max = std::max(threads_max, Threads(ps0));
      rss_max = std::max(rss_max, ResidentBytes(ps0));
      absl::SleepFor(absl::Milliseconds(10));
    }
  });
  std::vector<std::thread> clients;
  for (int k = 0; k < kClients; ++k) {
    clients.emplace_back([&, k] {
      std::unique_ptr<GrpcPsClient> c = s.Worker(k);
      Buffers b = ClientGradients(s.vars, k);
      std::vector<PushOutcome> out;
      while (failures[k].ok() && pushes[k] < kMaxPushes &&
             (pushes[k] < kMinPushes || !abuse_done.load())) {
        const absl::Time t0 = absl::Now();
        failures[k] = c->PushFrom(std::vector<int64_t>(2, 0), b.src(), &out);
        latency_ms[k].push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
        for (PushOutcome o : out) {
          if (failures[k].ok() && o != APPLIED) failures[k] = absl::InternalError("not applied");
        }
        if (failures[k].ok()) ++pushes[k];
      }
    });
  }
  // Beside the load, on ps:0: connections that stall half-way, garbage
  // frames and protobufs, a stream cut short, and a message over the cap.
  const std::string address = s.cluster->address(kPsJob, 0);
  const std::string preface = kHttp2Preface;
  std::vector<int> stalled;
  for (int i = 0; i < 8; ++i) {
    // The preface and the first 5 bytes of a 9-byte frame header, then
    // silence (the next case shows the server closing such connections).
    stalled.push_back(RawConnect(address, preface + std::string("\x00\x00\x10\x04\x00", 5)));
  }
  int garbage_refused = 0, garbage_sent = 0, cut_short = 0;
  grpc::StatusCode oversized = grpc::StatusCode::OK;
  {
    auto channel = CreateChannel(address);
    grpc::GenericStub raw(channel);
    std::mt19937 rng(7);
    for (int i = 0; i < 40; ++i) {
      std::string junk(1 + rng() % 4096, '\0');
      for (char& ch : junk) ch = static_cast<char>(rng());
      grpc::Slice slice(junk);
      grpc::ByteBuffer request(&slice, 1), response;
      for (const char* method : {"/pstrain.PsService/Push", "/pstrain.PsService/PushRows"}) {
        grpc::ClientContext ctx;
        SetDeadline(&ctx, absl::Seconds(10));
        ++garbage_sent;
        if (!RawCall(&raw, &ctx, method, request, &response).ok()) ++garbage_refused;
      }
      // A stream cut short: the preface, then half a HEADERS frame, then close.
      const int fd = RawConnect(address, preface + std::string("\x00\x01\x00\x01\x04\x00\x00", 7));
      if (fd >= 0) {
        ::close(fd);
        ++cut_short;
      }
    }
    // 257 MiB, one MiB over the servers' cap, from a channel that allows it.
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    auto big_channel =
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    grpc::GenericStub big(big_channel);
    std::string huge((257 << 20), 'x');
    grpc::Slice slice(std::move(huge));
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(60));
    oversized = RawCall(&big, &ctx, "/pstrain.PsService/Push", request, &response).error_code();
  }
  abuse_done = true;
  for (auto& t : clients) t.join();
  load_done = true;
  sampler.join();
  for (int fd : stalled) {
    if (fd >= 0) ::close(fd);
  }

  std::vector<double> all;
  int64_t total = 0;
  for (int k = 0; k < kClients; ++k) {
    all.insert(all.end(), latency_ms[k].begin(), latency_ms[k].end());
    total += pushes[k];
  }
  WARN("load: " << kClients << " clients, " << total << " pushes of 33 KiB; push latency ms p50 "
                << Percentile(all, 0.5) << ", p90 " << Percentile(all, 0.9) << ", p99 "
                << Percentile(all, 0.99) << ", max " << Percentile(all, 1.0) << "; ps:0 threads "
                << threads_before << ", at most " << threads_max << " under load, resident at most "
                << rss_max / (1 << 20) << " MiB; " << garbage_refused << "/" << garbage_sent
                << " garbage calls refused, " << cut_short << " streams cut short, 8 stalled, "
                << "257 MiB push: " << static_cast<int>(oversized));
  for (const absl::Status& st : failures) CHECK(st.ok());
  for (int k = 0; k < kClients; ++k) CHECK(pushes[k] > 0);  // every client was served
  CHECK(garbage_refused == garbage_sent);
  CHECK(cut_short == 40);
  CHECK(oversized == grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Every update is there exactly once, on both servers.
  std::vector<int64_t> per_rest(3, 0);
  for (int k = 0; k < kClients; ++k) {
    for (int r = 0; r < 3; ++r) per_rest[r] += int64_t{pushes[k]} * (k + 1 + r);
  }
  const std::vector<std::vector<float>> got = PullAll(s);
  for (size_t v = 0; v < got.size(); ++v) {
    int64_t wrong = 0;
    for (size_t j = 0; j < got[v].size(); ++j) {
      wrong += got[v][j] != static_cast<float>(1 - per_rest[j % 3]);
    }
    CHECK(wrong == 0);
  }
  for (int server = 0; server < 2; ++server) {
    PsStatusResponse st;
    REQUIRE(s.chief->GetStatus(server, &st).ok());
    CHECK(st.pushes_applied() == total);
    CHECK(st.version() == total);
    CHECK_FALSE(s.procs[server]->Wait(absl::ZeroDuration()).has_value());  // still running
  }
  // Bounded: gRPC's threads, not one per client or per bad connection, and
  // the memory of the model and the refused message's buffer at most.
  CHECK(threads_max > 0);
  CHECK(threads_max - threads_before < 64);
  CHECK(rss_max < (int64_t{1} << 30));
}

// When the server closed each of `fds` (everything it sent read and
// dropped), in seconds after `since`; -1 for one still open at `deadline`.
std::vector<double> WhenServerClosed(const std::vector<int>& fds, absl::Time since,
                                     absl::Time deadline) {
  std::vector<double> closed(fds.size(), -1);
  std::vector<pollfd> watch;
  for (int fd : fds) watch.push_back({fd, POLLIN, 0});
  char sink[4096];
  for (size_t open = fds.size(); open > 0 && absl::Now() < deadline;) {
    const int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now())) + 1;
    if (::poll(watch.data(), watch.size(), left) <= 0) continue;
    for (size_t i = 0; i < watch.size(); ++i) {
      if (watch[i].fd < 0 || watch[i].revents == 0) continue;
      const ssize_t n = ::recv(watch[i].fd, sink, sizeof(sink), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        closed[i] = absl::ToDoubleSeconds(absl::Now() - since);
        watch[i].fd = -1;  // poll skips it from now on
        --open;
      }
    }
  }
  return closed;
}

TEST_CASE("a server closes connections that stall half-way: in the handshake after "
          "--handshake_timeout_ms, after it when a ping goes unanswered for --keepalive_ms",
          "[data_path][security]") {
  Servers s(1, "stalled_peers", {{"w", {64}}}, 0, "", 1,
            {"--handshake_timeout_ms=1500", "--keepalive_ms=1000"});
  const std::string address = s.cluster->address(kPsJob, 0);
  const std::string preface = kHttp2Preface;
  std::vector<int> in_handshake, after_it;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 8; ++i) {
    // The preface and the first 5 bytes of a 9-byte frame header, then
    // silence: the handshake never ends.
    in_handshake.push_back(
        RawConnect(address, preface + std::string("\x00\x00\x10\x04\x00", 5)));
    // The preface and an empty SETTINGS frame, then silence: the handshake
    // ends, and neither the server's SETTINGS nor its pings are answered.
    after_it.push_back(RawConnect(
        address, preface + std::string("\x00\x00\x00\x04\x00\x00\x00\x00\x00", 9)));
  }
  std::vector<int> all = in_handshake;
  all.insert(all.end(), after_it.begin(), after_it.end());
  for (int fd : all) REQUIRE(fd >= 0);
  const std::vector<double> closed = WhenServerClosed(all, start, start + absl::Seconds(30));
  for (int fd : all) ::close(fd);
  std::vector<double> handshake(closed.begin(), closed.begin() + 8),
      ping(closed.begin() + 8, closed.end());
  std::sort(handshake.begin(), handshake.end());
  std::sort(ping.begin(), ping.end());
  WARN("closed by the server: 8 stalled in the handshake after " << handshake.front() << " to "
       << handshake.back() << " s, 8 silent after it after " << ping.front() << " to "
       << ping.back() << " s");
  // The handshake's deadline (1.5 s), and a ping sent after 1 s quiet left
  // unanswered for 1 s more; gRPC's timers may fire late, never early.
  for (double t : handshake) {
    CHECK(t >= 1.4);
    CHECK(t < 15);
  }
  for (double t : ping) {
    CHECK(t >= 1.9);
    CHECK(t < 15);
  }
  // The server served on: a client's pull beside them.
  std::vector<std::vector<float>> got = PullAll(s);
  REQUIRE(got.size() == 1);
  CHECK(got[0] == std::vector<float>(64, 1.0f));
}

// `calls` calls of `bytes` each at once, each on a connection of its own,
// to ps:0's Push; returns their codes, and *rss_growth gets how far ps:0's
// resident memory rose above where it stood before while they ran.
std::vector<grpc::StatusCode> ConcurrentBigPushes(Servers& s, int64_t bytes, int64_t* rss_growth,
                                                  int calls_at_once = 8) {
  const int kCalls = calls_at_once;
  const int pid = s.procs[0]->pid();
  const int64_t rss_before = ResidentBytes(pid);
  std::atomic<bool> done{false};
  int64_t rss_max = rss_before;
  std::thread sampler([&] {
    while (!done.load()) {
      rss_max = std::max(rss_max, ResidentBytes(pid));
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  // One payload, shared by every call's buffer (slices are reference-counted).
  const grpc::Slice payload(std::string(static_cast<size_t>(bytes), 'x'));
  std::vector<grpc::StatusCode> codes(kCalls, grpc::StatusCode::OK);
  std::vector<std::thread> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.emplace_back([&, i] {
      grpc::ChannelArguments args;
      args.SetMaxSendMessageSize(-1);
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
      args.SetInt("pstrain.test.connection", i);
      auto channel = grpc::CreateCustomChannel(s.cluster->address(kPsJob, 0),
                                               grpc::InsecureChannelCredentials(), args);
      grpc::GenericStub stub(channel);
      grpc::Slice slice = payload;
      grpc::ByteBuffer request(&slice, 1), response;
      grpc::ClientContext ctx;
      SetDeadline(&ctx, absl::Seconds(60));
      codes[i] = RawCall(&stub, &ctx, "/pstrain.PsService/Push", request, &response).error_code();
    });
  }
  for (auto& t : calls) t.join();
  done = true;
  sampler.join();
  *rss_growth = rss_max - rss_before;
  return codes;
}

TEST_CASE("in-flight request memory is bounded: 8 concurrent 200 MiB pushes, or one of 1 GiB, "
          "are refused past the quota, not held", "[data_path][limits]") {
  // The same calls against a quota they fit in show what they would cost.
  int64_t unbounded = 0;
  {
    Servers s(1, "inflight_big", {}, 0, "", 2, {"--max_inflight_mib=8192"});
    for (grpc::StatusCode c : ConcurrentBigPushes(s, int64_t{200} << 20, &unbounded)) {
      CHECK(c == grpc::StatusCode::INVALID_ARGUMENT);  // received whole, then refused
    }
  }
  // One 1 GiB message, on a server of its own (its resident memory starts
  // low): cut off once it fills the quota, long before the rest of it
  // arrives. (Under a quota above it, it would be received whole, +1 GiB,
  // and then refused by size.)
  int64_t gib_growth = 0;
  absl::Duration gib_took;
  std::vector<grpc::StatusCode> gib;
  {
    Servers fresh(1, "inflight_gib", {}, 0, "", 2, {"--max_inflight_mib=512"});
    const absl::Time start = absl::Now();
    gib = ConcurrentBigPushes(fresh, int64_t{1} << 30, &gib_growth, 1);
    gib_took = absl::Now() - start;
  }
  WARN("a 1 GiB push against --max_inflight_mib=512: code " << static_cast<int>(gib[0])
       << " after " << absl::FormatDuration(gib_took) << ", ps:0's resident memory rose "
       << (gib_growth >> 20) << " MiB");
  CHECK(gib[0] == grpc::StatusCode::RESOURCE_EXHAUSTED);
  if (!testing::kSanitized) CHECK(gib_growth < (int64_t{800} << 20));
  Servers s(1, "inflight", {}, 0, "", 2, {"--max_inflight_mib=512"});
  int64_t bounded = 0;
  int exhausted = 0;
  for (grpc::StatusCode c : ConcurrentBigPushes(s, int64_t{200} << 20, &bounded)) {
    CHECK((c == grpc::StatusCode::INVALID_ARGUMENT || c == grpc::StatusCode::RESOURCE_EXHAUSTED));
    exhausted += c == grpc::StatusCode::RESOURCE_EXHAUSTED;
  }
  WARN("8 concurrent 200 MiB pushes: ps:0's resident memory rose " << (unbounded >> 20)
                                                                    << " MiB with an 8 GiB quota, "
                                                                    << (bounded >> 20)
                                                                    << " MiB with 512 MiB; "
                                                                    << exhausted
                                                                    << " of 8 refused "
                                                                       "RESOURCE_EXHAUSTED");
  CHECK(exhausted > 0);
  if (!testing::kSanitized) {
    // (The sanitizers' allocators keep or map memory their own way: resident
    // memory would measure them, not the quota.)
    CHECK(unbounded > (int64_t{1} << 30));
    CHECK(bounded < (int64_t{800} << 20));
  }
  // Nothing changed and the server still trains.
  CHECK_FALSE(s.procs[0]->Wait(absl::ZeroDuration()).has_value());
  auto w0 = s.Worker(0), w1 = s.Worker(1);
  Buffers b0(s.vars, 0.5f), b1(s.vars, 0.5f);
  SyncStep(s, *w0, *w1, b0, b1, 0);
  PsStatusResponse st;
  REQUIRE(s.chief->GetStatus(0, &st).ok());
  CHECK(st.version() == 1);
  CHECK(st.pushes_applied() == 2);
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

TEST_CASE("a server serves at most --max_concurrent_calls data calls; one more is refused at once",
          "[data_path][limits]") {
  Servers s(1, "callcap", {}, 0, "", 2, {"--max_concurrent_calls=4"});
  auto channel = CreateChannel(s.cluster->address(kPsJob, 0));
  grpc::GenericStub raw(channel);
  PullRequest req;
  req.set_incarnation(4242);
  req.set_worker(0);
  req.set_min_version(1000);  // never reached: each waits until its deadline
  req.set_timeout_ms(600000);
  const grpc::ByteBuffer request = SerializeMessage(req);
  absl::Mutex mu;
  int parked_done = 0;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<grpc::ByteBuffer> responses(4);
  for (int i = 0; i < 4; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    SetDeadline(contexts.back().get(), absl::Seconds(60));  // cancelled below
    raw.UnaryCall(contexts[i].get(), "/pstrain.PsService/Pull", grpc::StubOptions(), &request,
                  &responses[i], [&](grpc::Status) {
                    absl::MutexLock lock(&mu);
                    ++parked_done;
                  });
  }
  absl::SleepFor(absl::Seconds(1));  // all four parked by now
  // A fifth call, pull or push, is refused at once and names the limit. A
  // push fails with it; a pull, which only reads, is made again until its
  // deadline (its wait plus the rpc timeout: 1 + 1 s for this client).
  auto w0 = s.Worker(0), w1 = s.Worker(1);
  GrpcPsClient hurried(*s.cluster, &*s.placement, 0, absl::Seconds(1));
  hurried.set_incarnation(4242);
  Buffers b0(s.vars, 0.5f), b1(s.vars, 0.5f);
  const absl::Time t0 = absl::Now();
  std::vector<PushOutcome> out;
  absl::Status push = w1->PushFrom({0}, b1.src(), &out);
  CHECK(absl::Now() - t0 < absl::Seconds(3));
  CHECK(absl::IsResourceExhausted(push));
  CHECK(push.message().find("--max_concurrent_calls") != std::string::npos);
  const absl::Time t1 = absl::Now();
  PsClient::PullResult r;
  absl::Status pull = hurried.PullInto({0}, absl::Seconds(1), b0.dst(), &r);
  const absl::Duration pulled_for = absl::Now() - t1;
  INFO(pull.ToString());
  CHECK(absl::IsResourceExhausted(pull));
  CHECK(pull.message().find("--max_concurrent_calls") != std::string::npos);
  CHECK(pull.message().find("times until its deadline") != std::string::npos);
  CHECK(pulled_for >= absl::Milliseconds(1500));
  CHECK(pulled_for < absl::Seconds(6));
  PsStatusResponse st;
  REQUIRE(s.chief->GetStatus(0, &st).ok());  // GetStatus is not a data call
  CHECK(st.version() == 0);
  CHECK(st.pushes_applied() == 0);
  {
    absl::MutexLock lock(&mu);
    CHECK(parked_done == 0);
  }
  for (auto& ctx : contexts) ctx->TryCancel();
  {
    absl::MutexLock lock(&mu);
    auto all = [&parked_done]() { return parked_done == 4; };
    REQUIRE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(20)));
  }
  // Their places are free again once the server has ended them too (a
  // moment after their callers gave up): a pull made now gets through,
  // made again by the client while they are still taken.
  absl::Status again = w0->PullInto({0}, absl::Seconds(20), b0.dst(), &r);
  INFO(again.ToString());
  CHECK(again.ok());
  SyncStep(s, *w0, *w1, b0, b1, 0);
  REQUIRE(s.chief->GetStatus(0, &st).ok());
  CHECK(st.version() == 1);
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

TEST_CASE("synchronous handlers take at most --max_rpc_threads threads; a call past them is "
          "refused", "[data_path][limits]") {
  const std::string ckpt = JoinPath(testing::FreshTempDir("threadcap_ckpt"), "ckpt");
  Servers s(1, "threadcap", {}, 0,
            absl::StrCat("optimizer { learning_rate: 0.5 } ", kTables, " checkpoint { dir: \"",
                         ckpt, "\" every_steps: 1000 }"),
            2, {"--max_rpc_threads=8"});
  const int pid = s.procs[0]->pid();
  const int threads_before = Threads(pid);
  // 32 shard requests that each wait (a synchronous handler holds its
  // thread) for a checkpoint never cut.
  GetShardRequest req;
  req.set_incarnation(4242);
  req.set_step(1000);
  req.set_timeout_ms(3000);
  auto stub = PsService::NewStub(CreateChannel(s.cluster->address(kPsJob, 0)));
  constexpr int kCalls = 32;
  std::vector<grpc::StatusCode> codes(kCalls, grpc::StatusCode::OK);
  int threads_max = 0;
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    while (!done.load()) {
      threads_max = std::max(threads_max, Threads(pid));
      absl::SleepFor(absl::Milliseconds(10));
    }
  });
  std::vector<std::thread> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.emplace_back([&, i] {
      grpc::ClientContext ctx;
      SetDeadline(&ctx, absl::Seconds(20));
      GetShardResponse resp;
      codes[i] = stub->GetShard(&ctx, req, &resp).error_code();
    });
  }
  for (auto& t : calls) t.join();
  done = true;
  sampler.join();
  int exhausted = 0, waited = 0;
  for (grpc::StatusCode c : codes) {
    exhausted += c == grpc::StatusCode::RESOURCE_EXHAUSTED;
    waited += c == grpc::StatusCode::DEADLINE_EXCEEDED;
  }
  WARN("32 waiting shard requests, --max_rpc_threads=8: " << waited << " waited, " << exhausted
                                                    << " refused; threads " << threads_before
                                                    << " before, at most " << threads_max);
  CHECK(exhausted + waited == kCalls);
  CHECK(exhausted > 0);
  CHECK(waited <= 8);  // each held one of the 8 threads while it waited
  CHECK(threads_max - threads_before <= 16);  // those, and a few of gRPC's own

  // Row pulls waiting for a version never reached park as pulls do: none
  // holds a thread, so none is refused for the 8, and all end at their
  // deadline.
  const int threads_rows = Threads(pid);
  std::vector<absl::Status> rows(kCalls);
  std::atomic<int> rows_max{0};
  std::atomic<bool> rows_done{false};
  std::thread rows_sampler([&] {
    while (!rows_done.load()) {
      rows_max = std::max(rows_max.load(), Threads(pid));
      absl::SleepFor(absl::Milliseconds(10));
    }
  });
  std::vector<std::thread> pulls;
  for (int i = 0; i < kCalls; ++i) {
    pulls.emplace_back([&, i] {
      GrpcPsClient client(*s.cluster, &*s.placement, 0, absl::Seconds(1));
      client.set_incarnation(4242);
      const std::vector<uint64_t> ids = {7, 8};
      std::vector<float> out(ids.size() * 4);
      rows[i] = client.PullRows("ads", 4, ids, /*min_version=*/1000, absl::Seconds(2), out.data());
    });
  }
  for (auto& t : pulls) t.join();
  rows_done = true;
  rows_sampler.join();
  int rows_waited = 0;
  for (const absl::Status& st : rows) {
    INFO(st.ToString());
    rows_waited += absl::IsDeadlineExceeded(st);
  }
  WARN("32 waiting row pulls, --max_rpc_threads=8: " << rows_waited << " waited; threads "
                                                     << threads_rows << " before, at most "
                                                     << rows_max.load());
  INFO(rows[0].ToString());
  CHECK(rows_waited == kCalls);
  CHECK(rows_max.load() - threads_rows < 8);  // none holds a thread while it waits
}

TEST_CASE("load: 32 sync workers for 20 steps against 2 servers: every step is the exact mean",
          "[data_path][concurrency][load]") {
  // Each step's mean gradient is (sum_k (k + 1) + 32 * (j mod 3)) / 32 =
  // 16.5 + j mod 3, exact in float32; 20 steps at learning rate 1.
  constexpr int kClients = 32, kSteps = 20;
  Servers s(2, "load_sync", {{"w", {128, 64}}, {"b", {64}}}, 0,
            "optimizer { learning_rate: 1 } sync {}", kClients);
  std::vector<absl::Status> failures(kClients);
  std::vector<std::vector<double>> step_ms(kClients);
  std::vector<std::thread> clients;
  for (int k = 0; k < kClients; ++k) {
    clients.emplace_back([&, k] {
      std::unique_ptr<GrpcPsClient> c = s.Worker(k);
      Buffers b = ClientGradients(s.vars, k);
      std::vector<PushOutcome> out;
      PsClient::PullResult r;
      for (int64_t step = 0; step < kSteps && failures[k].ok(); ++step) {
        const absl::Time t0 = absl::Now();
        const std::vector<int64_t> at(2, step);
        failures[k] = c->PullInto(at, absl::Seconds(30), b.dst(), &r);
        if (failures[k].ok()) failures[k] = c->PushFrom(at, b.src(), &out);
        for (PushOutcome o : out) {
          if (failures[k].ok() && o != APPLIED && o != ACCUMULATED) {
            failures[k] = absl::InternalError("dropped");
          }
        }
        step_ms[k].push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
      }
    });
  }
  for (auto& t : clients) t.join();
  std::vector<double> all;
  for (const auto& v : step_ms) all.insert(all.end(), v.begin(), v.end());
  WARN("sync load: " << kClients << " workers x " << kSteps << " steps; step ms p50 "
                     << Percentile(all, 0.5) << ", p99 " << Percentile(all, 0.99) << ", max "
                     << Percentile(all, 1.0));
  for (const absl::Status& st : failures) CHECK(st.ok());
  const std::vector<std::vector<float>> got = PullAll(s);
  for (size_t v = 0; v < got.size(); ++v) {
    int64_t wrong = 0;
    for (size_t j = 0; j < got[v].size(); ++j) {
      wrong += got[v][j] != 1.0f - kSteps * (16.5f + static_cast<float>(j % 3));
    }
    CHECK(wrong == 0);
  }
  for (int server = 0; server < 2; ++server) {
    PsStatusResponse st;
    REQUIRE(s.chief->GetStatus(server, &st).ok());
    CHECK(st.version() == kSteps);
    CHECK(st.pushes_applied() == kSteps * kClients);
  }
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

std::vector<uint64_t> SomeIds(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> ids(n);
  for (uint64_t& id : ids) id = rng();
  return ids;
}

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

TEST_CASE("no lost update, sparse: 8 clients x 200 concurrent row pushes to 2 servers",
          "[data_path][embedding][concurrency]") {
  constexpr int kClients = 8, kPushes = 200;
  Servers s(2, "rows_lost", {}, 0,
            absl::StrCat("optimizer { learning_rate: 1 } async {} ",
                         "embedding_tables { name: \"ads\" dim: 4 init_scale: 0 }"),
            kClients);
  const std::vector<uint64_t> shared = SomeIds(64, 1);
  std::vector<std::thread> clients;
  std::vector<absl::Status> failures(kClients);
  for (int k = 0; k < kClients; ++k) {
    clients.emplace_back([&, k] {
      auto c = s.Worker(k);
      // Every shared id once, plus the client's own id twice.
      std::vector<uint64_t> ids = shared;
      ids.insert(ids.end(), {uint64_t(k), uint64_t(k)});
      std::vector<float> g(ids.size() * 4, 1.0f);
      std::vector<PushOutcome> out;
      for (int i = 0; i < kPushes && failures[k].ok(); ++i) {
        failures[k] = c->PushRows("ads", 4, ids, g.data(), {0, 0}, &out);
        for (PushOutcome o : out) {
          if (o != PUSH_OUTCOME_UNSPECIFIED && o != APPLIED && failures[k].ok()) {
            failures[k] = absl::InternalError("not applied");
          }
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  for (const absl::Status& st : failures) CHECK(st.ok());
  std::vector<float> rows(64 * 4), own(kClients * 4);
  REQUIRE(s.chief->PullRows("ads", 4, shared, 0, absl::Seconds(5), rows.data()).ok());
  REQUIRE(Mismatch(rows, -kClients * kPushes) == "");
  std::vector<uint64_t> own_ids;
  for (int k = 0; k < kClients; ++k) own_ids.push_back(k);
  REQUIRE(s.chief->PullRows("ads", 4, own_ids, 0, absl::Seconds(5), own.data()).ok());
  REQUIRE(Mismatch(own, -2 * kPushes) == "");
  int64_t on_each[2];
  for (int server = 0; server < 2; ++server) {
    PsStatusResponse st;
    REQUIRE(s.chief->GetStatus(server, &st).ok());
    on_each[server] = st.tables(0).rows();
  }
  CHECK(on_each[0] + on_each[1] == 64 + kClients);
  CHECK(on_each[0] > 0);
  CHECK(on_each[1] > 0);
}

}  // namespace
}  // namespace pstrain
