// Beyond one machine, for real on this one: training across simulated hosts
// (a Linux network namespace each, tests/netns/hosts.sh), binding checked
// across hosts' interfaces, and the demo submitted with sbatch to a real
// one-node Slurm cluster (tests/slurm/one_node_cluster.sh). Each part skips,
// saying why, where namespaces or Slurm's daemons cannot be had (not root, or
// the packages missing: tools/test.sh installs them). `pstrain sweep --slurm`
// runs its trials as a job array there. Tagged "local": Bazel's
// sandbox would hide /run/netns and the machine's host name.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/observability/event_writer.h"
#include "common/rpc/rpc.h"
#include "common/storage/env.h"
#include "common/testing/skip.h"
#include "nlohmann/json.hpp"
#include "tests/cluster_testlib.h"
#include "tools/local_ports.h"
#include "tools/subprocess.h"

namespace pstrain {
namespace {

using testing::Binary;
using testing::BinDir;
using testing::CommandResult;
using testing::ConfigOptions;
using testing::RunCommand;

std::string Script(const std::string& rel) { return JoinPath(BinDir(), rel); }

// Bazel runs tests with PATH=/bin:/usr/bin; ip, munged, slurmd and the
// scripts' tools live in the sbin directories too.
const bool kPathSet = [] {
  const char* path = std::getenv("PATH");
  const std::string p = path ? path : "/usr/bin:/bin";
  ::setenv("PATH", ("/usr/local/sbin:/usr/sbin:/sbin:" + p).c_str(), 1);
  return true;
}();

// iproute2's ip (Subprocess runs a path, not a name looked up in PATH).
std::string Ip() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "ip";
}

// Empty when simulated hosts can be made here, else why not.
std::string WhyNoNamespaces() {
  CommandResult r =
      RunCommand({"/bin/bash", Script("tests/netns/hosts.sh"), "check"}, absl::Seconds(20));
  if (r.exit_code == 0) return "";
  return r.output.empty() ? "hosts.sh check failed" : r.output;
}

// The demo's shape on the test digits, output under `dir`.
std::string DemoConfig(const std::string& dir) {
  ConfigOptions o;
  o.max_steps = 300;
  o.batch_size = 64;
  o.hidden_units = {128};
  o.eval_every_steps = 100;
  o.output_dir = JoinPath(dir, "out");
  return testing::WriteFile(JoinPath(dir, "config.pbtxt"), testing::ConfigText(o));
}

nlohmann::json ReadJson(const std::string& path) {
  auto text = Env::Default()->ReadFile(path);
  if (!text.ok()) return nlohmann::json();
  return nlohmann::json::parse(*text, nullptr, false);
}

// Whether a TCP connection to ip:port from inside namespace `ns` is accepted.
bool Connects(const std::string& ns, const std::string& ip, int port) {
  CommandResult r = RunCommand({Ip(), "netns", "exec", ns, "/bin/bash", "-c",
                                absl::StrCat("exec 3<>/dev/tcp/", ip, "/", port)},
                               absl::Seconds(10));
  return r.exit_code == 0;
}

// True, after saying why, where simulated hosts cannot be made.
bool SkippedWithoutNamespaces() {
  const std::string why = WhyNoNamespaces();
  if (why.empty()) return false;
  testing::SkipCase("netns", "simulated hosts cannot be made here: " + why);
  return true;
}

// Deletes the namespaces of `name` however the test ends.
struct HostsGuard {
  std::string name;
  ~HostsGuard() {
    RunCommand({"/bin/bash", Script("tests/netns/hosts.sh"), "down", name}, absl::Seconds(30));
  }
};

TEST_CASE("the demo trains across five simulated hosts, capped links changing only the speed",
          "[multihost][netns]") {
  if (SkippedWithoutNamespaces()) return;
  const std::string dir = testing::FreshTempDir("across_hosts");
  const std::string config = DemoConfig(dir);
  // Removes the run's namespaces (and any daemon in them) even if the script
  // is killed at the deadline.
  HostsGuard hosts{absl::StrCat("psm", ::getpid())};
  // Every task in a namespace of its own, with authentication on (the spec
  // names hosts beyond loopback); one worker host's link capped at 1 Gbit/s.
  CommandResult r =
      RunCommand({"/bin/bash", Script("tools/multihost.sh"), "--rates=unlimited,1gbit",
                  "--config=" + config, "--bin_dir=" + BinDir(), "--out=" + JoinPath(dir, "runs"),
                  "--timeout=150", "--name=" + hosts.name},
                 absl::Seconds(400));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // A row of the table per rate ("unlimited   28793   0.9677 ...").
  CHECK(std::regex_search(r.output, std::regex(R"((^|\n)unlimited +[0-9]+ +0\.[0-9]+)")));
  CHECK(std::regex_search(r.output, std::regex(R"((^|\n)1gbit +[0-9]+ +0\.[0-9]+)")));
  nlohmann::json fast = ReadJson(JoinPath(dir, "runs/unlimited/output/summary.json"));
  nlohmann::json capped = ReadJson(JoinPath(dir, "runs/1gbit/output/summary.json"));
  REQUIRE(fast.is_object());
  REQUIRE(capped.is_object());
  CHECK(fast["global_step"] == 300);
  CHECK(fast["eval_accuracy"].get<double>() >= 0.85);
  // Sync training is a function of the data and the seed, not of the wire.
  CHECK(capped["eval_accuracy"] == fast["eval_accuracy"]);
  CHECK(capped["eval_loss"] == fast["eval_loss"]);
  // The tasks really were on other hosts: the chief's address is no
  // loopback one, and calls carried tokens.
  auto spec = ReadJson(JoinPath(dir, "runs/cluster.json"));
  REQUIRE(spec.is_object());
  CHECK(spec["chief"][0] == "10.213.0.1:7000");
  auto chief_log = Env::Default()->ReadFile(JoinPath(dir, "runs/unlimited/logs/chief-0.log"));
  REQUIRE(chief_log.ok());
  CHECK(chief_log->find("authentication on") != std::string::npos);
  CHECK(testing::NoProcessesMatching(dir, absl::Seconds(10)));
}

TEST_CASE("a daemon bound to its host's address is not reachable at the host's other interface",
          "[multihost][netns]") {
  if (SkippedWithoutNamespaces()) return;
  const std::string dir = testing::FreshTempDir("bind_across_hosts");
  HostsGuard hosts{absl::StrCat("psb", ::getpid())};
  // Three hosts on two networks: host 0 is 10.213.0.1 and 10.213.1.1.
  CommandResult up = RunCommand(
      {"/bin/bash", Script("tests/netns/hosts.sh"), "up", hosts.name, "3", "2"}, absl::Seconds(60));
  REQUIRE(up.exit_code == 0);
  const std::string spec = testing::WriteFile(
      JoinPath(dir, "cluster.json"),
      R"({"chief": ["10.213.0.2:7000"], "ps": ["10.213.0.1:7000"], "worker": ["10.213.0.3:7000"]})");
  for (const bool bind_all : {false, true}) {
    INFO("bind all: " << bind_all);
    SpawnOptions so;
    so.argv = {Ip(),
               "netns",
               "exec",
               hosts.name + "-h0",
               Binary("ps_server/ps_server"),
               "--cluster_spec=" + spec,
               "--task=0",
               "--insecure"};
    if (bind_all) so.argv.push_back("--bind=0.0.0.0");
    so.output_file = JoinPath(dir, absl::StrCat("ps-", bind_all, ".log"));
    auto ps = Subprocess::Spawn(so);
    REQUIRE(ps.ok());
    bool listening = false;
    for (int i = 0; i < 100 && !listening; ++i) {
      listening = Connects(hosts.name + "-h2", "10.213.0.1", 7000);
      if (!listening) ::usleep(100000);
    }
    REQUIRE(listening);  // the address the spec names, from another host
    // The same host's other interface: refused unless --bind asked for all.
    CHECK(Connects(hosts.name + "-h2", "10.213.1.1", 7000) == bind_all);
    // Nor the host's own loopback, unless bound to all.
    CHECK(Connects(hosts.name + "-h0", "127.0.0.1", 7000) == bind_all);
    (*ps)->Stop(absl::Seconds(5));
  }
}

// The first of `count` consecutive free ports below the ephemeral range
// (where srun and slurmstepd take theirs), none of them in `taken`; 0 if none
// was found.
int ConsecutiveFreePorts(int count, const std::vector<int>& taken) {
  std::mt19937 rng(static_cast<unsigned>(::getpid()));
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int base = 20000 + static_cast<int>(rng() % 12000);
    bool free = true;
    for (int p = base; p < base + count && free; ++p) {
      if (std::find(taken.begin(), taken.end(), p) != taken.end()) {
        free = false;
        break;
      }
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(static_cast<uint16_t>(p));
      free = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
      ::close(fd);
    }
    if (free) return base;
  }
  return 0;
}

std::string WhyNoSlurm() {
  if (::geteuid() != 0) return "not root (slurmd and munged run as root here)";
  for (const char* tool : {"munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scancel"}) {
    CommandResult r =
        RunCommand({"/bin/sh", "-c", absl::StrCat("command -v ", tool)}, absl::Seconds(10));
    if (r.exit_code != 0) {
      return absl::StrCat(tool,
                          " is not installed (Debian's slurmctld, slurmd, slurm-client "
                          "and munge; tools/test.sh installs them)");
    }
  }
  CommandResult host =
      RunCommand({"/bin/sh", "-c", "getent hosts \"$(hostname -s)\""}, absl::Seconds(10));
  if (host.exit_code != 0) return "this machine's short host name does not resolve";
  return "";
}

struct SlurmGuard {
  std::string dir;
  ~SlurmGuard() {
    if (dir.empty()) return;
    RunCommand({"/bin/bash", Script("tests/slurm/one_node_cluster.sh"), "stop", dir},
               absl::Seconds(60));
    RunCommand({"/bin/rm", "-rf", dir}, absl::Seconds(30));
  }
};

// Starts a one-node Slurm cluster on slurmctld's and slurmd's `ports`, its
// files (and so `guard`'s dir, which stops and removes it) under a short
// path: a unix socket's path must fit in 108 bytes, which TEST_TMPDIR's does
// not.
void StartSlurm(const std::vector<int>& ports, SlurmGuard* guard) {
  char short_dir[] = "/tmp/pstrain-slurm.XXXXXX";
  REQUIRE(::mkdtemp(short_dir) != nullptr);
  guard->dir = short_dir;
  CommandResult up = RunCommand({"/bin/bash", Script("tests/slurm/one_node_cluster.sh"), "start",
                                 guard->dir, std::to_string(ports[0]), std::to_string(ports[1])},
                                absl::Seconds(90));
  INFO(up.output);
  REQUIRE(up.exit_code == 0);
}

TEST_CASE("the demo submitted with sbatch to a real Slurm cluster trains, with mutual TLS",
          "[multihost][slurm]") {
  const std::string why = WhyNoSlurm();
  if (!why.empty()) {
    testing::SkipCase("slurm", "no Slurm cluster can be started here: " + why);
    return;
  }
  const std::string dir = testing::FreshTempDir("slurm");
  const std::vector<int> ports = PickFreePorts(2);
  const int base_port = ConsecutiveFreePorts(5, ports);
  REQUIRE(base_port > 0);
  SlurmGuard guard;
  StartSlurm(ports, &guard);
  const std::string config = DemoConfig(dir);
  const std::string job_out = JoinPath(dir, "job.out");
  const std::string slurm_conf = "SLURM_CONF=" + JoinPath(guard.dir, "slurm.conf");
  // The job script as users submit it; --overcommit: 5 tasks on this
  // machine's cores.
  CommandResult job = RunCommand(
      {"/usr/bin/env", slurm_conf, "PSTRAIN_BIN=" + Binary("tools/pstrain"),
       absl::StrCat("PSTRAIN_BASE_PORT=", base_port), "PSTRAIN_AUTH_DIR=" + JoinPath(dir, "auth"),
       "PSTRAIN_TLS=1", "sbatch", "--wait", "--overcommit", "--ntasks=5", "--chdir=" + dir,
       "--output=" + job_out, Script("configs/slurm/train.sbatch"), config},
      absl::Seconds(240));
  if (job.timed_out) {
    RunCommand({"/usr/bin/env", slurm_conf, "scancel", "--user=root"}, absl::Seconds(30));
  }
  auto output = Env::Default()->ReadFile(job_out);
  INFO(job.output << "\n--- job output:\n" << output.value_or("(none)"));
  REQUIRE(job.exit_code == 0);
  REQUIRE(output.ok());
  CHECK(output->find("rank 0 of 5 on ") != std::string::npos);
  CHECK(output->find("is ps:1 at ") != std::string::npos);
  CHECK(output->find("is worker:1 at ") != std::string::npos);
  CHECK(output->find("authentication on") != std::string::npos);
  // With mutual TLS from the job's own CA, whose key it deleted at once.
  CHECK(output->find("mutual TLS on: this task's certificate is worker:1's") != std::string::npos);
  CHECK(output->find("ca.key is readable here") == std::string::npos);
  CHECK(output->find("training finished at step 300") != std::string::npos);
  nlohmann::json summary = ReadJson(JoinPath(dir, "out/summary.json"));
  REQUIRE(summary.is_object());
  CHECK(summary["global_step"] == 300);
  CHECK(summary["eval_accuracy"].get<double>() >= 0.85);
  // The job's secret went with it.
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(dir, "auth/cluster.secret")));
}

TEST_CASE(
    "pstrain sweep --slurm runs its trials as a Slurm job array; a trial cancelled "
    "mid-run is failed, and --resume submits it alone",
    "[multihost][slurm][sweep]") {
  const std::string why = WhyNoSlurm();
  if (!why.empty()) {
    testing::SkipCase("slurm", "no Slurm cluster can be started here: " + why);
    return;
  }
  const std::string dir = testing::FreshTempDir("slurm_sweep");
  const std::vector<int> ports = PickFreePorts(2);
  // Trial k's 3 tasks listen from base + 3k.
  const int base_port = ConsecutiveFreePorts(9, ports);
  REQUIRE(base_port > 0);
  SlurmGuard guard;
  StartSlurm(ports, &guard);
  const std::string slurm_conf = "SLURM_CONF=" + JoinPath(guard.dir, "slurm.conf");
  ConfigOptions o;
  o.eval_every_steps = 0;
  testing::WriteFile(JoinPath(dir, "base.pbtxt"), testing::ConfigText(o));
  // Trial 0 trains long enough to be cancelled in the middle.
  const std::string sweep = testing::WriteFile(JoinPath(dir, "sweep.pbtxt"), R"(
base_config: "base.pbtxt"
parameters { field: "max_steps" values { value: [6000, 30, 40] } }
)");
  const std::string out = JoinPath(dir, "sweep_out");
  const std::vector<std::string> argv = {"/usr/bin/env",
                                         slurm_conf,
                                         Binary("tools/pstrain"),
                                         "sweep",
                                         "--slurm",
                                         "--sweep",
                                         sweep,
                                         "--out",
                                         out,
                                         "--bin_dir",
                                         BinDir(),
                                         "--ps=1",
                                         "--workers=1",
                                         absl::StrCat("--base_port=", base_port),
                                         "--sbatch_args=--overcommit",
                                         "--trial_timeout_s=200"};
  SpawnOptions so;
  so.argv = argv;
  so.output_file = JoinPath(dir, "sweep.log");
  auto proc = Subprocess::Spawn(so);
  REQUIRE(proc.ok());
  // Once trial 0 has trained some steps, Slurm cancels it (as a user's
  // scancel, a preemption or a time limit would).
  absl::Status training = RetryWithBackoff("trial 0 training", absl::Seconds(120), [&]() {
    auto events = ReadScalarEvents(Env::Default(), JoinPath(out, "trial-0/events"));
    return events.ok() && !events->empty() && events->back().step > 0
               ? absl::OkStatus()
               : absl::UnavailableError("not yet");
  });
  INFO(Env::Default()->ReadFile(so.output_file).value_or(""));
  REQUIRE(training.ok());
  const std::string job = std::string(absl::StripAsciiWhitespace(
      Env::Default()->ReadFile(JoinPath(out, "slurm_job")).value_or("")));
  REQUIRE_FALSE(job.empty());
  CommandResult cancel =
      RunCommand({"/usr/bin/env", slurm_conf, "scancel", job + "_0"}, absl::Seconds(30));
  REQUIRE(cancel.exit_code == 0);
  std::optional<int> code = (*proc)->Wait(absl::Seconds(240));
  if (!code.has_value()) {
    RunCommand({"/usr/bin/env", slurm_conf, "scancel", "--user=root"}, absl::Seconds(30));
  }
  const std::string log = Env::Default()->ReadFile(so.output_file).value_or("");
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  CHECK(log.find("3 trial(s) (grid over 1 parameter(s)), a Slurm job array, as many at once as "
                 "Slurm places, 1 ps and 1 worker(s) each") != std::string::npos);
  CHECK(log.find("submitted 3 trial(s) as Slurm job array " + job) != std::string::npos);
  const nlohmann::json cancelled = ReadJson(JoinPath(out, "trial-0/trial.json"));
  CHECK(cancelled["state"] == "failed");
  CHECK(cancelled["error"].get<std::string>().find("Slurm job " + job + "_0 ended CANCELLED") !=
        std::string::npos);
  for (int k : {1, 2}) {
    const nlohmann::json t = ReadJson(JoinPath(out, absl::StrCat("trial-", k, "/trial.json")));
    CHECK(t["state"] == "finished");
    CHECK(t["steps"] == 30 + 10 * (k - 1));
    CHECK(t["seconds"].get<double>() > 0);
  }
  // Each ran as a Slurm task of the array, from srun pstrain launch --slurm.
  const std::string task_log =
      Env::Default()->ReadFile(JoinPath(out, "trial-1/launch.log")).value_or("");
  CHECK(task_log.find("pstrain sweep: trial 1 as Slurm job ") != std::string::npos);
  CHECK(task_log.find("is ps:0 at ") != std::string::npos);
  // The trials' secrets went with them.
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(out, "trial-1/auth/cluster.secret")));

  // --resume submits the cancelled trial alone, which now finishes.
  std::vector<std::string> resume = argv;
  resume.push_back("--resume");
  CommandResult resumed = RunCommand(resume, absl::Seconds(240));
  INFO(resumed.output);
  if (resumed.timed_out) {
    RunCommand({"/usr/bin/env", slurm_conf, "scancel", "--user=root"}, absl::Seconds(30));
  }
  CHECK(resumed.exit_code == 0);
  CHECK(resumed.output.find("2 finished before") != std::string::npos);
  CHECK(resumed.output.find("submitted 1 trial(s) as Slurm job array") != std::string::npos);
  const nlohmann::json again = ReadJson(JoinPath(out, "trial-0/trial.json"));
  CHECK(again["state"] == "finished");
  CHECK(again["steps"] == 6000);
  CHECK(again["accuracy"].get<double>() > 0.8);
}

}  // namespace
}  // namespace pstrain
