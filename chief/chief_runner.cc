#include "chief/chief_runner.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "chief/driver.h"
#include "chief/run_context.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/client/grpc_ps_client.h"
#include "common/cluster/config.h"
#include "common/cluster/placement.h"
#include "common/storage/env.h"
#include "worker/data/loader.h"
#include "worker/model/backend.h"
#include "worker/model/model.h"

namespace pstrain {
namespace {

// The model is written to output_dir at the end: find out now, not after
// the run, that it cannot be.
absl::Status CheckOutputWritable(const std::string& output_dir) {
  Env* env = Env::Default();
  const std::string probe = JoinPath(output_dir, ".pstrain-write-test");
  absl::Status writable = env->CreateDirs(output_dir);
  if (writable.ok()) writable = env->WriteFile(probe, "ok\n", /*sync=*/false);
  if (!writable.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("output_dir ", output_dir, " is not writable: ", writable.message()));
  }
  (void)env->DeleteFile(probe);
  return absl::OkStatus();
}

// The variables' placement on this cluster's servers, one log line per
// server and per variable.
absl::StatusOr<Placement> PlaceVariables(const TrainingConfig& config, const ClusterSpec& cluster,
                                         const Model& model) {
  ASSIGN_OR_RETURN(Placement placement,
                   Placement::Compute(model.variables(), cluster.num_ps(),
                                      config.placement().partition_min_bytes(),
                                      config.placement().partition_max_bytes()));
  for (absl::string_view line : absl::StrSplit(placement.DebugString(), '\n', absl::SkipEmpty())) {
    LOG_INFO("placement: {}", line);
  }
  return placement;
}

// The held-out examples, when the config has a test split.
absl::StatusOr<std::optional<Dataset>> LoadTestSet(const TrainingConfig& config,
                                                   const Model& model) {
  if (!HasTestSplit(config.data())) return std::optional<Dataset>();
  ASSIGN_OR_RETURN(Dataset test, LoadDataset(Env::Default(), config.data(), DataSplit::kTest,
                                             model.input_dim(), model.num_labels()));
  if (test.size == 0) {
    // Its accuracy would read 0.0000, as if the model had learnt nothing.
    return absl::InvalidArgumentError(
        "the test split has no examples: nothing to evaluate on (give data a test file with "
        "examples, or none to train without evaluation)");
  }
  LOG_INFO("{} held-out examples for evaluation", test.size);
  return std::optional<Dataset>(std::move(test));
}

// Every 250 ms, on a thread of its own (the driver can be busy evaluating or
// committing a checkpoint), every server's status: a restarted one wakes the
// driver, and workers that lost it wait for the rollback instead of failing.
// Stopped and joined by the destructor.
class Heartbeat {
 public:
  Heartbeat(const RunContext& run, Chief* chief)
      : thread_([this, &run, chief] { Run(run, chief); }) {}
  ~Heartbeat() {
    stop_.Notify();
    thread_.join();
  }

 private:
  void Run(const RunContext& run, Chief* chief) {
    GrpcPsClient probe(run.cluster, &run.placement, /*worker=*/-1, run.rpc_timeout);
    while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(250))) {
      const int64_t generation = chief->health_generation();
      if (generation < 0) continue;  // a rollback under way
      const uint64_t incarnation = chief->incarnation();
      int down = 0;
      bool restarted = false;
      for (int s = 0; s < probe.num_servers(); ++s) {
        PsStatusResponse status;
        if (!probe.GetStatus(s, &status).ok()) {
          ++down;
        } else if (!status.initialized() || status.incarnation() != incarnation) {
          restarted = true;
        }
      }
      chief->SetServerHealth(generation, down, restarted);
    }
  }

  absl::Notification stop_;
  std::thread thread_;  // last: started once the notification exists
};

}  // namespace

absl::Status RunChief(const TrainingConfig& config, const ClusterSpec& cluster, uint64_t incarnation,
                      Chief* chief, StopSignal* stop, const ChiefStart& start) {
  RETURN_IF_ERROR(CheckOutputWritable(config.output_dir()));
  RETURN_IF_ERROR(CheckConfiguredModelFits(config, cluster.num_ps(), "the chief"));
  // The chief evaluates on the CPU: it is one process beside the workers,
  // and its numbers should not depend on which device a run had.
  std::unique_ptr<Backend> cpu = NewCpuBackend(config.compute_threads());
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(config.model(), cpu.get()));
  LOG_INFO("model: {}", model->Summary());
  ASSIGN_OR_RETURN(const Placement placement, PlaceVariables(config, cluster, *model));
  ASSIGN_OR_RETURN(const std::optional<Dataset> test, LoadTestSet(config, *model));
  const RunContext run(config, cluster, placement, RunFingerprint(config, model->variables()));

  GrpcPsClient ps(cluster, &placement, /*worker=*/-1, run.rpc_timeout);
  ps.set_incarnation(incarnation);
  // The evaluation's pulls: a share of up to 64 MiB in one call, read at
  // one version; a larger one in calls of up to 64 MiB of whole
  // partitions, each at the version it found (the oldest is reported).
  ps.set_chunk_bytes(int64_t{64} << 20);
  ps.set_calls_in_flight(config.rpc().calls_in_flight());
  ps.set_connections_per_server(config.rpc().connections_per_server());
  ps.set_mixed_versions(true);

  ASSIGN_OR_RETURN(const RunStart begun, StartRun(run, start, model.get(), &ps, chief));
  Driver driver(run, model.get(), test.has_value() ? &*test : nullptr, &ps, chief, stop, start,
                begun);
  Heartbeat heartbeat(run, chief);
  RETURN_IF_ERROR(driver.Train());
  return driver.Finish();
}

}  // namespace pstrain
