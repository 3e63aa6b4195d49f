// The cluster spec: which tasks exist and where they listen, in the format of
// TF_CONFIG's "cluster" object, e.g.
//   {"chief": ["localhost:2220"], "ps": ["localhost:2221", "localhost:2222"],
//    "worker": ["localhost:2223", "localhost:2224"]}
// An optional "pstrain" key holds pstrain's own extras (TensorFlow ignores it).
// Parsing validates everything and fails with one line naming the source, the
// key and what was expected. A ClusterSpec is immutable after parsing and safe
// to share between threads.
#ifndef PSTRAIN_COMMON_CLUSTER_CLUSTER_SPEC_H_
#define PSTRAIN_COMMON_CLUSTER_CLUSTER_SPEC_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pstrain {

inline constexpr char kChiefJob[] = "chief";
inline constexpr char kPsJob[] = "ps";
inline constexpr char kWorkerJob[] = "worker";

struct TaskId {
  std::string job;
  int index = 0;
  std::string ToString() const;  // "ps:1"
};

struct HostPort {
  std::string host;
  int port = 0;
};

// A host as a task address may name it: a DNS name (RFC 1123 labels), an
// IPv4 literal or an IPv6 literal (without brackets).
absl::Status ValidateHost(const std::string& host);

// localhost, 127.0.0.0/8 or ::1.
bool IsLoopbackHost(const std::string& host);
// A loopback host, 0.0.0.0, or this machine's host name: where `pstrain
// launch` starts a task itself.
bool IsThisMachine(const std::string& host);

// "host:port", with brackets around an IPv6 host.
std::string HostPortString(const std::string& host, int port);

// Splits "host:port" ("[::1]:80" for IPv6); the host must pass ValidateHost and
// the port must be 1..65535.
absl::StatusOr<HostPort> ParseHostPort(const std::string& address);

class ClusterSpec {
 public:
  // `source` names where the text came from (a file name or "TF_CONFIG") and
  // starts every error message.
  static absl::StatusOr<ClusterSpec> Parse(const std::string& json_text,
                                           const std::string& source);
  static absl::StatusOr<ClusterSpec> FromFile(const std::string& path);

  int num_tasks(const std::string& job) const;
  int num_ps() const { return num_tasks(kPsJob); }
  int num_workers() const { return num_tasks(kWorkerJob); }
  // Requires ValidateTask(job, index).ok().
  const std::string& address(const std::string& job, int index) const;
  // Fails with INVALID_ARGUMENT naming the job or the allowed index range.
  absl::Status ValidateTask(const std::string& job, int index) const;
  // Every task, chief first, then ps, then worker, each in index order.
  std::vector<TaskId> AllTasks() const;
  const std::string& source() const { return source_; }
  // Whether every task's host is a loopback one (localhost, 127.0.0.0/8, ::1).
  bool AllLoopback() const;
  // The "pstrain" extras: {"auth": {"secret_file": PATH}, "tls": {"dir":
  // DIR}, "insecure": BOOL, "metrics": {...}}.
  // A relative secret_file or TLS dir read by FromFile is made relative to
  // the spec file's directory; from TF_CONFIG, to the working directory.
  const std::string& auth_secret_file() const { return auth_secret_file_; }
  // Where `pstrain certs` wrote the cluster's CA and certificates (mutual TLS).
  const std::string& tls_dir() const { return tls_dir_; }
  bool insecure() const { return insecure_; }
  // {"metrics": {"ps": ["host:port", ...], ...}}: where each task of a job
  // serves /metrics (one address per task, each a port of its own). Empty
  // where the spec names none for the task.
  std::string metrics_address(const std::string& job, int index) const;
  bool has_metrics() const { return !metrics_.empty(); }

 private:
  std::string source_;
  std::string auth_secret_file_;
  std::string tls_dir_;
  bool insecure_ = false;
  std::map<std::string, std::vector<std::string>> jobs_;
  std::map<std::string, std::vector<std::string>> metrics_;  // job -> per task
};

// A task's identity and its cluster, from flags or from TF_CONFIG.
struct TaskConfig {
  ClusterSpec cluster;
  TaskId task;
};

// Parses the TF_CONFIG environment variable's value as Kubeflow's TFJob sets
// it: {"cluster": {...}, "task": {"type": "ps", "index": 0}}.
absl::StatusOr<TaskConfig> ParseTfConfig(const std::string& tf_config);

// Resolves a daemon's identity: from --cluster_spec/--job/--task when
// `spec_path` is set, otherwise from `tf_config` (the environment's value).
// `expected_job` is the daemon's role; a different job is an error.
absl::StatusOr<TaskConfig> ResolveTask(const std::string& spec_path, const std::string& job,
                                       int task, const std::string& tf_config,
                                       const std::string& expected_job);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CLUSTER_CLUSTER_SPEC_H_
