// Multi-process tests of a job's life as a user starts it, with the real
// chief, ps_server and worker binaries started by `pstrain launch` (or by
// hand) on free loopback ports, always reaped: malformed specs and configs
// refused in one line, signals, a daemon lost, paused or exiting, a second
// launch into a running one's output, TF_CONFIG, `pstrain plan` and
// `pstrain bench`. Training itself (what the jobs learn, equivalence,
// determinism): tests/cluster_test.cc.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/client/chief_client.h"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/config.h"
#include "common/cluster/sizing.h"
#include "common/storage/env.h"
#include "common/rpc/rpc.h"
#include "tools/subprocess.h"
#include "common/storage/tensor_file.h"
#include "common/testing/skip.h"
#include "common/rpc/wire_frame.h"
#include "nlohmann/json.hpp"
#include "proto/ps_service.grpc.pb.h"
#include "ps_server/embedding_table.h"
#include "ps_server/optimizer.h"
#include "common/base/embedding_ids.h"
#include "tests/cluster_testlib.h"
#include "worker/data/criteo_reader.h"
#include "worker/data/idx_reader.h"
#include "worker/data/partition.h"
#include "worker/model/backend.h"
#include "worker/model/embedding_bag.h"
#include "worker/model/model.h"

namespace pstrain {
namespace {

using testing::Binary;
using testing::BinDir;
using testing::CommandResult;
using testing::ConfigOptions;

TEST_CASE("malformed cluster specs and configs: one-line error, non-zero exit", "[cluster][errors]") {
  const std::string dir = testing::FreshTempDir("errors");
  ConfigOptions o;
  o.output_dir = JoinPath(dir, "out");
  const std::string config = testing::WriteFile(JoinPath(dir, "ok.pbtxt"), testing::ConfigText(o));
  const std::string good_spec = testing::WriteClusterSpec(dir, 1, 1);
  struct Case {
    std::string spec_text, expect;
  };
  const std::vector<Case> cases = {
      {"{\"chief\": [\"localhost:1\"], \"ps\": [", "not valid JSON"},
      {R"({"chief": ["localhost:1"], "ps": ["localhost:2"], "worker": ["127.0.0.1:2"]})",
       "duplicate address"},
      {R"({"chief": ["localhost:1"], "worker": ["localhost:3"]})", "at least one parameter server"},
      {R"({"chief": ["localhost:1"], "ps": ["localhost:99999"], "worker": ["localhost:3"]})",
       "1..65535"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string spec = testing::WriteFile(JoinPath(dir, absl::StrCat("bad", i, ".json")),
                                                cases[i].spec_text);
    CommandResult r = testing::RunCommand(
        {Binary("tools/pstrain"), "launch", "--cluster_spec", spec, "--config", config},
        absl::Seconds(30));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(cases[i].expect) != std::string::npos);
    CHECK(r.output.find(spec) != std::string::npos);  // names the file
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  }
  // A task index out of range, given to a daemon directly.
  CommandResult r = testing::RunCommand(
      {Binary("ps_server/ps_server"), "--cluster_spec=" + good_spec, "--task=3"}, absl::Seconds(30));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("out of range") != std::string::npos);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  // Server limits out of range, each refused in one line naming the flag.
  for (const auto& [flag, expect] : std::vector<std::pair<std::string, std::string>>{
           {"--max_inflight_mib=100", "minimum of 512 MiB"},
           {"--max_rpc_threads=1", "outside [4, 65536]"},
           {"--max_concurrent_calls=0", "at least 1"},
           {"--handshake_timeout_ms=5", "--handshake_timeout_ms=5: expected 100..86400000"},
           {"--keepalive_ms=100000000", "--keepalive_ms=100000000: expected 100..86400000"},
           {"--tls_reload_s=-5", "expected seconds between looks, or 0"}}) {
    r = testing::RunCommand(
        {Binary("ps_server/ps_server"), "--cluster_spec=" + good_spec, "--task=0", flag},
        absl::Seconds(30));
    INFO(flag << ": " << r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(expect) != std::string::npos);
    CHECK(r.output.find(flag.substr(0, flag.find('='))) != std::string::npos);
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  }
  // The same limits given to `pstrain launch`: checked before any task
  // starts; good ones reach the servers (and the chief), which say so.
  for (const auto& [flag, expect] : std::vector<std::pair<std::string, std::string>>{
           {"--max_inflight_mib=100", "--max_inflight_mib: expected 512.."},
           {"--max_rpc_threads=2", "--max_rpc_threads: expected 4..65536"},
           {"--max_concurrent_calls=zero", "--max_concurrent_calls: expected 1.."},
           {"--handshake_timeout_ms=50", "--handshake_timeout_ms: expected 100..86400000"},
           {"--keepalive_ms=-1", "--keepalive_ms: expected 100..86400000"},
           // The config's rpc.step_timeout_ms + rpc.rpc_timeout_ms: 30 s + 10 s.
           {"--keepalive_ms=39999", "--keepalive_ms=39999 is below rpc.step_timeout_ms + "
                                    "rpc.rpc_timeout_ms (40000): a worker paused that long "
                                    "would be dropped mid-step"}}) {
    r = testing::RunCommand({Binary("tools/pstrain"), "launch", "--cluster_spec", good_spec,
                             "--config", config, "--bin_dir", BinDir(), flag},
                            absl::Seconds(30));
    INFO(flag << ": " << r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(expect) != std::string::npos);
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  }
  r = testing::RunCommand({Binary("tools/pstrain"), "launch", "--cluster_spec", good_spec,
                           "--config", config, "--bin_dir", BinDir(), "--progress=false",
                           "--max_inflight_mib=600", "--max_rpc_threads=32",
                           "--max_concurrent_calls=1000", "--handshake_timeout_ms=15000",
                           "--keepalive_ms=45000"},
                          absl::Seconds(120));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  const std::string ps_log =
      Env::Default()->ReadFile(JoinPath(o.output_dir, "logs/ps-0.log")).value_or("");
  CHECK(ps_log.find("(at most 1000 data calls at once, 32 RPC threads, 600 MiB of messages in "
                    "flight; a handshake may take 15s, a ping may go unanswered 45s)") !=
        std::string::npos);
  // A malformed training config names line and column.
  const std::string bad_config =
      testing::WriteFile(JoinPath(dir, "bad.pbtxt"), "max_steps: 10\nseed: [\n");
  r = testing::RunCommand(
      {Binary("tools/pstrain"), "launch", "--cluster_spec", good_spec, "--config", bad_config},
      absl::Seconds(30));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find(bad_config + ":2:") != std::string::npos);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  CHECK(testing::NoProcessesMatching(dir, absl::Seconds(10)));
}

// Starts `pstrain launch` on a long job and waits until training is under way.
// With `own_group`, launch runs as the leader of a new process group (setsid),
// as a shell starts a foreground job.
std::unique_ptr<Subprocess> StartLongJob(const std::string& dir, std::string* spec_path,
                                         bool own_group = false) {
  ConfigOptions o;
  o.max_steps = 1000000;
  o.output_dir = JoinPath(dir, "out");
  *spec_path = testing::WriteClusterSpec(dir, 2, 2);
  const std::string config =
      testing::WriteFile(JoinPath(dir, "train.pbtxt"), testing::ConfigText(o));
  SpawnOptions so;
  so.argv = {Binary("tools/pstrain"), "launch", "--cluster_spec", *spec_path, "--config", config,
             "--bin_dir", BinDir()};
  if (own_group) so.argv.insert(so.argv.begin(), "/usr/bin/setsid");
  so.output_file = JoinPath(dir, "launch.out");
  auto proc = Subprocess::Spawn(so);
  REQUIRE(proc.ok());
  auto cluster = ClusterSpec::FromFile(*spec_path);
  REQUIRE(cluster.ok());
  // The run signs its calls with a secret of its own: the test reads the
  // chief's status as the operator, as pstrain launch does.
  testing::ActAs("operator", testing::RunSecretFile(o.output_dir));
  GrpcChiefClient chief(cluster->address(kChiefJob, 0), absl::Seconds(1));
  absl::Status training = RetryWithBackoff("wait for training", absl::Seconds(60), [&chief]() {
    ChiefStatusResponse s;
    absl::Status st = chief.GetStatus(&s);
    if (!st.ok()) return absl::UnavailableError(st.message());
    if (s.global_step() < 20) return absl::UnavailableError("not training yet");
    return absl::OkStatus();
  }, /*max_backoff=*/absl::Milliseconds(100));
  REQUIRE(training.ok());
  return std::move(*proc);
}

TEST_CASE("Ctrl-C on pstrain launch stops every task and leaves none behind", "[cluster][signals]") {
  const std::string dir = testing::FreshTempDir("sigint");
  std::string spec;
  std::unique_ptr<Subprocess> launch = StartLongJob(dir, &spec);
  CHECK(testing::ProcessesMatching(spec).size() == 6);  // launch + 5 tasks
  launch->Signal(SIGINT);
  std::optional<int> code = launch->Wait(absl::Seconds(30));
  REQUIRE(code.has_value());
  CHECK(*code != 0);
  CHECK(testing::NoProcessesMatching(spec, absl::Seconds(10)));
}

TEST_CASE("a forged progress report cannot end a run: the chief acts on the servers' version",
          "[cluster][security]") {
  const std::string dir = testing::FreshTempDir("forged_progress");
  std::string spec;
  std::unique_ptr<Subprocess> launch = StartLongJob(dir, &spec);
  auto cluster = ClusterSpec::FromFile(spec);
  REQUIRE(cluster.ok());
  // A worker's key (the run's secret is the test's): a worker can read the
  // incarnation and claim any step.
  testing::ActAs("worker:0", JoinPath(dir, "out/run.secret"));
  auto ps = PsService::NewStub(CreateChannel(cluster->address(kPsJob, 0), "ps:0"));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(10));
  PsStatusResponse ps_status;
  REQUIRE(ps->GetStatus(&ctx, PsStatusRequest(), &ps_status).ok());
  GrpcChiefClient chief(cluster->address(kChiefJob, 0), absl::Seconds(5));
  ProgressReport forged;
  forged.set_incarnation(ps_status.incarnation());
  forged.set_worker(0);
  forged.set_global_step(100000000);
  ProgressResponse resp;
  REQUIRE(chief.ReportProgress(forged, &resp).ok());
  CHECK_FALSE(resp.stop());
  // The chief used to finish within a second, and launch to exit 0.
  CHECK_FALSE(launch->Wait(absl::Seconds(3)).has_value());
  ChiefStatusResponse s;
  REQUIRE(chief.GetStatus(&s).ok());
  CHECK(s.global_step() < 1000000);
  CHECK(s.state() == "training");
  launch->Signal(SIGINT);
  REQUIRE(launch->Wait(absl::Seconds(30)).has_value());
  CHECK(testing::NoProcessesMatching(spec, absl::Seconds(10)));
}

TEST_CASE("a parameter server that exits with code 0 mid-run fails the launch, naming it",
          "[cluster][faults]") {
  const std::string dir = testing::FreshTempDir("ps_exit_zero");
  std::string spec;
  std::unique_ptr<Subprocess> launch = StartLongJob(dir, &spec);
  auto cluster = ClusterSpec::FromFile(spec);
  REQUIRE(cluster.ok());
  // Stopped as its chief does at the end (with the chief's key); ps:1 then
  // exits with code 0.
  testing::ActAs("chief:0", JoinPath(dir, "out/run.secret"));
  auto ps = PsService::NewStub(CreateChannel(cluster->address(kPsJob, 1), "ps:1"));
  PsStatusResponse status;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    REQUIRE(ps->GetStatus(&ctx, PsStatusRequest(), &status).ok());
  }
  ShutdownRequest bye;
  bye.set_incarnation(status.incarnation());
  bye.set_reason("test");
  ShutdownResponse bye_resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(10));
  REQUIRE(ps->Shutdown(&ctx, bye, &bye_resp).ok());
  const absl::Time start = absl::Now();
  std::optional<int> code = launch->Wait(absl::Seconds(30));
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  CHECK(absl::Now() - start < absl::Seconds(15));  // it went unnoticed for ~70 s
  auto out = Env::Default()->ReadFile(JoinPath(dir, "launch.out"));
  REQUIRE(out.ok());
  INFO(*out);
  // Named as the failure, or beside the worker that failed for it first.
  CHECK((out->find("ps:1 exited with code 0 before the chief finished the run") !=
             std::string::npos ||
         out->find("ps:1 had exited with code 0 before the chief finished the run") !=
             std::string::npos));
  CHECK(testing::NoProcessesMatching(spec, absl::Seconds(10)));
}

// Starts `argv` with its output in `log`.
std::unique_ptr<Subprocess> SpawnLogged(std::vector<std::string> argv, const std::string& log) {
  SpawnOptions so;
  so.argv = std::move(argv);
  so.output_file = log;
  auto p = Subprocess::Spawn(so);
  REQUIRE(p.ok());
  return std::move(*p);
}

// Waits up to `timeout` for the file `log` to hold `text`.
absl::Status WaitForLog(const std::string& log, const std::string& text, absl::Duration timeout) {
  return RetryWithBackoff(absl::StrCat("\"", text, "\" in ", log), timeout, [&]() {
    return Env::Default()->ReadFile(log).value_or("").find(text) != std::string::npos
               ? absl::OkStatus()
               : absl::UnavailableError("not yet");
  }, absl::Milliseconds(100));
}

TEST_CASE("a parameter server whose chief is gone exits after --chief_timeout_s, saying why",
          "[cluster][faults]") {
  const std::string dir = testing::FreshTempDir("chief_gone");
  const std::string spec = testing::WriteClusterSpec(dir, 1, 1);
  ConfigOptions o;
  o.output_dir = JoinPath(dir, "out");
  const std::string config =
      testing::WriteFile(JoinPath(dir, "train.pbtxt"), testing::ConfigText(o));
  const std::string ps_log = JoinPath(dir, "ps.log");
  auto ps = SpawnLogged({Binary("ps_server/ps_server"), "--cluster_spec=" + spec, "--task=0",
                         "--chief_timeout_s=2"},
                        ps_log);
  auto chief = SpawnLogged(
      {Binary("chief/chief"), "--cluster_spec=" + spec, "--config=" + config},
      JoinPath(dir, "chief.log"));
  // The chief installs the model, then waits for its worker, which never comes.
  REQUIRE(WaitForLog(ps_log, "initialized", absl::Seconds(30)).ok());
  CHECK_FALSE(ps->Wait(absl::Seconds(4)).has_value());  // the chief is there: it stays
  chief->Signal(SIGKILL);
  std::optional<int> code = ps->Wait(absl::Seconds(20));
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  const std::string log = Env::Default()->ReadFile(ps_log).value_or("");
  INFO(log);
  CHECK(log.find("has been unreachable for") != std::string::npos);
  chief->Wait(absl::Seconds(5));
}

TEST_CASE("a parameter server whose chief never answers exits after --chief_timeout_s too",
          "[cluster][faults]") {
  // It used to time the chief only from a first answer: a chief that died
  // before it left the server running for good.
  const std::string dir = testing::FreshTempDir("chief_never");
  const std::string spec = testing::WriteClusterSpec(dir, 1, 1);  // no chief is started
  const std::string ps_log = JoinPath(dir, "ps.log");
  const absl::Time start = absl::Now();
  auto ps = SpawnLogged({Binary("ps_server/ps_server"), "--cluster_spec=" + spec, "--task=0",
                         "--chief_timeout_s=2"},
                        ps_log);
  std::optional<int> code = ps->Wait(absl::Seconds(30));
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  CHECK(absl::Now() - start < absl::Seconds(15));
  const std::string log = Env::Default()->ReadFile(ps_log).value_or("");
  INFO(log);
  CHECK(log.find("has not answered in the ") != std::string::npos);
  CHECK(log.find(" since this server started (--chief_timeout_s=2; last: ") != std::string::npos);
}

TEST_CASE("a worker whose chief is gone exits after rpc.startup_timeout_ms, saying why",
          "[cluster][faults]") {
  const std::string dir = testing::FreshTempDir("worker_chief_gone");
  const std::string spec = testing::WriteClusterSpec(dir, 1, 1);
  ConfigOptions o;
  o.output_dir = JoinPath(dir, "out");
  o.max_steps = 1000000;  // it never ends by itself
  o.startup_timeout_ms = 3000;
  const std::string config =
      testing::WriteFile(JoinPath(dir, "train.pbtxt"), testing::ConfigText(o));
  auto ps = SpawnLogged({Binary("ps_server/ps_server"), "--cluster_spec=" + spec, "--task=0"},
                        JoinPath(dir, "ps.log"));
  auto chief = SpawnLogged(
      {Binary("chief/chief"), "--cluster_spec=" + spec, "--config=" + config},
      JoinPath(dir, "chief.log"));
  const std::string worker_log = JoinPath(dir, "worker.log");
  auto worker = SpawnLogged(
      {Binary("worker/worker"), "--cluster_spec=" + spec, "--task=0", "--config=" + config},
      worker_log);
  REQUIRE(WaitForLog(worker_log, "registered with the chief", absl::Seconds(60)).ok());
  absl::SleepFor(absl::Milliseconds(500));  // some steps, and a report or two
  chief->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  std::optional<int> code = worker->Wait(absl::Seconds(60));
  if (!code.has_value()) worker->Stop(absl::Seconds(5));
  ps->Stop(absl::Seconds(5));
  chief->Wait(absl::Seconds(5));
  const std::string log = Env::Default()->ReadFile(worker_log).value_or("");
  INFO(log);
  REQUIRE(code.has_value());
  WARN("the worker exited " << absl::FormatDuration(absl::Now() - killed)
                            << " after its chief was killed (startup timeout 3 s)");
  CHECK(*code == 1);
  CHECK(log.find("waiting up to 3s for it to come back") != std::string::npos);
  CHECK(log.find("no chief to follow") != std::string::npos);
  CHECK(log.find("the chief has not answered for 3s (rpc.startup_timeout_ms)") !=
        std::string::npos);
}

TEST_CASE("a worker waiting for its chief stops at once on SIGTERM, not at the startup timeout",
          "[cluster][faults]") {
  const std::string dir = testing::FreshTempDir("worker_term");
  const std::string spec = testing::WriteClusterSpec(dir, 1, 1);
  ConfigOptions o;
  o.output_dir = JoinPath(dir, "out");
  o.startup_timeout_ms = 120000;  // the wait SIGTERM must cut short
  const std::string config =
      testing::WriteFile(JoinPath(dir, "train.pbtxt"), testing::ConfigText(o));
  const std::string worker_log = JoinPath(dir, "worker.log");
  auto worker = SpawnLogged(
      {Binary("worker/worker"), "--cluster_spec=" + spec, "--task=0", "--config=" + config},
      worker_log);
  // No chief ever runs: the worker has read its data and waits to register.
  REQUIRE(WaitForLog(worker_log, "training examples in this worker's partition",
                     absl::Seconds(30))
              .ok());
  CHECK_FALSE(worker->Wait(absl::Milliseconds(500)).has_value());
  const absl::Time sent = absl::Now();
  worker->Signal(SIGTERM);
  // Before, it waited out the call to the chief: up to the 120 s above.
  std::optional<int> code = worker->Wait(absl::Seconds(20));
  if (!code.has_value()) worker->Stop(absl::Seconds(5));
  REQUIRE(code.has_value());
  WARN("the waiting worker exited " << absl::FormatDuration(absl::Now() - sent)
                                    << " after SIGTERM");
  CHECK(*code == 128 + SIGTERM);
  const std::string log = Env::Default()->ReadFile(worker_log).value_or("");
  INFO(log);
  CHECK(log.find("stopped: received Terminated") != std::string::npos);
}

TEST_CASE("a second launch into a running launch's output_dir is refused, naming it",
          "[cluster][errors]") {
  const std::string dir = testing::FreshTempDir("shared_output");
  std::string spec;
  std::unique_ptr<Subprocess> launch = StartLongJob(dir, &spec);
  CommandResult second = testing::RunCommand(
      {Binary("tools/pstrain"), "launch", "--cluster_spec", spec, "--config",
       JoinPath(dir, "train.pbtxt"), "--bin_dir", BinDir()},
      absl::Seconds(30));
  CHECK(second.exit_code == 2);
  CHECK(second.output.find(absl::StrCat("is in use by another launch (pid ", launch->pid(), ")")) !=
        std::string::npos);
  CHECK_FALSE(launch->Wait(absl::ZeroDuration()).has_value());  // the first goes on
  launch->Signal(SIGINT);
  REQUIRE(launch->Wait(absl::Seconds(30)).has_value());
  CHECK(testing::NoProcessesMatching(spec, absl::Seconds(10)));
}

TEST_CASE("a chief whose output_dir is not writable fails at once, not after training",
          "[cluster][errors]") {
  const std::string dir = testing::FreshTempDir("unwritable_output");
  const std::string spec = testing::WriteClusterSpec(dir, 1, 1);
  ConfigOptions o;
  o.output_dir = JoinPath(dir, "a_file/out");  // under a regular file: never creatable
  testing::WriteFile(JoinPath(dir, "a_file"), "x");
  const std::string config =
      testing::WriteFile(JoinPath(dir, "train.pbtxt"), testing::ConfigText(o));
  CommandResult r = testing::RunCommand(
      {Binary("chief/chief"), "--cluster_spec=" + spec, "--config=" + config}, absl::Seconds(30));
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("is not writable") != std::string::npos);
}

TEST_CASE("an empty test split is refused at start instead of reporting accuracy 0.0000",
          "[cluster][errors]") {
  const std::string dir = testing::FreshTempDir("empty_test_split");
  const std::string spec = testing::WriteClusterSpec(dir, 1, 1);
  ConfigOptions o;
  o.output_dir = JoinPath(dir, "out");
  // IDX files of 0 images and 0 labels: well-formed, and empty.
  const std::string images = testing::WriteFile(JoinPath(dir, "empty-images"),
                                                std::string("\0\0\x08\x03\0\0\0\0\0\0\0\x1c\0\0\0\x1c", 16));
  const std::string labels =
      testing::WriteFile(JoinPath(dir, "empty-labels"), std::string("\0\0\x08\x01\0\0\0\0", 8));
  const std::string d = testing::DigitsDir();
  o.data = absl::StrCat("train_images: \"", d, "/train-images-idx3-ubyte\" train_labels: \"", d,
                        "/train-labels-idx1-ubyte\" test_images: \"", images,
                        "\" test_labels: \"", labels, "\"");
  const std::string config =
      testing::WriteFile(JoinPath(dir, "train.pbtxt"), testing::ConfigText(o));
  CommandResult r = testing::RunCommand(
      {Binary("chief/chief"), "--cluster_spec=" + spec, "--config=" + config}, absl::Seconds(30));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("the test split has no examples") != std::string::npos);
}

TEST_CASE("a sync worker paused past rpc_timeout_ms but within step_timeout_ms does not fail the run",
          "[cluster][faults]") {
  // It failed with "Push to ps:1: Deadline Exceeded" when paused with a push
  // in flight: pushes had the rpc deadline, not the step's.
  const std::string dir = testing::FreshTempDir("worker_paused");
  ConfigOptions o;
  o.max_steps = 1000000;
  o.rpc_timeout_ms = 1000;
  o.step_timeout_ms = 30000;
  o.output_dir = JoinPath(dir, "out");
  const std::string spec = testing::WriteClusterSpec(dir, 2, 2);
  const std::string config =
      testing::WriteFile(JoinPath(dir, "train.pbtxt"), testing::ConfigText(o));
  SpawnOptions so;
  so.argv = {Binary("tools/pstrain"), "launch", "--cluster_spec", spec, "--config", config,
             "--bin_dir", BinDir()};
  so.output_file = JoinPath(dir, "launch.out");
  auto launch = Subprocess::Spawn(so);
  REQUIRE(launch.ok());
  auto cluster = ClusterSpec::FromFile(spec);
  REQUIRE(cluster.ok());
  testing::ActAs("operator", testing::RunSecretFile(o.output_dir));
  GrpcChiefClient chief(cluster->address(kChiefJob, 0), absl::Seconds(1));
  auto step_at_least = [&](int64_t step) {
    return RetryWithBackoff("training", absl::Seconds(60), [&]() {
      ChiefStatusResponse s;
      absl::Status st = chief.GetStatus(&s);
      if (!st.ok()) return absl::UnavailableError(st.message());
      return s.global_step() >= step ? absl::OkStatus() : absl::UnavailableError("not yet");
    }, absl::Milliseconds(50));
  };
  REQUIRE(step_at_least(20).ok());
  std::vector<int> worker = testing::ProcessesMatching("--job=worker --task=1 --config=" + config);
  REQUIRE(worker.size() == 1);
  for (int pause = 0; pause < 5; ++pause) {
    ::kill(worker[0], SIGSTOP);
    absl::SleepFor(absl::Milliseconds(2500));  // 2.5x the rpc deadline
    ::kill(worker[0], SIGCONT);
    absl::SleepFor(absl::Milliseconds(300 + 150 * pause));
  }
  ChiefStatusResponse before;
  REQUIRE(chief.GetStatus(&before).ok());
  CHECK(step_at_least(before.global_step() + 20).ok());  // still training, both workers
  CHECK_FALSE((*launch)->Wait(absl::ZeroDuration()).has_value());
  (*launch)->Signal(SIGINT);
  REQUIRE((*launch)->Wait(absl::Seconds(30)).has_value());
  auto out = Env::Default()->ReadFile(so.output_file);
  INFO(out.value_or(""));
  // No push or pull ran out of time. A progress report paused in flight may
  // time out: the worker says so and trains on (a warning, not a failure).
  int deadline_failures = 0;
  for (absl::string_view line : absl::StrSplit(out.value_or(""), '\n')) {
    deadline_failures += absl::StrContains(line, "Deadline Exceeded") &&
                         !absl::StrContains(line, "progress report to the chief timed out");
  }
  CHECK(deadline_failures == 0);
  CHECK(testing::NoProcessesMatching(spec, absl::Seconds(10)));
}

TEST_CASE("Ctrl-C at a terminal (SIGINT to the whole process group) leaves nothing behind",
          "[cluster][signals]") {
  const std::string dir = testing::FreshTempDir("sigint_group");
  std::string spec;
  std::unique_ptr<Subprocess> launch = StartLongJob(dir, &spec, /*own_group=*/true);
  REQUIRE(::getpgid(launch->pid()) == launch->pid());
  ::kill(-launch->pid(), SIGINT);  // what the terminal does on Ctrl-C
  std::optional<int> code = launch->Wait(absl::Seconds(30));
  REQUIRE(code.has_value());
  CHECK(*code != 0);
  CHECK(testing::NoProcessesMatching(spec, absl::Seconds(10)));
}

TEST_CASE("a worker killed mid-run fails the job promptly instead of hanging", "[cluster][faults]") {
  const std::string dir = testing::FreshTempDir("worker_killed");
  std::string spec;
  std::unique_ptr<Subprocess> launch = StartLongJob(dir, &spec);
  std::vector<int> workers = testing::ProcessesMatching("--job=worker --task=1 --config=" + dir);
  REQUIRE(workers.size() == 1);
  ::kill(workers[0], SIGKILL);
  std::optional<int> code = launch->Wait(absl::Seconds(30));
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  auto out = Env::Default()->ReadFile(JoinPath(dir, "launch.out"));
  REQUIRE(out.ok());
  INFO(*out);
  CHECK(out->find("worker:1 exited with code 137") != std::string::npos);
  CHECK(testing::NoProcessesMatching(spec, absl::Seconds(10)));
}

TEST_CASE("the ps_server daemon refuses bad pushes over gRPC and keeps serving", "[cluster][errors]") {
  const std::string dir = testing::FreshTempDir("bad_pushes");
  const std::string spec = testing::WriteClusterSpec(dir, 1, 2);
  auto cluster = ClusterSpec::FromFile(spec);
  REQUIRE(cluster.ok());
  SpawnOptions so;
  so.argv = {Binary("ps_server/ps_server"), "--cluster_spec=" + spec, "--task=0",
             "--chief_timeout_s=0"};  // no chief: the test calls it
  so.output_file = JoinPath(dir, "ps.log");
  auto ps = Subprocess::Spawn(so);
  REQUIRE(ps.ok());
  auto channel = CreateChannel(cluster->address(kPsJob, 0));
  auto stub = PsService::NewStub(channel);
  grpc::GenericStub raw(channel);  // Push and Pull speak frames
  auto call = [](auto method) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    ctx.set_wait_for_ready(true);
    return method(&ctx);
  };

  InitializeRequest init = testing::TinyModelInit(JoinPath(dir, "out"));
  REQUIRE(init.has_config());
  InitializeResponse init_resp;
  REQUIRE(call([&](grpc::ClientContext* c) { return stub->Initialize(c, init, &init_resp); }).ok());

  auto push = [&](int worker, int64_t step, uint64_t incarnation, std::vector<int64_t> shape,
                  std::vector<float> values) {
    PushRequest req;
    req.set_incarnation(incarnation);
    req.set_worker(worker);
    req.set_step(step);
    NamedTensor* g = req.add_gradients();
    g->mutable_ref()->set_variable("w");
    ToProto(shape, values, g->mutable_tensor());
    grpc::ByteBuffer frame = EncodePushFrame(req), resp;
    return call([&](grpc::ClientContext* c) {
             return RawCall(&raw, c, "/pstrain.PsService/Push", frame, &resp);
           }).error_code();
  };
  const float nan = std::nanf("");
  CHECK(push(0, 0, 42, {2, 2}, {1, nan, 1, 1}) == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(push(0, 0, 42, {4}, {1, 1, 1, 1}) == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(push(7, 0, 42, {2, 2}, {1, 1, 1, 1}) == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(push(0, 0, 41, {2, 2}, {1, 1, 1, 1}) == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(push(0, 5, 42, {2, 2}, {1, 1, 1, 1}) == grpc::StatusCode::FAILED_PRECONDITION);

  PullRequest pull;
  pull.set_incarnation(42);
  pull.set_worker(-1);
  grpc::ByteBuffer pull_frame;
  REQUIRE(call([&](grpc::ClientContext* c) {
            return RawCall(&raw, c, "/pstrain.PsService/Pull", SerializeMessage(pull),
                           &pull_frame);
          }).ok());
  PullResponse pulled;
  REQUIRE(DecodePullFrame(pull_frame, &pulled).ok());
  auto w = FromProto(pulled.tensors(0).tensor());
  REQUIRE(w.ok());
  CHECK(w->values() == std::vector<float>{1, 2, 3, 4});  // untouched
  CHECK(pulled.version() == 0);

  // Still serving: a good sync step from both workers applies.
  CHECK(push(0, 0, 42, {2, 2}, {1, 1, 1, 1}) == grpc::StatusCode::OK);
  CHECK(push(1, 0, 42, {2, 2}, {1, 1, 1, 1}) == grpc::StatusCode::OK);
  PsStatusRequest sreq;
  PsStatusResponse status;
  REQUIRE(call([&](grpc::ClientContext* c) { return stub->GetStatus(c, sreq, &status); }).ok());
  CHECK(status.version() == 1);
  CHECK(status.pushes_rejected() == 5);

  ShutdownRequest bye;
  bye.set_incarnation(42);
  ShutdownResponse bye_resp;
  CHECK(call([&](grpc::ClientContext* c) { return stub->Shutdown(c, bye, &bye_resp); }).ok());
  std::optional<int> code = (*ps)->Wait(absl::Seconds(20));
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}

TEST_CASE("a daemon takes its task from TF_CONFIG as Kubeflow sets it", "[cluster][tf_config]") {
  const std::string dir = testing::FreshTempDir("tf_config");
  const std::string spec_text =
      *Env::Default()->ReadFile(testing::WriteClusterSpec(dir, 2, 1));
  auto cluster = ClusterSpec::Parse(spec_text, "spec");
  REQUIRE(cluster.ok());
  SpawnOptions so;
  so.argv = {Binary("ps_server/ps_server"), "--chief_timeout_s=0"};  // its task from TF_CONFIG
  so.extra_env = {"TF_CONFIG={\"cluster\": " + spec_text +
                  ", \"task\": {\"type\": \"ps\", \"index\": 1}}"};
  so.output_file = JoinPath(dir, "ps.log");
  auto ps = Subprocess::Spawn(so);
  REQUIRE(ps.ok());
  auto stub = PsService::NewStub(CreateChannel(cluster->address(kPsJob, 1)));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(20));
  ctx.set_wait_for_ready(true);
  PsStatusRequest req;
  PsStatusResponse status;
  REQUIRE(stub->GetStatus(&ctx, req, &status).ok());  // listening at ps[1]'s address
  CHECK_FALSE(status.initialized());
  (*ps)->Signal(SIGTERM);
  std::optional<int> code = (*ps)->Wait(absl::Seconds(20));
  REQUIRE(code.has_value());
  CHECK(*code == 128 + SIGTERM);
  auto log = Env::Default()->ReadFile(JoinPath(dir, "ps.log"));
  REQUIRE(log.ok());
  CHECK(log->find(" ps:1 I parameter server listening on") != std::string::npos);
  CHECK(log->find("stopping: received Terminated") != std::string::npos);

  // A task index out of range in TF_CONFIG: one line, non-zero exit.
  so.extra_env = {"TF_CONFIG={\"cluster\": " + spec_text +
                  ", \"task\": {\"type\": \"ps\", \"index\": 5}}"};
  so.output_file.clear();
  so.capture_output = true;
  CommandResult r;
  {
    auto bad = Subprocess::Spawn(so);
    REQUIRE(bad.ok());
    char buf[4096];
    ssize_t n;
    while ((n = ::read((*bad)->output_fd(), buf, sizeof(buf))) > 0) r.output.append(buf, n);
    r.exit_code = (*bad)->Wait(absl::Seconds(20)).value_or(-1);
  }
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("TF_CONFIG") != std::string::npos);
  CHECK(r.output.find("out of range") != std::string::npos);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
}

TEST_CASE("pstrain plan shows placement, optimizer memory and each table's share",
          "[cli][embedding]") {
  const std::string dir = testing::FreshTempDir("plan");
  const std::string spec = testing::WriteClusterSpec(dir, 2, 1);
  const std::string config = testing::WriteFile(JoinPath(dir, "c.pbtxt"), R"(
model { mlp { input_dim: 784 hidden_units: 64 num_classes: 10 } }
data { train_images: "a" train_labels: "b" batch_size: 32 }
optimizer { learning_rate: 0.001 adam {} }
max_steps: 100
embedding_tables { name: "ads" dim: 16 memory_budget_bytes: 1000000000 }
embedding_tables { name: "user" dim: 8 num_rows: 1000000 optimizer { learning_rate: 0.05 ftrl {} } }
)");
  CommandResult r = testing::RunCommand(
      {Binary("tools/pstrain"), "plan", "--cluster_spec=" + spec, "--config=" + config},
      absl::Seconds(30));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("dense0/kernel [784,64]") != std::string::npos);
  CHECK(r.output.find("optimizer adam on the servers: 2 slot(s) (m, v)") != std::string::npos);
  CHECK(r.output.find("table ads: hashed") != std::string::npos);
  CHECK(r.output.find("192 bytes per row with adam's slots") != std::string::npos);
  CHECK(r.output.find("of any id set; in memory at most 5208333 rows (") != std::string::npos);
  CHECK(r.output.find(") on each server, the rest in its disk tier (--tier_dir)\n") !=
        std::string::npos);
  CHECK(r.output.find("table user: 1000000 rows of 8 floats, 96 bytes per row with ftrl") !=
        std::string::npos);
  // Jump consistent hashing splits a million consecutive ids within 0.1%.
  CHECK(r.output.find("ps:0 49.9") != std::string::npos);
  CHECK(r.output.find("ps:1 50.0") != std::string::npos);
  CHECK(r.output.find("memory, at least: ps:0 ") != std::string::npos);
  // One worker's and the chief's calls: the daemons' default holds them.
  CHECK(r.output.find("messages in flight at the busiest server, at most: ") !=
        std::string::npos);
  CHECK(r.output.find(" here holds them") != std::string::npos);

  // 40 workers of a 784-4096-4096-10 model on one server: each direction of
  // each worker has 16 calls of 4 MiB in flight (64 MiB, less than the
  // share), 80 of them, and the chief's pulls the whole 76.4 MiB share:
  // 5,197 MiB, more than the default (at most 2 GiB), so pstrain launch
  // raises it, up to half the machine among the server and the chief.
  const std::string many = testing::WriteClusterSpec(dir, 1, 40);
  ConfigOptions big;
  big.hidden_units = {4096, 4096};
  big.output_dir = JoinPath(dir, "big");
  const std::string big_config = testing::WriteFile(JoinPath(dir, "big.pbtxt"),
                                                    testing::ConfigText(big));
  r = testing::RunCommand(
      {Binary("tools/pstrain"), "plan", "--cluster_spec=" + many, "--config=" + big_config},
      absl::Seconds(30));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("messages in flight at the busiest server, at most: 5.1 GiB (40 worker(s)' "
                      "pulls and pushes and the chief's pulls, 16 calls each way of up to "
                      "4.0 MiB)") != std::string::npos);
  const int64_t quarter_machine_mib = PhysicalMemoryBytes() / 4 >> 20;
  CHECK(r.output.find(absl::StrCat("pstrain launch gives the servers --max_inflight_mib=",
                                   std::min<int64_t>(5197, quarter_machine_mib))) !=
        std::string::npos);

  // Without its files, plan names the flags (it used to say "cluster spec :
  // cannot open file", an empty name).
  CommandResult bare = testing::RunCommand({Binary("tools/pstrain"), "plan"}, absl::Seconds(30));
  INFO(bare.output);
  CHECK(bare.exit_code != 0);
  CHECK(bare.output.find("--cluster_spec and --config are required") != std::string::npos);
  CommandResult help = testing::RunCommand({Binary("tools/pstrain"), "--help"}, absl::Seconds(30));
  CHECK(help.output.find("list, verify, inspect, export (safetensors, npy) or restore") !=
        std::string::npos);
}

TEST_CASE("a model too large for the messages or the machine is refused in one line, before "
          "anything is allocated",
          "[cli][errors]") {
  const std::string dir = testing::FreshTempDir("too_large");
  const std::string spec = testing::WriteClusterSpec(dir, 2, 1);
  ConfigOptions o;
  o.hidden_units = {65536, 65536};  // 4.3 billion parameters in dense1/kernel
  o.output_dir = JoinPath(dir, "out");
  // Partitions of up to 1 GiB: one does not fit a message.
  std::string text = testing::ConfigText(o);
  const std::string placement = "placement { partition_min_bytes: 65536 }";
  REQUIRE(text.find(placement) != std::string::npos);
  text.replace(text.find(placement), placement.size(),
               "placement { partition_min_bytes: 65536 partition_max_bytes: 1073741824 }");
  const std::string config = testing::WriteFile(JoinPath(dir, "c.pbtxt"), text);
  const std::string expected =
      "partition 0 of dense1/kernel is 1.0 GiB (4096 rows of 256.0 KiB); one message carries "
      "at most 256.0 MiB: set placement.partition_max_bytes to at most 255.0 MiB";
  CommandResult plan = testing::RunCommand(
      {Binary("tools/pstrain"), "plan", "--cluster_spec=" + spec, "--config=" + config},
      absl::Seconds(30));
  INFO(plan.output);
  CHECK(plan.exit_code == 2);
  CHECK(plan.output.find(expected) != std::string::npos);
  CommandResult launch = testing::RunCommand({Binary("tools/pstrain"), "launch", "--cluster_spec",
                                              spec, "--config", config, "--bin_dir", BinDir()},
                                             absl::Seconds(30));
  INFO(launch.output);
  CHECK(launch.exit_code == 2);
  CHECK(launch.output.find(expected) != std::string::npos);
  // The chief started on its own (it died with std::bad_alloc, exit 134).
  CommandResult chief = testing::RunCommand(
      {Binary("chief/chief"), "--cluster_spec=" + spec, "--config=" + config}, absl::Seconds(30));
  INFO(chief.output);
  CHECK(chief.exit_code == 1);
  CHECK(chief.output.find(expected) != std::string::npos);
  // With the default 4 MiB partitions every call fits a message, whatever a
  // server's share (8 GiB here); now this machine's memory is the limit.
  const std::string fits = testing::WriteFile(JoinPath(dir, "d.pbtxt"), testing::ConfigText(o));
  CommandResult plan_fits = testing::RunCommand(
      {Binary("tools/pstrain"), "plan", "--cluster_spec=" + spec, "--config=" + fits},
      absl::Seconds(30));
  INFO(plan_fits.output);
  CHECK(plan_fits.exit_code == 2);
  CHECK(plan_fits.output.find("of memory; this machine has") != std::string::npos);
  CHECK(plan_fits.output.find("one message") == std::string::npos);
}

TEST_CASE("pstrain bench runs every suite, prints its tables and writes the CSV", "[bench]") {
  const std::string dir = testing::FreshTempDir("bench");
  // Under the sanitizers one repetition (its figures mean nothing there, and
  // each of the train suite's runs launches a cluster: 158 s under ASan and
  // 320 s under TSan with two, 2026-11-26).
  const std::string reps = testing::kSanitized ? "--reps=1" : "--reps=2";
  // Each training run 0.05 s at the compute-only rate, not the default 2 s
  // (which gives 784-16-10 the cap of 3,000 steps without a sanitizer).
  const std::string train_seconds = "--train_seconds=0.05";
  CommandResult r = testing::RunCommand(
      {Binary("tools/pstrain"), "bench", "--suites=wire,apply,train", "--sizes=4096,65536",
       "--connections=1,2", "--models=16", reps, "--rep_seconds=0.05", train_seconds,
       "--out=" + dir, "--bin_dir", BinDir()},
      absl::Seconds(240));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("== wire") != std::string::npos);
  CHECK(r.output.find("== apply") != std::string::npos);
  CHECK(r.output.find("784-16-10") != std::string::npos);
  CHECK(r.output.find("== train: what the overlap hides") != std::string::npos);
  // The picture, drawn by Debian's matplotlib (tools/setup.sh installs it).
  CHECK(r.output.find("wrote " + JoinPath(dir, "bench.png")) != std::string::npos);
  auto png = Env::Default()->ReadFile(JoinPath(dir, "bench.png"));
  REQUIRE(png.ok());
  CHECK(png->substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  CHECK(png->size() > 10000);
  auto csv = Env::Default()->ReadFile(JoinPath(dir, "bench.csv"));
  REQUIRE(csv.ok());
  // Header, then per size x workers: pstrain on 1 and 2 servers over 1 and
  // 2 connections, echo, TCP, memcpy (2 x 2 x 7), apply (a += b and 7
  // optimizers), train (3), and the overlap's (rpc.sequential's examples/s,
  // both runs' wait per step: 3).
  std::vector<std::string> lines = absl::StrSplit(*csv, '\n', absl::SkipEmpty());
  CHECK(lines.size() == 1 + 28 + 8 + 3 + 3);
  int over_two_connections = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f = absl::StrSplit(lines[i], ',');
    REQUIRE(f.size() == 9);
    double median = 0;
    CHECK(absl::SimpleAtod(f[5], &median));
    CHECK(median > 0);
    if (f[1] == "pstrain") {
      CHECK((f[8] == "1" || f[8] == "2"));
      over_two_connections += f[8] == "2";
    }
  }
  CHECK(over_two_connections == 8);
  // Bad flags are one clear line each.
  CommandResult bad = testing::RunCommand({Binary("tools/pstrain"), "bench", "--sizes=100"},
                                          absl::Seconds(30));
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("--sizes") != std::string::npos);
  bad = testing::RunCommand({Binary("tools/pstrain"), "bench", "--train_mode=both"},
                            absl::Seconds(30));
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("--train_mode") != std::string::npos);
  bad = testing::RunCommand({Binary("tools/pstrain"), "bench", "--connections=1,0"},
                            absl::Seconds(30));
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("--connections") != std::string::npos);
  bad = testing::RunCommand({Binary("tools/pstrain"), "bench", "--train_seconds=0"},
                            absl::Seconds(30));
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("--train_seconds") != std::string::npos);
  // The train suite in async mode.
  CommandResult async = testing::RunCommand(
      {Binary("tools/pstrain"), "bench", "--suites=train", "--train_mode=async", "--models=16",
       "--reps=1", "--train_connections=2", train_seconds, "--bin_dir", BinDir()},
      absl::Seconds(120));
  INFO(async.output);
  REQUIRE(async.exit_code == 0);
  CHECK(async.output.find("== train: async examples/s") != std::string::npos);
  CHECK(async.output.find("784-16-10") != std::string::npos);
  CHECK(async.output.find("== train: what the overlap hides, async 1 ps + 1 worker") !=
        std::string::npos);
}

}  // namespace
}  // namespace pstrain
