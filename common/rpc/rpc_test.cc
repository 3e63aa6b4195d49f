#include "common/rpc/rpc.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/base/shutdown.h"
#include "common/rpc/rpc_stats.h"
#include "common/rpc/wire_frame.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/ps_service.grpc.pb.h"

namespace pstrain {
namespace {

TEST_CASE("status codes survive the trip through gRPC", "[rpc]") {
  absl::Status st = absl::FailedPreconditionError("stale incarnation");
  grpc::Status g = ToGrpcStatus(st);
  CHECK(g.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  absl::Status back = FromGrpcStatus(g, "Push to ps:0");
  CHECK(absl::IsFailedPrecondition(back));
  CHECK(back.message() == "Push to ps:0: stale incarnation");
  CHECK(FromGrpcStatus(grpc::Status::OK, "x").ok());
  CHECK(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST_CASE("the codes a call to a dying peer ends with may mean a lost peer; answers do not",
          "[rpc]") {
  // What gRPC's C core ends a call with when the peer dies under it or is
  // not there: UNAVAILABLE (refused, reset), DEADLINE_EXCEEDED, UNKNOWN
  // ("Stream removed"), INTERNAL (a stream reset mid-message).
  CHECK(MayHaveLostPeer(absl::UnavailableError("recvmsg:Connection reset by peer")));
  CHECK(MayHaveLostPeer(absl::DeadlineExceededError("Deadline Exceeded")));
  CHECK(MayHaveLostPeer(absl::UnknownError("Stream removed")));
  CHECK(MayHaveLostPeer(absl::InternalError("Received RST_STREAM with error code 2")));
  // A peer's own answers.
  CHECK_FALSE(MayHaveLostPeer(absl::OkStatus()));
  CHECK_FALSE(MayHaveLostPeer(absl::InvalidArgumentError("bad shape")));
  CHECK_FALSE(MayHaveLostPeer(absl::FailedPreconditionError("stale incarnation")));
  CHECK_FALSE(MayHaveLostPeer(absl::PermissionDeniedError("not a worker")));
  CHECK_FALSE(MayHaveLostPeer(absl::ResourceExhaustedError("over the in-flight bound")));
  CHECK_FALSE(MayHaveLostPeer(absl::CancelledError("stopped")));
  // And a real call to a port nobody listens on.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const int port = ntohs(addr.sin_port);
  ::close(fd);  // bound, never listened on, closed: connections are refused
  auto stub = PsService::NewStub(CreateChannel(absl::StrCat("127.0.0.1:", port)));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(5));
  PsStatusRequest req;
  PsStatusResponse resp;
  const absl::Status st = FromGrpcStatus(stub->GetStatus(&ctx, req, &resp), "GetStatus");
  INFO(st);
  CHECK(MayHaveLostPeer(st));
}

TEST_CASE("the default in-flight memory is an eighth of the machine's, 512 MiB..2 GiB",
          "[rpc]") {
  constexpr int64_t kMiB = int64_t{1} << 20, kGiB = int64_t{1} << 30;
  CHECK(DefaultInflightBytes(2 * kGiB) == 512 * kMiB);   // a small container: the floor
  CHECK(DefaultInflightBytes(8 * kGiB) == 1 * kGiB);
  CHECK(DefaultInflightBytes(24 * kGiB) == 2 * kGiB);    // this machine: the ceiling
  CHECK(DefaultInflightBytes(int64_t{1} << 40) == 2 * kGiB);
  CHECK(DefaultInflightBytes(0) == kMinInflightBytes);   // unknown: still two messages
  CHECK(ValidateServerLimits(ServerLimits{DefaultInflightBytes(0)}).ok());
}

TEST_CASE("a job's in-flight memory: the default, raised to its calls' need up to half the "
          "machine", "[rpc]") {
  constexpr int64_t kMiB = int64_t{1} << 20, kGiB = int64_t{1} << 30;
  CHECK(JobInflightQuota(10 * kMiB, 24 * kGiB) == 2 * kGiB);  // a small job: the default
  CHECK(JobInflightQuota(5 * kGiB, 24 * kGiB) == 5 * kGiB);   // 16 workers of a large model
  CHECK(JobInflightQuota(33 * kGiB, 24 * kGiB) == 12 * kGiB);  // never past half the machine
  CHECK(JobInflightQuota(3 * kGiB, 2 * kGiB) == 1 * kGiB);
  CHECK(JobInflightQuota(3 * kGiB, 512 * kMiB) == 512 * kMiB);  // nor below two messages
  CHECK(JobInflightQuota(std::numeric_limits<int64_t>::max(), 0) == kMinInflightBytes);
  // Two servers and the chief on the machine: half of it among the three.
  CHECK(JobInflightQuota(33 * kGiB, 24 * kGiB, 3) == 4 * kGiB);
  CHECK(JobInflightQuota(33 * kGiB, 2 * kGiB, 3) == 512 * kMiB);  // the default, at least
}

TEST_CASE("retry with backoff retries UNAVAILABLE until it succeeds", "[rpc]") {
  int calls = 0;
  absl::Status st = RetryWithBackoff("connect", absl::Seconds(10), [&calls]() {
    return ++calls < 3 ? absl::UnavailableError("not yet") : absl::OkStatus();
  });
  CHECK(st.ok());
  CHECK(calls == 3);
}

TEST_CASE("a call refused as signed before its server started is made again, to a deadline",
          "[rpc]") {
  const absl::Status before =
      absl::UnavailableError("Initialize: signed 3s before this server started (...)");
  REQUIRE(IsSignedBeforeStart(before));
  int calls = 0;
  // Refused twice, then admitted.
  CHECK(RetrySignedBeforeStart(absl::Now() + absl::Seconds(10), [&] {
          return ++calls < 3 ? before : absl::OkStatus();
        }).ok());
  CHECK(calls == 3);
  // Another error: returned at once.
  calls = 0;
  absl::Status other = RetrySignedBeforeStart(absl::Now() + absl::Seconds(10), [&] {
    ++calls;
    return absl::PermissionDeniedError("no");
  });
  CHECK(absl::IsPermissionDenied(other));
  CHECK(calls == 1);
  // Refused until the deadline: DEADLINE_EXCEEDED naming the clocks, within it.
  const absl::Time start = absl::Now();
  absl::Status until = RetrySignedBeforeStart(start + absl::Milliseconds(300), [&] { return before; });
  CHECK(absl::IsDeadlineExceeded(until));
  CHECK_FALSE(IsSignedBeforeStart(until));
  CHECK(std::string(until.message()).find("clocks") != std::string::npos);
  CHECK(absl::Now() - start < absl::Seconds(2));
  // A last try cut short by the deadline says what came before it.
  calls = 0;
  absl::Status cut = RetrySignedBeforeStart(absl::Now() + absl::Seconds(10), [&] {
    return ++calls == 1 ? before : absl::DeadlineExceededError("deadline");
  });
  CHECK(absl::IsDeadlineExceeded(cut));
  CHECK(std::string(cut.message()).find("before this server started") != std::string::npos);
  // A stop ends the wait.
  StopSignal stop;
  stop.Stop("stopping");
  calls = 0;
  CHECK(absl::IsCancelled(
      RetrySignedBeforeStart(absl::Now() + absl::Seconds(10), [&] { ++calls; return before; },
                             &stop)));
  CHECK(calls == 1);
}

TEST_CASE("retry gives up at once on errors that retrying cannot fix", "[rpc]") {
  int calls = 0;
  absl::Status st = RetryWithBackoff("push", absl::Seconds(10), [&calls]() {
    ++calls;
    return absl::InvalidArgumentError("bad shape");
  });
  CHECK(absl::IsInvalidArgument(st));
  CHECK(calls == 1);
  CHECK(std::string(st.message()).find("push failed after 1 attempt") != std::string::npos);
}

TEST_CASE("retry stops at its deadline", "[rpc]") {
  const absl::Time start = absl::Now();
  absl::Status st = RetryWithBackoff("connect", absl::Milliseconds(300),
                                     []() { return absl::UnavailableError("down"); });
  const absl::Duration took = absl::Now() - start;
  CHECK(absl::IsUnavailable(st));
  CHECK(took >= absl::Milliseconds(300));
  CHECK(took < absl::Seconds(5));
}

TEST_CASE("a second server on a port in use fails with a clear status", "[rpc]") {
  PsService::Service service_a, service_b;  // every method answers UNIMPLEMENTED
  std::unique_ptr<grpc::Server> first;
  int port = 0;
  // Find a port this process can bind (a handful of tries against races).
  for (int p = 23000 + (::getpid() % 20000); p < 65000 && first == nullptr; p += 7) {
    auto s = StartServer(absl::StrCat("127.0.0.1:", p), &service_a);
    if (s.ok()) {
      first = std::move(*s);
      port = p;
    }
  }
  REQUIRE(first != nullptr);
  auto second = StartServer(absl::StrCat("127.0.0.1:", port), &service_b);
  CHECK(absl::IsUnavailable(second.status()));
  CHECK(std::string(second.status().message()).find(std::to_string(port)) != std::string::npos);
  first->Shutdown();
  CHECK_FALSE(StartServer("127.0.0.1:0", &service_b).ok());  // port 0 is not a task address
}

// Whether a TCP connection to host:port is accepted.
bool Connects(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

TEST_CASE("a server listens on its task's host only, or where --bind says", "[rpc]") {
  PsService::Service service;
  int tested = 0;
  // 127.0.0.2 is loopback too on Linux, but not the address the task names.
  for (int p = 24000 + (::getpid() % 20000); p < 65000; p += 11) {
    auto s = StartServer(absl::StrCat("127.0.0.1:", p), &service);
    if (!s.ok()) continue;
    CHECK(Connects("127.0.0.1", p));
    CHECK_FALSE(Connects("127.0.0.2", p));
    (*s)->Shutdown();
    ++tested;
    break;
  }
  for (int p = 25000 + (::getpid() % 20000); p < 65000; p += 13) {
    auto s = StartServer(absl::StrCat("127.0.0.1:", p), &service, "0.0.0.0");
    if (!s.ok()) continue;
    CHECK(Connects("127.0.0.1", p));
    CHECK(Connects("127.0.0.2", p));
    (*s)->Shutdown();
    ++tested;
    break;
  }
  CHECK(tested == 2);
  auto bad = StartServer("127.0.0.1:1", &service, "not a host");
  CHECK(absl::IsInvalidArgument(bad.status()));
  CHECK(std::string(bad.status().message()).find("--bind") != std::string::npos);
}

// Answers GetStatus with a fixed version, and Push (raw bytes, as the real
// server takes it) with an echo of its request; everything else is
// UNIMPLEMENTED.
class CountedService final : public PsService::WithRawCallbackMethod_Push<PsService::Service> {
 public:
  grpc::Status GetStatus(grpc::ServerContext*, const PsStatusRequest*,
                         PsStatusResponse* resp) override {
    resp->set_version(12345);
    resp->set_incarnation(0xabcdef);
    return grpc::Status::OK;
  }
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                 grpc::ByteBuffer* resp) override {
    *resp = *req;
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

// `service` on a free loopback port (a handful of tries against races).
std::unique_ptr<grpc::Server> StartOnSomePort(grpc::Service* service, int* port) {
  for (int p = 26000 + (::getpid() % 20000); p < 65000; p += 17) {
    auto s = StartServer(absl::StrCat("127.0.0.1:", p), service);
    if (s.ok()) {
      *port = p;
      return std::move(*s);
    }
  }
  return nullptr;
}

struct Counts {
  uint64_t ok = 0, unimplemented = 0, calls = 0, sent = 0, received = 0;
};
Counts Read(RpcStats& stats, const char* method) {
  RpcStats::Method* m = stats.Find(method);
  return {m->by_code[0].load(), m->by_code[grpc::StatusCode::UNIMPLEMENTED].load(),
          m->seconds.Read().cumulative.back(), m->sent_bytes.load(), m->received_bytes.load()};
}

TEST_CASE("every call served is counted by method and code, with its bytes", "[rpc]") {
  CountedService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartOnSomePort(&service, &port);
  REQUIRE(server != nullptr);
  const char kStatus[] = "/pstrain.PsService/GetStatus";
  const char kShutdown[] = "/pstrain.PsService/Shutdown";
  const char kPush[] = "/pstrain.PsService/Push";
  // The stats are the process's: compare before and after.
  const Counts s0 = Read(ServerRpcStats(), kStatus);
  const Counts sd0 = Read(ServerRpcStats(), kShutdown);
  const Counts sp0 = Read(ServerRpcStats(), kPush);

  std::shared_ptr<grpc::Channel> channel = CreateChannel(absl::StrCat("127.0.0.1:", port));
  auto stub = PsService::NewStub(channel);
  PsStatusRequest req;
  PsStatusResponse expected;
  expected.set_version(12345);
  expected.set_incarnation(0xabcdef);
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    PsStatusResponse resp;
    REQUIRE(stub->GetStatus(&ctx, req, &resp).ok());
  }
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    ShutdownRequest sreq;
    sreq.set_reason("test");
    ShutdownResponse sresp;
    CHECK(stub->Shutdown(&ctx, sreq, &sresp).error_code() == grpc::StatusCode::UNIMPLEMENTED);
  }
  // A raw call of 100,000 bytes, echoed.
  grpc::GenericStub raw(channel);
  const std::string payload(100000, 'x');
  grpc::Slice slice(payload);
  grpc::ByteBuffer request(&slice, 1), response;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    REQUIRE(RawCall(&raw, &ctx, kPush, request, &response).ok());
  }
  server->Shutdown();

  const Counts s1 = Read(ServerRpcStats(), kStatus);
  const uint64_t req_bytes = req.ByteSizeLong(), resp_bytes = expected.ByteSizeLong();
  CHECK(resp_bytes > 0);
  CHECK(s1.ok - s0.ok == 3);
  CHECK(s1.calls - s0.calls == 3);  // the histogram's count
  CHECK(s1.received - s0.received == 3 * req_bytes);
  CHECK(s1.sent - s0.sent == 3 * resp_bytes);

  const Counts sd1 = Read(ServerRpcStats(), kShutdown);
  CHECK(sd1.unimplemented - sd0.unimplemented == 2);
  CHECK(sd1.ok == sd0.ok);
  CHECK(sd1.sent == sd0.sent);  // an error carries no message

  const Counts sp1 = Read(ServerRpcStats(), kPush);
  CHECK(sp1.ok - sp0.ok == 1);
  CHECK(sp1.received - sp0.received == 100000);
  CHECK(sp1.sent - sp0.sent == 100000);

  RpcStats::Method* m = ServerRpcStats().Find(kStatus);
  CHECK(m->service == "pstrain.PsService");
  CHECK(m->name == "GetStatus");
}

TEST_CASE("calls of unknown methods are refused and counted under one record", "[rpc]") {
  CountedService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartOnSomePort(&service, &port);
  REQUIRE(server != nullptr);
  const uint64_t before = Read(ServerRpcStats(), "/unknown").unimplemented;
  const size_t methods_before = ServerRpcStats().Methods().size();
  grpc::GenericStub raw(CreateChannel(absl::StrCat("127.0.0.1:", port)));
  const std::string junk(64, '\x7f');
  grpc::Slice slice(junk);
  grpc::ByteBuffer request(&slice, 1), response;
  for (int i = 0; i < 30; ++i) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    const std::string method = i % 2 == 0 ? absl::StrCat("/made.Up/Method", i)
                                          : absl::StrCat("/pstrain.PsService/Nope", i);
    CHECK(RawCall(&raw, &ctx, method, request, &response).error_code() ==
          grpc::StatusCode::UNIMPLEMENTED);
  }
  // The server still answers, and 30 names made one record at most.
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(10));
  PsStatusResponse resp;
  CHECK(PsService::NewStub(CreateChannel(absl::StrCat("127.0.0.1:", port)))
            ->GetStatus(&ctx, PsStatusRequest(), &resp)
            .ok());
  server->Shutdown();
  CHECK(ServerRpcStats().Methods().size() <= methods_before + 2);  // "unknown", GetStatus
  CHECK(Read(ServerRpcStats(), "/unknown").unimplemented - before == 30);
}

TEST_CASE("a histogram puts each value in the first bucket that holds it", "[rpc]") {
  Histogram h({1, 2, 5});
  for (double v : {0.5, 1.0, 1.5, 2.0, 4.0, 5.0, 9.0}) h.Observe(v);
  const Histogram::Snapshot s = h.Read();
  CHECK(s.cumulative == std::vector<uint64_t>{2, 4, 6, 7});  // le=1, 2, 5, +Inf
  CHECK(s.sum == Approx(23.0));
}

}  // namespace
}  // namespace pstrain
