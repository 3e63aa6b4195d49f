// Mutual TLS: the certificates pstrain certs writes (checked by openssl
// itself), what LoadTls refuses, and calls over TLS through a real gRPC
// server: who the server sees, and what it refuses.
#include "common/security/tls.h"
#include "common/security/tls_watcher.h"
#include "tools/certificate_authority.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/security/auth.h"
#include "common/cluster/cluster_spec.h"
#include "common/storage/env.h"
#include "common/rpc/rpc.h"
#include "proto/ps_service.grpc.pb.h"

namespace pstrain {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir =
      JoinPath(base ? base : "/tmp", absl::StrCat("tls_", name, "_", ::getpid()));
  if (Env::Default()->IsDirectory(dir)) REQUIRE(DeleteRecursively(Env::Default(), dir).ok());
  REQUIRE(Env::Default()->CreateDirs(dir).ok());
  return dir;
}

ClusterSpec Spec(const std::string& json) {
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::Parse(json, "test");
  INFO(spec.status().ToString());
  REQUIRE(spec.ok());
  return *spec;
}

// Runs `command`, returning its output (stdout and stderr) and exit code.
std::pair<std::string, int> Run(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int status = ::pclose(p);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

bool HaveOpenssl() { return Run("command -v openssl").second == 0; }

TlsConfig Load(const std::string& dir, const std::string& identity) {
  absl::StatusOr<TlsConfig> tls = LoadTls(TlsFilesIn(dir, identity));
  INFO(tls.status().ToString());
  REQUIRE(tls.ok());
  return *tls;
}

// A task's material as a daemon holds it: static (gRPC's credentials over
// the PEMs), or `watched` (over a watcher's staging directory, its files
// looked at every second).
std::shared_ptr<const TlsConfig> Material(const std::string& dir, const std::string& id,
                                          bool watched) {
  TlsConfig t = Load(dir, id);
  if (watched) {
    absl::StatusOr<std::shared_ptr<TlsWatcher>> w =
        TlsWatcher::Start(TlsFilesIn(dir, id), id, absl::Seconds(1));
    REQUIRE(w.ok());
    t.watcher = *w;
  }
  return std::make_shared<const TlsConfig>(t);
}

TEST_CASE("pstrain's certificates are a CA and one per task that openssl accepts", "[tls]") {
  const std::string dir = TempDir("write");
  const ClusterSpec spec = Spec(
      R"({"chief": ["[::1]:2220"], "ps": ["ps-0.example.org:2221"], "worker": ["127.0.0.1:2222"]})");
  std::vector<std::string> written;
  REQUIRE(WriteClusterCertificates(&spec, dir, absl::Hours(24 * 30), &written).ok());
  CHECK(written.size() == 2 + 2 * 5);  // the CA, and chief, ps, worker, operator and monitor
  for (const char* id : {"chief:0", "ps:0", "worker:0", "operator", "monitor"}) {
    const TlsConfig tls = Load(dir, id);
    CHECK(tls.identity == id);
    CHECK(tls.not_after > absl::Now() + absl::Hours(24 * 29));
    CHECK(tls.not_after < absl::Now() + absl::Hours(24 * 31));
    struct stat st;
    REQUIRE(::stat(TlsFilesIn(dir, id).key_file.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
  }
  struct stat st;
  REQUIRE(::stat(JoinPath(dir, "ca.key").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  // A second run signs with the same CA: certificates of both runs verify.
  const std::string ca = *Env::Default()->ReadFile(JoinPath(dir, "ca.crt"));
  const std::string old_ps = *Env::Default()->ReadFile(JoinPath(dir, "ps-0.crt"));
  written.clear();
  REQUIRE(WriteClusterCertificates(&spec, dir, absl::Hours(24 * 30), &written).ok());
  CHECK(written.size() == 2 * 5);
  CHECK(*Env::Default()->ReadFile(JoinPath(dir, "ca.crt")) == ca);
  // Asked for longer than the CA lives (30 days and one): capped at the CA.
  absl::Time expires;
  written.clear();
  REQUIRE(WriteClusterCertificates(&spec, dir, absl::Hours(24 * 400), &written, &expires).ok());
  CHECK(expires < absl::Now() + absl::Hours(24 * 31) + absl::Minutes(1));
  CHECK(Load(dir, "worker:0").not_after <= expires + absl::Seconds(1));
  CHECK(*Env::Default()->ReadFile(JoinPath(dir, "ps-0.crt")) != old_ps);
  Load(dir, "ps:0");

  if (!HaveOpenssl()) {
    WARN("openssl is not installed: its view of the certificates was not checked");
    return;
  }
  auto [verify, code] = Run(absl::StrCat("openssl verify -CAfile ", dir, "/ca.crt ", dir,
                                         "/chief-0.crt ", dir, "/ps-0.crt ", dir,
                                         "/worker-0.crt ", dir, "/operator.crt ", dir,
                                         "/monitor.crt"));
  INFO(verify);
  CHECK(code == 0);
  CHECK(verify.find("ps-0.crt: OK") != std::string::npos);
  auto [text, code2] = Run(absl::StrCat("openssl x509 -noout -text -in ", dir, "/ps-0.crt; ",
                                        "openssl x509 -noout -text -in ", dir, "/chief-0.crt"));
  INFO(text);
  REQUIRE(code2 == 0);
  CHECK(text.find("CN = ps:0") != std::string::npos);
  CHECK(text.find("DNS:ps-0.example.org, DNS:ps-0.task.pstrain, DNS:metrics.pstrain") !=
        std::string::npos);
  CHECK(text.find("DNS:chief-0.task.pstrain") != std::string::npos);
  CHECK(text.find("IP Address:0:0:0:0:0:0:0:1") != std::string::npos);
  CHECK(text.find("TLS Web Server Authentication, TLS Web Client Authentication") !=
        std::string::npos);
  CHECK(text.find("CA:FALSE") != std::string::npos);
  // A worker serves no RPCs: its certificate names only its metrics
  // endpoint (no host, no task name), so it passes for no RPC server.
  auto [worker, code4] = Run(absl::StrCat("openssl x509 -noout -text -in ", dir, "/worker-0.crt"));
  INFO(worker);
  REQUIRE(code4 == 0);
  CHECK(worker.find("CN = worker:0") != std::string::npos);
  CHECK(worker.find("TLS Web Server Authentication, TLS Web Client Authentication") !=
        std::string::npos);
  const size_t san = worker.find("X509v3 Subject Alternative Name:");
  REQUIRE(san != std::string::npos);
  const size_t names = worker.find_first_not_of(" \n", worker.find('\n', san));
  CHECK(worker.substr(names, worker.find('\n', names) - names) == "DNS:metrics.pstrain");
  // The operator's and the scraper's are for clients only.
  for (const char* client : {"operator", "monitor"}) {
    auto [text, code5] =
        Run(absl::StrCat("openssl x509 -noout -text -in ", dir, "/", client, ".crt"));
    INFO(text);
    REQUIRE(code5 == 0);
    CHECK(text.find(absl::StrCat("CN = ", client)) != std::string::npos);
    CHECK(text.find("TLS Web Client Authentication") != std::string::npos);
    CHECK(text.find("Server Authentication") == std::string::npos);
    CHECK(text.find("Subject Alternative Name") == std::string::npos);
  }
  // And openssl's own key reads back as the key of the certificate.
  auto [key, code3] =
      Run(absl::StrCat("openssl pkey -in ", dir, "/ps-0.key -pubout; openssl x509 -in ", dir,
                       "/ps-0.crt -noout -pubkey"));
  REQUIRE(code3 == 0);
  const size_t half = key.find("-----BEGIN PUBLIC KEY-----", 10);
  REQUIRE(half != std::string::npos);
  CHECK(key.substr(0, half) == key.substr(half));
}

TEST_CASE("certificates for tasks whose hosts are known only at start name the task only",
          "[tls]") {
  const std::string dir = TempDir("unplaced");
  std::vector<std::string> written;
  REQUIRE(WriteClusterCertificates(nullptr, dir, absl::Hours(48), &written, nullptr,
                                   UnplacedTasks{2, 3})
              .ok());
  CHECK(written.size() == 2 + 2 * (1 + 2 + 3 + 2));  // CA; chief, 2 ps, 3 workers, operator, monitor
  for (const char* id : {"chief:0", "ps:1"}) {
    const TlsConfig tls = Load(dir, id);
    CHECK(CertificateNames(tls, TaskAltName(id)));
    CHECK(CertificateNames(tls, kMetricsAltName));
    CHECK_FALSE(CertificateNames(tls, TaskAltName("ps:0")));
  }
  const TlsConfig worker = Load(dir, "worker:2");
  CHECK(CertificateNames(worker, kMetricsAltName));
  CHECK_FALSE(CertificateNames(worker, TaskAltName("worker:2")));
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(dir, "worker-3.crt")));
  // Counts for both roles, or none; never beside a spec.
  CHECK(absl::IsInvalidArgument(
      WriteClusterCertificates(nullptr, dir, absl::Hours(48), &written, nullptr, {2, 0})));
  CHECK(absl::IsInvalidArgument(
      WriteClusterCertificates(nullptr, dir, absl::Hours(48), &written, nullptr, {-1, 2})));
  const ClusterSpec spec =
      Spec(R"({"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"], "worker": ["127.0.0.1:3"]})");
  CHECK(absl::IsInvalidArgument(
      WriteClusterCertificates(&spec, dir, absl::Hours(48), &written, nullptr, {1, 1})));
}

TEST_CASE("LoadTls refuses wrong, foreign, open and missing files, naming them", "[tls]") {
  const std::string a = TempDir("refuse_a"), b = TempDir("refuse_b");
  const ClusterSpec spec = Spec(
      R"({"chief": ["127.0.0.1:2220"], "ps": ["127.0.0.1:2221"], "worker": ["127.0.0.1:2222"]})");
  std::vector<std::string> written;
  REQUIRE(WriteClusterCertificates(&spec, a, absl::Hours(48), &written).ok());
  REQUIRE(WriteClusterCertificates(&spec, b, absl::Hours(48), &written).ok());

  auto error = [](const TlsFiles& f) {
    absl::StatusOr<TlsConfig> tls = LoadTls(f);
    REQUIRE_FALSE(tls.ok());
    return std::string(tls.status().message());
  };
  TlsFiles wrong_key = TlsFilesIn(a, "ps:0");
  wrong_key.key_file = TlsFilesIn(a, "chief:0").key_file;
  CHECK(error(wrong_key).find("chief-0.key is not the key of") != std::string::npos);

  TlsFiles foreign = TlsFilesIn(a, "ps:0");  // a certificate of another CA
  foreign.cert_file = TlsFilesIn(b, "ps:0").cert_file;
  foreign.key_file = TlsFilesIn(b, "ps:0").key_file;
  const std::string why = error(foreign);
  CHECK(why.find("does not verify against") != std::string::npos);
  CHECK(why.find("unable to get local issuer certificate") != std::string::npos);

  const TlsFiles open = TlsFilesIn(a, "ps:0");
  REQUIRE(::chmod(open.key_file.c_str(), 0644) == 0);
  CHECK(error(open).find("chmod 600") != std::string::npos);
  REQUIRE(::chmod(open.key_file.c_str(), 0600) == 0);

  TlsFiles garbage = TlsFilesIn(a, "ps:0");
  garbage.ca_file = JoinPath(a, "garbage.pem");
  REQUIRE(Env::Default()->WriteFile(garbage.ca_file, "not a certificate\n", false).ok());
  CHECK(error(garbage).find("no PEM certificate") != std::string::npos);

  TlsFiles missing = TlsFilesIn(a, "ps:7");
  CHECK(error(missing).find("ps-7.crt") != std::string::npos);
  CHECK(error(TlsFiles{"", "x", "y"}).find("all three") != std::string::npos);

  // A task must hold its own certificate.
  TlsFiles other;
  other.cert_file = TlsFilesIn(a, "chief:0").cert_file;
  other.key_file = TlsFilesIn(a, "chief:0").key_file;
  other.ca_file = TlsFilesIn(a, "chief:0").ca_file;
  absl::StatusOr<AuthSetup> as_ps = ResolveAuth(spec, "ps:0", true, "", "", false, "", other);
  REQUIRE_FALSE(as_ps.ok());
  CHECK(as_ps.status().message().find("is the certificate of \"chief:0\", not of this task, ps:0") !=
        std::string::npos);

  // Certificates are authentication enough beyond loopback (no --insecure).
  const ClusterSpec remote = Spec(
      R"({"chief": ["10.1.0.1:2220"], "ps": ["10.1.0.2:2221"], "worker": ["10.1.0.3:2222"],
          "pstrain": {"tls": {"dir": ")" + a +
      R"("}}})");
  CHECK(remote.tls_dir() == a);
  absl::StatusOr<AuthSetup> ok = ResolveAuth(remote, "ps:0", true, "", "", false);
  REQUIRE(ok.ok());
  REQUIRE(ok->tls != nullptr);
  CHECK(ok->tls->identity == "ps:0");
  const ClusterSpec bare = Spec(R"({"chief": ["10.1.0.1:2220"], "ps": ["10.1.0.2:2221"], "worker": ["10.1.0.3:2222"]})");
  absl::StatusOr<AuthSetup> refused = ResolveAuth(bare, "ps:0", true, "", "", false);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("pstrain certs") != std::string::npos);
}

// A server for `service` on the first free loopback port from `first` (in
// steps of 13), with the process's transport security; null if none.
// With `gate`, calls are authenticated as their headers arrive (StartServer).
std::unique_ptr<grpc::Server> StartOnSomePort(grpc::Service* service, int first, int* port,
                                              Authorizer* gate = nullptr) {
  for (int p = first; p < 65000; p += 13) {
    absl::StatusOr<std::unique_ptr<grpc::Server>> s =
        StartServer(absl::StrCat("127.0.0.1:", p), service, "", ServerLimits(), gate);
    if (s.ok()) {
      *port = p;
      return std::move(*s);
    }
  }
  return nullptr;
}

// GetStatus answers with the caller's task index and role (as `version` and
// `incarnation`); Shutdown is the chief's only.
class WhoService final : public PsService::Service {
 public:
  explicit WhoService(Authorizer* auth) : auth_(auth) {}
  grpc::Status GetStatus(grpc::ServerContext* ctx, const PsStatusRequest*,
                         PsStatusResponse* resp) override {
    absl::StatusOr<Caller> caller = auth_->CheckAuthenticated(*ctx, "GetStatus");
    if (!caller.ok()) return ToGrpcStatus(caller.status());
    resp->set_version(caller->index);
    resp->set_incarnation(static_cast<int64_t>(caller->role));
    return grpc::Status::OK;
  }
  grpc::Status Shutdown(grpc::ServerContext* ctx, const ShutdownRequest*,
                        ShutdownResponse*) override {
    absl::StatusOr<Caller> caller = auth_->Check(*ctx, {Role::kChief}, "Shutdown");
    return ToGrpcStatus(caller.status());
  }

 private:
  Authorizer* const auth_;
};

TEST_CASE("over mutual TLS the server knows each caller by its certificate", "[tls][rpc]") {
  const std::string dir = TempDir("rpc"), other_ca = TempDir("rpc_other");
  // The spec only names the tasks and their host: its ports are never dialled
  // (the server below takes a free one).
  ClusterSpec spec = Spec(R"({"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"],
                              "worker": ["127.0.0.1:3", "127.0.0.1:4"]})");
  std::vector<std::string> written;
  REQUIRE(WriteClusterCertificates(&spec, dir, absl::Hours(48), &written).ok());
  REQUIRE(WriteClusterCertificates(&spec, other_ca, absl::Hours(48), &written).ok());
  // Static material (gRPC's SSL credentials), or watched files (its TLS
  // credentials over the watcher's staging directory): the same checks.
  const bool watched = GENERATE(false, true);
  INFO((watched ? "watched files" : "static material"));
  auto tls = [watched](const std::string& d, const std::string& id) {
    return Material(d, id, watched);
  };

  // Callers checked in the handler, or at the door as their headers come
  // (common/rpc/server_gate.h): the same answers.
  const bool gated = GENERATE(false, true);
  INFO((gated ? "at the door" : "in the handler"));

  Authorizer auth("", spec, "ps:0", /*tls=*/true);
  WhoService service(&auth);
  SetTransportSecurity(tls(dir, "ps:0"));
  int port = 0;
  std::unique_ptr<grpc::Server> server =
      StartOnSomePort(&service, 27000 + (::getpid() % 20000), &port, gated ? &auth : nullptr);
  REQUIRE(server != nullptr);

  // Each channel takes the credentials set when it is made.
  auto channel_as = [&](std::shared_ptr<const TlsConfig> t, const std::string& host,
                        const std::string& peer = "") {
    SetTransportSecurity(std::move(t));
    auto channel = CreateChannel(absl::StrCat(host, ":", port), peer);
    SetTransportSecurity(nullptr);
    return PsService::NewStub(channel);
  };
  auto status_of = [](PsService::Stub* stub, PsStatusResponse* resp,
                      const std::string& header_identity = "") {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(5));
    if (!header_identity.empty()) ctx.AddMetadata(kIdentityHeader, header_identity);
    return stub->GetStatus(&ctx, PsStatusRequest(), resp);
  };
  auto shutdown = [](PsService::Stub* stub) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(5));
    ctx.AddMetadata(kIdentityHeader, "chief:0");  // a claim the certificate overrides
    ShutdownResponse resp;
    return stub->Shutdown(&ctx, ShutdownRequest(), &resp).error_code();
  };

  PsStatusResponse resp;
  auto worker1 = channel_as(tls(dir, "worker:1"), "127.0.0.1");
  grpc::Status st = status_of(worker1.get(), &resp, "chief:0");
  INFO(st.error_message());
  REQUIRE(st.ok());
  CHECK(resp.version() == 1);  // worker:1, whatever the header claims
  CHECK(resp.incarnation() == static_cast<int64_t>(Role::kWorker));
  CHECK(shutdown(worker1.get()) == grpc::StatusCode::PERMISSION_DENIED);
  auto chief = channel_as(tls(dir, "chief:0"), "127.0.0.1");
  CHECK(shutdown(chief.get()) == grpc::StatusCode::OK);
  auto op = channel_as(tls(dir, "operator"), "127.0.0.1");
  REQUIRE(status_of(op.get(), &resp).ok());
  CHECK(resp.incarnation() == static_cast<int64_t>(Role::kOperator));
  CHECK(auth.unauthenticated() == 0);
  CHECK(auth.denied() == 1);

  // TLS without a client certificate reaches the server, which refuses and counts it.
  TlsConfig anonymous = Load(dir, "worker:0");
  anonymous.cert_pem.clear();
  anonymous.key_pem.clear();
  auto anon = channel_as(std::make_shared<const TlsConfig>(anonymous), "127.0.0.1");
  st = status_of(anon.get(), &resp, "worker:0");
  CHECK(st.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(st.error_message().find("no client certificate") != std::string::npos);
  CHECK(auth.unauthenticated() == 1);
  // The scraper's certificate reads /metrics and nothing else.
  auto monitor = channel_as(tls(dir, kMonitorIdentity), "127.0.0.1");
  st = status_of(monitor.get(), &resp);
  CHECK(st.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(st.error_message().find("a certificate for no task of this cluster") != std::string::npos);
  CHECK(auth.unauthenticated() == 2);

  // A certificate of another CA, plaintext, and a server not named by its
  // certificate (127.0.0.1 reached as localhost) never get a call through.
  auto foreign = channel_as(tls(other_ca, "worker:0"), "127.0.0.1");
  CHECK(status_of(foreign.get(), &resp).error_code() == grpc::StatusCode::UNAVAILABLE);
  auto plain = channel_as(nullptr, "127.0.0.1");
  CHECK(status_of(plain.get(), &resp).error_code() == grpc::StatusCode::UNAVAILABLE);
  auto misnamed = channel_as(tls(dir, "worker:0"), "localhost");
  CHECK(status_of(misnamed.get(), &resp).error_code() == grpc::StatusCode::UNAVAILABLE);
  // A channel to a task accepts only that task's certificate (whatever the
  // host is called): this server is ps:0, not ps:1 nor the chief.
  auto to_ps0 = channel_as(tls(dir, "worker:0"), "localhost", "ps:0");
  CHECK(status_of(to_ps0.get(), &resp).ok());
  auto to_chief = channel_as(tls(dir, "worker:0"), "127.0.0.1", "chief:0");
  CHECK(status_of(to_chief.get(), &resp).error_code() == grpc::StatusCode::UNAVAILABLE);
  // A server whose certificate names its task only (pstrain certs --ps
  // --workers) passes for that task, whatever its host.
  {
    const std::string unplaced = TempDir(watched ? "rpc_unplaced_w" : "rpc_unplaced");
    REQUIRE(WriteClusterCertificates(nullptr, unplaced, absl::Hours(48), &written, nullptr,
                                     UnplacedTasks{1, 1})
                .ok());
    SetTransportSecurity(tls(unplaced, "ps:0"));
    int unplaced_port = 0;
    std::unique_ptr<grpc::Server> named =
        StartOnSomePort(&service, port + 7, &unplaced_port, gated ? &auth : nullptr);
    SetTransportSecurity(nullptr);
    REQUIRE(named != nullptr);
    auto dial = [&](const std::string& peer) {
      SetTransportSecurity(tls(unplaced, "worker:0"));
      auto stub = PsService::NewStub(
          CreateChannel(absl::StrCat("127.0.0.1:", unplaced_port), peer));
      SetTransportSecurity(nullptr);
      return stub;
    };
    auto as_ps0 = dial("ps:0");
    CHECK(status_of(as_ps0.get(), &resp).ok());
    auto as_chief = dial("chief:0");
    CHECK(status_of(as_chief.get(), &resp).error_code() == grpc::StatusCode::UNAVAILABLE);
    auto by_address = dial("");
    CHECK(status_of(by_address.get(), &resp).error_code() == grpc::StatusCode::UNAVAILABLE);
    named->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }
  // A client trusting another CA refuses this server.
  TlsConfig distrust = Load(dir, "worker:0");
  distrust.ca_pem = *Env::Default()->ReadFile(JoinPath(other_ca, "ca.crt"));
  auto distrusting = channel_as(std::make_shared<const TlsConfig>(distrust), "127.0.0.1");
  CHECK(status_of(distrusting.get(), &resp).error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(auth.unauthenticated() == 2);  // none of those reached the service
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));

  // A worker's certificate cannot serve: clients refuse a server showing it.
  SetTransportSecurity(tls(dir, "worker:1"));
  std::unique_ptr<grpc::Server> impostor =
      StartOnSomePort(&service, port + 1, &port, gated ? &auth : nullptr);
  REQUIRE(impostor != nullptr);
  auto fooled = channel_as(tls(dir, "chief:0"), "127.0.0.1");
  CHECK(status_of(fooled.get(), &resp).error_code() == grpc::StatusCode::UNAVAILABLE);
  impostor->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

// A GetStatus call to ps:0 on `port` with `tls`'s certificate: its code.
grpc::StatusCode GetStatusAs(int port, std::shared_ptr<const TlsConfig> tls) {
  SetTransportSecurity(std::move(tls));
  auto stub = PsService::NewStub(CreateChannel(absl::StrCat("127.0.0.1:", port), "ps:0"));
  SetTransportSecurity(nullptr);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(5));
  PsStatusResponse resp;
  return stub->GetStatus(&ctx, PsStatusRequest(), &resp).error_code();
}

TEST_CASE("a revoked certificate is refused at the next handshake, client or server",
          "[tls][rpc]") {
  const bool watched = GENERATE(false, true);
  INFO((watched ? "watched files" : "static material"));
  const std::string dir = TempDir(watched ? "revoke_w" : "revoke");
  ClusterSpec spec = Spec(R"({"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"],
                              "worker": ["127.0.0.1:3", "127.0.0.1:4"]})");
  std::vector<std::string> written;
  REQUIRE(WriteClusterCertificates(&spec, dir, absl::Hours(48), &written).ok());
  auto tls = [&](const std::string& id) { return Material(dir, id, watched); };
  // A server started before anything was revoked: the lists' directory is
  // not there yet.
  Authorizer auth("", spec, "ps:0", /*tls=*/true);
  WhoService service(&auth);
  const std::shared_ptr<const TlsConfig> ps = tls("ps:0");
  CHECK(ps->crl_dir == JoinPath(dir, "crl"));
  CHECK_FALSE(Env::Default()->IsDirectory(ps->crl_dir));
  SetTransportSecurity(ps);
  int port = 0;
  std::unique_ptr<grpc::Server> server =
      StartOnSomePort(&service, 31000 + (::getpid() % 20000), &port);
  SetTransportSecurity(nullptr);
  REQUIRE(server != nullptr);
  auto call_as = [&port](std::shared_ptr<const TlsConfig> t) {
    return GetStatusAs(port, std::move(t));
  };
  // worker:1's material, read before it is revoked.
  const std::shared_ptr<const TlsConfig> worker1 = tls("worker:1");
  CHECK(call_as(worker1) == grpc::StatusCode::OK);
  std::string crl;
  int revoked = 0;
  REQUIRE(RevokeCertificate(dir, "worker:1", &crl, &revoked).ok());
  CHECK(revoked == 1);
  CHECK(crl.find("/crl/") != std::string::npos);
  CHECK(crl.substr(crl.size() - 3) == ".r0");
  CHECK(absl::IsAlreadyExists(RevokeCertificate(dir, "worker:1", &crl)));
  // Read now, worker:1's files are refused, naming why.
  absl::StatusOr<TlsConfig> again = LoadTls(TlsFilesIn(dir, "worker:1"));
  REQUIRE_FALSE(again.ok());
  CHECK(again.status().message().find("certificate revoked") != std::string::npos);
  const std::shared_ptr<const TlsConfig> worker0 = tls("worker:0");
  CHECK(call_as(worker0) == grpc::StatusCode::OK);
  CHECK(call_as(worker1) == grpc::StatusCode::UNAVAILABLE);  // the server refuses it
  // Revoked while the server runs: the next handshake refuses it (a new
  // list, crl/<hash>.r1, holding both).
  REQUIRE(RevokeCertificate(dir, "worker:0", &crl, &revoked).ok());
  CHECK(revoked == 2);
  CHECK(crl.substr(crl.size() - 3) == ".r1");
  CHECK(call_as(worker0) == grpc::StatusCode::UNAVAILABLE);
  CHECK(call_as(tls("chief:0")) == grpc::StatusCode::OK);
  // A revoked server: its clients refuse it.
  REQUIRE(RevokeCertificate(dir, "ps:0", &crl, &revoked).ok());
  CHECK(call_as(tls("chief:0")) == grpc::StatusCode::UNAVAILABLE);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (HaveOpenssl()) {
    auto [text, code] = Run(absl::StrCat("openssl crl -noout -text -in ", crl));
    INFO(text);
    CHECK(code == 0);
    CHECK(text.find("Revoked Certificates:") != std::string::npos);
    auto [verify, code2] = Run(absl::StrCat("openssl verify -crl_check -CAfile ", dir,
                                            "/ca.crt -CRLfile ", crl, " ", dir, "/ps-0.crt"));
    INFO(verify);
    CHECK(code2 != 0);
    CHECK(verify.find("certificate revoked") != std::string::npos);
  }
  // A certificate renewed since (pstrain certs again) is not revoked; the
  // earlier one can still be, named by its file.
  const std::string earlier = JoinPath(dir, "chief-0.earlier.crt");
  REQUIRE(Env::Default()->WriteFile(earlier, *Env::Default()->ReadFile(
                                                 TlsFilesIn(dir, "chief:0").cert_file),
                                    false)
              .ok());
  REQUIRE(WriteClusterCertificates(&spec, dir, absl::Hours(48), &written).ok());
  REQUIRE(RevokeCertificate(dir, earlier, &crl, &revoked).ok());
  CHECK(revoked == 4);
  CHECK(LoadTls(TlsFilesIn(dir, "chief:0")).ok());
  // A list that does not parse would be skipped by every handshake: refused.
  const std::string next_list = crl.substr(0, crl.size() - 1) + "4";
  REQUIRE(Env::Default()->WriteFile(next_list, "-----BEGIN X509 CRL-----\n", false).ok());
  absl::StatusOr<TlsConfig> refused = LoadTls(TlsFilesIn(dir, "chief:0"));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("not a PEM revocation list signed by the CA") !=
        std::string::npos);
  REQUIRE(::unlink(next_list.c_str()) == 0);
  // Without the CA's key nothing can be revoked.
  REQUIRE(::rename(JoinPath(dir, "ca.key").c_str(), JoinPath(dir, "ca.key.away").c_str()) == 0);
  absl::Status no_key = RevokeCertificate(dir, "chief:0", &crl);
  CHECK(no_key.message().find("revoking needs the CA's key") != std::string::npos);
  // A new CA (the old one moved away) sets the earlier CA's lists aside,
  // and its own lists go under another name.
  REQUIRE(::rename(JoinPath(dir, "ca.crt").c_str(), JoinPath(dir, "ca.crt.away").c_str()) == 0);
  REQUIRE(WriteClusterCertificates(&spec, dir, absl::Hours(48), &written).ok());
  CHECK_FALSE(Env::Default()->IsDirectory(JoinPath(dir, "crl")));
  CHECK(LoadTls(TlsFilesIn(dir, "worker:1")).ok());
  std::string fresh;
  REQUIRE(RevokeCertificate(dir, "worker:1", &fresh, &revoked).ok());
  CHECK(revoked == 1);
  CHECK(fresh.substr(fresh.rfind('/')) != crl.substr(crl.rfind('/')));
}

TEST_CASE("revocation lists delivered apart (--tls_crl_dir), in a Kubernetes Secret's layout, "
          "are read at every handshake", "[tls][rpc]") {
  const std::string dir = TempDir("revoke_apart");
  ClusterSpec spec = Spec(R"({"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"],
                              "worker": ["127.0.0.1:3", "127.0.0.1:4"]})");
  std::vector<std::string> written;
  REQUIRE(WriteClusterCertificates(&spec, dir, absl::Hours(48), &written).ok());
  // The Secret's volume, not there yet (an optional Secret not made yet).
  const std::string lists = JoinPath(dir, "mounted-crl");
  auto with_lists = [&](const std::string& id) {
    TlsFiles files = TlsFilesIn(dir, id);
    files.crl_dir = lists;
    absl::StatusOr<TlsConfig> t = LoadTls(files);
    INFO(t.status().ToString());
    REQUIRE(t.ok());
    return std::make_shared<const TlsConfig>(*std::move(t));
  };
  const std::shared_ptr<const TlsConfig> ps = with_lists("ps:0");
  CHECK(ps->crl_dir == lists);
  Authorizer auth("", spec, "ps:0", /*tls=*/true);
  WhoService service(&auth);
  SetTransportSecurity(ps);
  int port = 0;
  std::unique_ptr<grpc::Server> server =
      StartOnSomePort(&service, 31000 + ((::getpid() + 7) % 20000), &port);
  SetTransportSecurity(nullptr);
  REQUIRE(server != nullptr);
  auto call_as = [&port](std::shared_ptr<const TlsConfig> t) {
    return GetStatusAs(port, std::move(t));
  };
  const std::shared_ptr<const TlsConfig> worker1 = with_lists("worker:1");
  // Revoked where pstrain certs keeps its lists: this server reads the
  // other directory, so worker:1 still gets through.
  std::string crl;
  REQUIRE(RevokeCertificate(dir, "worker:1", &crl).ok());
  CHECK(call_as(worker1) == grpc::StatusCode::OK);
  // The lists arrive as kubelet writes a Secret's files: a dated directory,
  // ..data linked to it, and each name linked through ..data.
  const std::string name = crl.substr(crl.rfind('/') + 1);
  const std::string dated = JoinPath(lists, "..2026_11_24_10_00_00.1");
  REQUIRE(Env::Default()->CreateDirs(dated).ok());
  REQUIRE(Env::Default()->WriteFile(JoinPath(dated, name), *Env::Default()->ReadFile(crl),
                                    false)
              .ok());
  REQUIRE(::symlink("..2026_11_24_10_00_00.1", JoinPath(lists, "..data").c_str()) == 0);
  REQUIRE(::symlink(JoinPath("..data", name).c_str(), JoinPath(lists, name).c_str()) == 0);
  CHECK(call_as(worker1) == grpc::StatusCode::UNAVAILABLE);  // the next handshake refuses it
  CHECK(call_as(with_lists("worker:0")) == grpc::StatusCode::OK);
  // Read now with those lists, worker:1's files are refused, naming why;
  // with an empty directory of lists they pass.
  TlsFiles files = TlsFilesIn(dir, "worker:1");
  files.crl_dir = lists;
  absl::StatusOr<TlsConfig> refused = LoadTls(files);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("certificate revoked") != std::string::npos);
  files.crl_dir = JoinPath(dir, "no-lists");
  REQUIRE(Env::Default()->CreateDirs(files.crl_dir).ok());
  CHECK(LoadTls(files).ok());
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

// The PEM of the certificate the server showed on the call `ctx` made.
std::string ServerCertificate(const grpc::ClientContext& ctx) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr) return "";
  std::vector<grpc::string_ref> pem = auth->FindPropertyValues("x509_pem_cert");
  return pem.empty() ? "" : std::string(pem.front().data(), pem.front().size());
}

TEST_CASE("a renewed certificate is taken without a restart; a broken or foreign one is refused",
          "[tls][rpc]") {
  const std::string dir = TempDir("renew");
  ClusterSpec spec = Spec(R"({"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"],
                              "worker": ["127.0.0.1:3"]})");
  std::vector<std::string> written;
  REQUIRE(WriteClusterCertificates(&spec, dir, absl::Hours(48), &written).ok());
  const TlsFiles ps_files = TlsFilesIn(dir, "ps:0");
  TlsConfig ps = Load(dir, "ps:0");
  // Looked at only when the test says (CheckNow), not on a thread of its
  // own that could take a file half written; gRPC rereads every second.
  absl::StatusOr<std::shared_ptr<TlsWatcher>> watcher =
      TlsWatcher::Start(ps_files, "ps:0", absl::Seconds(1), /*background=*/false);
  REQUIRE(watcher.ok());
  std::shared_ptr<TlsWatcher> w = *std::move(watcher);
  absl::StatusOr<std::shared_ptr<TlsWatcher>> foreign =
      TlsWatcher::Start(ps_files, "ps:1", absl::Seconds(1), false);
  REQUIRE_FALSE(foreign.ok());
  CHECK(foreign.status().message().find("is the certificate of \"ps:0\", not of ps:1") !=
        std::string::npos);
  ps.watcher = w;
  const std::string staging = w->staging_dir();
  CHECK(staging.find(absl::StrCat("/pstrain-tls-", ::getpid(), "-")) != std::string::npos);
  struct stat st;
  REQUIRE(::stat(staging.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  CHECK_FALSE(w->CheckNow());  // nothing changed

  Authorizer auth("", spec, "ps:0", /*tls=*/true);
  WhoService service(&auth);
  SetTransportSecurity(std::make_shared<const TlsConfig>(ps));
  int port = 0;
  std::unique_ptr<grpc::Server> server =
      StartOnSomePort(&service, 29000 + (::getpid() % 20000), &port);
  SetTransportSecurity(nullptr);
  REQUIRE(server != nullptr);
  // The server's certificate as a new connection of the chief sees it.
  auto shown = [&] {
    SetTransportSecurity(std::make_shared<const TlsConfig>(Load(dir, "chief:0")));
    auto stub = PsService::NewStub(CreateChannel(absl::StrCat("127.0.0.1:", port), "ps:0"));
    SetTransportSecurity(nullptr);
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(5));
    PsStatusResponse resp;
    grpc::Status status = stub->GetStatus(&ctx, PsStatusRequest(), &resp);
    return status.ok() ? ServerCertificate(ctx) : "failed: " + status.error_message();
  };
  const std::string first = *Env::Default()->ReadFile(ps_files.cert_file);
  CHECK(shown() == first);

  // Renewed in place (the same CA): taken, and shown to new connections
  // once gRPC has read the staging directory again (1 s here).
  written.clear();
  REQUIRE(WriteClusterCertificates(&spec, dir, absl::Hours(48), &written).ok());
  const std::string second = *Env::Default()->ReadFile(ps_files.cert_file);
  REQUIRE(second != first);
  CHECK(w->CheckNow());
  CHECK(w->reloads() == 1);
  CHECK(w->current()->cert_pem == second);
  std::string now = shown();
  for (absl::Time end = absl::Now() + absl::Seconds(10); now != second && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(200));
    now = shown();
  }
  CHECK(now == second);

  // A torn renewal (a certificate that does not parse), then another task's
  // pair: refused, and the server goes on with the second certificate.
  const std::string key = *Env::Default()->ReadFile(ps_files.key_file);
  REQUIRE(Env::Default()->WriteFile(ps_files.cert_file, "-----BEGIN CERT", false).ok());
  CHECK_FALSE(w->CheckNow());
  CHECK(w->refusals() == 1);
  const TlsFiles worker = TlsFilesIn(dir, "worker:0");
  REQUIRE(Env::Default()->WriteFile(ps_files.cert_file,
                                    *Env::Default()->ReadFile(worker.cert_file), false).ok());
  REQUIRE(WritePrivateFile(ps_files.key_file, *Env::Default()->ReadFile(worker.key_file)).ok());
  CHECK_FALSE(w->CheckNow());
  CHECK(w->refusals() == 2);
  CHECK(w->current()->cert_pem == second);
  absl::SleepFor(absl::Milliseconds(2500));  // gRPC reads the staging directory again
  CHECK(shown() == second);
  // Put back: taken again.
  REQUIRE(Env::Default()->WriteFile(ps_files.cert_file, second, false).ok());
  REQUIRE(WritePrivateFile(ps_files.key_file, key).ok());
  CHECK(w->CheckNow());
  CHECK(w->reloads() == 2);

  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server.reset();
  ps.watcher = nullptr;
  w.reset();  // the last holder: the staging directory goes with it
  CHECK(::stat(staging.c_str(), &st) != 0);

  // A staging directory whose process is gone (killed: nobody holds its
  // lock) is removed by the next watcher; one whose lock is held is not.
  const std::string base = staging.substr(0, staging.rfind('/'));
  std::string stale = JoinPath(base, "pstrain-tls-test-XXXXXX");
  std::string live = stale;
  REQUIRE(::mkdtemp(stale.data()) != nullptr);
  REQUIRE(::mkdtemp(live.data()) != nullptr);
  int held = -1;
  for (const std::string& d : {stale, live}) {
    REQUIRE(::mkdir(JoinPath(d, "g1").c_str(), 0700) == 0);
    REQUIRE(Env::Default()->WriteFile(JoinPath(d, "g1/key.pem"), "x", false).ok());
    REQUIRE(::symlink("g1", JoinPath(d, "current").c_str()) == 0);
    const int fd = ::open(JoinPath(d, "lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    if (d == live) {
      REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
      held = fd;
    } else {
      ::close(fd);
    }
  }
  auto next = TlsWatcher::Start(ps_files, "ps:0", absl::Seconds(1), false);
  REQUIRE(next.ok());
  CHECK(::lstat(stale.c_str(), &st) != 0);
  CHECK(::lstat(live.c_str(), &st) == 0);
  next->reset();
  ::close(held);
  REQUIRE(::unlink(JoinPath(live, "current").c_str()) == 0);
  REQUIRE(DeleteRecursively(Env::Default(), live).ok());
}

TEST_CASE("watchers started at once, as a job's tasks on one host are, never take each "
          "other's staging directory for a dead one's",
          "[tls]") {
  // Each start first removes the staging directories of dead processes. A
  // directory whose lock file could be named before it was locked was taken
  // for dead and removed under its maker (a Slurm job's five tasks on one
  // host, 2026-11-27: "TLS: cannot make /dev/shm/pstrain-tls-.../g1: No such
  // file or directory").
  const std::string dir = TempDir("concurrent");
  ClusterSpec spec = Spec(R"({"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"],
                              "worker": ["127.0.0.1:3"]})");
  std::vector<std::string> written;
  REQUIRE(WriteClusterCertificates(&spec, dir, absl::Hours(48), &written).ok());
  const TlsFiles files = TlsFilesIn(dir, "ps:0");
  constexpr int kThreads = 8, kStarts = 40;
  std::atomic<int> failed{0}, lost{0};
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kStarts; ++i) {
        auto w = TlsWatcher::Start(files, "ps:0", absl::Seconds(1), /*background=*/false);
        if (!w.ok()) {
          ++failed;
          errors[t] = std::string(w.status().message());
          continue;
        }
        // Still there, the certificate staged in it, while the others start.
        struct stat st;
        if (::stat(JoinPath((*w)->staging_dir(), "current/cert.pem").c_str(), &st) != 0) ++lost;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (const std::string& e : errors) {
    if (!e.empty()) WARN(e);
  }
  CHECK(failed == 0);
  CHECK(lost == 0);
}

}  // namespace
}  // namespace pstrain
