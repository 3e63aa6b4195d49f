// The Kubernetes manifests (configs/k8s): valid against Kubernetes' own
// schemas and the TFJob API (tests/k8s/validate.py, with kubernetes-validate
// from PyPI); the TF_CONFIG the entry point builds for every StatefulSet pod
// parses into one cluster with that pod's task; the entry point really starts
// a daemon that answers its probes; the pod config loads; the image's runtime
// stage has every library the daemons link.
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "catch2/catch.hpp"
#include "common/cluster_spec.h"
#include "common/config.h"
#include "common/env.h"
#include "common/local_ports.h"
#include "common/subprocess.h"
#include "common/testing/https_get.h"
#include "common/tls.h"
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

// Checks validate.py's "TF_CONFIG <statefulset> <ordinal> <json>" lines: one
// per pod, each parsing into the same cluster with that pod's task at
// <name>-<job>-<ordinal>.<name>:7000.
void CheckPodTfConfigs(const std::string& output, const std::string& name,
                       const std::map<std::string, int>& expected_pods) {
  std::map<std::string, int> pods_per_job;
  std::string first_cluster;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::ConsumePrefix(&line, "TF_CONFIG ")) continue;
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(' ', 2));
    REQUIRE(parts.size() == 3);
    INFO(parts[0] << " " << parts[1]);
    auto task = ParseTfConfig(parts[2]);
    REQUIRE(task.ok());
    const std::string job = parts[0].substr(name.size() + 1);  // trainer-ps -> ps
    CHECK(task->task.job == job);
    CHECK(std::to_string(task->task.index) == parts[1]);
    CHECK(task->cluster.address(job, task->task.index) ==
          absl::StrCat(parts[0], "-", parts[1], ".", name, ":7000"));
    CHECK(task->cluster.auth_secret_file() == "/var/run/pstrain/auth/cluster.secret");
    const std::string cluster = nlohmann::json::parse(parts[2])["cluster"].dump();
    if (first_cluster.empty()) first_cluster = cluster;
    CHECK(cluster == first_cluster);  // every pod sees the same cluster
    ++pods_per_job[job];
  }
  CHECK(pods_per_job == expected_pods);
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
  CheckPodTfConfigs(r.output, "pstrain", {{"chief", 1}, {"ps", 2}, {"worker", 2}});
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

// ps:0 started as the image starts it: the entry point with PSTRAIN_JOB=ps,
// the daemons side by side in dir/bin, TF_CONFIG as the TFJob operator
// would set it (loopback here), and `env`; its output in dir/ps.log.
// `ports`: the chief's, ps:0's, the worker's and ps:0's probes' (metrics).
std::unique_ptr<Subprocess> StartEntryPointPs(const std::string& dir,
                                              const std::vector<std::string>& env,
                                              std::vector<int>* ports) {
  const std::string bin = JoinPath(dir, "bin");
  REQUIRE(Env::Default()->CreateDirs(bin).ok());
  REQUIRE(::symlink(Binary("ps_server/ps_server").c_str(), JoinPath(bin, "ps_server").c_str()) ==
          0);
  *ports = PickFreePorts(4);
  const std::vector<int>& p = *ports;
  const std::string tf_config = absl::StrCat(
      R"({"cluster": {"chief": ["127.0.0.1:)", p[0], R"("], "ps": ["127.0.0.1:)", p[1],
      R"("], "worker": ["127.0.0.1:)", p[2], R"("]}, "task": {"type": "ps", "index": 0}})");
  SpawnOptions so;
  so.argv = {"/bin/sh", JoinPath(K8sDir(), "entrypoint.sh")};
  so.extra_env = {"PSTRAIN_JOB=ps", "TF_CONFIG=" + tf_config, "PSTRAIN_BIN_DIR=" + bin,
                  "PSTRAIN_CONFIG=" + JoinPath(K8sDir(), "train.pbtxt"),
                  absl::StrCat("PSTRAIN_METRICS_PORT=", p[3])};
  so.extra_env.insert(so.extra_env.end(), env.begin(), env.end());
  so.output_file = JoinPath(dir, "ps.log");
  auto ps = Subprocess::Spawn(so);
  REQUIRE(ps.ok());
  return std::move(*ps);
}

TEST_CASE("the container entry point starts the pod's daemon with its probes", "[k8s]") {
  const std::string dir = testing::FreshTempDir("k8s_entry");
  testing::CommandResult tokens = RunCommand(
      {Binary("tools/pstrain"), "tokens", "--out", JoinPath(dir, "auth")}, absl::Seconds(30));
  REQUIRE(tokens.exit_code == 0);
  std::vector<int> ports;
  auto ps = StartEntryPointPs(dir, {"PSTRAIN_SECRET_FILE=" + JoinPath(dir, "auth/cluster.secret")},
                              &ports);
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
  CHECK(ps->running());
  ps->Stop(absl::Seconds(5));
  const std::string log = Env::Default()->ReadFile(JoinPath(dir, "ps.log")).value_or("");
  CHECK(log.find("authentication on") != std::string::npos);
  CHECK(log.find(absl::StrCat("listening on 127.0.0.1:", ports[1])) != std::string::npos);
}

// pstrain certs for 1 ps and 1 worker, named by task, in dir/tls.
void WriteTaskCertificates(const std::string& dir) {
  testing::CommandResult certs =
      RunCommand({Binary("tools/pstrain"), "certs", "--ps=1", "--workers=1", "--out",
                  JoinPath(dir, "tls"), "--days=2"},
                 absl::Seconds(30));
  INFO(certs.output);
  REQUIRE(certs.exit_code == 0);
}

TEST_CASE("with PSTRAIN_TLS_DIR the entry point's daemon uses mutual TLS, probes over HTTPS",
          "[k8s][tls]") {
  const std::string dir = testing::FreshTempDir("k8s_entry_tls");
  // As the manifests' header says: certificates named by task, the CA's key
  // moved away.
  WriteTaskCertificates(dir);
  REQUIRE(::rename(JoinPath(dir, "tls/ca.key").c_str(), JoinPath(dir, "ca.key.keep").c_str()) ==
          0);
  std::vector<int> ports;
  auto ps = StartEntryPointPs(dir, {"PSTRAIN_TLS_DIR=" + JoinPath(dir, "tls")}, &ports);
  // A kubelet's probe: HTTPS, no client certificate (this client does check
  // the server's, which a kubelet does not).
  const TlsFiles probe{JoinPath(dir, "tls/ca.crt"), "", ""};
  std::string healthz, error;
  for (int i = 0; i < 100 && healthz.find(" 200 ") == std::string::npos; ++i) {
    healthz = testing::HttpsGet(ports[3], "/healthz", probe, kMetricsAltName, &error);
    if (healthz.find(" 200 ") == std::string::npos) ::usleep(100000);
  }
  const std::string readyz = testing::HttpsGet(ports[3], "/readyz", probe, kMetricsAltName, &error);
  ps->Stop(absl::Seconds(5));
  const std::string log = Env::Default()->ReadFile(JoinPath(dir, "ps.log")).value_or("");
  INFO(log << error);
  CHECK(healthz.find(" 200 ") != std::string::npos);
  CHECK(readyz.find(" 503 ") != std::string::npos);
  CHECK(log.find("mutual TLS on: this task's certificate is ps:0's") != std::string::npos);
  CHECK(log.find("ca.key is readable here") == std::string::npos);
}

TEST_CASE("with PSTRAIN_TLS_CRL_DIR the entry point's daemon reads revocation lists from there",
          "[k8s][tls]") {
  const std::string dir = testing::FreshTempDir("k8s_entry_crl");
  WriteTaskCertificates(dir);
  // ps:0 revoked, and the lists moved apart, as their own Secret would be.
  testing::CommandResult revoke =
      RunCommand({Binary("tools/pstrain"), "certs", "--out", JoinPath(dir, "tls"),
                  "--revoke=ps:0"},
                 absl::Seconds(30));
  INFO(revoke.output);
  REQUIRE(revoke.exit_code == 0);
  REQUIRE(::rename(JoinPath(dir, "tls/crl").c_str(), JoinPath(dir, "crl-secret").c_str()) == 0);
  REQUIRE(::rename(JoinPath(dir, "tls/ca.key").c_str(), JoinPath(dir, "ca.key.keep").c_str()) ==
          0);
  std::vector<int> ports;
  auto ps = StartEntryPointPs(dir,
                              {"PSTRAIN_TLS_DIR=" + JoinPath(dir, "tls"),
                               "PSTRAIN_TLS_CRL_DIR=" + JoinPath(dir, "crl-secret")},
                              &ports);
  // Its own certificate is on the lists: it refuses to start, saying so.
  const std::optional<int> code = ps->Wait(absl::Seconds(20));
  const std::string log = Env::Default()->ReadFile(JoinPath(dir, "ps.log")).value_or("");
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code != 0);
  CHECK(log.find("certificate revoked") != std::string::npos);
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

TEST_CASE("pstrain k8s-manifest writes manifests that validate, for either kind", "[k8s]") {
  const std::string python = ValidatorPython();
  if (python.empty()) return;
  const std::string dir = testing::FreshTempDir("k8s_manifest");
  // A config whose first line starts with spaces: the ConfigMap must keep it.
  const std::string config = testing::WriteFile(
      JoinPath(dir, "train.pbtxt"),
      "  # indented first line\n" +
          Env::Default()->ReadFile(JoinPath(K8sDir(), "train.pbtxt")).value_or(""));
  for (const std::string kind : {"statefulsets", "tfjob"}) {
    INFO(kind);
    const std::string out = JoinPath(dir, kind);
    REQUIRE(Env::Default()->CreateDirs(out).ok());
    // The validator reads the schema and runs the entry point from its directory.
    for (const char* f : {"tfjob-v1.schema.json", "entrypoint.sh"}) {
      testing::WriteFile(JoinPath(out, f),
                         Env::Default()->ReadFile(JoinPath(K8sDir(), f)).value_or(""));
    }
    // The TFJob with mutual TLS, the StatefulSets without.
    const bool tls = kind == "tfjob";
    testing::CommandResult gen = RunCommand(
        {Binary("tools/pstrain"), "k8s-manifest", "--config=" + config, "--kind=" + kind,
         "--image=registry.example.com/pstrain:1.0", "--name=trainer", "--ps=3", "--workers=4",
         "--gpus_per_worker=1", tls ? "--tls" : "--tls=false"},
        absl::Seconds(30));
    REQUIRE(gen.exit_code == 0);
    CHECK((gen.output.find("httpGet: {path: /readyz, port: metrics, scheme: HTTPS}") !=
           std::string::npos) == tls);
    // One Secret per role: each role's pods mount only their role's keys.
    for (const char* job : {"chief", "ps", "worker"}) {
      CHECK((gen.output.find(absl::StrCat("secret: {secretName: trainer-tls-", job,
                                          ", defaultMode: 0400}")) != std::string::npos) == tls);
    }
    CHECK((gen.output.find("for job in chief ps worker; do kubectl create secret generic "
                           "trainer-tls-$job") != std::string::npos) == tls);
    CHECK((gen.output.find("{name: PSTRAIN_TLS_DIR, value: /var/run/pstrain/tls}") !=
           std::string::npos) == tls);
    // The revocation lists: a Secret of their own in every pod, optional
    // until the first certificate is revoked.
    CHECK((gen.output.find("{name: PSTRAIN_TLS_CRL_DIR, value: /var/run/pstrain/crl}") !=
           std::string::npos) == tls);
    CHECK((gen.output.find("secret: {secretName: trainer-tls-crl, optional: true}") !=
           std::string::npos) == tls);
    CHECK((gen.output.find("kubectl create secret generic trainer-tls-crl") !=
           std::string::npos) == tls);
    CHECK((gen.output.find("pstrain certs --ps=3 --workers=4") != std::string::npos) == tls);
    testing::WriteFile(JoinPath(out, "job.yaml"), gen.output);
    testing::CommandResult r =
        RunCommand({python, JoinPath(BinDir(), "tests/k8s/validate.py"), out, kKubernetesVersion,
                    "--config", config},
                   absl::Seconds(120));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("ConfigMap/trainer-config") != std::string::npos);
    if (kind == "statefulsets") {
      CheckPodTfConfigs(r.output, "trainer", {{"chief", 1}, {"ps", 3}, {"worker", 4}});
    } else {
      CHECK(r.output.find("TFJob/trainer") != std::string::npos);
      CHECK(gen.output.find("replicas: 4") != std::string::npos);
    }
    CHECK(gen.output.find("nvidia.com/gpu: 1") != std::string::npos);
    // And the self-test refuses damaged copies of what it wrote.
    testing::CommandResult self = RunCommand(
        {python, JoinPath(BinDir(), "tests/k8s/validate.py"), out, kKubernetesVersion,
         "--self-test"},
        absl::Seconds(120));
    INFO(self.output);
    CHECK(self.exit_code == 0);
  }
  // Bad flags are one line naming the flag; nothing is written.
  for (const auto& [flag, named] :
       {std::pair{"--name=Bad_Name", "--name"}, std::pair{"--image=a b", "--image"},
        std::pair{"--ps=0", "--ps"}, std::pair{"--kind=deployment", "--kind"},
        std::pair{"--storage=lots", "--storage"}, std::pair{"--storage=2-0", "--storage"},
        std::pair{"--storage=20GB", "--storage"}}) {
    testing::CommandResult bad = RunCommand(
        {Binary("tools/pstrain"), "k8s-manifest", "--config=" + config, "--image=img:1", flag},
        absl::Seconds(30));
    INFO(flag << ": " << bad.output);
    CHECK(bad.exit_code == 2);
    CHECK(bad.output.find(named) != std::string::npos);
    CHECK(bad.output.find("apiVersion") == std::string::npos);
  }
}

}  // namespace
}  // namespace pstrain
