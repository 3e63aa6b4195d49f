#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/client/chief_client.h"
#include "common/cluster/config.h"
#include "common/base/logging.h"
#include "common/cluster/placement.h"
#include "common/client/ps_client.h"
#include "common/rpc/rpc.h"
#include "common/base/status_macros.h"
#include "worker/data/loader.h"
#include "worker/data/partition.h"
#include "worker/data/prefetcher.h"
#include "worker/model/cpu_ops.h"
#include "worker/model/device.h"
#include "worker/model/embedding_bag.h"
#include "worker/model/model.h"

namespace pstrain {
namespace {

// The dropout stream of one step of one worker: reproducible from the seed.
uint64_t StepSeed(uint64_t seed, int worker, int64_t step) {
  return cpu::Mix64(seed + 0x9E3779B97F4A7C15ULL * (static_cast<uint64_t>(worker) + 1) +
                    0xC2B2AE3D27D4EB4FULL * static_cast<uint64_t>(step));
}

double Millis(absl::Duration d, int64_t steps) {
  return steps > 0 ? absl::ToDoubleMilliseconds(d) / steps : 0.0;
}

// A restarted worker (session > 0) claims its session on every server and
// goes on where its data stood. Async: at its last push the servers took
// (the newest cursor of theirs: a batch applied on only some servers is not
// trained again), its steps and dropout seeds counting on from the pushes
// applied (`steps_before`). Sync: at the cursor of the last step it helped
// complete on the server furthest behind, so it computes the open step's
// gradient from the batch its earlier process had (servers take a
// partition it had pushed already once).
absl::Status Rejoin(PsClient* ps, int worker, int32_t session, bool sync,
                    DataPartition* partition, int64_t* steps_before) {
  DataCursor resume_at{0, 0};
  bool have_cursor = false;
  int64_t min_version = std::numeric_limits<int64_t>::max(), max_version = -1;
  for (int s = 0; s < ps->num_servers(); ++s) {
    PsStatusResponse st;
    // Claiming the session fences off any earlier process of this worker
    // still alive (hung, not dead), and the cursor read with it already
    // counts each push of that process the server took.
    RETURN_IF_ERROR(ps->ClaimSession(s, session, &st));
    if (worker >= st.workers_size()) continue;
    const WorkerProgress& wp = st.workers(worker);
    *steps_before = std::max(*steps_before, wp.pushes_applied());
    const DataCursor c{wp.cursor_epoch(), wp.cursor_position()};
    bool take;
    if (sync) {
      take = st.version() < min_version;
      max_version = std::max(max_version, st.version());
      min_version = std::min(min_version, st.version());
    } else {
      take = !have_cursor || std::make_pair(c.epoch, c.position) >
                                 std::make_pair(resume_at.epoch, resume_at.position);
    }
    if (take) {
      have_cursor = wp.has_cursor();
      if (have_cursor) resume_at = c;
    }
  }
  if (have_cursor) {
    RETURN_IF_ERROR(partition->Restore(resume_at));
  } else {
    LOG_WARN("no server has this worker's data cursor (none of its pushes completed a step "
             "there): its data starts where the run's did");
  }
  LOG_INFO("rejoined the running job after a restart (session {}): {}data goes on at epoch {}, "
           "position {}",
           session,
           sync ? absl::StrCat("at step ", min_version, "; ")
                : absl::StrCat(*steps_before, " of this worker's pushes were applied; "),
           partition->cursor().epoch, partition->cursor().position);
  if (sync && max_version > min_version) {
    LOG_WARN("the servers are at steps {} to {}: the step its earlier process left open was "
             "completed on some of them, so this step's gradient is computed from newer "
             "parameters there than its earlier process had",
             min_version, max_version);
  }
  return absl::OkStatus();
}

// Waits until the chief answers, up to `timeout`; a stop ends the wait.
absl::Status WaitForChief(ChiefClient* chief, absl::Duration timeout, StopSignal* stop) {
  const absl::Time deadline = absl::Now() + timeout;
  for (bool told = false;;) {
    ChiefStatusResponse status;
    absl::Status st = chief->GetStatus(&status);
    if (st.ok()) {
      if (told) LOG_INFO("the chief answers again (state: {})", status.state());
      return absl::OkStatus();
    }
    if (!MayHaveLostPeer(st)) return st;
    if (!told) {
      LOG_WARN("the chief does not answer ({}); waiting up to {} for it to come back", st,
               absl::FormatDuration(timeout));
      told = true;
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("the chief has not answered for ",
                                                 absl::FormatDuration(timeout),
                                                 " (rpc.startup_timeout_ms): ", st.message()));
    }
    if (stop->WaitFor(absl::Milliseconds(100))) return absl::CancelledError(stop->reason());
  }
}

}  // namespace

absl::Status RunWorker(const TrainingConfig& config, const ClusterSpec& cluster,
                       const WorkerOptions& options, StopSignal* stop) {
  const absl::Duration rpc_timeout = absl::Milliseconds(config.rpc().rpc_timeout_ms());
  const absl::Duration step_timeout = absl::Milliseconds(config.rpc().step_timeout_ms());
  const bool sync = IsSyncMode(config);

  RETURN_IF_ERROR(
      CheckConfiguredModelFits(config, cluster.num_ps(), absl::StrCat("worker:", options.worker)));
  ASSIGN_OR_RETURN(DeviceSpec device_spec,
                   ParseDeviceSpec(options.device.empty() ? config.device() : options.device));
  ASSIGN_OR_RETURN(OpenedDevice device, OpenDevice(device_spec, config.compute_threads()));
  Backend* backend = device.backend.get();
  LOG_INFO("compute device: {} ({})", backend->Describe(), device.reason);
  if (!device.warning.empty()) LOG_WARN("{}", device.warning);
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(config.model(), backend));
  LOG_INFO("model: {}", model->Summary());

  ASSIGN_OR_RETURN(Dataset data, LoadDataset(Env::Default(), config.data(), DataSplit::kTrain,
                                             model->input_dim(), model->num_labels()));
  DataPartition partition(&data, options.worker, cluster.num_workers(), config.data().batch_size(),
                          config.data().shuffle(), config.seed());
  if (partition.size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", options.worker, " of ",
                                                      cluster.num_workers(),
                                                      ": no examples in the training data"));
  }
  LOG_INFO("{} training examples in this worker's partition of {}; {} mode", partition.size(),
           data.size, sync ? "sync" : "async");
  ChiefClient chief(cluster.address(kChiefJob, 0), rpc_timeout);
  RegisterWorkerResponse reg;
  RETURN_IF_ERROR(chief.RegisterWorker(options.worker, ConfigFingerprint(config),
                                       absl::Milliseconds(config.rpc().startup_timeout_ms()),
                                       &reg, /*previous_incarnation=*/0, /*session=*/0, stop));
  LOG_INFO("registered with the chief: incarnation {:x}, starting at step {}", reg.incarnation(),
           reg.start_step());
  WorkerStats unused;
  WorkerStats* stats = options.stats != nullptr ? options.stats : &unused;
  stats->registered = true;
  // Device memory for the metrics (the CPU backend reports no device).
  auto read_device_memory = [backend, stats] {
    if (backend->host_memory()) return;
    size_t used = 0, total = 0;
    if (backend->MemoryInfo(&used, &total).ok()) {
      stats->device_memory_used.store(static_cast<int64_t>(used), std::memory_order_relaxed);
      stats->device_memory_total.store(static_cast<int64_t>(total), std::memory_order_relaxed);
    }
  };
  read_device_memory();
  if (reg.has_cursor()) {
    // Resuming from a checkpoint: the data goes on where it stood at its step.
    RETURN_IF_ERROR(partition.Restore({reg.cursor_epoch(), reg.cursor_position()}));
    LOG_INFO("data cursor restored: epoch {}, position {}", reg.cursor_epoch(),
             reg.cursor_position());
  }
  ASSIGN_OR_RETURN(Placement placement,
                   Placement::Compute(model->variables(), cluster.num_ps(),
                                      config.placement().partition_min_bytes(),
                                      config.placement().partition_max_bytes()));


  // Pulls and pushes travel as calls of up to rpc.call_bytes (4 MiB), up
  // to rpc.calls_in_flight (16) per server in flight together, so no
  // message nears gRPC's cap: sync servers aggregate
  // per partition and apply each as it lands; async servers hold a push's
  // parts until the last is in and apply it as one update, and this worker
  // takes an async pull's parts at whatever version each answered (the
  // oldest counts). A new client after a rollback: the new incarnation.
  auto connect = [&](const RegisterWorkerResponse& r) {
    auto client = std::make_unique<PsClient>(cluster, &placement, options.worker, rpc_timeout);
    client->set_incarnation(r.incarnation());
    // The chief's pulls (evaluation, the saved model) stay float32.
    if (config.rpc().wire_dtype() == "bfloat16") client->set_wire_dtype(DT_BFLOAT16);
    client->set_chunk_bytes(config.rpc().call_bytes());
    client->set_calls_in_flight(config.rpc().calls_in_flight());
    client->set_connections_per_server(config.rpc().connections_per_server());
    client->set_mixed_versions(!sync);
    client->set_push_timeout(step_timeout + rpc_timeout);
    client->set_session(r.session());
    return client;
  };
  std::unique_ptr<PsClient> ps = connect(reg);
  std::vector<int64_t> min_versions(ps->num_servers(), reg.start_step());
  // This worker's steps before a restart: in async mode the servers' count
  // of its pushes applied (exact); in sync mode what it had reported.
  int64_t steps_before = reg.local_steps_before();
  if (reg.rejoin()) {
    RETURN_IF_ERROR(
        Rejoin(ps.get(), options.worker, reg.session(), sync, &partition, &steps_before));
  }
  // Batches are assembled ahead on a thread of their own, into pinned memory
  // on CUDA so that their copy to the device runs at full speed.
  Prefetcher::Allocator pinned;
  pinned.alloc = [backend](size_t bytes) { return backend->AllocateHost(bytes); };
  pinned.free = [backend](void* p) { backend->FreeHost(p); };
  ASSIGN_OR_RETURN(std::unique_ptr<Prefetcher> batches,
                   Prefetcher::Create(&partition, config.data().prefetch_batches(), pinned));
  // Pulls land in the model's host parameter block (pinned on CUDA) and
  // pushes read its host gradient block: no intermediate tensors.
  const std::vector<float*> param_dst = model->host_parameter_pointers();
  const std::vector<const float*> grad_src = model->host_gradient_pointers();
  std::vector<PushOutcome> outcomes;
  PsClient::PullResult pulled;
  absl::Status early_push;  // the first failure of a push started during backward
  // Clipping by the global norm needs the whole gradient before any of it
  // leaves, so it gives up pushing layers during the backward pass.
  const float clip_norm = config.optimizer().clip_global_norm();
  // A click-through model's bags: rows of the batch's unique ids are pulled
  // from the servers, bagged into the model's input, and their gradients
  // (from the model's input gradient) pushed back. In sync mode the rows must
  // reach a server before the dense push that may complete its step, so the
  // dense push waits for the backward pass to end.
  const bool click_through = config.model().has_click_through();
  std::optional<EmbeddingBags> bags;
  // On a device the bags run there: the rows go up, their gradients come down.
  std::optional<DeviceEmbeddingBags> device_bags;
  std::string table;
  int embedding_dim = 0;
  if (click_through) {
    const ClickThroughConfig& ct = config.model().click_through();
    table = ct.table();
    embedding_dim = ct.embedding_dim();
    bags.emplace(partition.dim(), partition.id_fields(), embedding_dim,
                 ct.mean_bags() ? Combiner::kMean : Combiner::kSum);
    if (bags->output_dim() != model->input_dim()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "click-through data gives ", bags->output_dim(), " inputs, the model takes ",
          model->input_dim()));
    }
    if (backend->host_memory()) {
      model->set_input_gradient(true);
    } else {
      device_bags.emplace(backend, partition.dim(), partition.id_fields(), embedding_dim,
                          ct.mean_bags() ? Combiner::kMean : Combiner::kSum);
      model->set_input_gradient(true, /*to_host=*/false);
    }
  }
  std::vector<float> rows, row_grads, bagged;
  std::vector<PushOutcome> row_outcomes;
  // rpc.sequential: pull, compute and push strictly in turn (to measure what
  // the overlap hides).
  const bool overlap = !config.rpc().sequential();
  if (!overlap) {
    LOG_INFO("rpc.sequential: no push during the backward pass, no early pull");
  }
  // rpc.async_prefetch (async only; the config refuses it otherwise): each
  // step's pull leaves as the previous step's parameters come in.
  const bool async_prefetch = !sync && overlap && config.rpc().async_prefetch();
  if (async_prefetch) {
    LOG_INFO("rpc.async_prefetch: each pull is sent a step ahead, while the step before it "
             "computes and pushes");
  }
  if (sync && overlap && clip_norm == 0 && !click_through) {
    model->set_gradients_ready([&ps, &early_push](size_t first, size_t end) {
      absl::Status st = ps->PushReady(first, end);
      if (early_push.ok()) early_push = st;
    });
  }
  int64_t local_steps = 0, examples = 0, dropped = 0;
  // prefetched: answered from a pull sent ahead (with the last push, or
  // with rpc.async_prefetch as the last step began)
  int64_t pulls = 0, prefetched = 0;
  double loss_sum = 0;
  int loss_count = 0;
  int late_reports = 0;
  int rollbacks = 0;
  bool chief_lost = false;  // the step failed on its report to the chief
  // Where the worker's time goes, for the closing log line.
  absl::Duration pull_time, data_wait, compute_time, push_time;

  auto report = [&](bool done, bool* stop_requested) -> absl::Status {
    ProgressReport r;
    r.set_incarnation(reg.incarnation());
    r.set_worker(options.worker);
    r.set_session(reg.session());
    r.set_global_step(pulled.versions.empty()
                          ? reg.start_step()
                          : *std::min_element(pulled.versions.begin(), pulled.versions.end()));
    // A restarted worker's steps include its earlier process's.
    r.set_local_steps(steps_before + local_steps);
    r.set_loss(loss_count > 0 ? static_cast<float>(loss_sum / loss_count) : 0.0f);
    r.set_examples(examples);
    r.set_done(done);
    r.set_pull_seconds(absl::ToDoubleSeconds(pull_time));
    r.set_data_seconds(absl::ToDoubleSeconds(data_wait));
    r.set_compute_seconds(absl::ToDoubleSeconds(compute_time));
    r.set_push_seconds(absl::ToDoubleSeconds(push_time));
    ProgressResponse resp;
    RETURN_IF_ERROR(chief.ReportProgress(r, &resp));
    *stop_requested = resp.stop();
    loss_sum = 0;
    loss_count = 0;
    return absl::OkStatus();
  };

  // One step: pull, compute, push, and every report_every steps a report.
  // *end says whether training ends here (the servers at max_steps, or the
  // chief's stop).
  auto train_step = [&](bool* end) -> absl::Status {
    absl::Time t0 = absl::Now();
    const int64_t prefetched_before = ps->counters().prefetched_pulls;
    RETURN_IF_ERROR(ps->PullInto(sync ? min_versions : std::vector<int64_t>(), step_timeout,
                                 param_dst, &pulled));
    prefetched += ps->counters().prefetched_pulls - prefetched_before;
    ++pulls;
    absl::Time t1 = absl::Now();
    pull_time += t1 - t0;
    if (pulled.finished) {
      *end = true;
      return absl::OkStatus();
    }
    // rpc.async_prefetch: the next step's pull leaves now and travels while
    // this step computes and pushes; the next PullInto takes its replies as
    // they are, without this step's push in them.
    if (async_prefetch) ps->PrefetchPull({}, step_timeout, {}, /*as_is=*/true);
    Prefetcher::Batch batch;
    RETURN_IF_ERROR(batches->Next(step_timeout, &batch));
    t0 = absl::Now();
    data_wait += t0 - t1;
    // Sync: one step for every server, the oldest version pulled. With backup
    // workers the servers can be a step apart while pushes are in flight; a
    // server already past this step drops the gradient, the lagging one takes
    // it and catches up, so the servers never drift apart. Async: each push
    // carries the version it was computed from on that server.
    std::vector<int64_t> steps = pulled.versions;
    // A checkpoint at the step this push completes records where the data
    // stands after this batch.
    ps->set_data_cursor(batch.end.epoch, batch.end.position);
    if (sync) {
      steps.assign(ps->num_servers(),
                   *std::min_element(pulled.versions.begin(), pulled.versions.end()));
      // Each layer's gradients leave as soon as the backward pass has them
      // (with the overlap: not with rpc.sequential, clipping or bags).
      RETURN_IF_ERROR(ps->PushBegin(steps, grad_src));
      // And the next step's pull goes out now (with the overlap): each
      // server answers each of its calls once the partitions it names are
      // applied, while this step still computes and pushes; the next
      // PullInto takes the replies.
      if (overlap) {
        std::vector<int64_t> next(steps.size());
        for (size_t s = 0; s < steps.size(); ++s) next[s] = steps[s] + 1;
        ps->PrefetchPull(next, step_timeout);
      }
    }
    float loss = 0;
    const float* x = batch.x;
    SparseBatch sparse;
    UniqueRows unique;
    absl::Status computed = absl::OkStatus();
    if (click_through) {
      sparse = SparseBatch::OnePerField(batch.ids, batch.rows, batch.id_fields);
      unique = UniqueRows::Of(sparse.ids);
      rows.resize(unique.ids.size() * embedding_dim);
      computed = ps->PullRows(table, embedding_dim, unique.ids, sync ? steps[0] : 0,
                              step_timeout, rows.data());
      if (computed.ok() && !device_bags) {
        bagged.resize(static_cast<size_t>(batch.rows) * bags->output_dim());
        bags->Forward(sparse, unique, rows.data(), batch.x, bagged.data());
        x = bagged.data();
      }
    }
    if (computed.ok()) computed = model->UploadParameters();
    const uint64_t seed =
        StepSeed(config.seed(), options.worker, sync ? steps[0] : steps_before + local_steps);
    if (computed.ok() && device_bags) {
      computed = model->StageBatchWith(batch.y, batch.rows, [&](float* x_device) {
        return device_bags->Forward(sparse, unique, rows.data(), batch.x, x_device);
      });
      if (computed.ok()) computed = model->ForwardBackward(seed);
      if (computed.ok()) computed = device_bags->Backward(model->device_input_gradient());
      if (computed.ok()) computed = model->FinishStep(&loss);
    } else if (computed.ok()) {
      computed = model->ComputeGradients(x, batch.y, batch.rows, seed, &loss);
    }
    batches->Release();
    RETURN_IF_ERROR(computed);
    RETURN_IF_ERROR(early_push);
    if (click_through) {
      row_grads.resize(rows.size());
      if (device_bags) {
        std::copy(device_bags->host_row_gradients(),
                  device_bags->host_row_gradients() + rows.size(), row_grads.begin());
      } else {
        bags->Backward(sparse, unique, model->host_input_gradient(), row_grads.data());
      }
    }
    if (clip_norm > 0) {
      // The global norm covers the embedding rows' gradients too.
      double rows_squared = 0;
      for (float g : row_grads) rows_squared += double{g} * g;
      const double norm = model->ClipGradientsByGlobalNorm(clip_norm, rows_squared);
      if (click_through && std::isfinite(norm) && norm > clip_norm) {
        const float scale = static_cast<float>(clip_norm / norm);
        for (float& g : row_grads) g *= scale;
      }
    }
    if (click_through) {
      RETURN_IF_ERROR(ps->PushRows(table, embedding_dim, unique.ids, row_grads.data(), steps,
                                   &row_outcomes));
    }
    t1 = absl::Now();
    compute_time += t1 - t0;
    if (!sync) {
      RETURN_IF_ERROR(ps->PushBegin(steps, grad_src));
      // With the overlap the push's calls leave, and then the next step's
      // pull: each server answers it once it has applied this push (its
      // count of this worker's pushes, known from the last push's replies,
      // plus one), so the pull sees it as one made after the push would,
      // a round trip sooner. Not before the first push a client made.
      const std::vector<int64_t>& own = ps->own_pushes();
      if (overlap && !async_prefetch && !own.empty() &&
          *std::min_element(own.begin(), own.end()) >= 0) {
        RETURN_IF_ERROR(ps->PushReady(0, grad_src.size()));
        std::vector<int64_t> after(own.size());
        for (size_t s = 0; s < own.size(); ++s) after[s] = own[s] + 1;
        ps->PrefetchPull({}, step_timeout, after);
      }
    }
    RETURN_IF_ERROR(ps->PushEnd(&outcomes));
    push_time += absl::Now() - t1;
    int servers_finished = 0;
    for (int s = 0; s < ps->num_servers(); ++s) {
      if (outcomes[s] == FINISHED) ++servers_finished;
      if (outcomes[s] == DROPPED_STALE) ++dropped;
      min_versions[s] = steps[s] + 1;
    }
    *end = servers_finished == ps->num_servers();
    ++local_steps;
    examples += batch.rows;
    stats->steps.fetch_add(1, std::memory_order_relaxed);
    stats->examples.fetch_add(batch.rows, std::memory_order_relaxed);
    stats->gradients_dropped_stale.store(dropped, std::memory_order_relaxed);
    stats->pull_ns.store(absl::ToInt64Nanoseconds(pull_time), std::memory_order_relaxed);
    stats->data_ns.store(absl::ToInt64Nanoseconds(data_wait), std::memory_order_relaxed);
    stats->compute_ns.store(absl::ToInt64Nanoseconds(compute_time), std::memory_order_relaxed);
    stats->push_ns.store(absl::ToInt64Nanoseconds(push_time), std::memory_order_relaxed);
    loss_sum += loss;
    ++loss_count;
    if (local_steps % options.report_every == 0) {
      read_device_memory();
      bool stop_requested = false;
      absl::Status st = report(false, &stop_requested);
      // A report whose deadline passed while this process was paused is
      // only late; a chief that stays silent fails the run on the third.
      if (absl::IsDeadlineExceeded(st) && ++late_reports < 3) {
        LOG_WARN("progress report to the chief timed out ({} in a row); training on: {}",
                 late_reports, st);
      } else {
        chief_lost = !st.ok();
        RETURN_IF_ERROR(st);
        late_reports = 0;
      }
      if (stop_requested) *end = true;
    }
    return absl::OkStatus();
  };

  // A step that failed as a lost server fails it (refused on the old
  // incarnation, or the server gone: any code a call to a dying peer can
  // end with, common/rpc/rpc.h MayHaveLostPeer): the chief may be rolling the
  // job back to a checkpoint. Asked, it answers once the rollback is done,
  // and this worker goes on from the step and data cursor rolled back to,
  // with a new client on the new incarnation; else (within 5 s when no
  // server was lost) the step's own error stands.
  auto follow_rollback = [&](const absl::Status& cause) -> absl::Status {
    if (!MayHaveLostPeer(cause) && !absl::IsFailedPrecondition(cause) &&
        !absl::IsAborted(cause)) {
      return cause;
    }
    ps->AbandonPush();  // nothing more of the failed step is sent
    const absl::Duration startup_timeout = absl::Milliseconds(config.rpc().startup_timeout_ms());
    // The chief itself may be gone (the step failed on its report): a
    // restarted one takes the run over from its latest checkpoint. Up to
    // the startup timeout for one to answer, asking in short calls (a stop
    // is seen). A step that failed on the servers asks the chief at once.
    auto wait_for_chief = [&]() -> absl::Status {
      absl::Status up = WaitForChief(&chief, startup_timeout, stop);
      if (!up.ok() && !(absl::IsCancelled(up) && stop->stopped())) {
        LOG_WARN("no chief to follow ({}): the step's failure stands", up);
      }
      return up;
    };
    bool waited = false;
    if (chief_lost) {
      chief_lost = false;
      waited = true;
      if (absl::Status up = wait_for_chief(); !up.ok()) {
        return absl::IsCancelled(up) && stop->stopped() ? up : cause;
      }
    }
    RegisterWorkerResponse again;
    // The chief may wait up to the startup timeout for a lost server to come
    // back, and as long again to put the checkpoint on every server.
    const absl::Duration wait = 2 * startup_timeout + step_timeout;
    auto register_again = [&]() {
      return chief.RegisterWorker(options.worker, ConfigFingerprint(config), wait, &again,
                                  reg.incarnation(), reg.session(), stop);
    };
    absl::Status st = register_again();
    // A restarted chief may have taken the run over (the servers refused
    // this step on its new incarnation) before any report of this worker
    // failed: a report that only timed out, its connection to the dead
    // chief gone silent, leaves the channel backing off from refused
    // connects, and the call fails at once (seen with a chief's container
    // killed, tests/k8s_test). Wait for the chief as above and ask again.
    if (!waited && absl::IsUnavailable(st)) {
      LOG_WARN("the chief did not take the registration ({}); waiting for it", st);
      if (absl::Status up = wait_for_chief(); !up.ok()) {
        return absl::IsCancelled(up) && stop->stopped() ? up : cause;
      }
      st = register_again();
    }
    if (absl::IsCancelled(st) && stop->stopped()) return st;
    if (!st.ok()) {
      LOG_WARN("no rollback to follow ({}): the step's failure stands", st);
      return cause;
    }
    LOG_WARN("the job was rolled back to step {} (this worker's step had failed: {}); going on "
             "from there",
             again.start_step(), cause);
    reg = again;
    batches.reset();  // its thread reads the partition
    RETURN_IF_ERROR(partition.Restore(reg.has_cursor()
                                          ? DataCursor{reg.cursor_epoch(), reg.cursor_position()}
                                          : DataCursor{0, 0}));
    ASSIGN_OR_RETURN(batches,
                     Prefetcher::Create(&partition, config.data().prefetch_batches(), pinned));
    ps = connect(reg);
    min_versions.assign(ps->num_servers(), reg.start_step());
    pulled = PsClient::PullResult();
    early_push = absl::OkStatus();
    ++rollbacks;
    // The prefetcher's thread moves the partition's cursor on from here: the
    // cursor it started at is its consumed one (read under its lock; reading
    // the partition's raced with that thread, found by ThreadSanitizer).
    const DataCursor at = batches->consumed_cursor();
    LOG_INFO("data cursor after the rollback: epoch {}, position {}", at.epoch, at.position);
    return absl::OkStatus();
  };

  for (bool end = false; !end;) {
    if (stop->stopped()) return absl::CancelledError(stop->reason());
    absl::Status st = train_step(&end);
    if (!st.ok()) {
      RETURN_IF_ERROR(follow_rollback(st));
      end = false;  // (a report refused after the servers finished: they start over)
    }
  }
  bool ignored;
  absl::Status st = report(true, &ignored);
  if (!st.ok()) LOG_WARN("final report to the chief failed: {}", st);
  const DataCursor cursor = batches->consumed_cursor();
  LOG_INFO(
      "done after {} local steps ({} examples, data cursor epoch {} position {}, {} stale "
      "gradients dropped, {} rollback(s) followed)",
      local_steps, examples, cursor.epoch, cursor.position, dropped, rollbacks);
  LOG_INFO("pulls sent {}: {} of {}",
           async_prefetch ? "a step ahead" : "with the previous step's push", prefetched, pulls);
  const double total = absl::ToDoubleSeconds(pull_time + data_wait + compute_time + push_time);
  auto share = [total](absl::Duration d) {
    return total > 0 ? 100.0 * absl::ToDoubleSeconds(d) / total : 0.0;
  };
  LOG_INFO(
      "time per step: pull {:.2f} ms ({:.0f}%), waiting for data {:.2f} ms ({:.0f}%), "
      "compute {:.2f} ms ({:.0f}%), push {:.2f} ms ({:.0f}%)",
      Millis(pull_time, local_steps), share(pull_time), Millis(data_wait, local_steps),
      share(data_wait), Millis(compute_time, local_steps), share(compute_time),
      Millis(push_time, local_steps), share(push_time));
  return absl::OkStatus();
}

}  // namespace pstrain
