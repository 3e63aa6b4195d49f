#include "common/runtime/daemon.h"

#include <arpa/inet.h>

#include <algorithm>
#include <tuple>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/runtime/allocator.h"
#include "common/cluster/config.h"
#include "common/security/tls_watcher.h"
#include "common/cluster/sizing.h"
#include "common/storage/env.h"
#include "common/rpc/grpc_lifetime.h"
#include "common/base/logging.h"
#include "common/rpc/rpc.h"
#include "common/base/status_macros.h"

ABSL_FLAG(std::string, auth_secret_file, "",
          "the cluster secret (pstrain tokens writes it); default: the cluster spec's "
          "\"pstrain\": {\"auth\": {\"secret_file\": ...}}");
ABSL_FLAG(std::string, auth_token_file, "",
          "this task's own token instead of the secret (workers, which serve no RPCs)");
ABSL_FLAG(std::string, bind, "",
          "ps and chief: listen on this host at the task's port instead of the task's own "
          "address (e.g. 0.0.0.0 in a container)");
ABSL_FLAG(std::string, metrics_address, "",
          "serve /metrics, /healthz and /readyz on host:port (port 0: any free one); default: "
          "the cluster spec's \"pstrain\": {\"metrics\": ...} address for this task, on the "
          "--bind host where set; off when neither names one");
ABSL_FLAG(std::string, tls_dir, "",
          "mutual TLS: the directory pstrain certs wrote (ca.crt and this task's JOB-INDEX.crt "
          "and .key), instead of the cluster spec's \"pstrain\": {\"tls\": {\"dir\": ...}}; "
          "the three file flags below win over it");
ABSL_FLAG(std::string, tls_ca_file, "",
          "mutual TLS: the cluster CA's certificate; default: ca.crt in the cluster spec's "
          "\"pstrain\": {\"tls\": {\"dir\": ...}} (pstrain certs writes it)");
ABSL_FLAG(std::string, tls_cert_file, "",
          "mutual TLS: this task's certificate; default: JOB-INDEX.crt in the spec's TLS dir");
ABSL_FLAG(std::string, tls_key_file, "",
          "mutual TLS: this task's private key (mode 0600); default: JOB-INDEX.key in the "
          "spec's TLS dir");
ABSL_FLAG(std::string, tls_crl_dir, "",
          "mutual TLS: the directory of revocation lists (pstrain certs --revoke writes them), "
          "read at every handshake; default: crl beside the CA's certificate");
ABSL_FLAG(int, tls_reload_s, 60,
          "mutual TLS: look at the CA, certificate and key files this often, in seconds, and "
          "take renewed ones that pass the start's checks (new connections use them); 0: read "
          "them at start only");
ABSL_FLAG(bool, insecure, false,
          "run without authentication on purpose: allowed beyond loopback (a trusted network "
          "only), and on loopback without the warning that any local process may call");
ABSL_FLAG(int64_t, max_inflight_mib, 0,
          "ps and chief: memory for RPC messages being received and sent, in MiB (at least "
          "512); as it fills senders are slowed, past it calls fail with RESOURCE_EXHAUSTED; "
          "0: an eighth of the machine's (or the container's) memory, 512..2048");
ABSL_FLAG(int, max_rpc_threads, 0,
          "ps and chief: threads for synchronous RPC handlers; a call finding none free fails "
          "with RESOURCE_EXHAUSTED; 0: 256, or 2 per task of the cluster and 64 more where "
          "that is more (a waiting RegisterWorker or GetShard holds one)");
ABSL_FLAG(int64_t, handshake_timeout_ms,
          absl::ToInt64Milliseconds(pstrain::ServerLimits().handshake_timeout),
          "ps and chief: close a connection whose peer has not finished its handshake (TLS, "
          "HTTP/2's preface and settings) within this many milliseconds");
ABSL_FLAG(int64_t, keepalive_ms, absl::ToInt64Milliseconds(pstrain::ServerLimits().keepalive),
          "ps and chief: ping a peer quiet for this many milliseconds, and close its "
          "connection when it leaves the ping unanswered as long again; at least "
          "rpc.step_timeout_ms + rpc.rpc_timeout_ms, the longest a worker may be paused");

namespace pstrain {
namespace {

// The TLS files the flags name for `identity`: --tls_dir's, each replaced by
// its own flag where set.
TlsFiles TlsFlags(const std::string& identity) {
  const std::string dir = absl::GetFlag(FLAGS_tls_dir);
  TlsFiles files = dir.empty() ? TlsFiles() : TlsFilesIn(dir, identity);
  for (auto [flag, file] : {std::pair{&FLAGS_tls_ca_file, &files.ca_file},
                            std::pair{&FLAGS_tls_cert_file, &files.cert_file},
                            std::pair{&FLAGS_tls_key_file, &files.key_file}}) {
    if (std::string v = absl::GetFlag(*flag); !v.empty()) *file = v;
  }
  files.crl_dir = absl::GetFlag(FLAGS_tls_crl_dir);
  return files;
}

}  // namespace

absl::StatusOr<std::string> ResolveMetricsAddress(const TaskConfig& task, const std::string& flag,
                                                  const std::string& bind) {
  if (!flag.empty()) return flag;
  const std::string spec = task.cluster.metrics_address(task.task.job, task.task.index);
  if (spec.empty()) return std::string();
  const HostPort hp = *ParseHostPort(spec);  // validated by the spec's parser
  if (!bind.empty()) return HostPortString(bind, hp.port);
  in_addr ignored;
  if (hp.host != "localhost" && ::inet_pton(AF_INET, hp.host.c_str(), &ignored) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        task.cluster.source(), ": \"pstrain\".\"metrics\" names ", spec, " for ",
        task.task.ToString(), "; its endpoint listens on an IPv4 address: give one, or start the "
        "task with --bind=0.0.0.0 (or --metrics_address=HOST:PORT)"));
  }
  return spec;
}

absl::StatusOr<DaemonSetup> SetUpDaemon(const std::string& expected_job, bool config_required,
                                        const char* tf_config) {
  DaemonSetup setup;
  TuneAllocator();
  KeepGrpcUntilExit();
  ASSIGN_OR_RETURN(setup.task,
                   ResolveTask(absl::GetFlag(FLAGS_cluster_spec), absl::GetFlag(FLAGS_job),
                               absl::GetFlag(FLAGS_task), tf_config ? tf_config : "",
                               expected_job));
  const std::string config_path = absl::GetFlag(FLAGS_config);
  if (!config_path.empty()) {
    ASSIGN_OR_RETURN(setup.config, LoadTrainingConfig(config_path));
  } else if (config_required) {
    return absl::InvalidArgumentError("--config=FILE (the training config) is required");
  }
  const int tls_reload_s = absl::GetFlag(FLAGS_tls_reload_s);
  if (tls_reload_s < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_reload_s=", tls_reload_s, ": expected seconds between looks, or 0 for none"));
  }
  ASSIGN_OR_RETURN(setup.auth,
                   ResolveAuth(setup.task.cluster, setup.task.task.ToString(),
                               /*serves=*/expected_job != kWorkerJob,
                               absl::GetFlag(FLAGS_auth_secret_file),
                               absl::GetFlag(FLAGS_auth_token_file), absl::GetFlag(FLAGS_insecure),
                               absl::GetFlag(FLAGS_bind),
                               TlsFlags(setup.task.task.ToString()),
                               absl::Seconds(tls_reload_s)));
  ASSIGN_OR_RETURN(setup.metrics_address,
                   ResolveMetricsAddress(setup.task, absl::GetFlag(FLAGS_metrics_address),
                                         absl::GetFlag(FLAGS_bind)));
  const int64_t inflight_mib = absl::GetFlag(FLAGS_max_inflight_mib);
  setup.limits.inflight_bytes =
      inflight_mib == 0
          ? DefaultInflightBytes(PhysicalMemoryBytes())
          : std::clamp<int64_t>(inflight_mib, 0, int64_t{1} << 30) * (int64_t{1} << 20);
  setup.limits.threads = absl::GetFlag(FLAGS_max_rpc_threads);
  if (setup.limits.threads == 0) {
    const int64_t tasks = static_cast<int64_t>(setup.task.cluster.AllTasks().size());
    setup.limits.threads = static_cast<int>(
        std::clamp<int64_t>(2 * tasks + 64, ServerLimits().threads, 65536));
  }
  for (auto [name, flag, field] :
       {std::tuple{"handshake_timeout_ms", &FLAGS_handshake_timeout_ms,
                   &setup.limits.handshake_timeout},
        std::tuple{"keepalive_ms", &FLAGS_keepalive_ms, &setup.limits.keepalive}}) {
    const int64_t ms = absl::GetFlag(*flag);
    if (ms < kMinPeerTimeoutMs || ms > kMaxPeerTimeoutMs) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, "=", ms, ": expected ",
                                                     kMinPeerTimeoutMs, "..", kMaxPeerTimeoutMs));
    }
    *field = absl::Milliseconds(ms);
  }
  if (absl::Status st = ValidateServerLimits(setup.limits); !st.ok()) {
    const bool memory = setup.limits.inflight_bytes < kMinInflightBytes;
    return absl::InvalidArgumentError(
        absl::StrCat(memory ? absl::StrCat("--max_inflight_mib=", inflight_mib)
                            : absl::StrCat("--max_rpc_threads=", setup.limits.threads),
                     ": ", st.message()));
  }
  SetCallCredentials(setup.task.task.ToString(), setup.auth.own_token);
  SetTransportSecurity(setup.auth.tls);
  setup.transport_scope =
      std::shared_ptr<void>(nullptr, [](void*) { SetTransportSecurity(nullptr); });
  InitLogging(setup.task.task.ToString(), absl::GetFlag(FLAGS_log_level));
  if (setup.auth.tls) {
    const absl::Duration left = setup.auth.tls->not_after - absl::Now();
    LOG_INFO("mutual TLS on: this task's certificate is {}'s, valid until {}{}",
             setup.auth.tls->identity,
             absl::FormatTime("%Y-%m-%d %H:%M UTC", setup.auth.tls->not_after, absl::UTCTimeZone()),
             setup.auth.tls->watcher == nullptr
                 ? "; renewed files are not read (--tls_reload_s=0)"
                 : absl::StrCat("; renewed files are taken within ",
                                2 * tls_reload_s, " s (staged in ",
                                setup.auth.tls->watcher->staging_dir(), ")"));
    if (left < absl::Hours(24 * 7)) {
      LOG_WARN("this task's certificate or its CA expires in {}: renew with pstrain certs",
               absl::FormatDuration(absl::Floor(left, absl::Minutes(1))));
    }
    const std::string dir = absl::GetFlag(FLAGS_tls_dir).empty() ? setup.task.cluster.tls_dir()
                                                                 : absl::GetFlag(FLAGS_tls_dir);
    if (!dir.empty() && Env::Default()->FileExists(JoinPath(dir, "ca.key"))) {
      LOG_WARN("{} is readable here: whoever reads it can make a certificate for any task; "
               "keep the CA's key off the cluster",
               JoinPath(dir, "ca.key"));
    }
  }
  if (!setup.auth.own_token.empty()) {
    LOG_INFO("authentication on: calls are signed with {}'s key{}", setup.task.task.ToString(),
             setup.auth.secret.empty() ? "" : "; calls served are verified");
  }
  setup.open_by_accident = setup.auth.own_token.empty() && !setup.auth.tls &&
                           !absl::GetFlag(FLAGS_insecure) && !setup.task.cluster.insecure();
  return setup;
}

void WarnIfOpen(const DaemonSetup& setup) {
  // Loopback is not a trust boundary on a shared machine (ResolveAuth
  // refuses the rest).
  if (!setup.open_by_accident) return;
  LOG_WARN("no authentication: any process on this machine can call this task, and read, "
           "change or stop the model; pstrain launch makes a secret per run, or name one "
           "(--auth_secret_file, pstrain tokens), or pass --insecure to run open on purpose");
}

}  // namespace pstrain
