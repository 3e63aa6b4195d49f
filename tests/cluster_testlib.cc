#include "tests/cluster_testlib.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/cluster/config.h"
#include "common/rpc/rpc.h"
#include "common/security/auth.h"
#include "common/storage/env.h"
#include "tools/local_ports.h"
#include "tools/subprocess.h"
#include "common/base/tensor.h"
#include "nlohmann/json.hpp"
#include "tools/datagen.h"

namespace pstrain::testing {

std::string BinDir() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return JoinPath(srcdir ? srcdir : ".", "pstrain");
}

std::string Binary(const std::string& rel) { return JoinPath(BinDir(), rel); }

std::string FreshTempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = JoinPath(tmp ? tmp : "/tmp", name);
  std::string cmd = "rm -rf '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) return dir;
  (void)Env::Default()->CreateDirs(dir);
  return dir;
}

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

std::string WriteClusterSpec(const std::string& dir, int ps, int workers, bool metrics) {
  return WriteFile(JoinPath(dir, "cluster.json"), LocalClusterSpecJson(ps, workers, metrics));
}

std::string DigitsDir() {
  static std::once_flag once;
  static std::string dir;
  std::call_once(once, [] {
    dir = FreshTempDir("digits");
    DigitsOptions o;
    o.train_examples = 6000;
    o.test_examples = 1000;
    o.seed = 3;
    if (!WriteDigitsDataset(Env::Default(), dir, o).ok()) dir.clear();
  });
  return dir;
}

std::string DigitsCsvDir() {
  static std::once_flag once;
  static std::string dir;
  std::call_once(once, [] {
    dir = FreshTempDir("digits_csv");
    DigitsOptions o;
    o.train_examples = 3000;
    o.test_examples = 500;
    o.seed = 3;
    if (!WriteDigitsCsv(Env::Default(), dir, o).ok()) dir.clear();
  });
  return dir;
}

std::string ConfigText(const ConfigOptions& o) {
  const std::string d = DigitsDir();
  std::string mode =
      o.sync ? absl::StrCat("sync { replicas_to_aggregate: ", o.replicas_to_aggregate, " }")
             : absl::StrCat("async { staleness_bound: ", o.staleness_bound, " }");
  std::string hidden;
  for (int units : o.hidden_units) absl::StrAppend(&hidden, "hidden_units: ", units, " ");
  const std::string model = o.model.empty()
                                ? absl::StrCat("mlp { input_dim: 784 ", hidden, "num_classes: 10",
                                               o.gelu ? " activation: GELU" : "", " }")
                                : o.model;
  std::string data;
  if (!o.data.empty()) {
    data = absl::StrCat("data { ", o.data, " batch_size: ", o.batch_size,
                        o.shuffle ? " shuffle: true" : "", " }\n");
  } else if (o.csv) {
    const std::string c = DigitsCsvDir();
    data = absl::StrCat("data {\n  format: CSV\n  train_csv: \"", c, "/train.csv\"\n  test_csv: \"",
                        c, "/test.csv\"\n  max_malformed_lines: ", o.max_malformed_lines,
                        "\n  batch_size: ", o.batch_size, "\n  shuffle: true\n}\n");
  } else {
    data = absl::StrCat(
        "data {\n  train_images: \"", d, "/train-images-idx3-ubyte\"\n  train_labels: \"", d,
        "/train-labels-idx1-ubyte\"\n  test_images: \"", d, "/t10k-images-idx3-ubyte\"\n",
        "  test_labels: \"", d, "/t10k-labels-idx1-ubyte\"\n  batch_size: ", o.batch_size,
        "\n  shuffle: true\n  normalize: true\n}\n");
  }
  return absl::StrCat(
      "model { ", model, " }\n", "device: \"", o.device, "\"\n", data,
      "optimizer { learning_rate: ", o.learning_rate, " ", o.optimizer, " }\n", mode, "\n",
      "max_steps: ", o.max_steps, "\nseed: 11\neval_every_steps: ", o.eval_every_steps,
      "\noutput_dir: \"", o.output_dir, "\"\n", "placement { partition_min_bytes: 65536 }\n",
      "rpc { step_timeout_ms: ", o.step_timeout_ms, " startup_timeout_ms: ", o.startup_timeout_ms,
      o.rpc_timeout_ms > 0 ? absl::StrCat(" rpc_timeout_ms: ", o.rpc_timeout_ms) : "", " ",
      o.rpc_extra, " }\n",
      o.extra,
      "\n");
}

CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout) {
  CommandResult result;
  absl::StatusOr<CommandOutput> run = RunToEnd(argv, timeout);
  if (!run.ok()) {
    result.output = std::string(run.status().message());
    return result;
  }
  result.exit_code = run->exit_code;
  result.timed_out = run->timed_out;
  result.output = std::move(run->output);
  return result;
}

std::vector<int> ProcessesMatching(const std::string& needle) {
  std::vector<int> pids;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return pids;
  const int self = ::getpid();
  while (dirent* e = ::readdir(proc)) {
    const int pid = std::atoi(e->d_name);
    if (pid <= 0 || pid == self) continue;
    std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
    std::stringstream ss;
    ss << in.rdbuf();
    std::string cmdline = ss.str();
    for (char& c : cmdline) {
      if (c == '\0') c = ' ';
    }
    // Zombies have an empty cmdline and are not running.
    if (!cmdline.empty() && cmdline.find(needle) != std::string::npos) pids.push_back(pid);
  }
  ::closedir(proc);
  return pids;
}

bool NoProcessesMatching(const std::string& needle, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!ProcessesMatching(needle).empty()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

PythonReaders PythonWithModules(const std::string& modules) {
  PythonReaders r;
  const char* env = std::getenv("PSTRAIN_PYTHON");
  r.python = env != nullptr && *env != '\0' ? env : "/usr/bin/python3";
  CommandResult probe =
      RunCommand({r.python, "-c", absl::StrCat("import ", modules)}, absl::Seconds(60));
  if (probe.exit_code != 0) {
    r.error = absl::StrCat("no Python with ", modules, " at ", r.python,
                           " (tools/test.sh sets one up): ", probe.output);
  }
  return r;
}

absl::StatusOr<std::pair<std::string, double>> CriteoData(const std::string& name,
                                                          const std::vector<std::string>& flags) {
  const std::string dir = FreshTempDir(name);
  std::vector<std::string> argv = {Binary("tools/pstrain"), "datagen", "--format=criteo",
                                   "--out=" + dir};
  argv.insert(argv.end(), flags.begin(), flags.end());
  CommandResult r = RunCommand(argv, absl::Seconds(120));
  const std::string marker = "ground-truth model on the held-out part: AUC ";
  const size_t at = r.output.find(marker);
  double auc = 0;
  if (r.exit_code != 0 || at == std::string::npos ||
      !absl::SimpleAtod(r.output.substr(at + marker.size(), 6), &auc)) {
    return absl::InternalError(absl::StrCat("pstrain datagen failed: ", r.output));
  }
  return std::make_pair(dir, auc);
}

ConfigOptions ClickThroughOptions(const std::string& data_dir) {
  ConfigOptions o;
  o.model = "click_through { table: \"features\" hidden_units: 64 }";
  o.data = absl::StrCat("format: CRITEO train_tsv: \"", data_dir, "/train.tsv\" test_tsv: \"",
                        data_dir, "/test.tsv\"");
  o.extra = "embedding_tables { name: \"features\" dim: 16 }";
  o.optimizer = "adam {}";
  return o;
}

std::string UseMutualTls(const std::string& dir, const std::string& spec_path) {
  CommandResult certs =
      RunCommand({Binary("tools/pstrain"), "certs", "--cluster_spec", spec_path, "--out",
                  JoinPath(dir, "tls"), "--days", "2"},
                 absl::Seconds(30));
  INFO(certs.output);
  REQUIRE(certs.exit_code == 0);
  nlohmann::json j = nlohmann::json::parse(*Env::Default()->ReadFile(spec_path));
  j["pstrain"]["tls"] = {{"dir", "tls"}};
  WriteFile(spec_path, j.dump());
  return certs.output;
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  std::string out;
  // Bounded: a peer that accepts but never answers (a stopped process) ends
  // the read after 10 s.
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
    const std::string req = absl::StrCat(
        "GET ", path, " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) > 0) {
      char buf[8192];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
    }
  }
  ::close(fd);
  return out;
}

InitializeRequest TinyModelInit(const std::string& output_dir) {
  ConfigOptions o;
  o.output_dir = output_dir;
  absl::StatusOr<TrainingConfig> config = ParseTrainingConfig(ConfigText(o), "test");
  InitializeRequest init;
  init.set_incarnation(42);
  if (config.ok()) *init.mutable_config() = *config;  // else Initialize refuses the empty one
  init.set_num_workers(2);
  NamedTensor* v = init.add_variables();
  v->mutable_ref()->set_variable("w");
  ToProto({2, 2}, {1, 2, 3, 4}, v->mutable_tensor());
  return init;
}

std::string RunSecretFile(const std::string& output_dir) {
  const std::string path = JoinPath(output_dir, "run.secret");
  for (const absl::Time end = absl::Now() + absl::Seconds(30);
       !Env::Default()->FileExists(path) && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  INFO(path);
  REQUIRE(Env::Default()->FileExists(path));
  return path;
}

void ActAs(const std::string& identity, const std::string& secret_file) {
  absl::StatusOr<std::string> secret = ReadSecretFile(secret_file);
  for (const absl::Time end = absl::Now() + absl::Seconds(5);
       !secret.ok() && absl::Now() < end;) {  // being written (it is fsynced once whole)
    absl::SleepFor(absl::Milliseconds(20));
    secret = ReadSecretFile(secret_file);
  }
  INFO(secret.status().ToString());
  REQUIRE(secret.ok());
  SetCallCredentials(identity, DeriveToken(*secret, identity));
}

}  // namespace pstrain::testing
