// The Kubernetes manifests (configs/k8s): valid against Kubernetes' own
// schemas and the TFJob API (tests/k8s/validate.py, with kubernetes-validate
// from PyPI); the TF_CONFIG the entry point builds for every StatefulSet pod
// parses into one cluster with that pod's task; the entry point really starts
// a daemon that answers its probes; the pod config loads; the image's runtime
// stage has every library the daemons link.
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "catch2/catch.hpp"
#include "common/cluster_spec.h"
#include "common/config.h"
#include "common/env.h"
#include "common/local_ports.h"
#include "common/subprocess.h"
#include "nlohmann/json.hpp"
#include "tests/cluster_testlib.h"

namespace pstrain {
namespace {

using testing::Binary;
using testing::BinDir;
using testing::RunCommand;

constexpr char kKubernetesVersion[] = "1.30.0";

std::string K8sDir() { return JoinPath(BinDir(), "configs/k8s"); }

// The venv's Python with kubernetes-validate, or "" after failing or
// skipping as PythonWithModules says.
std::string ValidatorPython() {
  const testing::PythonReaders py = testing::PythonWithModules("kubernetes_validate, jsonschema, yaml");
  if (!py.error.empty()) {
    if (py.required) FAIL(py.error);
    WARN("skipped: " << py.error);
    return "";
  }
  return py.python;
}

TEST_CASE("the Kubernetes manifests validate and each StatefulSet pod gets its own task",
          "[k8s]") {
  const std::string python = ValidatorPython();
  if (python.empty()) return;
  testing::CommandResult r =
      RunCommand({python, JoinPath(BinDir(), "tests/k8s/validate.py"), K8sDir(),
                  kKubernetesVersion},
                 absl::Seconds(120));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("TFJob/pstrain") != std::string::npos);
  CHECK(r.output.find("Service/pstrain") != std::string::npos);
  CHECK(r.output.find("PersistentVolumeClaim/pstrain-data") != std::string::npos);
  // "TF_CONFIG <statefulset> <ordinal> <json>" per pod.
  std::map<std::string, int> pods_per_job;
  std::string first_cluster;
  for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
    if (!absl::ConsumePrefix(&line, "TF_CONFIG ")) continue;
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(' ', 2));
    REQUIRE(parts.size() == 3);
    INFO(parts[0] << " " << parts[1]);
    auto task = ParseTfConfig(parts[2]);
    REQUIRE(task.ok());
    // pstrain-ps 1 -> ps:1, at pstrain-ps-1.pstrain:7000.
    const std::string job = parts[0].substr(std::string("pstrain-").size());
    CHECK(task->task.job == job);
    CHECK(std::to_string(task->task.index) == parts[1]);
    CHECK(task->cluster.address(job, task->task.index) ==
          absl::StrCat(parts[0], "-", parts[1], ".pstrain:7000"));
    CHECK(task->cluster.auth_secret_file() == "/var/run/pstrain/auth/cluster.secret");
    const std::string cluster = nlohmann::json::parse(parts[2])["cluster"].dump();
    if (first_cluster.empty()) first_cluster = cluster;
    CHECK(cluster == first_cluster);  // every pod sees the same cluster
    ++pods_per_job[job];
  }
  CHECK(pods_per_job == std::map<std::string, int>{{"chief", 1}, {"ps", 2}, {"worker", 2}});
}

TEST_CASE("the manifest check refuses damaged manifests", "[k8s]") {
  const std::string python = ValidatorPython();
  if (python.empty()) return;
  testing::CommandResult r =
      RunCommand({python, JoinPath(BinDir(), "tests/k8s/validate.py"), K8sDir(),
                  kKubernetesVersion, "--self-test"},
                 absl::Seconds(120));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("16 damaged manifests, 16 refused") != std::string::npos);
}

TEST_CASE("the pods' training config loads", "[k8s]") {
  auto config = LoadTrainingConfig(JoinPath(K8sDir(), "train.pbtxt"));
  REQUIRE(config.ok());
  CHECK(config->output_dir() == "/data/output");
  CHECK(config->checkpoint().dir() == "/data/output/checkpoints");
}

TEST_CASE("the container entry point starts the pod's daemon with its probes", "[k8s]") {
  const std::string dir = testing::FreshTempDir("k8s_entry");
  // The image's layout: the daemons side by side in one directory.
  const std::string bin = JoinPath(dir, "bin");
  REQUIRE(Env::Default()->CreateDirs(bin).ok());
  REQUIRE(::symlink(Binary("ps_server/ps_server").c_str(), JoinPath(bin, "ps_server").c_str()) ==
          0);
  testing::CommandResult tokens = RunCommand(
      {Binary("tools/pstrain"), "tokens", "--out", JoinPath(dir, "auth")}, absl::Seconds(30));
  REQUIRE(tokens.exit_code == 0);
  const std::vector<int> ports = PickFreePorts(4);
  // As the TFJob operator would set it (loopback here).
  const std::string tf_config = absl::StrCat(
      R"({"cluster": {"chief": ["127.0.0.1:)", ports[0], R"("], "ps": ["127.0.0.1:)", ports[1],
      R"("], "worker": ["127.0.0.1:)", ports[2], R"("]}, "task": {"type": "ps", "index": 0}})");
  SpawnOptions so;
  so.argv = {"/bin/sh", JoinPath(K8sDir(), "entrypoint.sh")};
  so.extra_env = {"PSTRAIN_JOB=ps", "TF_CONFIG=" + tf_config, "PSTRAIN_BIN_DIR=" + bin,
                  "PSTRAIN_CONFIG=" + JoinPath(K8sDir(), "train.pbtxt"),
                  absl::StrCat("PSTRAIN_METRICS_PORT=", ports[3]),
                  "PSTRAIN_SECRET_FILE=" + JoinPath(dir, "auth/cluster.secret")};
  so.output_file = JoinPath(dir, "ps.log");
  auto ps = Subprocess::Spawn(so);
  REQUIRE(ps.ok());
  std::string healthz;
  for (int i = 0; i < 100 && healthz.find(" 200 ") == std::string::npos; ++i) {
    healthz = testing::HttpGet(ports[3], "/healthz");
    if (healthz.find(" 200 ") == std::string::npos) ::usleep(100000);
  }
  INFO(Env::Default()->ReadFile(JoinPath(dir, "ps.log")).value_or(""));
  CHECK(healthz.find(" 200 ") != std::string::npos);
  // Not ready until a chief installs the model: Kubernetes keeps it out of
  // the Service's ready endpoints meanwhile.
  CHECK(testing::HttpGet(ports[3], "/readyz").find(" 503 ") != std::string::npos);
  CHECK((*ps)->running());
  (*ps)->Stop(absl::Seconds(5));
  const std::string log = Env::Default()->ReadFile(JoinPath(dir, "ps.log")).value_or("");
  CHECK(log.find("authentication on") != std::string::npos);
  CHECK(log.find(absl::StrCat("listening on 127.0.0.1:", ports[1])) != std::string::npos);
}

TEST_CASE("the image's runtime stage installs every library the daemons load", "[k8s]") {
  // Checked without a container runtime: ldd of the real binaries against the
  // Debian packages the Containerfile's last stage installs.
  testing::CommandResult r = RunCommand(
      {"/bin/bash", JoinPath(BinDir(), "tests/k8s/runtime_libs.sh"),
       JoinPath(K8sDir(), "Containerfile"), Binary("chief/chief"), Binary("ps_server/ps_server"),
       Binary("worker/worker"), Binary("tools/pstrain")},
      absl::Seconds(60));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("libgrpc++1.51") != std::string::npos);
  CHECK(r.output.find("MISSING") == std::string::npos);
}

}  // namespace
}  // namespace pstrain
