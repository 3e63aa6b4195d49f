// Helpers of the data path's multi-process suites (tests/data_path_test.cc,
// tests/overload_test.cc): real ps_server processes with a small model
// installed, full-size host buffers per worker, a sync step driven from the
// test's thread, and readings of a process from /proc.
#ifndef PSTRAIN_TESTS_DATA_PATH_TESTLIB_H_
#define PSTRAIN_TESTS_DATA_PATH_TESTLIB_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/client/grpc_ps_client.h"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/placement.h"
#include "tools/subprocess.h"

namespace pstrain {
namespace testing {

// "" when every element of `v` is `want`, else the first that is not: one
// assertion per tensor. Catch's JUnit reporter (Bazel's) keeps every
// assertion it is given, and one per element of a 12 MiB tensor took a case
// from 7 s to 57 s under TSan.
std::string Mismatch(const std::vector<float>& v, float want);

// Minor page faults of a process so far (/proc/<pid>/stat field 10).
int64_t MinorFaults(int pid);

int Threads(int pid);

// 1 or 2 ps_server processes with 2 sync workers' worth of variables:
// w [512, 256] (512 KiB) and b [256], placed by the real placement.
struct Servers {
  std::string dir;
  std::optional<ClusterSpec> cluster;
  std::vector<std::unique_ptr<Subprocess>> procs;
  std::optional<Placement> placement;
  std::vector<VariableSpec> vars = {{"w", {512, 256}}, {"b", {256}}};
  std::unique_ptr<GrpcPsClient> chief;

  // `settings`: text-format lines added to the training config (the
  // optimizer, the mode); `workers`: how many the servers expect;
  // `server_flags`: added to every ps_server's command line.
  explicit Servers(int n, const std::string& name, std::vector<VariableSpec> variables = {},
                   int64_t partition_max_bytes = 0, const std::string& settings = "",
                   int workers = 2, const std::vector<std::string>& server_flags = {});

  std::unique_ptr<GrpcPsClient> Worker(int w);
};

// Full-size host buffers of every variable for one worker.
struct Buffers {
  std::vector<std::vector<float>> params, grads;
  explicit Buffers(const std::vector<VariableSpec>& vars, float g) {
    for (const VariableSpec& v : vars) {
      params.emplace_back(v.num_elements());
      grads.emplace_back(v.num_elements(), g);
    }
  }
  std::vector<float*> dst() {
    std::vector<float*> p;
    for (auto& v : params) p.push_back(v.data());
    return p;
  }
  std::vector<const float*> src() {
    std::vector<const float*> p;
    for (auto& v : grads) p.push_back(v.data());
    return p;
  }
};

// Client k's gradients in the no-lost-update and load cases: k + 1 +
// (element mod 3) in every element of every variable.
Buffers ClientGradients(const std::vector<VariableSpec>& vars, int k);

// One sync step driven from this thread: both workers pull the step, then
// push (the second push completes it).
void SyncStep(Servers& s, GrpcPsClient& w0, GrpcPsClient& w1, Buffers& b0, Buffers& b1, int64_t step);

// Two embedding tables, for the training config.
inline constexpr char kTables[] =
    "embedding_tables { name: \"ads\" dim: 4 } "
    "embedding_tables { name: \"slots\" dim: 2 num_rows: 1000 init_scale: 0 } ";

// Every partition's values, by variable, as the chief pulls them.
std::vector<std::vector<float>> PullAll(Servers& s);

std::vector<uint64_t> SomeIds(int n, uint64_t seed);

}  // namespace testing
}  // namespace pstrain

#endif  // PSTRAIN_TESTS_DATA_PATH_TESTLIB_H_
