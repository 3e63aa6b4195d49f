// chief: initialises the variables, owns the global step, evaluates, and ends
// the job. Usage:
//   chief --cluster_spec=cluster.json --config=train.pbtxt   (or TF_CONFIG)
#include <cstdlib>
#include <iostream>
#include <memory>
#include <random>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "chief/chief_metrics.h"
#include "chief/chief_state.h"
#include "chief/chief_runner.h"
#include "chief/chief_service.h"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/config.h"
#include "common/runtime/daemon.h"
#include "common/base/logging.h"
#include "common/observability/monitoring.h"
#include "common/rpc/rpc.h"
#include "common/base/shutdown.h"
#include "worker/model/cpu_ops.h"
#include "worker/model/model.h"

ABSL_FLAG(std::string, cluster_spec, "", "cluster spec JSON file (else TF_CONFIG)");
ABSL_FLAG(std::string, job, "chief", "job name; must be chief");
ABSL_FLAG(int, task, 0, "task index within the chief job (always 0)");
ABSL_FLAG(std::string, config, "", "training config (text-format TrainingConfig)");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warn, error");
ABSL_FLAG(bool, resume, false,
          "start from the latest complete checkpoint in the config's checkpoint.dir (values, "
          "optimizer slots, step, data cursors); from the seed when there is none");
ABSL_FLAG(std::string, init_from, "",
          "a checkpoint directory (ckpt-<step>) whose values start a new run at step 0 with "
          "fresh optimizer state; a --resume that finds a checkpoint of the run's own wins");

int main(int argc, char** argv) {
  pstrain::cpu::ReexecWithFittingBlasCore("chief", argv);
  absl::SetProgramUsageMessage("pstrain chief: --cluster_spec=FILE --config=FILE");
  absl::ParseCommandLine(argc, argv);
  pstrain::StopSignal& stop = pstrain::StopOnTerminationSignals();

  auto setup = pstrain::SetUpDaemon(pstrain::kChiefJob, /*config_required=*/true,
                                    std::getenv("TF_CONFIG"));
  if (!setup.ok()) {
    std::cerr << "chief: " << setup.status().message() << "\n";
    return 2;
  }
  const pstrain::TaskConfig* task = &setup->task;
  const pstrain::TrainingConfig* config = &*setup->config;

  // A fresh incarnation per chief start: requests from tasks of an earlier
  // run of the cluster are refused by it.
  std::random_device rd;
  uint64_t incarnation = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  if (incarnation == 0) incarnation = 1;

  // Workers registering are compared with it (an external model's: with
  // its variables file's names and shapes too).
  auto variables = pstrain::ModelVariables(config->model());
  if (!variables.ok()) {
    std::cerr << "chief: " << variables.status().message() << "\n";
    return 2;
  }
  pstrain::Chief chief(task->cluster.num_workers(), config->max_steps(), incarnation,
                       pstrain::RunFingerprint(*config, *variables), /*start_step=*/0);
  // Off without a secret or TLS.
  pstrain::Authorizer auth(setup->auth.secret, task->cluster, task->task.ToString(),
                          setup->auth.tls != nullptr);
  pstrain::ChiefServiceImpl service(&chief, &auth);
  const std::string& address = task->cluster.address(pstrain::kChiefJob, 0);
  auto server =
      pstrain::StartServer(address, &service, absl::GetFlag(FLAGS_bind), setup->limits,
                           &auth);
  if (!server.ok()) {
    LOG_ERROR("{}", server.status().message());
    return 1;
  }
  pstrain::WarnIfOpen(*setup);  // before "listening", which tests wait for
  LOG_INFO("chief listening on {}; {} ps, {} workers, incarnation {:x}", address,
           task->cluster.num_ps(), task->cluster.num_workers(), incarnation);
  std::unique_ptr<pstrain::MonitoringServer> monitoring;
  if (const std::string& m = setup->metrics_address; !m.empty()) {
    const int workers = task->cluster.num_workers();
    auto started = pstrain::MonitoringServer::Start(
        m,
        {pstrain::ChiefMetrics(&chief), pstrain::ProcessMetrics(), pstrain::RpcMetrics(),
         pstrain::RefusalMetrics(&auth)},
        [&chief, workers] { return pstrain::ChiefNotReady(&chief, workers); },
        {{"job", pstrain::kChiefJob}, {"task", "0"}},
        setup->auth.tls);
    if (!started.ok()) {
      LOG_ERROR("{}", started.status().message());
      return 1;
    }
    monitoring = std::move(*started);
    LOG_INFO("metrics on {}", monitoring->url());
  }
  // A termination signal wakes the driver's waits at once; but while it
  // trains with a save on stop, the workers train on to the save's cut and
  // the driver (which looks at the signal every 250 ms) tells them to stop.
  const bool save_on_stop = pstrain::StopSaveTimeout(*config) > absl::ZeroDuration();
  std::thread stop_watcher([&stop, &chief, save_on_stop] {
    stop.Wait();
    pstrain::ChiefStatusResponse status;
    chief.GetStatus(&status);
    if (!save_on_stop || status.state() != "training") chief.RequestStop();
  });
  pstrain::ChiefStart start;
  start.resume = absl::GetFlag(FLAGS_resume);
  start.init_from = absl::GetFlag(FLAGS_init_from);
  absl::Status st = pstrain::RunChief(*config, task->cluster, incarnation, &chief, &stop, start);
  // Said before the RPC server shuts down: that ends the workers' waiting
  // calls, they fail and exit, and the launcher may stop this process before
  // a later line is out.
  if (!st.ok() && !absl::IsCancelled(st)) LOG_ERROR("training failed: {}", st);
  stop.Stop("chief finished");  // releases the watcher
  stop_watcher.join();
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (absl::IsCancelled(st)) {
    LOG_INFO("stopped: {}", st.message());
    return stop.exit_code();
  }
  return st.ok() ? 0 : 1;
}
