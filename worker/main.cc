// worker: computes gradients on its partition of the data and exchanges them
// with the parameter servers. Usage:
//   worker --cluster_spec=cluster.json --task=0 --config=train.pbtxt [--device=cuda:0]
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/cluster/config.h"
#include "common/runtime/daemon.h"
#include "common/base/logging.h"
#include "common/observability/monitoring.h"
#include "common/base/shutdown.h"
#include "worker/trainer.h"
#include "worker/worker_metrics.h"
#include "worker/model/cpu_ops.h"

ABSL_FLAG(std::string, cluster_spec, "", "cluster spec JSON file (else TF_CONFIG)");
ABSL_FLAG(std::string, job, "worker", "job name; must be worker");
ABSL_FLAG(int, task, 0, "task index within the worker job");
ABSL_FLAG(std::string, config, "", "training config (text-format TrainingConfig)");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warn, error");
ABSL_FLAG(std::string, device, "",
          "auto, cpu or cuda:N (default: the config's device, itself auto by default)");

int main(int argc, char** argv) {
  pstrain::cpu::ReexecWithFittingBlasCore("worker", argv);
  absl::SetProgramUsageMessage("pstrain worker: --cluster_spec=FILE --task=N --config=FILE");
  absl::ParseCommandLine(argc, argv);
  pstrain::StopSignal& stop = pstrain::StopOnTerminationSignals();

  auto setup =
      pstrain::SetUpDaemon(pstrain::kWorkerJob, /*config_required=*/true, std::getenv("TF_CONFIG"));
  if (!setup.ok()) {
    std::cerr << "worker: " << setup.status().message() << "\n";
    return 2;
  }
  const pstrain::TrainingConfig& config = *setup->config;
  const std::string device = absl::GetFlag(FLAGS_device);
  if (!device.empty() && !pstrain::ParseDeviceSpec(device).ok()) {
    std::cerr << "worker: --device=" << device << ": expected auto, cpu or cuda:N\n";
    return 2;
  }

  pstrain::WorkerOptions options;
  options.worker = setup->task.task.index;
  options.device = device;
  pstrain::WorkerStats stats;
  options.stats = &stats;
  std::unique_ptr<pstrain::MonitoringServer> monitoring;
  if (const std::string& m = setup->metrics_address; !m.empty()) {
    auto started = pstrain::MonitoringServer::Start(
        m, {pstrain::WorkerMetrics(&stats), pstrain::ProcessMetrics(), pstrain::RpcMetrics()},
        [&stats]() -> std::string {
          return stats.registered ? "" : "registering with the chief";
        },
        {{"job", pstrain::kWorkerJob}, {"task", std::to_string(options.worker)}},
        setup->auth.tls);
    if (!started.ok()) {
      LOG_ERROR("{}", started.status().message());
      return 1;
    }
    monitoring = std::move(*started);
    LOG_INFO("metrics on {}", monitoring->url());
  }
  absl::Status st = pstrain::RunWorker(config, setup->task.cluster, options, &stop);
  if (!st.ok()) {
    if (absl::IsCancelled(st)) {
      LOG_INFO("stopped: {}", st.message());
      return stop.exit_code();
    }
    LOG_ERROR("training failed: {}", st);
    return 1;
  }
  return 0;
}
