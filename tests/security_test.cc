// Authentication and authorization with the real daemons: a cluster secret
// from `pstrain tokens`, calls signed with the right, a wrong or no key, and
// captured calls made again.
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/client/chief_client.h"
#include "common/security/auth.h"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/config.h"
#include "common/storage/env.h"
#include "common/rpc/rpc.h"
#include "tools/subprocess.h"
#include "common/testing/https_get.h"
#include "common/security/tls.h"
#include "common/base/tensor.h"
#include "common/rpc/wire_frame.h"
#include "nlohmann/json.hpp"
#include "proto/chief_service.grpc.pb.h"
#include "proto/ps_service.grpc.pb.h"
#include "tests/cluster_testlib.h"

namespace pstrain {
namespace {

using testing::Binary;
using testing::BinDir;
using testing::CommandResult;
using testing::ConfigOptions;

// A spec of 1 chief, `ps` servers and `workers` workers on free loopback
// ports whose extras name `secret_file`, and the tokens written for it.
std::string WriteSecuredSpec(const std::string& dir, int ps, int workers) {
  const std::string spec = testing::WriteClusterSpec(dir, ps, workers);
  nlohmann::json j = nlohmann::json::parse(*Env::Default()->ReadFile(spec));
  j["pstrain"] = {{"auth", {{"secret_file", "auth/cluster.secret"}}}};  // relative to the spec
  testing::WriteFile(spec, j.dump());
  CommandResult r = testing::RunCommand(
      {Binary("tools/pstrain"), "tokens", "--cluster_spec", spec, "--out", JoinPath(dir, "auth")},
      absl::Seconds(30));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return spec;
}

// A call's authorization as `identity`'s channel to `audience` signs it
// (common/security/auth.h), with the key `token`; "" without a token.
std::string Signature(const std::string& identity, const std::string& token,
                      const std::string& audience, const std::string& method) {
  static std::atomic<uint64_t> seq{0};
  if (token.empty()) return "";
  return SignCall(token, identity, audience, method, absl::Now(),
                  /*session=*/static_cast<uint64_t>(::getpid()), ++seq);
}

std::string Token(const std::string& dir, const std::string& file) {
  absl::StatusOr<std::string> t = ReadSecretFile(JoinPath(JoinPath(dir, "auth"), file));
  REQUIRE(t.ok());
  return *t;
}

// Waits until the log at `log_path` holds `line` (a daemon listening).
void WaitForLogLine(const std::string& log_path, const std::string& line) {
  absl::Status st = RetryWithBackoff(
      line, absl::Seconds(30),
      [&]() {
        return Env::Default()->ReadFile(log_path).value_or("").find(line) == std::string::npos
                   ? absl::UnavailableError("not yet")
                   : absl::OkStatus();
      },
      absl::Milliseconds(50));
  INFO(log_path);
  REQUIRE(st.ok());
}

// The port in a daemon's "metrics on http(s)://127.0.0.1:PORT/metrics" line.
int MetricsPort(const std::string& log_path) {
  int port = 0;
  absl::Status st = RetryWithBackoff(
      "metrics line", absl::Seconds(20),
      [&]() {
        std::string log = Env::Default()->ReadFile(log_path).value_or("");
        const size_t line = log.find("metrics on http");
        const std::string host = "://127.0.0.1:";
        const size_t at = line == std::string::npos ? line : log.find(host, line);
        if (at == std::string::npos) return absl::UnavailableError("not yet");
        const size_t begin = at + host.size();
        if (!absl::SimpleAtoi(log.substr(begin, log.find('/', begin) - begin), &port)) {
          return absl::InternalError("bad line");
        }
        return absl::OkStatus();
      },
      absl::Milliseconds(100));
  REQUIRE(st.ok());
  return port;
}

TEST_CASE("with a cluster secret only the right task in the right role changes a server",
          "[security][cluster]") {
  const std::string dir = testing::FreshTempDir("auth_ps");
  const std::string spec = WriteSecuredSpec(dir, 1, 2);
  auto cluster = ClusterSpec::FromFile(spec);
  REQUIRE(cluster.ok());
  CHECK(Env::Default()->FileExists(JoinPath(dir, "auth/worker-1.token")));
  CHECK(Env::Default()->FileExists(JoinPath(dir, "auth/operator.token")));
  SpawnOptions so;
  so.argv = {Binary("ps_server/ps_server"), "--cluster_spec=" + spec, "--task=0",
             "--metrics_address=127.0.0.1:0", "--chief_timeout_s=0"};
  so.output_file = JoinPath(dir, "ps.log");
  auto ps = Subprocess::Spawn(so);
  REQUIRE(ps.ok());
  const int metrics_port = MetricsPort(so.output_file);

  // This test process has no credentials of its own: each call sets them.
  auto channel = CreateChannel(cluster->address(kPsJob, 0));
  auto stub = PsService::NewStub(channel);
  grpc::GenericStub raw(channel);
  const std::string chief = Token(dir, "chief-0.token");
  const std::string w0 = Token(dir, "worker-0.token");
  const std::string w1 = Token(dir, "worker-1.token");
  auto call = [](const std::string& identity, const std::string& token, const char* name,
                 auto method) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    ctx.set_wait_for_ready(true);
    if (!identity.empty()) ctx.AddMetadata(kIdentityHeader, identity);
    if (!token.empty()) ctx.AddMetadata("authorization", Signature(identity, token, "ps:0", name));
    return method(&ctx).error_code();
  };
  PsStatusResponse status;
  auto get_status = [&](const std::string& id, const std::string& token) {
    return call(id, token, "GetStatus", [&](grpc::ClientContext* c) {
      return stub->GetStatus(c, PsStatusRequest(), &status);
    });
  };
  CHECK(get_status("", "") == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(get_status("worker:0", w1) == grpc::StatusCode::UNAUTHENTICATED);  // another's token
  REQUIRE(get_status("worker:0", w0) == grpc::StatusCode::OK);
  CHECK_FALSE(status.initialized());

  // A worker may neither stop nor (re)initialize a server.
  ShutdownRequest bye;  // incarnation 0, as a server waiting for its chief accepted
  ShutdownResponse bye_resp;
  auto shutdown = [&](const std::string& id, const std::string& token) {
    return call(id, token, "Shutdown",
                [&](grpc::ClientContext* c) { return stub->Shutdown(c, bye, &bye_resp); });
  };
  CHECK(shutdown("worker:0", w0) == grpc::StatusCode::PERMISSION_DENIED);
  CHECK(shutdown("", "") == grpc::StatusCode::UNAUTHENTICATED);
  // A worker naming the chief in a header of its own before the one its
  // signature is for: gRPC keeps both, and the signature checked at the
  // door must be the caller the handler sees. Refused, counted.
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    ctx.AddMetadata(kIdentityHeader, "chief:0");
    ctx.AddMetadata(kIdentityHeader, "worker:0");
    ctx.AddMetadata("authorization", Signature("worker:0", w0, "ps:0", "Shutdown"));
    const grpc::Status two = stub->Shutdown(&ctx, bye, &bye_resp);
    CHECK(two.error_code() == grpc::StatusCode::UNAUTHENTICATED);
    CHECK(two.error_message().find("given more than once") != std::string::npos);
    CHECK_FALSE((*ps)->Wait(absl::Milliseconds(100)).has_value());
  }
  InitializeRequest init = testing::TinyModelInit(JoinPath(dir, "out"));
  REQUIRE(init.has_config());
  InitializeResponse init_resp;
  auto initialize = [&](const std::string& id, const std::string& token) {
    return call(id, token, "Initialize",
                [&](grpc::ClientContext* c) { return stub->Initialize(c, init, &init_resp); });
  };
  CHECK(initialize("worker:0", w0) == grpc::StatusCode::PERMISSION_DENIED);
  CHECK(initialize("chief:0", w0) == grpc::StatusCode::UNAUTHENTICATED);
  REQUIRE(get_status("worker:1", w1) == grpc::StatusCode::OK);
  CHECK_FALSE(status.initialized());  // refused calls changed nothing
  REQUIRE(initialize("chief:0", chief) == grpc::StatusCode::OK);

  auto push = [&](const std::string& id, const std::string& token, int worker) {
    PushRequest req;
    req.set_incarnation(42);
    req.set_worker(worker);
    req.set_step(0);
    NamedTensor* g = req.add_gradients();
    g->mutable_ref()->set_variable("w");
    ToProto({2, 2}, {1, 1, 1, 1}, g->mutable_tensor());
    grpc::ByteBuffer frame = EncodePushFrame(req), resp;
    return call(id, token, "Push", [&](grpc::ClientContext* c) {
      return RawCall(&raw, c, "/pstrain.PsService/Push", frame, &resp);
    });
  };
  CHECK(push("worker:0", w0, 1) == grpc::StatusCode::PERMISSION_DENIED);     // acting as worker 1
  CHECK(push("chief:0", chief, -1) == grpc::StatusCode::PERMISSION_DENIED);  // chiefs do not push
  CHECK(push("", "", 0) == grpc::StatusCode::UNAUTHENTICATED);
  REQUIRE(get_status("chief:0", chief) == grpc::StatusCode::OK);
  CHECK(status.version() == 0);
  CHECK(status.pushes_applied() == 0);
  CHECK(push("worker:0", w0, 0) == grpc::StatusCode::OK);
  CHECK(push("worker:1", w1, 1) == grpc::StatusCode::OK);
  REQUIRE(get_status("operator", Token(dir, "operator.token")) == grpc::StatusCode::OK);
  CHECK(status.version() == 1);

  // The model goes only to the run's workers (each as itself) and its chief.
  auto pull = [&](const std::string& id, const std::string& token, int worker) {
    PullRequest req;
    req.set_incarnation(42);
    req.set_worker(worker);
    req.set_min_version(1);
    req.set_timeout_ms(5000);
    grpc::ByteBuffer resp;
    return call(id, token, "Pull", [&](grpc::ClientContext* c) {
      return RawCall(&raw, c, "/pstrain.PsService/Pull", SerializeMessage(req), &resp);
    });
  };
  CHECK(pull("", "", 0) == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(pull("operator", Token(dir, "operator.token"), 0) ==
        grpc::StatusCode::PERMISSION_DENIED);
  CHECK(pull("worker:0", w0, 1) == grpc::StatusCode::PERMISSION_DENIED);  // as worker 1
  CHECK(pull("worker:1", w1, 1) == grpc::StatusCode::OK);
  CHECK(pull("chief:0", chief, -1) == grpc::StatusCode::OK);

  // Refusals are counted: 7 unauthenticated, 6 denied so far.
  const std::string metrics = testing::HttpGet(metrics_port, "/metrics");
  INFO(metrics);
  CHECK(metrics.find(
            "pstrain_rpc_refused_total{reason=\"unauthenticated\",job=\"ps\",task=\"0\"} 7") !=
        std::string::npos);
  CHECK(metrics.find(
            "pstrain_rpc_refused_total{reason=\"permission_denied\",job=\"ps\",task=\"0\"} 6") !=
        std::string::npos);

  bye.set_incarnation(42);
  CHECK(shutdown("chief:0", chief) == grpc::StatusCode::OK);
  std::optional<int> code = (*ps)->Wait(absl::Seconds(10));
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  const std::string log = Env::Default()->ReadFile(so.output_file).value_or("");
  CHECK(log.find("Shutdown refused for worker:0: only chief may call it") != std::string::npos);
}

TEST_CASE("a call captured on the wire can be made neither again nor at another server",
          "[security][cluster]") {
  const std::string dir = testing::FreshTempDir("auth_replay");
  const std::string spec = WriteSecuredSpec(dir, 2, 1);
  auto cluster = ClusterSpec::FromFile(spec);
  REQUIRE(cluster.ok());
  std::vector<std::unique_ptr<Subprocess>> servers;
  for (int i = 0; i < 2; ++i) {
    SpawnOptions so;
    so.argv = {Binary("ps_server/ps_server"), "--cluster_spec=" + spec,
               absl::StrCat("--task=", i), "--chief_timeout_s=0"};
    so.output_file = JoinPath(dir, absl::StrCat("ps", i, ".log"));
    auto ps = Subprocess::Spawn(so);
    REQUIRE(ps.ok());
    servers.push_back(*std::move(ps));
  }
  // The calls below are signed before they are sent: a server still
  // starting would refuse them as signed before it started.
  for (int i = 0; i < 2; ++i) {
    WaitForLogLine(JoinPath(dir, absl::StrCat("ps", i, ".log")), "parameter server listening");
  }
  const std::string chief = Token(dir, "chief-0.token");
  // Makes a call with exactly these headers, as one seen on a plaintext
  // wire would be made again.
  auto send = [&](int server, const std::string& authorization, auto method) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    ctx.set_wait_for_ready(true);
    ctx.AddMetadata(kIdentityHeader, "chief:0");
    ctx.AddMetadata("authorization", authorization);
    auto stub = PsService::NewStub(CreateChannel(cluster->address(kPsJob, server)));
    return method(stub.get(), &ctx);
  };
  auto get_status = [](PsService::Stub* stub, grpc::ClientContext* ctx) {
    PsStatusResponse status;
    return stub->GetStatus(ctx, PsStatusRequest(), &status);
  };
  auto shutdown = [](PsService::Stub* stub, grpc::ClientContext* ctx) {
    ShutdownRequest bye;  // incarnation 0: a server waiting for its chief takes it
    ShutdownResponse resp;
    return stub->Shutdown(ctx, bye, &resp);
  };

  const std::string captured = Signature("chief:0", chief, "ps:0", "GetStatus");
  REQUIRE(send(0, captured, get_status).ok());
  grpc::Status again = send(0, captured, get_status);
  CHECK(again.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(again.error_message().find("a replayed call") != std::string::npos);

  // The chief's Shutdown for ps:1, brought to ps:0: refused, ps:0 serves on.
  const std::string for_ps1 = Signature("chief:0", chief, "ps:1", "Shutdown");
  grpc::Status redirected = send(0, for_ps1, shutdown);
  CHECK(redirected.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(redirected.error_message().find("signed for \"ps:1\", not for this task (ps:0)") !=
        std::string::npos);
  // A GetStatus signed as a Shutdown: the method is signed too.
  CHECK(send(0, Signature("chief:0", chief, "ps:0", "Shutdown"), get_status).error_code() ==
        grpc::StatusCode::UNAUTHENTICATED);
  CHECK(send(0, Signature("chief:0", chief, "ps:0", "GetStatus"), get_status).ok());
  CHECK_FALSE(servers[0]->Wait(absl::Milliseconds(200)).has_value());
  // At ps:1, for which it was signed, the same call stops the server once.
  REQUIRE(send(1, for_ps1, shutdown).ok());
  std::optional<int> code = servers[1]->Wait(absl::Seconds(10));
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  // ps:1 restarted: its memory of calls starts afresh, but the captured
  // Shutdown was signed before it started (by more than kStartMargin), and
  // is refused.
  absl::SleepFor(kStartMargin);
  {
    SpawnOptions so;
    so.argv = {Binary("ps_server/ps_server"), "--cluster_spec=" + spec, "--task=1",
               "--chief_timeout_s=0"};
    so.output_file = JoinPath(dir, "ps1-again.log");
    auto ps = Subprocess::Spawn(so);
    REQUIRE(ps.ok());
    servers[1] = *std::move(ps);
  }
  WaitForLogLine(JoinPath(dir, "ps1-again.log"), "parameter server listening");
  grpc::Status replayed = send(1, for_ps1, shutdown);
  CHECK(replayed.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(replayed.error_message().find("before this server started") != std::string::npos);
  CHECK_FALSE(servers[1]->Wait(absl::Milliseconds(200)).has_value());
  CHECK(send(1, Signature("chief:0", chief, "ps:1", "GetStatus"), get_status).ok());
  servers[1]->Stop(absl::Seconds(5));
  servers[0]->Stop(absl::Seconds(5));
}

TEST_CASE("pstrain launch signs a loopback run's calls with a secret of its own; other local "
          "processes are refused", "[security][cluster]") {
  // This case signs as the operator; the cases after it set their headers
  // by hand, with no credentials of the process's own.
  struct ResetCredentials {
    ~ResetCredentials() { SetCallCredentials("", ""); }
  } reset;
  const std::string dir = testing::FreshTempDir("launch_secret");
  ConfigOptions o;
  o.max_steps = 1000000;
  o.output_dir = JoinPath(dir, "out");
  const std::string spec = testing::WriteClusterSpec(dir, 1, 1);  // names no secret
  const std::string config =
      testing::WriteFile(JoinPath(dir, "train.pbtxt"), testing::ConfigText(o));
  SpawnOptions so;
  so.argv = {Binary("tools/pstrain"), "launch", "--cluster_spec", spec, "--config", config,
             "--bin_dir", BinDir(), "--progress=false"};
  so.output_file = JoinPath(dir, "launch.out");
  auto launch = Subprocess::Spawn(so);
  REQUIRE(launch.ok());
  const std::string secret = testing::RunSecretFile(o.output_dir);
  struct stat st;
  REQUIRE(::stat(secret.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto cluster = ClusterSpec::FromFile(spec);
  REQUIRE(cluster.ok());
  // The operator, with the run's secret, sees it train.
  testing::ActAs("operator", secret);
  GrpcChiefClient chief(cluster->address(kChiefJob, 0), absl::Seconds(1));
  REQUIRE(RetryWithBackoff("training", absl::Seconds(60), [&]() {
            ChiefStatusResponse s;
            absl::Status status = chief.GetStatus(&s);
            if (!status.ok()) return absl::UnavailableError(status.message());
            return s.global_step() >= 5 ? absl::OkStatus() : absl::UnavailableError("not yet");
          }, absl::Milliseconds(50)).ok());
  // Another process on the machine, without the secret: it can neither read
  // the incarnation nor stop a server (both worked before runs had secrets).
  SetCallCredentials("", "");
  auto ps = PsService::NewStub(CreateChannel(cluster->address(kPsJob, 0), "ps:0"));
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    PsStatusResponse status;
    const grpc::Status refused = ps->GetStatus(&ctx, PsStatusRequest(), &status);
    CHECK(refused.error_code() == grpc::StatusCode::UNAUTHENTICATED);
    CHECK(refused.error_message().find("pstrain launch writes in the output_dir") !=
          std::string::npos);
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    ShutdownRequest bye;
    ShutdownResponse resp;
    CHECK(ps->Shutdown(&ctx, bye, &resp).error_code() == grpc::StatusCode::UNAUTHENTICATED);
  }
  CHECK_FALSE((*launch)->Wait(absl::Seconds(1)).has_value());  // still training
  (*launch)->Signal(SIGINT);
  REQUIRE((*launch)->Wait(absl::Seconds(30)).has_value());
  const std::string out = Env::Default()->ReadFile(so.output_file).value_or("");
  INFO(out);
  CHECK(out.find("calls are signed with a secret made for this run, " + secret) !=
        std::string::npos);
  for (const char* task : {"chief-0", "ps-0", "worker-0"}) {
    const std::string log =
        Env::Default()->ReadFile(JoinPath(o.output_dir, absl::StrCat("logs/", task, ".log")))
            .value_or("");
    INFO(task << ": " << log);
    CHECK(log.find("authentication on: calls are signed") != std::string::npos);
    CHECK(log.find("no authentication") == std::string::npos);
  }
  CHECK(testing::NoProcessesMatching(spec, absl::Seconds(10)));
}

TEST_CASE("a daemon started by hand without credentials says so; --insecure is the opt-out",
          "[security][cluster]") {
  const std::string dir = testing::FreshTempDir("open_daemon");
  const std::string spec = testing::WriteClusterSpec(dir, 1, 1);
  for (const bool insecure : {false, true}) {
    SpawnOptions so;
    so.argv = {Binary("ps_server/ps_server"), "--cluster_spec=" + spec, "--task=0",
               "--chief_timeout_s=0"};
    if (insecure) so.argv.push_back("--insecure");
    so.output_file = JoinPath(dir, absl::StrCat("ps-", insecure, ".log"));
    auto ps = Subprocess::Spawn(so);
    REQUIRE(ps.ok());
    std::string log;
    for (const absl::Time end = absl::Now() + absl::Seconds(20);
         log.find("listening") == std::string::npos && absl::Now() < end;) {
      absl::SleepFor(absl::Milliseconds(50));
      log = Env::Default()->ReadFile(so.output_file).value_or("");
    }
    (*ps)->Stop(absl::Seconds(5));
    log = Env::Default()->ReadFile(so.output_file).value_or("");
    INFO(log);
    REQUIRE(log.find("listening") != std::string::npos);
    const std::string warning = "no authentication: any process on this machine can call";
    const size_t at = log.find(warning);
    if (insecure) {
      CHECK(at == std::string::npos);
    } else {
      CHECK(at != std::string::npos);
      CHECK(log.find(warning, at + 1) == std::string::npos);  // one line
    }
  }
}

TEST_CASE("only the operator may roll a job back (the chief's Restore)", "[security][cluster]") {
  const std::string dir = testing::FreshTempDir("auth_restore");
  const std::string spec = WriteSecuredSpec(dir, 1, 1);
  auto cluster = ClusterSpec::FromFile(spec);
  REQUIRE(cluster.ok());
  ConfigOptions o;
  o.output_dir = JoinPath(dir, "out");
  const std::string config = testing::WriteFile(JoinPath(dir, "train.pbtxt"), testing::ConfigText(o));
  // The chief alone: it serves while it waits for its servers.
  SpawnOptions so;
  so.argv = {Binary("chief/chief"), "--cluster_spec=" + spec, "--config=" + config};
  so.output_file = JoinPath(dir, "chief.log");
  auto chief = Subprocess::Spawn(so);
  REQUIRE(chief.ok());
  WaitForLogLine(so.output_file, "listening on");  // the calls are signed before they are sent
  auto stub = ChiefService::NewStub(CreateChannel(cluster->address(kChiefJob, 0)));
  auto restore = [&](const std::string& identity, const std::string& token) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    ctx.set_wait_for_ready(true);
    if (!identity.empty()) ctx.AddMetadata(kIdentityHeader, identity);
    if (!token.empty()) {
      ctx.AddMetadata("authorization", Signature(identity, token, "chief:0", "Restore"));
    }
    RestoreRequest req;
    req.set_checkpoint(JoinPath(dir, "ckpt-100"));
    RestoreResponse resp;
    return stub->Restore(&ctx, req, &resp).error_code();
  };
  CHECK(restore("", "") == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(restore("worker:0", Token(dir, "worker-0.token")) == grpc::StatusCode::PERMISSION_DENIED);
  CHECK(restore("chief:0", Token(dir, "chief-0.token")) == grpc::StatusCode::PERMISSION_DENIED);
  // The operator is let through; a chief still starting takes no restore.
  CHECK(restore("operator", Token(dir, "operator.token")) == grpc::StatusCode::UNAVAILABLE);
  (*chief)->Stop(absl::Seconds(5));
  const std::string log = Env::Default()->ReadFile(so.output_file).value_or("");
  CHECK(log.find("Restore refused for worker:0") != std::string::npos);
}

TEST_CASE("a cluster with a secret trains end to end; plaintext beyond loopback is refused",
          "[security][cluster]") {
  const std::string dir = testing::FreshTempDir("auth_launch");
  const std::string spec = WriteSecuredSpec(dir, 2, 2);
  ConfigOptions o;
  o.max_steps = 40;
  o.eval_every_steps = 20;
  o.output_dir = JoinPath(dir, "out");
  const std::string config =
      testing::WriteFile(JoinPath(dir, "train.pbtxt"), testing::ConfigText(o));
  CommandResult r = testing::RunCommand({Binary("tools/pstrain"), "launch", "--cluster_spec", spec,
                                         "--config", config, "--bin_dir", BinDir()},
                                        absl::Seconds(120));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("finished: step 40") != std::string::npos);
  const std::string ps_log =
      Env::Default()->ReadFile(JoinPath(o.output_dir, "logs/ps-1.log")).value_or("");
  CHECK(ps_log.find("authentication on") != std::string::npos);
  CHECK(ps_log.find("refused") == std::string::npos);

  // The same job on addresses beyond loopback, without a secret: refused at
  // start, naming the way out; --insecure lets it start.
  const std::string remote = testing::WriteFile(
      JoinPath(dir, "remote.json"),
      R"({"chief": ["10.255.255.1:2220"], "ps": ["10.255.255.2:2221"], "worker": ["10.255.255.3:2222"]})");
  CommandResult refused = testing::RunCommand(
      {Binary("ps_server/ps_server"), "--cluster_spec=" + remote, "--task=0"}, absl::Seconds(20));
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("pstrain tokens") != std::string::npos);
  CommandResult insecure = testing::RunCommand(
      {Binary("ps_server/ps_server"), "--cluster_spec=" + remote, "--task=0", "--insecure"},
      absl::Seconds(20));
  INFO(insecure.output);
  CHECK(insecure.exit_code == 1);  // past authentication: 10.255.255.2 is not this machine
  CHECK(insecure.output.find("cannot listen on 10.255.255.2:2221") != std::string::npos);
}

TEST_CASE("a cluster with mutual TLS, and with TLS and tokens, trains end to end",
          "[security][cluster][tls]") {
  const std::string dir = testing::FreshTempDir("tls_launch");
  const std::string spec = testing::WriteClusterSpec(dir, 2, 2);
  const std::string certs = testing::UseMutualTls(dir, spec);
  INFO(certs);
  CHECK(certs.find("wrote a new CA") != std::string::npos);
  CHECK(certs.find("valid until ") != std::string::npos);
  CHECK(certs.find("when the CA expires") == std::string::npos);
  nlohmann::json j = nlohmann::json::parse(*Env::Default()->ReadFile(spec));
  for (bool with_tokens : {false, true}) {
    if (with_tokens) {
      j["pstrain"]["auth"] = {{"secret_file", "auth/cluster.secret"}};
      testing::WriteFile(spec, j.dump());
      REQUIRE(testing::RunCommand({Binary("tools/pstrain"), "tokens", "--cluster_spec", spec,
                                   "--out", JoinPath(dir, "auth")},
                                  absl::Seconds(30))
                  .exit_code == 0);
    }
    ConfigOptions o;
    o.max_steps = 40;
    o.eval_every_steps = 20;
    o.output_dir = JoinPath(dir, with_tokens ? "out_both" : "out_tls");
    const std::string config =
        testing::WriteFile(JoinPath(dir, "train.pbtxt"), testing::ConfigText(o));
    CommandResult r = testing::RunCommand({Binary("tools/pstrain"), "launch", "--cluster_spec",
                                           spec, "--config", config, "--bin_dir", BinDir()},
                                          absl::Seconds(120));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("finished: step 40") != std::string::npos);
    for (const char* task : {"ps-1", "chief-0", "worker-1"}) {
      const std::string log =
          Env::Default()->ReadFile(JoinPath(o.output_dir, absl::StrCat("logs/", task, ".log")))
              .value_or("");
      INFO(log);
      CHECK(log.find("mutual TLS on") != std::string::npos);
      CHECK((log.find("authentication on") != std::string::npos) == with_tokens);
      CHECK(log.find(" refused: ") == std::string::npos);  // no call was turned away
      CHECK(log.find(" refused for ") == std::string::npos);
    }
  }

  // A task started with another task's certificate stops at once, saying so.
  CommandResult wrong = testing::RunCommand(
      {Binary("ps_server/ps_server"), "--cluster_spec=" + spec, "--task=0",
       "--tls_cert_file=" + JoinPath(dir, "tls/ps-1.crt"),
       "--tls_key_file=" + JoinPath(dir, "tls/ps-1.key")},
      absl::Seconds(20));
  CHECK(wrong.exit_code == 2);
  CHECK(wrong.output.find("is the certificate of \"ps:1\", not of this task, ps:0") !=
        std::string::npos);
}

TEST_CASE("a running daemon takes renewed certificates without a restart", "[security][tls]") {
  const std::string dir = testing::FreshTempDir("tls_renew");
  const std::string spec = testing::WriteClusterSpec(dir, 1, 1);
  // Written, then written again with the same CA (the spec names the same
  // directory both times): ps:0's certificate each time.
  auto certs = [&] {
    testing::UseMutualTls(dir, spec);
    return *Env::Default()->ReadFile(JoinPath(dir, "tls/ps-0.crt"));
  };
  const std::string first = certs();
  SpawnOptions so;
  so.argv = {Binary("ps_server/ps_server"), "--cluster_spec=" + spec, "--task=0",
             "--metrics_address=127.0.0.1:0", "--tls_reload_s=1", "--chief_timeout_s=0"};
  so.output_file = JoinPath(dir, "ps.log");
  auto ps = Subprocess::Spawn(so);
  REQUIRE(ps.ok());
  const int port = MetricsPort(so.output_file);
  const TlsFiles monitor = TlsFilesIn(JoinPath(dir, "tls"), kMonitorIdentity);
  auto shown = [&](std::string* metrics = nullptr) {
    std::string error, cert;
    const std::string r =
        testing::HttpsGet(port, "/metrics", monitor, kMetricsAltName, &error, &cert);
    if (metrics != nullptr) *metrics = r;
    return cert;
  };
  CHECK(shown() == first);

  // Renewed with the same CA while it runs: served within about 2 s.
  const std::string second = certs();
  REQUIRE(second != first);
  std::string now, metrics;
  for (absl::Time end = absl::Now() + absl::Seconds(15);
       (now = shown(&metrics)) != second && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  CHECK(now == second);
  INFO(metrics);
  CHECK(metrics.find("pstrain_tls_reloads_total{outcome=\"ok\",job=\"ps\",task=\"0\"} 1") !=
        std::string::npos);
  CHECK(metrics.find("pstrain_tls_certificate_expiry_timestamp_seconds{") != std::string::npos);
  // And over gRPC, which reads the staged files on the same interval: a new
  // connection of the operator sees the new certificate.
  const std::string address = ClusterSpec::FromFile(spec)->address(kPsJob, 0);
  // A GetStatus of ps:0 over a new connection with `material`: its code,
  // and the certificate the server showed.
  auto call_with = [&](const TlsConfig& material, std::string* server_cert = nullptr) {
    SetTransportSecurity(std::make_shared<const TlsConfig>(material));
    auto stub = PsService::NewStub(CreateChannel(address, "ps:0"));
    SetTransportSecurity(nullptr);
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    PsStatusResponse status;
    const grpc::Status st = stub->GetStatus(&ctx, PsStatusRequest(), &status);
    if (st.ok() && server_cert != nullptr) {
      const std::vector<grpc::string_ref> pem =
          ctx.auth_context()->FindPropertyValues("x509_pem_cert");
      *server_cert = pem.empty() ? std::string() : std::string(pem[0].data(), pem[0].size());
    }
    return st.error_code();
  };
  auto material = [&](const std::string& identity) {
    return *LoadTls(TlsFilesIn(JoinPath(dir, "tls"), identity));
  };
  auto grpc_shown = [&] {
    std::string cert;
    return call_with(material("operator"), &cert) == grpc::StatusCode::OK ? cert : "failed";
  };
  for (absl::Time end = absl::Now() + absl::Seconds(15);
       (now = grpc_shown()) != second && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  CHECK(now == second);

  // Revoked with the CLI while it runs (it started before any list was
  // made): the operator's next connection is refused, the chief's is not.
  // The operator's material, read while it was good, and a call with it.
  const TlsConfig op = material("operator");
  CHECK(call_with(op) == grpc::StatusCode::OK);
  CommandResult revoke = testing::RunCommand(
      {Binary("tools/pstrain"), "certs", "--out", JoinPath(dir, "tls"), "--revoke=operator"},
      absl::Seconds(30));
  INFO(revoke.output);
  REQUIRE(revoke.exit_code == 0);
  CHECK(revoke.output.find("lists 1 revoked certificate(s)") != std::string::npos);
  CHECK(call_with(material("chief:0")) == grpc::StatusCode::OK);
  CHECK(call_with(op) == grpc::StatusCode::UNAVAILABLE);
  CHECK_FALSE(LoadTls(TlsFilesIn(JoinPath(dir, "tls"), "operator")).ok());  // revoked

  // The key copy it staged goes when it stops.
  (*ps)->Stop(absl::Seconds(20));
  const std::string log = Env::Default()->ReadFile(so.output_file).value_or("");
  INFO(log);
  CHECK(log.find("TLS: took the renewed certificate of ps:0") != std::string::npos);
  const size_t at = log.find("(staged in ");
  REQUIRE(at != std::string::npos);
  const size_t begin = at + std::string("(staged in ").size();
  const std::string staging = log.substr(begin, log.find(')', begin) - begin);
  CHECK(staging.find("pstrain-tls-") != std::string::npos);
  CHECK_FALSE(Env::Default()->FileExists(staging));
}

}  // namespace
}  // namespace pstrain
