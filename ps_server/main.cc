// ps_server: holds a shard of the model's variables and applies the gradients
// workers push. Usage:
//   ps_server --cluster_spec=cluster.json --task=0   (or TF_CONFIG in the env)
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/client/chief_client.h"
#include "common/cluster/cluster_spec.h"
#include "common/runtime/daemon.h"
#include "common/base/logging.h"
#include "common/observability/monitoring.h"
#include "common/rpc/rpc.h"
#include "common/base/shutdown.h"
#include "common/storage/env.h"
#include "ps_server/parameter_server.h"
#include "ps_server/ps_metrics.h"
#include "ps_server/ps_service.h"

ABSL_FLAG(std::string, cluster_spec, "", "cluster spec JSON file (else TF_CONFIG)");
ABSL_FLAG(std::string, job, "ps", "job name; must be ps");
ABSL_FLAG(int, task, 0, "task index within the ps job");
ABSL_FLAG(std::string, config, "", "training config (accepted for uniformity; the chief sends it)");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warn, error");
ABSL_FLAG(int, max_concurrent_calls, pstrain::PsServiceImpl::kDefaultMaxCalls,
          "data calls (Pull, Push, PullRows, PushRows) served at once, waiting pulls included; "
          "one more fails at once with RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, tier_dir, "",
          "where embedding tables with a memory budget (memory_budget_bytes) keep the rows "
          "past it, on a local disk (not a tmpfs): files unlinked once open, so nothing is left "
          "behind; default $TMPDIR, else /tmp");
ABSL_FLAG(int, chief_timeout_s, 60,
          "exit (code 1) when the chief has been unreachable this long: since its last answer, "
          "or since this server started if it never answered; 0: never");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("pstrain parameter server: --cluster_spec=FILE --task=N");
  absl::ParseCommandLine(argc, argv);
  pstrain::StopSignal& stop = pstrain::StopOnTerminationSignals();

  auto setup = pstrain::SetUpDaemon(pstrain::kPsJob, /*config_required=*/false,
                                    std::getenv("TF_CONFIG"));
  if (!setup.ok()) {
    std::cerr << "ps_server: " << setup.status().message() << "\n";
    return 2;
  }
  const pstrain::TaskConfig& task = setup->task;
  const int max_calls = absl::GetFlag(FLAGS_max_concurrent_calls);
  if (max_calls < 1) {
    std::cerr << "ps_server: --max_concurrent_calls=" << max_calls << " must be at least 1\n";
    return 2;
  }
  const std::string& address = task.cluster.address(pstrain::kPsJob, task.task.index);

  pstrain::ParameterServer ps;
  if (const std::string dir = absl::GetFlag(FLAGS_tier_dir); !dir.empty()) {
    if (absl::Status st = pstrain::Env::Default()->CreateDirs(dir); !st.ok()) {
      std::cerr << "ps_server: --tier_dir=" << dir << ": " << st.message() << "\n";
      return 2;
    }
    ps.SetTier({dir, nullptr});
  }
  // Off without a secret or TLS.
  pstrain::Authorizer auth(setup->auth.secret, task.cluster, task.task.ToString(),
                          setup->auth.tls != nullptr);
  pstrain::PsServiceImpl service(&ps, &stop, &auth, max_calls);
  auto server =
      pstrain::StartServer(address, &service, absl::GetFlag(FLAGS_bind), setup->limits,
                           &auth);
  if (!server.ok()) {
    LOG_ERROR("{}", server.status().message());
    return 1;
  }
  pstrain::WarnIfOpen(*setup);  // before "listening", which tests wait for
  LOG_INFO("parameter server listening on {} (at most {} data calls at once, {} RPC threads, "
           "{} MiB of messages in flight; a handshake may take {}, a ping may go unanswered {})",
           address, max_calls, setup->limits.threads, setup->limits.inflight_bytes >> 20,
           absl::FormatDuration(setup->limits.handshake_timeout),
           absl::FormatDuration(setup->limits.keepalive));
  std::unique_ptr<pstrain::MonitoringServer> monitoring;
  if (const std::string& m = setup->metrics_address; !m.empty()) {
    auto started = pstrain::MonitoringServer::Start(
        m,
        {pstrain::PsMetrics(&ps, &service), pstrain::ProcessMetrics(), pstrain::RpcMetrics(),
         pstrain::RefusalMetrics(&auth)},
        [&ps]() -> std::string {
          pstrain::PsStatusResponse s;
          ps.GetStatus(&s);
          return s.initialized() ? "" : "waiting for the chief to install the model";
        },
        {{"job", pstrain::kPsJob}, {"task", std::to_string(task.task.index)}},
        setup->auth.tls);
    if (!started.ok()) {
      LOG_ERROR("{}", started.status().message());
      return 1;
    }
    monitoring = std::move(*started);
    LOG_INFO("metrics on {}", monitoring->url());
  }
  // A server outlives its chief only by --chief_timeout_s: the chief asks
  // for the servers' version every second, and this asks for its status,
  // timing from the server's start until the chief first answers (a chief
  // that dies before then must not leave the server behind).
  std::thread chief_watch;
  if (const int timeout_s = absl::GetFlag(FLAGS_chief_timeout_s); timeout_s > 0) {
    chief_watch = std::thread([&stop, &task, timeout_s] {
      const std::string address = task.cluster.address(pstrain::kChiefJob, 0);
      pstrain::GrpcChiefClient chief(address, absl::Seconds(1));
      const absl::Time started = absl::Now();
      absl::Time last_seen = absl::InfinitePast();
      while (!stop.WaitFor(absl::Seconds(std::min(2, timeout_s)))) {
        pstrain::ChiefStatusResponse status;
        const absl::Status st = chief.GetStatus(&status);
        if (st.ok()) {
          last_seen = absl::Now();
          continue;
        }
        const bool ever = last_seen != absl::InfinitePast();
        const absl::Duration gone = absl::Now() - (ever ? last_seen : started);
        if (gone <= absl::Seconds(timeout_s)) continue;
        stop.Stop(absl::StrCat("the chief at ", address,
                               ever ? " has been unreachable for " : " has not answered in the ",
                               absl::FormatDuration(absl::Trunc(gone, absl::Seconds(1))),
                               ever ? "" : " since this server started",
                               " (--chief_timeout_s=", timeout_s, "; last: ", st.message(),
                               "); exiting"),
                  1);
      }
    });
  }
  stop.Wait();
  if (stop.exit_code() != 0) {
    LOG_ERROR("stopping: {}", stop.reason());
  } else {
    LOG_INFO("stopping: {}", stop.reason());
  }
  ps.Shutdown();  // wakes waiting pulls so in-flight calls finish promptly
  // Waits are already woken; the deadline only bounds replies still in flight
  // (gRPC waits it out while a client keeps its connection open).
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  if (chief_watch.joinable()) chief_watch.join();
  return stop.exit_code();
}
