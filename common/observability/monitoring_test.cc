#include "common/observability/monitoring.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/cluster/cluster_spec.h"
#include "common/storage/env.h"
#include "common/testing/https_get.h"
#include "common/security/tls.h"
#include "tools/certificate_authority.h"
#include "openssl/ssl.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace pstrain {
namespace {

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0);
  return fd;
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Sends `request` to 127.0.0.1:port and returns everything the server sent.
std::string Exchange(int port, const std::string& request) {
  const int fd = Connect(port);
  if (!request.empty()) REQUIRE(::send(fd, request.data(), request.size(), 0) > 0);
  std::string out = ReadAll(fd);
  ::close(fd);
  return out;
}

std::string Get(int port, const std::string& path) {
  return Exchange(port, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\n\r\n"));
}

TEST_CASE("the monitoring endpoint serves metrics, health and readiness", "[monitoring]") {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& family = prometheus::BuildCounter()
                     .Name("pstrain_test_events_total")
                     .Help("Events seen.")
                     .Register(*registry);
  family.Add({{"kind", "a"}}).Increment(3);
  std::atomic<bool> ready{false};
  auto server = MonitoringServer::Start(
      "127.0.0.1:0", {registry, ProcessMetrics()},
      [&ready]() -> std::string { return ready ? "" : "waiting for the chief"; });
  REQUIRE(server.ok());
  const int port = (*server)->port();
  REQUIRE(port > 0);

  const std::string metrics = Get(port, "/metrics");
  CHECK(metrics.rfind("HTTP/1.0 200 OK\r\n", 0) == 0);
  CHECK(metrics.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  CHECK(metrics.find("# TYPE pstrain_test_events_total counter") != std::string::npos);
  CHECK(metrics.find("pstrain_test_events_total{kind=\"a\"} 3") != std::string::npos);
  for (const char* name : {"process_cpu_seconds_total ", "process_resident_memory_bytes ",
                           "process_open_fds ", "process_threads ", "process_start_time_seconds "}) {
    INFO(name);
    CHECK(metrics.find(std::string("\n") + name) != std::string::npos);
  }
  CHECK(Get(port, "/healthz").find("200 OK\r\n") != std::string::npos);
  const std::string not_ready = Get(port, "/readyz");
  CHECK(not_ready.rfind("HTTP/1.0 503 Service Unavailable", 0) == 0);
  CHECK(not_ready.find("waiting for the chief") != std::string::npos);
  ready = true;
  CHECK(Get(port, "/readyz").rfind("HTTP/1.0 200 OK", 0) == 0);
  CHECK(Get(port, "/nope").rfind("HTTP/1.0 404", 0) == 0);
  CHECK(Exchange(port, "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.0 405", 0) == 0);
  CHECK(Exchange(port, "garbage\r\n\r\n").rfind("HTTP/1.0 400", 0) == 0);
  // An oversized request is refused; the next is served.
  CHECK(Exchange(port, std::string(8192, 'x')).rfind("HTTP/1.0 400", 0) == 0);
  CHECK(Get(port, "/healthz").find("ok\n") != std::string::npos);
  // A request cut short (the client half-closes) is answered 400 at once.
  {
    const int fd = Connect(port);
    REQUIRE(::send(fd, "GET /metr", 9, 0) == 9);
    ::shutdown(fd, SHUT_WR);
    CHECK(ReadAll(fd).rfind("HTTP/1.0 400", 0) == 0);
    ::close(fd);
  }
  // A client that connects and sends nothing holds only its own connection:
  // the next client is answered at once, and the silent one is answered
  // (400) at its 2 s deadline.
  {
    const int silent = Connect(port);
    absl::SleepFor(absl::Milliseconds(50));  // accepted first
    const absl::Time start = absl::Now();
    CHECK(Get(port, "/healthz").find("ok\n") != std::string::npos);
    CHECK(absl::Now() - start < absl::Seconds(1));
    CHECK(ReadAll(silent).rfind("HTTP/1.0 400", 0) == 0);
    ::close(silent);
  }
}

TEST_CASE("clients holding connections open never starve /healthz", "[monitoring]") {
  // 18 clients holding half-sent requests starved /healthz for 17 s when
  // the endpoint served one connection at a time: longer than the 1 s
  // timeout of the liveness probes pstrain's manifests set.
  auto server = MonitoringServer::Start("127.0.0.1:0", {}, nullptr);
  REQUIRE(server.ok());
  const int port = (*server)->port();
  std::vector<int> slow;
  for (int i = 0; i < 18; ++i) {
    slow.push_back(Connect(port));
    REQUIRE(::send(slow.back(), "GET /metr", 9, 0) == 9);
  }
  absl::SleepFor(absl::Milliseconds(100));  // all accepted
  for (int probe = 0; probe < 3; ++probe) {
    const absl::Time start = absl::Now();
    CHECK(Get(port, "/healthz").find("ok\n") != std::string::npos);
    CHECK(absl::Now() - start < absl::Seconds(1));
  }
  // More than it serves at once: the oldest are closed to make room, the
  // probe is still answered, and the shed connections are counted.
  for (size_t i = 0; i < MonitoringServer::kMaxClients + 16; ++i) {
    slow.push_back(Connect(port));
    REQUIRE(::send(slow.back(), "GET /", 5, 0) == 5);
  }
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  const std::string metrics = Get(port, "/metrics");
  CHECK(absl::Now() - start < absl::Seconds(1));
  INFO(metrics);
  const std::string shed = "pstrain_monitoring_refused_total{reason=\"shed\"} ";
  const size_t at = metrics.find(shed);
  REQUIRE(at != std::string::npos);
  CHECK(std::stoi(metrics.substr(at + shed.size())) >= 1);
  for (int fd : slow) ::close(fd);
}

TEST_CASE("the monitoring endpoint refuses bad addresses and taken ports", "[monitoring]") {
  for (const char* bad : {"nohost", "127.0.0.1:99999", "127.0.0.1:x", "not-an-ip:80"}) {
    INFO(bad);
    CHECK_FALSE(MonitoringServer::Start(bad, {}, nullptr).ok());
  }
  auto first = MonitoringServer::Start("127.0.0.1:0", {}, nullptr);
  REQUIRE(first.ok());
  auto second = MonitoringServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()), {}, nullptr);
  CHECK_FALSE(second.ok());
}

TEST_CASE("with mutual TLS the endpoint serves HTTPS, and /metrics only to a certified client",
          "[monitoring][tls]") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = JoinPath(tmp ? tmp : "/tmp", absl::StrCat("monitoring_tls_", ::getpid()));
  const std::string other = dir + "_other";
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::Parse(
      R"({"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"], "worker": ["127.0.0.1:3"]})", "test");
  REQUIRE(spec.ok());
  std::vector<std::string> written;
  for (const std::string& d : {dir, other}) {
    REQUIRE(Env::Default()->CreateDirs(d).ok());
    REQUIRE(WriteClusterCertificates(&*spec, d, absl::Hours(48), &written).ok());
  }
  // A worker serves its metrics with its own certificate, which names only
  // the metrics endpoint's name.
  absl::StatusOr<TlsConfig> worker = LoadTls(TlsFilesIn(dir, "worker:0"));
  REQUIRE(worker.ok());
  CHECK(CertificateNames(*worker, kMetricsAltName));
  CHECK_FALSE(CertificateNames(*worker, TaskAltName("worker:0")));
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("pstrain_test_events_total").Help("Events.").Register(*registry)
      .Add({}).Increment(5);
  auto server = MonitoringServer::Start(
      "127.0.0.1:0", {registry}, [] { return std::string(); }, {{"job", "worker"}},
      std::make_shared<const TlsConfig>(*worker));
  REQUIRE(server.ok());
  const int port = (*server)->port();
  CHECK((*server)->url() == absl::StrCat("https://127.0.0.1:", port, "/metrics"));

  std::string error;
  const TlsFiles monitor = TlsFilesIn(dir, kMonitorIdentity);
  const std::string metrics = testing::HttpsGet(port, "/metrics", monitor, kMetricsAltName, &error);
  INFO(error);
  CHECK(metrics.rfind("HTTP/1.0 200 OK\r\n", 0) == 0);
  CHECK(metrics.find("pstrain_test_events_total{job=\"worker\"} 5") != std::string::npos);
  // Any certificate of the cluster CA may read them: a task's too.
  CHECK(testing::HttpsGet(port, "/metrics", TlsFilesIn(dir, "ps:0"), kMetricsAltName, &error)
            .rfind("HTTP/1.0 200 OK", 0) == 0);

  // Without a client certificate: the probes answer, /metrics does not.
  const TlsFiles anonymous{monitor.ca_file, "", ""};
  CHECK(testing::HttpsGet(port, "/healthz", anonymous, kMetricsAltName, &error)
            .rfind("HTTP/1.0 200 OK", 0) == 0);
  CHECK(testing::HttpsGet(port, "/readyz", anonymous, kMetricsAltName, &error)
            .rfind("HTTP/1.0 200 OK", 0) == 0);
  const std::string refused = testing::HttpsGet(port, "/metrics", anonymous, kMetricsAltName, &error);
  CHECK(refused.rfind("HTTP/1.0 403 Forbidden", 0) == 0);
  CHECK(refused.find("client certificate") != std::string::npos);
  CHECK(refused.find("pstrain_test_events_total") == std::string::npos);

  // A client certificate of another CA ends the handshake; a client that
  // trusts another CA, or checks another name, refuses the server; plain
  // HTTP gets no answer. None of it stops the endpoint.
  error.clear();
  CHECK(testing::HttpsGet(port, "/metrics", TlsFilesIn(other, kMonitorIdentity), kMetricsAltName,
                          &error)
            .empty());
  CHECK_FALSE(error.empty());
  error.clear();
  CHECK(testing::HttpsGet(port, "/healthz", TlsFiles{JoinPath(other, "ca.crt"), "", ""},
                          kMetricsAltName, &error)
            .empty());
  CHECK(error.find("certificate verify failed") != std::string::npos);
  error.clear();
  CHECK(testing::HttpsGet(port, "/healthz", anonymous, TaskAltName("worker:0"), &error).empty());
  CHECK(error.find("certificate verify failed") != std::string::npos);
  CHECK(Get(port, "/metrics").find("pstrain_test_events_total") == std::string::npos);
  // A client that connects and says nothing holds the handshake 2 s at most.
  {
    const int silent = Connect(port);
    absl::SleepFor(absl::Milliseconds(50));
    const absl::Time start = absl::Now();
    CHECK(testing::HttpsGet(port, "/healthz", anonymous, kMetricsAltName, &error)
              .rfind("HTTP/1.0 200 OK", 0) == 0);
    CHECK(absl::Now() - start < absl::Seconds(5));
    ::close(silent);
  }
  // A client that resets the connection while the server answers it (the
  // request line sent, no blank line, then a reset) costs the server an
  // EPIPE, not the process a SIGPIPE.
  {
    std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()),
                                                            SSL_CTX_free);
    REQUIRE(SSL_CTX_load_verify_locations(ctx.get(), monitor.ca_file.c_str(), nullptr) == 1);
    const int fd = Connect(port);
    std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()), SSL_free);
    REQUIRE(SSL_set_fd(ssl.get(), fd) == 1);
    REQUIRE(SSL_connect(ssl.get()) == 1);
    const std::string line = "GET /healthz HTTP/1.0\r\n";
    REQUIRE(SSL_write(ssl.get(), line.data(), static_cast<int>(line.size())) > 0);
    absl::SleepFor(absl::Milliseconds(100));  // read by the server, which waits for more
    linger reset{1, 0};
    REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset)) == 0);
    ::close(fd);
  }
  absl::SleepFor(absl::Milliseconds(200));
  CHECK(testing::HttpsGet(port, "/healthz", anonymous, kMetricsAltName, &error)
            .rfind("HTTP/1.0 200 OK", 0) == 0);
  // Each refusal is counted, by reason.
  const std::string after = testing::HttpsGet(port, "/metrics", monitor, kMetricsAltName, &error);
  INFO(after);
  CHECK(after.find("pstrain_monitoring_refused_total{reason=\"no_client_certificate\",job=\"worker\"} 1") !=
        std::string::npos);
  // The foreign client certificate, the plain request and the silent client
  // (clients that refused the server may end before the server notices).
  const size_t at = after.find("pstrain_monitoring_refused_total{reason=\"tls_handshake\"");
  REQUIRE(at != std::string::npos);
  const double handshakes = std::stod(after.substr(after.find("} ", at) + 2));
  CHECK(handshakes >= 3);
  CHECK(handshakes <= 5);
  // Once the scraper's certificate is revoked, the endpoint (started
  // before any list was made) refuses it at the next handshake; other
  // certificates of the CA still read /metrics.
  std::string crl;
  REQUIRE(RevokeCertificate(dir, kMonitorIdentity, &crl).ok());
  error.clear();
  CHECK(testing::HttpsGet(port, "/metrics", monitor, kMetricsAltName, &error).empty());
  CHECK_FALSE(error.empty());
  CHECK(testing::HttpsGet(port, "/metrics", TlsFilesIn(dir, "ps:0"), kMetricsAltName, &error)
            .rfind("HTTP/1.0 200 OK", 0) == 0);
  REQUIRE(DeleteRecursively(Env::Default(), dir).ok());
  REQUIRE(DeleteRecursively(Env::Default(), other).ok());
}

}  // namespace
}  // namespace pstrain
