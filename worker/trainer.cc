#include "worker/trainer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/chief_client.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/placement.h"
#include "common/ps_client.h"
#include "common/status_macros.h"
#include "worker/dataset.h"
#include "worker/mlp.h"

namespace pstrain {

absl::Status RunWorker(const TrainingConfig& config, const ClusterSpec& cluster,
                       const WorkerOptions& options, StopSignal* stop) {
  const absl::Duration rpc_timeout = absl::Milliseconds(config.rpc().rpc_timeout_ms());
  const absl::Duration step_timeout = absl::Milliseconds(config.rpc().step_timeout_ms());
  const bool sync = IsSyncMode(config);
  SetBlasThreads(config.compute_threads());

  Mlp model(config.model().mlp());
  ASSIGN_OR_RETURN(Dataset data,
                   LoadIdxDataset(Env::Default(), config.data().train_images(),
                                  config.data().train_labels(), model.input_dim(),
                                  model.num_classes(), config.data().normalize()));
  DataPartition partition(&data, options.worker, cluster.num_workers(), config.data().batch_size(),
                          config.data().shuffle(), config.seed());
  if (partition.size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", options.worker, " of ",
                                                      cluster.num_workers(), ": no examples in ",
                                                      config.data().train_images()));
  }
  ASSIGN_OR_RETURN(Placement placement,
                   Placement::Compute(model.variables(), cluster.num_ps(),
                                      config.placement().partition_min_bytes()));
  LOG_INFO("{} training examples in this worker's partition of {}; {} mode", partition.size(),
           data.size, sync ? "sync" : "async");

  ChiefClient chief(cluster.address(kChiefJob, 0), rpc_timeout);
  RegisterWorkerResponse reg;
  RETURN_IF_ERROR(chief.RegisterWorker(options.worker, ConfigFingerprint(config),
                                       absl::Milliseconds(config.rpc().startup_timeout_ms()), &reg));
  LOG_INFO("registered with the chief: incarnation {:x}, starting at step {}", reg.incarnation(),
           reg.start_step());

  PsClient ps(cluster, &placement, options.worker, rpc_timeout);
  ps.set_incarnation(reg.incarnation());
  std::vector<int64_t> min_versions(ps.num_servers(), reg.start_step());
  std::vector<Tensor> params, grads;
  std::vector<float> x;
  std::vector<int32_t> y;
  std::vector<PushOutcome> outcomes;
  PsClient::PullResult pulled;
  int64_t local_steps = 0, examples = 0, dropped = 0;
  double loss_sum = 0;
  int loss_count = 0;
  bool finished = false;

  auto report = [&](bool done, bool* stop_requested) -> absl::Status {
    ProgressReport r;
    r.set_incarnation(reg.incarnation());
    r.set_worker(options.worker);
    r.set_global_step(pulled.versions.empty()
                          ? reg.start_step()
                          : *std::min_element(pulled.versions.begin(), pulled.versions.end()));
    r.set_local_steps(local_steps);
    r.set_loss(loss_count > 0 ? static_cast<float>(loss_sum / loss_count) : 0.0f);
    r.set_examples(examples);
    r.set_done(done);
    ProgressResponse resp;
    RETURN_IF_ERROR(chief.ReportProgress(r, &resp));
    *stop_requested = resp.stop();
    loss_sum = 0;
    loss_count = 0;
    return absl::OkStatus();
  };

  while (!finished) {
    if (stop->stopped()) return absl::CancelledError(stop->reason());
    RETURN_IF_ERROR(ps.PullAll(sync ? min_versions : std::vector<int64_t>(), step_timeout, &params,
                               &pulled));
    if (pulled.finished) break;
    partition.NextBatch(&x, &y);
    float loss = 0;
    RETURN_IF_ERROR(model.ComputeGradients(params, x.data(), y.data(), config.data().batch_size(),
                                           &grads, &loss));
    // Sync: one step for every server, the oldest version pulled. With backup
    // workers the servers can be a step apart while pushes are in flight; a
    // server already past this step drops the gradient, the lagging one takes
    // it and catches up, so the servers never drift apart. Async: each push
    // carries the version it was computed from on that server.
    std::vector<int64_t> steps = pulled.versions;
    if (sync) {
      steps.assign(ps.num_servers(),
                   *std::min_element(pulled.versions.begin(), pulled.versions.end()));
    }
    RETURN_IF_ERROR(ps.PushAll(steps, grads, &outcomes));
    int servers_finished = 0;
    for (int s = 0; s < ps.num_servers(); ++s) {
      if (outcomes[s] == FINISHED) ++servers_finished;
      if (outcomes[s] == DROPPED_STALE) ++dropped;
      min_versions[s] = steps[s] + 1;
    }
    finished = servers_finished == ps.num_servers();
    ++local_steps;
    examples += config.data().batch_size();
    loss_sum += loss;
    ++loss_count;
    if (local_steps % options.report_every == 0) {
      bool stop_requested = false;
      RETURN_IF_ERROR(report(false, &stop_requested));
      if (stop_requested) break;
    }
  }
  bool ignored;
  absl::Status st = report(true, &ignored);
  if (!st.ok()) LOG_WARN("final report to the chief failed: {}", st);
  LOG_INFO("done after {} local steps ({} examples, epoch {}, {} stale gradients dropped)",
           local_steps, examples, partition.epoch(), dropped);
  return absl::OkStatus();
}

}  // namespace pstrain
