// The daemons' monitoring endpoints, end to end: `pstrain launch` gives each
// task a /metrics port and prints it; the exposition is read during a real
// run by the Prometheus client's own parser.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/cluster/cluster_spec.h"
#include "common/storage/env.h"
#include "tools/local_ports.h"
#include "tools/subprocess.h"
#include "common/testing/https_get.h"
#include "common/testing/skip.h"
#include "common/security/tls.h"
#include "nlohmann/json.hpp"
#include "tests/cluster_testlib.h"

namespace pstrain {
namespace {

using testing::Binary;
using testing::BinDir;
using testing::CommandResult;
using testing::ConfigOptions;

// `pstrain launch` of a config on a spec, its output in dir/launch.out.
std::unique_ptr<Subprocess> StartLaunch(const std::string& dir, const std::string& spec_path,
                                        ConfigOptions o) {
  o.output_dir = JoinPath(dir, "out");
  const std::string config = testing::WriteFile(JoinPath(dir, "train.pbtxt"), ConfigText(o));
  SpawnOptions so;
  so.argv = {Binary("tools/pstrain"), "launch", "--cluster_spec", spec_path, "--config", config,
             "--bin_dir", BinDir(), "--progress=false"};
  so.output_file = JoinPath(dir, "launch.out");
  auto launch = Subprocess::Spawn(so);
  REQUIRE(launch.ok());
  return std::move(*launch);
}

// The /metrics port of each task, from the launcher's lines
// "pstrain launch: metrics: ps:0 http://127.0.0.1:P/metrics" (all five, or
// what it printed by the deadline).
std::map<std::string, int> MetricsPorts(Subprocess* launch, const std::string& launch_out,
                                        absl::Time deadline) {
  std::map<std::string, int> ports;
  const std::string marker = "pstrain launch: metrics: ";
  while (ports.size() < 5 && absl::Now() < deadline && launch->running()) {
    const std::string out = Env::Default()->ReadFile(launch_out).value_or("");
    for (size_t at = out.find(marker); at != std::string::npos; at = out.find(marker, at + 1)) {
      const size_t end = out.find('\n', at);
      if (end == std::string::npos) break;
      std::vector<std::string> parts =
          absl::StrSplit(out.substr(at + marker.size(), end - at - marker.size()), ' ');
      const size_t colon = parts.size() == 2 ? parts[1].rfind(':') : std::string::npos;
      int port = 0;
      if (colon != std::string::npos &&
          absl::SimpleAtoi(parts[1].substr(colon + 1, parts[1].find('/', colon) - colon - 1),
                           &port)) {
        ports[parts[0]] = port;
      }
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return ports;
}

// What one scrape of a run read: ps:0's, the chief's and worker:1's
// /metrics, and every task's /healthz and /readyz.
struct Scrape {
  std::string metrics, chief, worker;
  std::vector<std::string> health, ready;
};

// Scrapes every task once ps:0 has written a checkpoint, all at once while
// the run goes on (the first checkpoint is at step 100). False where the run
// ended or the deadline passed first.
bool ScrapeDuringRun(Subprocess* launch, const std::map<std::string, int>& ports,
                     absl::Time deadline, Scrape* out) {
  bool scraped = false;
  while (!scraped && absl::Now() < deadline && launch->running()) {
    out->metrics = testing::HttpGet(ports.at("ps:0"), "/metrics");
    if (out->metrics.find("\npstrain_checkpoint_shards_written_total{job=\"ps\",task=\"0\"} ") ==
            std::string::npos ||
        out->metrics.find("\npstrain_checkpoint_shards_written_total{job=\"ps\",task=\"0\"} 0\n") !=
            std::string::npos) {
      absl::SleepFor(absl::Milliseconds(20));
      continue;
    }
    out->chief = testing::HttpGet(ports.at("chief:0"), "/metrics");
    out->worker = testing::HttpGet(ports.at("worker:1"), "/metrics");
    out->health.clear();
    out->ready.clear();
    for (const auto& [task, port] : ports) {
      out->health.push_back(task + " " + testing::HttpGet(port, "/healthz"));
      out->ready.push_back(task + " " + testing::HttpGet(port, "/readyz"));
    }
    scraped = true;
  }
  return scraped;
}

// ps:0's exposition: every family the server and the process export.
void CheckPsMetrics(const std::string& metrics) {
  INFO(metrics);
  CHECK(metrics.rfind("HTTP/1.0 200 OK", 0) == 0);
  for (const char* name :
       {"pstrain_ps_version", "pstrain_ps_pushes_applied_total", "pstrain_ps_pulls_total",
        "pstrain_ps_data_calls", "pstrain_ps_max_data_calls", "pstrain_ps_payload_bytes_total", "pstrain_checkpoint_shards_written_total",
        "pstrain_checkpoint_last_shard_success_timestamp_seconds", "pstrain_sync_waiting_on",
        "pstrain_ps_pushes_rejected_total", "pstrain_ps_partition_pushes_total",
        "pstrain_ps_partition_pulls_total", "pstrain_ps_partition_bytes_total",
        "pstrain_ps_partition_apply_seconds_total", "pstrain_ps_apply_seconds",
        "pstrain_sync_quorum_wait_seconds", "pstrain_async_staleness",
        "pstrain_rpc_server_handled_total", "pstrain_rpc_server_handling_seconds",
        "pstrain_rpc_server_received_bytes_total", "pstrain_rpc_server_sent_bytes_total",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total", "process_open_fds", "process_threads"}) {
    INFO(name);
    CHECK(metrics.find(absl::StrCat("# TYPE ", name, " ")) != std::string::npos);
  }
  CHECK(metrics.find("pstrain_ps_initialized{job=\"ps\",task=\"0\"} 1") != std::string::npos);
  CHECK(metrics.find("pstrain_ps_max_data_calls{job=\"ps\",task=\"0\"} 65536") !=
        std::string::npos);
  CHECK(metrics.find("pstrain_sync_waiting_on{worker=\"1\",job=\"ps\",task=\"0\"} ") !=
        std::string::npos);
  CHECK(metrics.find("pstrain_rpc_server_handled_total{service=\"pstrain.PsService\","
                     "method=\"Push\",code=\"OK\",job=\"ps\",task=\"0\"} ") != std::string::npos);
  CHECK(metrics.find("pstrain_ps_pushes_rejected_total{reason=\"non_finite\",job=\"ps\","
                     "task=\"0\"} 0") != std::string::npos);
}

// The chief's and a worker's expositions.
void CheckChiefAndWorkerMetrics(const std::string& chief, const std::string& worker) {
  INFO(chief);
  for (const char* name : {"pstrain_chief_global_step", "pstrain_chief_examples_per_second",
                           "pstrain_chief_seconds_since_progress",
                           "pstrain_checkpoints_committed_total", "process_threads"}) {
    INFO(name);
    CHECK(chief.find(absl::StrCat("# TYPE ", name, " ")) != std::string::npos);
  }
  CHECK(chief.find("pstrain_chief_workers_registered{job=\"chief\",task=\"0\"} 2") !=
        std::string::npos);
  CHECK(chief.find("pstrain_chief_worker_step_seconds_total{phase=\"compute\",job=\"chief\","
                   "task=\"0\"} ") != std::string::npos);
  CHECK(chief.find("pstrain_rpc_server_handled_total{service=\"pstrain.ChiefService\","
                   "method=\"RegisterWorker\",code=\"OK\",job=\"chief\",task=\"0\"} 2") !=
        std::string::npos);
  INFO(worker);
  CHECK(worker.find("pstrain_worker_registered{job=\"worker\",task=\"1\"} 1") !=
        std::string::npos);
  for (const char* phase : {"pull", "data", "compute", "push"}) {
    INFO(phase);
    CHECK(worker.find(absl::StrCat("pstrain_worker_step_seconds_total{phase=\"", phase,
                                   "\",job=\"worker\",task=\"1\"}")) != std::string::npos);
  }
}

// The Prometheus client's parser reads every family of ps:0's exposition,
// and the version is a positive number.
void CheckPrometheusParses(const testing::PythonReaders& py, const std::string& dir,
                           const std::string& metrics) {
  const std::string body = metrics.substr(metrics.find("\r\n\r\n") + 4);
  const std::string file = testing::WriteFile(JoinPath(dir, "metrics.txt"), body);
  CommandResult parsed = testing::RunCommand(
      {py.python, "-c",
       "import sys\n"
       "from prometheus_client.parser import text_string_to_metric_families as parse\n"
       "fams = list(parse(open(sys.argv[1]).read()))\n"
       "v = [s.value for f in fams for s in f.samples if s.name == 'pstrain_ps_version']\n"
       "labels = {k for f in fams for s in f.samples for k in s.labels}\n"
       "print(len(fams), 'families', 'version', v[0], 'labels', sorted(labels))\n"
       "assert v[0] > 0 and {'job', 'task'} <= labels\n",
       file},
      absl::Seconds(60));
  INFO(parsed.output);
  CHECK(parsed.exit_code == 0);
  CHECK(parsed.output.find("families") != std::string::npos);
}

// summary.json's step split and the launcher's last line from it; and
// TensorBoard's own reader reads the chief's events, ending at the
// summary's step and accuracy.
void CheckSummaryAndEvents(const testing::PythonReaders& py, const std::string& output_dir,
                           const std::string& launch_out) {
  auto summary = Env::Default()->ReadFile(JoinPath(output_dir, "summary.json"));
  REQUIRE(summary.ok());
  const nlohmann::json j = nlohmann::json::parse(*summary);
  // The launcher's last line: where a worker's step went, from the workers'
  // reports that the chief summed into summary.json.
  double split_ms = 0;
  for (const char* phase : {"pull", "data", "compute", "push"}) {
    INFO(phase);
    REQUIRE(j["step_time_ms"][phase].is_number());
    CHECK(j["step_time_ms"][phase].get<double>() >= 0);
    split_ms += j["step_time_ms"][phase].get<double>();
  }
  CHECK(split_ms > 0);
  CHECK(j["worker_steps"].get<int64_t>() >= j["global_step"].get<int64_t>());
  const std::string launched = Env::Default()->ReadFile(launch_out).value_or("");
  INFO(launched);
  CHECK(launched.find("pstrain launch: a worker's step, on average: pull ") != std::string::npos);
  CommandResult tb = testing::RunCommand(
      {py.python, "-c",
       "import sys\n"
       "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
       "a = EventAccumulator(sys.argv[1]); a.Reload()\n"
       "tags = sorted(a.Tags()['scalars'])\n"
       "acc = a.Scalars('eval/accuracy')\n"
       "print('tags', tags)\n"
       "print('last eval/accuracy step %d value %.4f' % (acc[-1].step, acc[-1].value))\n"
       "print('evaluations', len(acc), 'loss points', len(a.Scalars('train/loss')))\n",
       JoinPath(output_dir, "events")},
      absl::Seconds(120));
  INFO(tb.output);
  CHECK(tb.exit_code == 0);
  for (const char* tag : {"'eval/accuracy'", "'eval/loss'", "'train/loss'",
                          "'train/examples_per_second'", "'train/step_time_seconds'",
                          "'train/learning_rate'"}) {
    INFO(tag);
    CHECK(tb.output.find(tag) != std::string::npos);
  }
  CHECK(tb.output.find(absl::StrFormat("last eval/accuracy step %d value %.4f",
                                       j["global_step"].get<int64_t>(),
                                       j["eval_accuracy"].get<double>())) != std::string::npos);
}

TEST_CASE("every task serves /metrics, /healthz and /readyz during a run, and TensorBoard reads "
          "the chief's events",
          "[metrics][cluster]") {
  const std::string dir = testing::FreshTempDir("metrics_run");
  ConfigOptions o;
  // Long enough to scrape every task while it runs (the scrape waits for the
  // first checkpoint, at step 100). Under the sanitizers, 1,000: with 4,000
  // the case took 80.8 s alone under TSan, with 1,000 24.5 s (2026-11-27),
  // and the extra steps checked nothing more.
  o.max_steps = testing::SanitizedSteps(4000, 1000);
  o.extra = absl::StrCat("checkpoint { dir: \"", JoinPath(dir, "ckpt"), "\" every_steps: 100 }\n");
  const std::string spec = testing::WriteClusterSpec(dir, 2, 2);
  std::unique_ptr<Subprocess> launch = StartLaunch(dir, spec, o);
  o.output_dir = JoinPath(dir, "out");  // where StartLaunch put it
  const std::string launch_out = JoinPath(dir, "launch.out");
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::map<std::string, int> ports = MetricsPorts(launch.get(), launch_out, deadline);
  REQUIRE(ports.size() == 5);
  Scrape scrape;
  REQUIRE(ScrapeDuringRun(launch.get(), ports, deadline, &scrape));  // during the run
  // The launcher keeps the same addresses for Prometheus' file_sd while it runs.
  const std::string targets_path = JoinPath(o.output_dir, "metrics_targets.json");
  auto listed_targets = [&targets_path] {
    std::map<std::string, int> listed;
    const nlohmann::json targets = nlohmann::json::parse(
        Env::Default()->ReadFile(targets_path).value_or("[]"), nullptr, /*allow_exceptions=*/false);
    if (!targets.is_array()) return listed;
    for (const nlohmann::json& group : targets) {
      const std::string target = group["targets"][0].get<std::string>();
      listed[group["labels"]["pstrain_task"].get<std::string>()] =
          std::stoi(target.substr(target.rfind(':') + 1));
      CHECK(group["labels"]["__scheme__"] == "http");
    }
    return listed;
  };
  CHECK(listed_targets() == ports);
  // The rest of the run: a bound, not a speed check. Under the
  // sanitizers, beside another test on a slow 2-core machine, a run of
  // 4,000 steps passed 120 s (TSan, 2026-11-26).
  const absl::Duration rest = absl::Seconds(testing::kSanitized ? 600 : 120);
  REQUIRE(launch->Wait(rest).has_value());
  CheckPsMetrics(scrape.metrics);
  for (const std::string& h : scrape.health) CHECK(h.find("200 OK") != std::string::npos);
  for (const std::string& r : scrape.ready) CHECK(r.find("200 OK") != std::string::npos);
  CheckChiefAndWorkerMetrics(scrape.chief, scrape.worker);
  // Ended, it lists none: Prometheus stops scraping tasks that are gone.
  CHECK(Env::Default()->ReadFile(targets_path).value_or("") == "[]\n");
  CHECK(listed_targets().empty());

  // The Prometheus client's parser reads every family, and the version is
  // a positive number; TensorBoard's own reader reads the chief's events.
  const testing::PythonReaders py = testing::PythonWithModules(
      "prometheus_client.parser, tensorboard.backend.event_processing.event_accumulator");
  if (!py.error.empty()) {
    testing::SkipCase("python", "the parser check: " + py.error);
    return;
  }
  CheckPrometheusParses(py, dir, scrape.metrics);

  CheckSummaryAndEvents(py, o.output_dir, launch_out);
}

// The body of an HTTP response.
std::string Body(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

// The value of the sample `series` (name{labels} exactly as exposed) in an
// exposition, or -1.
double SampleValue(const std::string& exposition, const std::string& series) {
  const size_t at = exposition.find("\n" + series + " ");
  double v = -1;
  if (at == std::string::npos) return v;
  const size_t start = at + series.size() + 2;
  if (!absl::SimpleAtod(exposition.substr(start, exposition.find('\n', start) - start), &v)) {
    return -1;
  }
  return v;
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

// An instant query through Prometheus's HTTP API: its result array, or
// null when Prometheus refused the query or did not answer.
nlohmann::json PromResult(int port, const std::string& query) {
  const std::string body = Body(testing::HttpGet(port, "/api/v1/query?query=" + UrlEncode(query)));
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || j.value("status", "") != "success" || !j["data"]["result"].is_array()) {
    return nullptr;
  }
  return j["data"]["result"];
}

// The value of a query's single result, or -1 (no result, several, or none).
double PromQuery(int port, const std::string& query) {
  const nlohmann::json result = PromResult(port, query);
  double v = -1;
  if (!result.is_array() || result.size() != 1 ||
      !absl::SimpleAtod(result[0]["value"][1].get<std::string>(), &v)) {
    return -1;
  }
  return v;
}

// How many series a query returns (-1: Prometheus refused it).
int PromSeries(int port, const std::string& query) {
  const nlohmann::json result = PromResult(port, query);
  return result.is_array() ? static_cast<int>(result.size()) : -1;
}


constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr char kPromtool[] = "/usr/bin/promtool";

// Whether Prometheus and promtool are installed. Where they are not, the
// test fails where tools/test.sh requires them, and otherwise skips, saying so.
bool HavePrometheus() {
  if (::access(kPrometheus, X_OK) == 0 && ::access(kPromtool, X_OK) == 0) return true;
  testing::SkipCase(
      "prometheus",
      "no /usr/bin/prometheus or /usr/bin/promtool (tools/test.sh installs Debian's prometheus)");
  return false;
}

struct Prometheus {
  std::unique_ptr<Subprocess> process;
  int port = 0;         // its HTTP API
  std::string log;      // its output
};

// A real Prometheus with the configuration `yml`, its files named `name`
// in `dir`, on a free port none of the spec's.
Prometheus SpawnPrometheus(const std::string& dir, const std::string& name,
                           const std::string& yml, const std::string& spec_path) {
  Prometheus prom;
  const std::string spec_text = Env::Default()->ReadFile(spec_path).value_or("");
  for (int tries = 0; tries < 10 && prom.port == 0; ++tries) {
    const int p = PickFreePorts(1)[0];
    if (spec_text.find(absl::StrCat(":", p, "\"")) == std::string::npos) prom.port = p;
  }
  REQUIRE(prom.port != 0);
  SpawnOptions so;
  so.argv = {kPrometheus, "--config.file=" + yml,
             "--storage.tsdb.path=" + JoinPath(dir, name + "-tsdb"),
             absl::StrCat("--web.listen-address=127.0.0.1:", prom.port), "--log.level=warn"};
  so.output_file = prom.log = JoinPath(dir, name + ".log");
  auto process = Subprocess::Spawn(so);
  REQUIRE(process.ok());
  prom.process = std::move(*process);
  return prom;
}

// `pstrain prometheus-config` for the spec, checked by promtool, and a real
// Prometheus scraping by it every 500 ms, on a free port none of the spec's.
Prometheus StartPrometheus(const std::string& dir, const std::string& spec_path) {
  CommandResult generated = testing::RunCommand(
      {Binary("tools/pstrain"), "prometheus-config", "--cluster_spec", spec_path,
       "--scrape_interval=500ms"},
      absl::Seconds(60));
  INFO(generated.output);
  REQUIRE(generated.exit_code == 0);
  const std::string yml = testing::WriteFile(JoinPath(dir, "prometheus.yml"), generated.output);
  CommandResult checked =
      testing::RunCommand({kPromtool, "check", "config", yml}, absl::Seconds(60));
  INFO(checked.output);
  REQUIRE(checked.exit_code == 0);
  return SpawnPrometheus(dir, "prometheus", yml, spec_path);
}

TEST_CASE("promtool passes every daemon's metrics, and a real Prometheus scrapes the cluster "
          "through pstrain prometheus-config",
          "[metrics][cluster][prometheus]") {
  if (!HavePrometheus()) return;
  const std::string dir = testing::FreshTempDir("prometheus_run");
  const std::string spec_path = testing::WriteClusterSpec(dir, 2, 2, /*metrics=*/true);
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::FromFile(spec_path);
  REQUIRE(spec.ok());
  std::map<std::string, int> ports;  // task -> metrics port, from the spec
  for (const TaskId& id : spec->AllTasks()) {
    ports[id.ToString()] = ParseHostPort(spec->metrics_address(id.job, id.index))->port;
  }
  Prometheus prometheus = StartPrometheus(dir, spec_path);
  const int prom_port = prometheus.port;

  ConfigOptions o;
  o.max_steps = 1000000;  // ended by the test
  o.eval_every_steps = 1000;
  std::unique_ptr<Subprocess> launch = StartLaunch(dir, spec_path, o);
  // A second Prometheus finds the tasks through the launcher's
  // metrics_targets.json alone (file_sd: follows restarted tasks' ports).
  const std::string file_sd_yml = testing::WriteFile(
      JoinPath(dir, "file_sd.yml"),
      absl::StrCat("global:\n  scrape_interval: 500ms\n  scrape_timeout: 400ms\n"
                   "scrape_configs:\n  - job_name: file_sd\n    file_sd_configs:\n"
                   "      - files: ['",
                   JoinPath(JoinPath(dir, "out"), "metrics_targets.json"),
                   "']\n        refresh_interval: 1s\n"));
  CommandResult file_sd_checked =
      testing::RunCommand({kPromtool, "check", "config", file_sd_yml}, absl::Seconds(60));
  INFO(file_sd_checked.output);
  REQUIRE(file_sd_checked.exit_code == 0);
  Prometheus by_file = SpawnPrometheus(dir, "prometheus-file-sd", file_sd_yml, spec_path);

  // Training is under way once ps:0 has applied a few steps.
  const std::string version = "pstrain_ps_version{job=\"ps\",task=\"0\"}";
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  while (absl::Now() < deadline && launch->running() &&
         SampleValue(Body(testing::HttpGet(ports.at("ps:0"), "/metrics")), version) < 20) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  REQUIRE(SampleValue(Body(testing::HttpGet(ports.at("ps:0"), "/metrics")), version) >= 20);

  // Every daemon's exposition passes promtool's lint.
  for (const auto& [task, port] : ports) {
    const std::string file = testing::WriteFile(JoinPath(dir, task + ".prom"),
                                                Body(testing::HttpGet(port, "/metrics")));
    CommandResult lint = testing::RunCommand(
        {"/bin/sh", "-c", absl::StrCat(kPromtool, " check metrics < '", file, "'")},
        absl::Seconds(60));
    INFO(task << ": " << lint.output);
    CHECK(lint.exit_code == 0);
  }

  // The file_sd Prometheus scrapes every task the launcher listed.
  int up_by_file = 0;
  for (const absl::Time until = absl::Now() + absl::Seconds(30);
       up_by_file < static_cast<int>(ports.size()) && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(200));
    up_by_file = 0;
    for (const auto& [task, port] : ports) {
      up_by_file += PromQuery(by_file.port, absl::StrCat("up{job=\"file_sd\",pstrain_task=\"",
                                                         task, "\",instance=\"127.0.0.1:", port,
                                                         "\"}")) == 1;
    }
  }
  by_file.process->Stop(absl::Seconds(20));
  INFO(Env::Default()->ReadFile(by_file.log).value_or(""));
  CHECK(up_by_file == static_cast<int>(ports.size()));

  // Hold worker:1 back (SIGSTOP): the servers' open step waits on it and
  // their version stops, so both the endpoint and Prometheus have one value.
  const std::vector<int> pids = testing::ProcessesMatching(
      absl::StrCat("--cluster_spec=", spec_path, " --job=worker --task=1 "));
  REQUIRE(pids.size() == 1);
  REQUIRE(::kill(pids[0], SIGSTOP) == 0);
  // Stopped for sure ("T" in /proc/PID/stat) before the servers are read.
  auto state = [](int pid) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
    std::string stat;
    std::getline(in, stat);
    const size_t paren = stat.rfind(')');
    return paren == std::string::npos || paren + 2 >= stat.size() ? '?' : stat[paren + 2];
  };
  while (state(pids[0]) != 'T' && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  REQUIRE(state(pids[0]) == 'T');
  double held = -1;
  const std::string waiting = "pstrain_sync_waiting_on{worker=\"1\",job=\"ps\",task=\"0\"}";
  while (absl::Now() < deadline) {
    const std::string a = Body(testing::HttpGet(ports.at("ps:0"), "/metrics"));
    absl::SleepFor(absl::Seconds(1));
    const std::string b = Body(testing::HttpGet(ports.at("ps:0"), "/metrics"));
    if (SampleValue(a, version) == SampleValue(b, version) && SampleValue(b, waiting) == 1) {
      held = SampleValue(b, version);
      break;
    }
  }
  double seen = -1, waiting_seen = -1, up_held = -1, up_ps = -1;
  while (held > 0 && absl::Now() < deadline) {
    seen = PromQuery(prom_port, "pstrain_ps_version{job=\"ps\",task=\"0\"}");
    waiting_seen =
        PromQuery(prom_port, "pstrain_sync_waiting_on{job=\"ps\",task=\"0\",worker=\"1\"}");
    up_held = PromQuery(prom_port, "up{pstrain_task=\"worker:1\"}");
    up_ps = PromQuery(prom_port, "up{pstrain_task=\"ps:0\"}");
    if (seen == held && waiting_seen == 1 && up_held == 0 && up_ps == 1) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  // Every query of the Grafana dashboard is valid PromQL over these series,
  // and every panel but the ones for events this run has none of (errors,
  // an evaluation) shows data.
  std::vector<std::string> dashboard_problems;
  int dashboard_queries = 0;
  auto dashboard = Env::Default()->ReadFile(JoinPath(BinDir(), "configs/grafana-dashboard.json"));
  REQUIRE(dashboard.ok());
  const nlohmann::json dash = nlohmann::json::parse(*dashboard);
  // Retried while samples arrive (a rate needs two in its window), within
  // the held step's timeout (30 s).
  const absl::Time dashboard_deadline = std::min(deadline, absl::Now() + absl::Seconds(15));
  do {
    dashboard_problems.clear();
    dashboard_queries = 0;
    for (const nlohmann::json& panel : dash["panels"]) {
      const std::string title = panel["title"].get<std::string>();
      const bool may_be_empty = title == "RPC errors by method and code" || title == "Evaluation";
      int series = 0;
      for (const nlohmann::json& target : panel["targets"]) {
        std::string expr = target["expr"].get<std::string>();
        for (size_t at; (at = expr.find("$__rate_interval")) != std::string::npos;) {
          expr.replace(at, std::string("$__rate_interval").size(), "1m");
        }
        const int n = PromSeries(prom_port, expr);
        ++dashboard_queries;
        if (n < 0) dashboard_problems.push_back(absl::StrCat(title, ": refused: ", expr));
        series += std::max(n, 0);
      }
      if (series == 0 && !may_be_empty) dashboard_problems.push_back(title + ": no data");
    }
  } while (!dashboard_problems.empty() && absl::Now() < dashboard_deadline &&
           (absl::SleepFor(absl::Milliseconds(500)), true));
  ::kill(pids[0], SIGCONT);
  launch->Stop(absl::Seconds(20));
  prometheus.process->Stop(absl::Seconds(20));
  INFO(Env::Default()->ReadFile(prometheus.log).value_or(""));
  REQUIRE(held > 0);
  CHECK(seen == held);        // Prometheus has the endpoint's value
  CHECK(waiting_seen == 1);   // and names the worker held back
  CHECK(up_held == 0);        // whose own endpoint no longer answers
  CHECK(up_ps == 1);
  INFO(absl::StrJoin(dashboard_problems, "\n"));
  CHECK(dashboard_queries >= 20);
  CHECK(dashboard_problems.empty());
  CHECK(testing::NoProcessesMatching(spec_path, absl::Seconds(20)));
}

TEST_CASE("with mutual TLS every daemon serves its metrics over HTTPS, and a real Prometheus "
          "scrapes them with the scraper's certificate",
          "[metrics][cluster][prometheus][tls]") {
  if (!HavePrometheus()) return;
  const std::string dir = testing::FreshTempDir("prometheus_tls");
  const std::string spec_path = testing::WriteClusterSpec(dir, 1, 1, /*metrics=*/true);
  testing::UseMutualTls(dir, spec_path);
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::FromFile(spec_path);
  REQUIRE(spec.ok());
  Prometheus prometheus = StartPrometheus(dir, spec_path);
  ConfigOptions o;
  o.max_steps = 1000000;  // ended by the test
  o.eval_every_steps = 1000;
  std::unique_ptr<Subprocess> launch = StartLaunch(dir, spec_path, o);

  // Prometheus scrapes every task over HTTPS, checking its certificate.
  const std::vector<TaskId> tasks = spec->AllTasks();
  double version = -1;
  int up = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  while (absl::Now() < deadline && launch->running()) {
    up = 0;
    for (const TaskId& id : tasks) {
      up += PromQuery(prometheus.port,
                      absl::StrCat("up{pstrain_task=\"", id.ToString(), "\"}")) == 1;
    }
    version = PromQuery(prometheus.port, "pstrain_ps_version{job=\"ps\",task=\"0\"}");
    if (up == static_cast<int>(tasks.size()) && version > 0) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  const std::string launch_out = JoinPath(dir, "launch.out");
  // Each task's endpoint, as the launcher prints it: HTTPS. Without a client
  // certificate /metrics is refused (the probes answer); plain HTTP gets nothing.
  const std::string printed = Env::Default()->ReadFile(launch_out).value_or("");
  const int ps_port = ParseHostPort(spec->metrics_address(kPsJob, 0))->port;
  std::string error;
  const TlsFiles anonymous{JoinPath(dir, "tls/ca.crt"), "", ""};
  const std::string refused =
      testing::HttpsGet(ps_port, "/metrics", anonymous, kMetricsAltName, &error);
  const std::string ready =
      testing::HttpsGet(ps_port, "/readyz", anonymous, kMetricsAltName, &error);
  const std::string plain = testing::HttpGet(ps_port, "/metrics");
  launch->Stop(absl::Seconds(20));
  prometheus.process->Stop(absl::Seconds(20));
  INFO(Env::Default()->ReadFile(prometheus.log).value_or(""));
  INFO(printed);
  CHECK(up == static_cast<int>(tasks.size()));
  CHECK(version > 0);
  CHECK(printed.find(absl::StrCat("metrics: ps:0 https://127.0.0.1:", ps_port, "/metrics")) !=
        std::string::npos);
  CHECK(refused.rfind("HTTP/1.0 403", 0) == 0);
  CHECK(ready.rfind("HTTP/1.0 200", 0) == 0);
  CHECK(plain.find("pstrain_ps_version") == std::string::npos);
  CHECK(testing::NoProcessesMatching(spec_path, absl::Seconds(20)));
}

TEST_CASE("a worker on a GPU serves its device memory", "[metrics][cluster][cuda]") {
  if (::access("/dev/nvidia0", F_OK) != 0) {
    testing::SkipCase("gpu", "no GPU (/dev/nvidia0)");
    return;
  }
  const std::string dir = testing::FreshTempDir("gpu_metrics");
  const std::string spec_path = testing::WriteClusterSpec(dir, 1, 1, /*metrics=*/true);
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::FromFile(spec_path);
  REQUIRE(spec.ok());
  const int port = ParseHostPort(spec->metrics_address("worker", 0))->port;
  ConfigOptions o;
  o.max_steps = 1000000;  // ended by the test
  o.device = "cuda:0";
  std::unique_ptr<Subprocess> launch = StartLaunch(dir, spec_path, o);
  const std::string used = "pstrain_worker_device_memory_used_bytes{job=\"worker\",task=\"0\"}";
  const std::string total = "pstrain_worker_device_memory_total_bytes{job=\"worker\",task=\"0\"}";
  std::string metrics;
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  while (absl::Now() < deadline && launch->running() && SampleValue(metrics, total) <= 0) {
    metrics = Body(testing::HttpGet(port, "/metrics"));
    absl::SleepFor(absl::Milliseconds(100));
  }
  launch->Stop(absl::Seconds(20));
  INFO(metrics);
  INFO(Env::Default()->ReadFile(JoinPath(dir, "launch.out")).value_or(""));
  CHECK(SampleValue(metrics, total) > 0);
  CHECK(SampleValue(metrics, used) > 0);
  CHECK(SampleValue(metrics, used) <= SampleValue(metrics, total));
}

}  // namespace
}  // namespace pstrain
