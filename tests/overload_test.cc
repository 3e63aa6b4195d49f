// The parameter server under load and abuse, against the real ps_server
// binary: no update lost to concurrent pushes (dense and rows, async and
// sync), malformed, oversized and stalled connections among 32 clients, and
// the limits that keep a server up: in-flight request memory, concurrent
// data calls, handler threads. The data path itself: tests/data_path_test.cc.
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
#include "common/security/auth.h"
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

TEST_CASE("no lost update: 8 clients x 200 concurrent async pushes to 2 servers, each applied "
          "exactly once", "[overload][concurrency]") {
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
          "[overload][concurrency][load]") {
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
          "[overload][security]") {
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
          "are refused past the quota, not held", "[overload][limits]") {
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

TEST_CASE("with a secret, unauthenticated calls are refused from their headers: their bodies "
          "take none of the in-flight memory, and the workers train on beside them",
          "[overload][limits][security]") {
  struct ResetCredentials {
    ~ResetCredentials() { SetCallCredentials("", ""); }
  } reset;
  const std::string secret = JoinPath(testing::FreshTempDir("gate_secret"), "cluster.secret");
  REQUIRE(CreateSecretFile(secret).ok());
  // Each client signs as the identity set when it is made.
  testing::ActAs("chief:0", secret);
  Servers s(1, "gate", {}, 0, "", 2, {"--max_inflight_mib=512", "--auth_secret_file=" + secret});
  testing::ActAs("worker:0", secret);
  auto w0 = s.Worker(0);
  testing::ActAs("worker:1", secret);
  auto w1 = s.Worker(1);
  SetCallCredentials("", "");  // the attacker's: none
  // Twice 8 concurrent pushes of 200 MiB, then one of 1 GiB, each on a
  // connection of its own: before the door, their bodies filled the quota
  // and gRPC reset streams to stay within it, the workers' among them.
  std::vector<grpc::StatusCode> codes;
  int64_t growth = 0;
  std::atomic<bool> attacking{true};
  std::thread attack([&] {
    for (auto [bytes, at_once] : {std::pair{int64_t{200} << 20, 8}, std::pair{int64_t{200} << 20, 8},
                                  std::pair{int64_t{1} << 30, 1}}) {
      int64_t g = 0;
      for (grpc::StatusCode c : ConcurrentBigPushes(s, bytes, &g, at_once)) codes.push_back(c);
      growth = std::max(growth, g);
    }
    attacking = false;
  });
  struct Joiner {
    std::thread* t;
    ~Joiner() { t->join(); }  // also when a step fails (it ends within its calls' deadlines)
  } joiner{&attack};
  Buffers b0(s.vars, 0.5f), b1(s.vars, 0.5f);
  int64_t steps = 0;
  for (; attacking.load() || steps < 3; ++steps) SyncStep(s, *w0, *w1, b0, b1, steps);
  while (attacking.load()) absl::SleepFor(absl::Milliseconds(10));
  WARN(steps << " steps trained beside 17 unauthenticated pushes (3.1 GiB); ps:0's resident "
             "memory rose at most " << (growth >> 20) << " MiB");
  REQUIRE(codes.size() == 17);
  for (grpc::StatusCode c : codes) CHECK(c == grpc::StatusCode::UNAUTHENTICATED);
  if (!testing::kSanitized) CHECK(growth < (int64_t{64} << 20));
  PsStatusResponse st;
  REQUIRE(s.chief->GetStatus(0, &st).ok());
  CHECK(st.version() == steps);
  CHECK(st.pushes_applied() == 2 * steps);
}

TEST_CASE("a server serves at most --max_concurrent_calls data calls; one more is refused at once",
          "[overload][limits]") {
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

TEST_CASE("synchronous handlers take at most --max_rpc_threads threads; a call past them is "
          "refused", "[overload][limits]") {
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
          "[overload][concurrency][load]") {
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

TEST_CASE("no lost update, sparse: 8 clients x 200 concurrent row pushes to 2 servers",
          "[overload][embedding][concurrency]") {
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
