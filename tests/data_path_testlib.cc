#include "tests/data_path_testlib.h"

#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "catch2/catch.hpp"
#include "common/cluster/config.h"
#include "common/rpc/grpc_lifetime.h"
#include "common/storage/env.h"
#include "tests/cluster_testlib.h"

namespace pstrain {
namespace testing {

std::string Mismatch(const std::vector<float>& v, float want) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!(v[i] == want)) {
      return absl::StrFormat("element %d of %d is %.9g, not %.9g", i, v.size(), v[i], want);
    }
  }
  return "";
}

int64_t MinorFaults(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name, which ends with the last ')'.
  std::istringstream rest(text.substr(text.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 10; ++i) rest >> field;
  return std::stoll(field);
}

int Threads(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

Servers::Servers(int n, const std::string& name, std::vector<VariableSpec> variables,
                 int64_t partition_max_bytes, const std::string& settings,
                 int workers, const std::vector<std::string>& server_flags) {
  // This process's clients come and go with each case: without the hold,
  // the last one's going away runs gRPC's global shutdown, which can wait
  // ~10 s for an executor thread (common/rpc/grpc_lifetime.h; it did in the
  // in-flight memory case: 18.7 s with it, 8.1 s without).
  KeepGrpcUntilExit();
  if (!variables.empty()) vars = std::move(variables);
  dir = FreshTempDir(name);
  auto spec = ClusterSpec::FromFile(WriteClusterSpec(dir, n, workers));
  REQUIRE(spec.ok());
  cluster = *spec;
  for (int s = 0; s < n; ++s) {
    SpawnOptions so;
    so.argv = {Binary("ps_server/ps_server"),
               "--cluster_spec=" + JoinPath(dir, "cluster.json"), absl::StrCat("--task=", s),
               "--chief_timeout_s=0"};  // the test plays the chief
    so.argv.insert(so.argv.end(), server_flags.begin(), server_flags.end());
    so.output_file = JoinPath(dir, absl::StrCat("ps", s, ".log"));
    auto p = Subprocess::Spawn(so);
    REQUIRE(p.ok());
    procs.push_back(std::move(*p));
  }
  auto pl = Placement::Compute(vars, n, 64 << 10, partition_max_bytes);
  REQUIRE(pl.ok());
  placement = std::move(*pl);
  auto config = ParseTrainingConfig(absl::StrCat(R"(
model { mlp { input_dim: 2 num_classes: 2 } }
data { train_images: "x" train_labels: "y" batch_size: 1 }
max_steps: 100000
)", settings.empty() ? "optimizer { learning_rate: 0.5 }" : settings), "test");
  REQUIRE(config.ok());
  chief = std::make_unique<GrpcPsClient>(*cluster, &*placement, -1, absl::Seconds(20));
  chief->set_incarnation(4242);
  std::vector<Tensor> init;
  for (const VariableSpec& v : vars) {
    init.emplace_back(v.shape, std::vector<float>(v.num_elements(), 1.0f));
  }
  REQUIRE(chief->InitializeAll(*config, 7, workers, 0, init, absl::Seconds(30)).ok());
}

std::unique_ptr<GrpcPsClient> Servers::Worker(int w) {
  auto c = std::make_unique<GrpcPsClient>(*cluster, &*placement, w, absl::Seconds(20));
  c->set_incarnation(4242);
  return c;
}

Buffers ClientGradients(const std::vector<VariableSpec>& vars, int k) {
  Buffers b(vars, 0);
  for (auto& g : b.grads) {
    for (size_t j = 0; j < g.size(); ++j) g[j] = static_cast<float>(k + 1 + j % 3);
  }
  return b;
}

void SyncStep(Servers& s, GrpcPsClient& w0, GrpcPsClient& w1, Buffers& b0, Buffers& b1, int64_t step) {
  const std::vector<int64_t> at(s.cluster->num_ps(), step);
  PsClient::PullResult r0, r1;
  REQUIRE(w0.PullInto(at, absl::Seconds(20), b0.dst(), &r0).ok());
  REQUIRE(w1.PullInto(at, absl::Seconds(20), b1.dst(), &r1).ok());
  std::vector<PushOutcome> out;
  REQUIRE(w0.PushFrom(at, b0.src(), &out).ok());
  REQUIRE(w1.PushFrom(at, b1.src(), &out).ok());
  for (PushOutcome o : out) REQUIRE(o == APPLIED);
}

std::vector<std::vector<float>> PullAll(Servers& s) {
  Buffers b(s.vars, 0);
  PsClient::PullResult r;
  REQUIRE(s.chief->PullInto({}, absl::Seconds(20), b.dst(), &r).ok());
  return b.params;
}

std::vector<uint64_t> SomeIds(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> ids(n);
  for (uint64_t& id : ids) id = rng();
  return ids;
}

}  // namespace testing
}  // namespace pstrain
