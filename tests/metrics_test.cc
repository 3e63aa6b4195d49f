// The daemons' monitoring endpoints, end to end: `pstrain launch` gives each
// parameter server a /metrics port and prints it; the exposition is read
// during a real run by the Prometheus client's own parser.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/env.h"
#include "common/subprocess.h"
#include "tests/cluster_testlib.h"

namespace pstrain {
namespace {

using testing::Binary;
using testing::BinDir;
using testing::CommandResult;
using testing::ConfigOptions;

// GET http://127.0.0.1:port/path: the whole response, "" when it failed.
std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
    const std::string req = absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: localhost\r\n\r\n");
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) > 0) {
      char buf[8192];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
    }
  }
  ::close(fd);
  return out;
}

TEST_CASE("parameter servers serve /metrics, /healthz and /readyz during a run",
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
  // "pstrain launch: metrics: ps:0 http://127.0.0.1:P/metrics, ps:1 ..."
  std::vector<int> ports;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (ports.size() < 2 && absl::Now() < deadline && (*launch)->running()) {
    const std::string out = Env::Default()->ReadFile(so.output_file).value_or("");
    ports.clear();
    for (size_t at = out.find("http://127.0.0.1:"); at != std::string::npos;
         at = out.find("http://127.0.0.1:", at + 1)) {
      int port = 0;
      const size_t begin = at + 17;
      if (absl::SimpleAtoi(out.substr(begin, out.find('/', begin) - begin), &port)) {
        ports.push_back(port);
      }
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  REQUIRE(ports.size() == 2);
  // Scrape ps:0 until it has applied some steps and written a checkpoint.
  std::string metrics;
  while (absl::Now() < deadline && (*launch)->running()) {
    metrics = HttpGet(ports[0], "/metrics");
    if (metrics.find("\npstrain_checkpoint_shards_written_total{job=\"ps\",task=\"0\"} 0") ==
            std::string::npos &&
        metrics.find("\npstrain_checkpoint_shards_written_total") != std::string::npos) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string health = HttpGet(ports[1], "/healthz");
  const std::string ready = HttpGet(ports[1], "/readyz");
  REQUIRE((*launch)->Wait(absl::Seconds(120)).has_value());
  INFO(metrics);
  CHECK(metrics.rfind("HTTP/1.0 200 OK", 0) == 0);
  CHECK(health.find("200 OK") != std::string::npos);
  CHECK(ready.find("200 OK") != std::string::npos);
  for (const char* name :
       {"pstrain_ps_version", "pstrain_ps_pushes_applied_total", "pstrain_ps_pulls_total",
        "pstrain_ps_payload_bytes_total", "pstrain_checkpoint_shards_written_total",
        "pstrain_checkpoint_last_success_timestamp_seconds", "process_resident_memory_bytes",
        "process_cpu_seconds_total", "process_open_fds", "process_threads"}) {
    INFO(name);
    CHECK(metrics.find(absl::StrCat("# TYPE ", name, " ")) != std::string::npos);
  }
  CHECK(metrics.find("pstrain_ps_initialized{job=\"ps\",task=\"0\"} 1") != std::string::npos);

  // The Prometheus client's parser reads every family, and the version is
  // a positive number.
  const testing::PythonReaders py = testing::PythonWithModules("prometheus_client.parser");
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
}

}  // namespace
}  // namespace pstrain
