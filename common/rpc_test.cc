#include "common/rpc.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
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

TEST_CASE("retry with backoff retries UNAVAILABLE until it succeeds", "[rpc]") {
  int calls = 0;
  absl::Status st = RetryWithBackoff("connect", absl::Seconds(10), [&calls]() {
    return ++calls < 3 ? absl::UnavailableError("not yet") : absl::OkStatus();
  });
  CHECK(st.ok());
  CHECK(calls == 3);
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

}  // namespace
}  // namespace pstrain
