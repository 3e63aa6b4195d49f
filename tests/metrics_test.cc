// The daemons' monitoring endpoints, end to end: `pstrain launch` gives each
// task a /metrics port and prints it; the exposition is read during a real
// run by the Prometheus client's own parser.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/env.h"
#include "common/subprocess.h"
#include "nlohmann/json.hpp"
#include "tests/cluster_testlib.h"

namespace pstrain {
namespace {

using testing::Binary;
using testing::BinDir;
using testing::CommandResult;
using testing::ConfigOptions;

TEST_CASE("every task serves /metrics, /healthz and /readyz during a run, and TensorBoard reads "
          "the chief's events",
          "[metrics][cluster]") {
  const std::string dir = testing::FreshTempDir("metrics_run");
  ConfigOptions o;
  o.max_steps = 4000;
  o.output_dir = JoinPath(dir, "out");
  o.extra = absl::StrCat("checkpoint { dir: \"", JoinPath(dir, "ckpt"), "\" every_steps: 100 }\n");
  const std::string spec = testing::WriteClusterSpec(dir, 2, 2);
  const std::string config = testing::WriteFile(JoinPath(dir, "train.pbtxt"), ConfigText(o));
  SpawnOptions so;
  so.argv = {Binary("tools/pstrain"), "launch", "--cluster_spec", spec, "--config", config,
             "--bin_dir", BinDir(), "--progress=false"};
  so.output_file = JoinPath(dir, "launch.out");
  auto launch = Subprocess::Spawn(so);
  REQUIRE(launch.ok());
  // One line per task: "pstrain launch: metrics: ps:0 http://127.0.0.1:P/metrics".
  std::map<std::string, int> ports;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  const std::string marker = "pstrain launch: metrics: ";
  while (ports.size() < 5 && absl::Now() < deadline && (*launch)->running()) {
    const std::string out = Env::Default()->ReadFile(so.output_file).value_or("");
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
  REQUIRE(ports.size() == 5);
  // Scrape every task until ps:0 has written a checkpoint, all at once while
  // the run goes on (4000 steps; the first checkpoint is at step 100).
  std::string metrics, chief, worker;
  std::vector<std::string> health, ready;
  bool scraped = false;
  while (!scraped && absl::Now() < deadline && (*launch)->running()) {
    metrics = testing::HttpGet(ports["ps:0"], "/metrics");
    if (metrics.find("\npstrain_checkpoint_shards_written_total{job=\"ps\",task=\"0\"} ") ==
            std::string::npos ||
        metrics.find("\npstrain_checkpoint_shards_written_total{job=\"ps\",task=\"0\"} 0\n") !=
            std::string::npos) {
      absl::SleepFor(absl::Milliseconds(20));
      continue;
    }
    chief = testing::HttpGet(ports["chief:0"], "/metrics");
    worker = testing::HttpGet(ports["worker:1"], "/metrics");
    health.clear();
    ready.clear();
    for (const auto& [task, port] : ports) {
      health.push_back(task + " " + testing::HttpGet(port, "/healthz"));
      ready.push_back(task + " " + testing::HttpGet(port, "/readyz"));
    }
    scraped = true;
  }
  REQUIRE(scraped);  // during the run, not after it
  REQUIRE((*launch)->Wait(absl::Seconds(120)).has_value());
  INFO(metrics);
  CHECK(metrics.rfind("HTTP/1.0 200 OK", 0) == 0);
  for (const std::string& h : health) CHECK(h.find("200 OK") != std::string::npos);
  for (const std::string& r : ready) CHECK(r.find("200 OK") != std::string::npos);
  for (const char* name :
       {"pstrain_ps_version", "pstrain_ps_pushes_applied_total", "pstrain_ps_pulls_total",
        "pstrain_ps_payload_bytes_total", "pstrain_checkpoint_shards_written_total",
        "pstrain_checkpoint_last_shard_success_timestamp_seconds", "pstrain_sync_waiting_on",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total", "process_open_fds", "process_threads"}) {
    INFO(name);
    CHECK(metrics.find(absl::StrCat("# TYPE ", name, " ")) != std::string::npos);
  }
  CHECK(metrics.find("pstrain_ps_initialized{job=\"ps\",task=\"0\"} 1") != std::string::npos);
  CHECK(metrics.find("pstrain_sync_waiting_on{worker=\"1\",job=\"ps\",task=\"0\"} ") !=
        std::string::npos);
  INFO(chief);
  for (const char* name : {"pstrain_chief_global_step", "pstrain_chief_examples_per_second",
                           "pstrain_chief_seconds_since_progress",
                           "pstrain_checkpoints_committed_total", "process_threads"}) {
    INFO(name);
    CHECK(chief.find(absl::StrCat("# TYPE ", name, " ")) != std::string::npos);
  }
  CHECK(chief.find("pstrain_chief_workers_registered{job=\"chief\",task=\"0\"} 2") !=
        std::string::npos);
  INFO(worker);
  CHECK(worker.find("pstrain_worker_registered{job=\"worker\",task=\"1\"} 1") !=
        std::string::npos);
  for (const char* phase : {"pull", "data", "compute", "push"}) {
    INFO(phase);
    CHECK(worker.find(absl::StrCat("pstrain_worker_step_seconds_total{phase=\"", phase,
                                   "\",job=\"worker\",task=\"1\"}")) != std::string::npos);
  }

  // The Prometheus client's parser reads every family, and the version is
  // a positive number; TensorBoard's own reader reads the chief's events.
  const testing::PythonReaders py = testing::PythonWithModules(
      "prometheus_client.parser, tensorboard.backend.event_processing.event_accumulator");
  if (!py.error.empty()) {
    if (py.required) FAIL(py.error);
    WARN("skipped the parser check: " << py.error);
    return;
  }
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

  auto summary = Env::Default()->ReadFile(JoinPath(o.output_dir, "summary.json"));
  REQUIRE(summary.ok());
  const nlohmann::json j = nlohmann::json::parse(*summary);
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
       JoinPath(o.output_dir, "events")},
      absl::Seconds(120));
  INFO(tb.output);
  CHECK(tb.exit_code == 0);
  for (const char* tag : {"'eval/accuracy'", "'eval/loss'", "'train/loss'",
                          "'train/examples_per_second'", "'train/step_time_seconds'"}) {
    INFO(tag);
    CHECK(tb.output.find(tag) != std::string::npos);
  }
  CHECK(tb.output.find(absl::StrFormat("last eval/accuracy step %d value %.4f",
                                       j["global_step"].get<int64_t>(),
                                       j["eval_accuracy"].get<double>())) != std::string::npos);
}

}  // namespace
}  // namespace pstrain
