// Helpers for the multi-process tests: locate the real binaries in Bazel's
// runfiles, pick free loopback ports, write cluster specs, configs and data
// into the test's temporary directory, and run commands with a deadline
// (a command still running at its deadline is killed and reported).
#ifndef PSTRAIN_TESTS_CLUSTER_TESTLIB_H_
#define PSTRAIN_TESTS_CLUSTER_TESTLIB_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/ps_service.pb.h"

namespace pstrain::testing {

// True in the ASan + UBSan and TSan builds, whose processes run 3-15x
// slower and whose allocators are not the real one (the tests ask this, not
// the compiler's macros). The longest multi-process runs take fewer steps there
// (`SanitizedSteps`): the sanitizers look for races and memory errors, which
// the same code paths (start, checkpoints, kills, restarts, rollbacks) show
// in fewer steps, and the default build still runs every one in full.
// GCC defines __SANITIZE_ADDRESS__ and __SANITIZE_THREAD__; clang 14 (the
// ASan + UBSan build's compiler) answers __has_feature instead.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
inline constexpr bool kSanitized =
    __has_feature(address_sanitizer) || __has_feature(thread_sanitizer);
#else
inline constexpr bool kSanitized = false;
#endif

// `full` steps, or `sanitized` under a sanitizer.
constexpr int SanitizedSteps(int full, int sanitized) { return kSanitized ? sanitized : full; }

std::string BinDir();                        // runfiles root holding ps_server/, worker/, ...
std::string Binary(const std::string& rel);  // e.g. "tools/pstrain"
std::string FreshTempDir(const std::string& name);

// A spec with 1 chief, `ps` servers and `workers` workers on free ports.
std::string WriteClusterSpec(const std::string& dir, int ps, int workers, bool metrics = false);
std::string WriteFile(const std::string& path, const std::string& text);

// Writes the synthetic digits once per test process (shared by cases).
std::string DigitsDir();
// The same digits as CSV (train.csv, test.csv), fewer of them.
std::string DigitsCsvDir();

struct ConfigOptions {
  bool sync = true;
  int replicas_to_aggregate = 0;
  int staleness_bound = 0;
  int max_steps = 200;
  int batch_size = 32;
  float learning_rate = 0.1f;
  // The rest of the optimizer block after the learning rate, e.g.
  // "adam {} schedule { warmup_steps: 5 }".
  std::string optimizer = "sgd {}";
  std::vector<int> hidden_units = {64};
  bool gelu = false;           // GELU instead of ReLU between the hidden layers
  std::string device = "cpu";  // the equivalence and bitwise tests are CPU properties
  std::string model;           // a `model { ... }` body replacing the MLP, e.g. "sequential {...}"
  bool csv = false;            // read DigitsCsvDir() instead of the IDX files
  std::string data;            // a `data { ... }` body replacing the digits (e.g. CRITEO)
  bool shuffle = true;         // with `data`: its shuffle
  std::string extra;           // more config lines (e.g. embedding_tables { ... })
  std::string rpc_extra;       // more fields of the rpc { } block (e.g. "sequential: true")
  int max_malformed_lines = 0;
  int eval_every_steps = 50;
  int step_timeout_ms = 30000;
  int rpc_timeout_ms = 0;  // 0: the default
  int startup_timeout_ms = 30000;
  std::string output_dir;
};
std::string ConfigText(const ConfigOptions& o);

struct CommandResult {
  int exit_code = -1;
  bool timed_out = false;
  std::string output;  // stdout and stderr together
};
CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout);

// Pids of live processes whose command line contains `needle`.
std::vector<int> ProcessesMatching(const std::string& needle);
// Waits until none is left (a process killed with SIGKILL keeps its command
// line until it has finished exiting); false if some remain at `timeout`.
bool NoProcessesMatching(const std::string& needle, absl::Duration timeout);

// The Python with third-party readers that tools/test.sh sets up
// ($PSTRAIN_PYTHON, else /usr/bin/python3), if it can import `modules`
// ("numpy, safetensors.numpy"). Otherwise `error` says why: the case then
// skips for want of "python" (SkipCase, which fails it where tools/test.sh
// requires the readers).
struct PythonReaders {
  std::string python;
  std::string error;
};
PythonReaders PythonWithModules(const std::string& modules);

// Synthetic click-through data written by `pstrain datagen --format=criteo
// <flags>` into a fresh directory `name`: the directory and the ground-truth
// model's held-out AUC, or the error with datagen's output.
absl::StatusOr<std::pair<std::string, double>> CriteoData(const std::string& name,
                                                          const std::vector<std::string>& flags);
// The click-through model over that data: a hashed table "features" of
// width 16, MLP 64, Adam, sync.
ConfigOptions ClickThroughOptions(const std::string& data_dir);

// Initializes a server with one 2x2 variable "w" = {1, 2, 3, 4}, for
// incarnation 42 and 2 workers, sync, writing under `output_dir`.
InitializeRequest TinyModelInit(const std::string& output_dir);

// Mutual TLS for the cluster of `spec_path`: `pstrain certs` writes its
// certificates (valid 2 days) into dir/tls, and the spec names that
// directory ("pstrain": {"tls": {"dir": "tls"}}, relative to the spec; its
// other extras kept). Returns what pstrain certs printed (it must succeed).
std::string UseMutualTls(const std::string& dir, const std::string& spec_path);

// The secret `pstrain launch` made for the run whose output_dir is
// `output_dir` (output_dir/run.secret), once it is there (up to 30 s;
// the case fails without it).
std::string RunSecretFile(const std::string& output_dir);
// Signs this process's calls from now on as `identity` ("operator",
// "worker:0", "chief:0") with the key the secret in `secret_file` gives it:
// what a process holding that key (a person's tools, a task) can do.
// Channels made before keep what they had.
void ActAs(const std::string& identity, const std::string& secret_file);

// GET http://127.0.0.1:port/path: the whole response, "" when it failed.
std::string HttpGet(int port, const std::string& path);

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_CLUSTER_TESTLIB_H_
