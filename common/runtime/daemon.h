// What every daemon's main() does before its real work: resolve which task it
// is (from --cluster_spec/--job/--task or the TF_CONFIG value main() read from
// the environment), load and validate the training config, and start logging
// with the task's name.
//
// The shared flags are declared here and defined in each daemon's main.cc with
// that role's defaults and help text (flags are defined in main.cc only);
// SetUpDaemon reads them. Any binary linking this library must define all five.
// The authentication flags (--auth_secret_file, --auth_token_file,
// --tls_ca_file, --tls_cert_file, --tls_key_file, --insecure), --bind,
// --metrics_address and the server limits (--max_inflight_mib,
// --max_rpc_threads, --handshake_timeout_ms, --keepalive_ms) are the same
// for every role and are defined in daemon.cc.
#ifndef PSTRAIN_COMMON_RUNTIME_DAEMON_H_
#define PSTRAIN_COMMON_RUNTIME_DAEMON_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "common/security/auth.h"
#include "common/cluster/cluster_spec.h"
#include "common/rpc/rpc.h"
#include "proto/config.pb.h"

ABSL_DECLARE_FLAG(std::string, cluster_spec);
ABSL_DECLARE_FLAG(std::string, job);
ABSL_DECLARE_FLAG(int, task);
ABSL_DECLARE_FLAG(std::string, config);
ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(std::string, bind);
ABSL_DECLARE_FLAG(std::string, metrics_address);

namespace pstrain {

struct DaemonSetup {
  TaskConfig task;
  std::optional<TrainingConfig> config;
  AuthSetup auth;  // its token is already on every call this process makes
  // Where to serve /metrics ("host:port"); empty: nowhere.
  std::string metrics_address;
  // For StartServer: --max_inflight_mib, --max_rpc_threads,
  // --handshake_timeout_ms and --keepalive_ms.
  ServerLimits limits;
  // Serving without authentication on loopback without --insecure (or the
  // spec's "insecure": true): WarnIfOpen says so.
  bool open_by_accident = false;
  // Last, so destroyed first: takes the process's transport security back
  // when main's setup goes, so that a certificate watcher (and its staging
  // directory) ends with main, not during the static destructors, when the
  // logger it may still use is gone.
  std::shared_ptr<void> transport_scope;
};

// --metrics_address when set; else the spec's address for the task (on
// `bind`'s host where set); else empty. The endpoint needs an IPv4 host.
absl::StatusOr<std::string> ResolveMetricsAddress(const TaskConfig& task, const std::string& flag,
                                                  const std::string& bind);

// Resolves the task (which must belong to `expected_job`) from the flags or,
// when --cluster_spec is empty, from `tf_config` (the TF_CONFIG value, or
// nullptr), and loads --config (an error when `config_required` and unset).
// On success logging is initialised with the task's name ("ps:1"), the
// allocator is tuned for large messages (common/runtime/allocator.h), and the task's
// credentials (common/security/auth.h; ps and chief, which serve RPCs, need the cluster
// secret when there is one) go with every call it makes.
absl::StatusOr<DaemonSetup> SetUpDaemon(const std::string& expected_job, bool config_required,
                                        const char* tf_config);

// One warning line when `setup` serves without authentication and without
// --insecure: any process on the machine may call it. The ps and the chief
// call it once their server has started (every flag checked by then).
void WarnIfOpen(const DaemonSetup& setup);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_RUNTIME_DAEMON_H_
