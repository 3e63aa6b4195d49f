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
#include "common/client/grpc_ps_client.h"
#include "common/rpc/rpc.h"
#include "common/base/status_macros.h"
#include "worker/data/loader.h"
#include "worker/data/part_stream.h"
#include "worker/data/partition.h"
#include "worker/data/prefetcher.h"
#include "worker/model/cpu_ops.h"
#include "worker/model/device.h"
#include "worker/model/bag_set.h"
#include "worker/model/model.h"
#include "worker/progress.h"
#include "worker/progressive_eval.h"
#include "worker/rejoin.h"

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
// goes on where its data stood (worker/rejoin.h); async, its steps and
// dropout seeds count on from the pushes applied (`steps_before`).
absl::Status Rejoin(PsClient* ps, int worker, int32_t session, bool sync,
                    BatchSource* partition, int64_t* steps_before) {
  ASSIGN_OR_RETURN(const RejoinPoint point, ClaimSession(ps, worker, session, sync));
  *steps_before = std::max(*steps_before, point.pushes_applied);
  if (point.cursor.has_value()) {
    RETURN_IF_ERROR(partition->Restore(*point.cursor));
  } else {
    LOG_WARN("no server has this worker's data cursor (none of its pushes completed a step "
             "there): its data starts where the run's did");
  }
  LOG_INFO("rejoined the running job after a restart (session {}): {}data goes on at {} {}, "
           "{} {}",
           session,
           sync ? absl::StrCat("at step ", point.min_version, "; ")
                : absl::StrCat(*steps_before, " of this worker's pushes were applied; "),
           partition->epoch_name(), partition->cursor().epoch, partition->position_name(),
           partition->cursor().position);
  if (sync && point.max_version > point.min_version) {
    LOG_WARN("the servers are at steps {} to {}: the step its earlier process left open was "
             "completed on some of them, so this step's gradient is computed from newer "
             "parameters there than its earlier process had",
             point.min_version, point.max_version);
  }
  return absl::OkStatus();
}

// The training loop over the state it keeps: set up once (device, model,
// data, registration, client), then steps until the job is done, following
// any rollback of the job. Lives on the worker's main thread; the
// prefetcher's thread owns the partition's cursor while it runs.
class Trainer {
 public:
  Trainer(const TrainingConfig& config, const ClusterSpec& cluster, const WorkerOptions& options,
          StopSignal* stop, WorkerConnections connections)
      : config_(config),
        cluster_(cluster),
        options_(options),
        stop_(stop),
        rpc_timeout_(absl::Milliseconds(config.rpc().rpc_timeout_ms())),
        step_timeout_(absl::Milliseconds(config.rpc().step_timeout_ms())),
        startup_timeout_(absl::Milliseconds(config.rpc().startup_timeout_ms())),
        fingerprint_(ConfigFingerprint(config)),
        sync_(IsSyncMode(config)),
        clip_norm_(config.optimizer().clip_global_norm()),
        click_through_(config.model().has_click_through()),
        overlap_(!config.rpc().sequential()),
        async_prefetch_(!sync_ && overlap_ && config.rpc().async_prefetch()),
        stats_(options.stats != nullptr ? options.stats : &unused_stats_),
        connect_(std::move(connections.connect)),
        chief_(std::move(connections.chief)) {}

  absl::Status Run();

 private:
  absl::Status SetUp();
  absl::Status LoadData();
  absl::Status Register();
  absl::Status SetUpBags();
  void SetUpOverlap();
  void ReadDeviceMemory();
  absl::Status Report(bool done, bool* stop_requested,
                      const WorkerEvaluation* eval = nullptr);
  absl::Status TrainStep(bool* end);
  absl::Status PushFirstLayers(const std::vector<int64_t>& steps);
  absl::Status Compute(const Prefetcher::Batch& batch, const std::vector<int64_t>& steps,
                       float* loss);
  absl::Status PushRest(const std::vector<int64_t>& steps);
  absl::Status Count(const Prefetcher::Batch& batch, const std::vector<int64_t>& steps, float loss,
                     bool* end);
  absl::Status FollowRollback(const absl::Status& cause);
  absl::Status RegisterAgain(const absl::Status& cause, RegisterWorkerResponse* again);
  void LogSummary() const;

  const TrainingConfig& config_;
  const ClusterSpec& cluster_;
  const WorkerOptions& options_;
  StopSignal* const stop_;
  const absl::Duration rpc_timeout_, step_timeout_, startup_timeout_;
  const uint64_t fingerprint_;
  const bool sync_;
  // Clipping by the global norm needs the whole gradient before any of it
  // leaves, so it gives up pushing layers during the backward pass.
  const float clip_norm_;
  // A click-through model's bags: rows of the batch's unique ids are pulled
  // from the servers, bagged into the model's input, and their gradients
  // (from the model's input gradient) pushed back. In sync mode the rows must
  // reach a server before the dense push that may complete its step, so the
  // dense push waits for the backward pass to end.
  const bool click_through_;
  // data.progressive_eval, on worker 0: the scores of its batches.
  std::optional<ProgressiveEval> progressive_;
  // Not rpc.sequential, which pulls, computes and pushes strictly in turn
  // (to measure what the overlap hides).
  const bool overlap_;
  // rpc.async_prefetch (async only; the config refuses it otherwise): each
  // step's pull leaves as the previous step's parameters come in.
  const bool async_prefetch_;
  WorkerStats unused_stats_;
  WorkerStats* const stats_;

  OpenedDevice device_;
  Backend* backend_ = nullptr;
  std::unique_ptr<Model> model_;
  Dataset data_;
  // The training data: a partition of `data_`, or a directory's parts as
  // they come (data.train_dir).
  std::unique_ptr<BatchSource> partition_;
  const std::function<std::unique_ptr<PsClient>(const Placement&, const RegisterWorkerResponse&)>
      connect_;
  const std::unique_ptr<ChiefClient> chief_;
  RegisterWorkerResponse reg_;
  std::optional<Placement> placement_;
  std::unique_ptr<PsClient> ps_;
  // The step's push, from its start to its end (before ps_ goes).
  std::unique_ptr<PsClient::Push> push_;
  std::vector<int64_t> min_versions_;
  // What it has trained and where its time went. tally_.steps_before, its
  // steps before a restart: in async mode the servers' count of its pushes
  // applied (exact); in sync mode what it had reported.
  WorkerTally tally_;
  Prefetcher::Allocator pinned_;
  std::unique_ptr<Prefetcher> batches_;
  // Pulls land in the model's host parameter block (pinned on CUDA) and
  // pushes read its host gradient block: no intermediate tensors.
  std::vector<float*> param_dst_;
  std::vector<const float*> grad_src_;
  std::vector<PushOutcome> outcomes_;
  PsClient::PullResult pulled_;
  absl::Status early_push_;  // the first failure of a push started during backward
  // The bags over the model's tables; on a device they run there (the rows
  // go up, their gradients come down).
  std::unique_ptr<BagSet> bags_;
  bool device_bags_ = false;
  std::vector<float> bagged_;  // the bagged input, on the host
  std::vector<std::vector<PushOutcome>> row_outcomes_;

  // prefetched: answered from a pull sent ahead (with the last push, or
  // with rpc.async_prefetch as the last step began)
  int64_t pulls_ = 0, prefetched_ = 0;
  int rollbacks_ = 0;
  bool chief_lost_ = false;  // the step failed on its report to the chief
};

absl::Status Trainer::SetUp() {
  if (config_.model().has_external()) {
    return absl::FailedPreconditionError(
        "model.external: this model is defined outside pstrain, and its workers are the "
        "user's own processes (pstrain launch --worker_cmd \"python train.py\", "
        "docs/pytorch.md), not this C++ worker");
  }
  RETURN_IF_ERROR(CheckConfiguredModelFits(config_, cluster_.num_ps(),
                                           absl::StrCat("worker:", options_.worker)));
  ASSIGN_OR_RETURN(DeviceSpec device_spec,
                   ParseDeviceSpec(options_.device.empty() ? config_.device() : options_.device));
  ASSIGN_OR_RETURN(device_, OpenDevice(device_spec, config_.compute_threads()));
  backend_ = device_.backend.get();
  LOG_INFO("compute device: {} ({})", backend_->Describe(), device_.reason);
  if (!device_.warning.empty()) LOG_WARN("{}", device_.warning);
  ASSIGN_OR_RETURN(model_, Model::Create(config_.model(), backend_));
  LOG_INFO("model: {}", model_->Summary());
  RETURN_IF_ERROR(LoadData());
  RETURN_IF_ERROR(Register());
  ASSIGN_OR_RETURN(placement_, Placement::Compute(model_->variables(), cluster_.num_ps(),
                                                  config_.placement().partition_min_bytes(),
                                                  config_.placement().partition_max_bytes()));
  ps_ = connect_(*placement_, reg_);
  min_versions_.assign(ps_->num_servers(), reg_.start_step());
  tally_.steps_before = reg_.local_steps_before();
  if (reg_.rejoin()) {
    RETURN_IF_ERROR(Rejoin(ps_.get(), options_.worker, reg_.session(), sync_, partition_.get(),
                           &tally_.steps_before));
  }
  // Batches are assembled ahead on a thread of their own, into pinned memory
  // on CUDA so that their copy to the device runs at full speed.
  pinned_.alloc = [backend = backend_](size_t bytes) { return backend->AllocateHost(bytes); };
  pinned_.free = [backend = backend_](void* p) { backend->FreeHost(p); };
  ASSIGN_OR_RETURN(batches_,
                   Prefetcher::Create(partition_.get(), config_.data().prefetch_batches(),
                                      pinned_));
  param_dst_ = model_->host_parameter_pointers();
  grad_src_ = model_->host_gradient_pointers();
  RETURN_IF_ERROR(SetUpBags());
  SetUpOverlap();
  if (config_.data().progressive_eval() && options_.worker == 0) {
    progressive_.emplace(config_.eval_every_steps(), reg_.start_step());
    model_->set_keep_scores(true);
  }
  return absl::OkStatus();
}

absl::Status Trainer::LoadData() {
  const DataConfig& d = config_.data();
  if (!d.train_dir().empty()) {
    PartStream::Options o;
    o.dir = d.train_dir();
    o.worker = options_.worker;
    o.num_workers = cluster_.num_workers();
    o.batch_size = d.batch_size();
    o.max_malformed = d.max_malformed_lines() < 0 ? 0 : d.max_malformed_lines();
    o.schema = d.schema();
    ASSIGN_OR_RETURN(partition_, PartStream::Open(Env::Default(), o));
    LOG_INFO("training data: the parts of {} as they come (part-<n>, in order), line i of "
             "each this worker's when i % {} == {}; {} mode",
             d.train_dir(), cluster_.num_workers(), options_.worker, sync_ ? "sync" : "async");
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(data_, LoadDataset(Env::Default(), d, DataSplit::kTrain, model_->input_dim(),
                                      model_->num_labels()));
  auto partition = std::make_unique<DataPartition>(&data_, options_.worker, cluster_.num_workers(),
                                                   d.batch_size(), d.shuffle(), config_.seed());
  if (partition->size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", options_.worker, " of ",
                                                      cluster_.num_workers(),
                                                      ": no examples in the training data"));
  }
  LOG_INFO("{} training examples in this worker's partition of {}; {} mode", partition->size(),
           data_.size, sync_ ? "sync" : "async");
  partition_ = std::move(partition);
  return absl::OkStatus();
}

absl::Status Trainer::Register() {
  RETURN_IF_ERROR(chief_->RegisterWorker(options_.worker, fingerprint_, startup_timeout_, &reg_,
                                         /*previous_incarnation=*/0, /*session=*/0, stop_));
  LOG_INFO("registered with the chief: incarnation {:x}, starting at step {}", reg_.incarnation(),
           reg_.start_step());
  stats_->registered = true;
  ReadDeviceMemory();
  if (reg_.has_cursor()) {
    // Resuming from a checkpoint: the data goes on where it stood at its step.
    RETURN_IF_ERROR(partition_->Restore({reg_.cursor_epoch(), reg_.cursor_position()}));
    LOG_INFO("data cursor restored: {} {}, {} {}", partition_->epoch_name(), reg_.cursor_epoch(),
             partition_->position_name(), reg_.cursor_position());
  }
  return absl::OkStatus();
}

// Device memory for the metrics (the CPU backend reports no device).
void Trainer::ReadDeviceMemory() {
  if (backend_->host_memory()) return;
  size_t used = 0, total = 0;
  if (backend_->MemoryInfo(&used, &total).ok()) {
    stats_->device_memory_used.store(static_cast<int64_t>(used), std::memory_order_relaxed);
    stats_->device_memory_total.store(static_cast<int64_t>(total), std::memory_order_relaxed);
  }
}

absl::Status Trainer::SetUpBags() {
  if (!click_through_) return absl::OkStatus();
  device_bags_ = !backend_->host_memory();
  bags_ = BagSet::ForConfig(config_, partition_->dim(), device_bags_ ? backend_ : nullptr);
  if (bags_->ids_per_example() != partition_->id_fields()) {
    return absl::InvalidArgumentError(
        absl::StrCat("click-through data holds ", partition_->id_fields(),
                     " ids an example, data.schema says ", bags_->ids_per_example()));
  }
  if (bags_->output_dim() != model_->input_dim()) {
    return absl::InvalidArgumentError(absl::StrCat("click-through data gives ",
                                                   bags_->output_dim(), " inputs, the model takes ",
                                                   model_->input_dim()));
  }
  model_->set_input_gradient(true, /*to_host=*/!device_bags_);
  return absl::OkStatus();
}

void Trainer::SetUpOverlap() {
  if (!overlap_) {
    LOG_INFO("rpc.sequential: no push during the backward pass, no early pull");
  }
  if (async_prefetch_) {
    LOG_INFO("rpc.async_prefetch: each pull is sent a step ahead, while the step before it "
             "computes and pushes");
  }
  if (sync_ && overlap_ && clip_norm_ == 0 && !click_through_) {
    // To the step's push of the moment (PushFirstLayers starts it before
    // the backward pass; a rollback drops it with its client).
    model_->set_gradients_ready([this](size_t first, size_t end) {
      absl::Status st = push_ != nullptr
                            ? push_->Ready(first, end)
                            : absl::FailedPreconditionError("gradients ready with no push started");
      if (early_push_.ok()) early_push_ = st;
    });
  }
}

absl::Status Trainer::Report(bool done, bool* stop_requested, const WorkerEvaluation* eval) {
  return SendProgress(chief_.get(), reg_, options_.worker, pulled_.versions, done, &tally_,
                      stop_requested, eval);
}

// One step: pull, compute, push, and every report_every steps a report.
// *end says whether training ends here (the servers at max_steps, or the
// chief's stop).
absl::Status Trainer::TrainStep(bool* end) {
  absl::Time t0 = absl::Now();
  const int64_t prefetched_before = ps_->counters().prefetched_pulls;
  RETURN_IF_ERROR(ps_->PullInto(sync_ ? min_versions_ : std::vector<int64_t>(), step_timeout_,
                                param_dst_, &pulled_));
  prefetched_ += ps_->counters().prefetched_pulls - prefetched_before;
  ++pulls_;
  absl::Time t1 = absl::Now();
  tally_.pull += t1 - t0;
  if (pulled_.finished) {
    *end = true;
    return absl::OkStatus();
  }
  // rpc.async_prefetch: the next step's pull leaves now and travels while
  // this step computes and pushes; the next PullInto takes its replies as
  // they are, without this step's push in them.
  if (async_prefetch_) ps_->PrefetchPull({}, step_timeout_, {}, /*as_is=*/true);
  Prefetcher::Batch batch;
  if (absl::Status got = batches_->Next(step_timeout_, &batch); !got.ok()) {
    if (absl::IsDeadlineExceeded(got) && !config_.data().train_dir().empty()) {
      return absl::DeadlineExceededError(absl::StrCat(
          got.message(), ": no new lines in ", config_.data().train_dir(),
          " (a worker waits for data at most rpc.step_timeout_ms, as for a step)"));
    }
    return got;
  }
  t0 = absl::Now();
  tally_.data += t0 - t1;
  // Sync: one step for every server, the oldest version pulled. With backup
  // workers the servers can be a step apart while pushes are in flight; a
  // server already past this step drops the gradient, the lagging one takes
  // it and catches up, so the servers never drift apart. Async: each push
  // carries the version it was computed from on that server.
  std::vector<int64_t> steps = pulled_.versions;
  // A checkpoint at the step this push completes records where the data
  // stands after this batch.
  ps_->set_data_cursor(batch.end.epoch, batch.end.position);
  if (sync_) {
    steps.assign(ps_->num_servers(),
                 *std::min_element(pulled_.versions.begin(), pulled_.versions.end()));
    RETURN_IF_ERROR(PushFirstLayers(steps));
  }
  float loss = 0;
  RETURN_IF_ERROR(Compute(batch, steps, &loss));
  t1 = absl::Now();
  tally_.compute += t1 - t0;
  RETURN_IF_ERROR(PushRest(steps));
  tally_.push += absl::Now() - t1;
  return Count(batch, steps, loss, end);
}

// Sync: each layer's gradients leave as soon as the backward pass has them
// (with the overlap: not with rpc.sequential, clipping or bags), and the
// next step's pull goes out now.
absl::Status Trainer::PushFirstLayers(const std::vector<int64_t>& steps) {
  ASSIGN_OR_RETURN(push_, ps_->StartPush(steps, grad_src_));
  if (overlap_) PrefetchNextSyncPull(ps_.get(), steps, step_timeout_);
  return absl::OkStatus();
}

// The forward and backward pass (a click-through model's bags around it:
// their rows pulled first, their gradients pushed after), with clipping.
absl::Status Trainer::Compute(const Prefetcher::Batch& batch, const std::vector<int64_t>& steps,
                              float* loss) {
  const float* x = batch.x;
  absl::Status computed = absl::OkStatus();
  if (click_through_) {
    bags_->Index(batch.ids, batch.rows);
    computed = ps_->PullTables(TableRowsOf(bags_.get(), /*gradients=*/false),
                               sync_ ? steps[0] : 0, step_timeout_);
    if (computed.ok() && !device_bags_) {
      bagged_.resize(static_cast<size_t>(batch.rows) * bags_->output_dim());
      bags_->Forward(batch.x, bagged_.data());
      x = bagged_.data();
    }
  }
  if (computed.ok()) computed = model_->UploadParameters();
  const uint64_t seed =
      StepSeed(config_.seed(), options_.worker,
               sync_ ? steps[0] : tally_.steps_before + tally_.local_steps);
  if (computed.ok() && device_bags_) {
    computed = model_->StageBatchWith(batch.y, batch.rows, [&](float* x_device) {
      return bags_->DeviceForward(batch.x, x_device);
    });
    if (computed.ok()) computed = model_->ForwardBackward(seed);
    if (computed.ok()) computed = bags_->DeviceBackward(model_->device_input_gradient());
    if (computed.ok()) computed = model_->FinishStep(loss);
  } else if (computed.ok()) {
    computed = model_->ComputeGradients(x, batch.y, batch.rows, seed, loss);
  }
  if (computed.ok() && progressive_) {
    progressive_->Add(model_->scores().data(), batch.y, batch.rows,
                      *std::min_element(steps.begin(), steps.end()));
  }
  batches_->Release();
  RETURN_IF_ERROR(computed);
  RETURN_IF_ERROR(early_push_);
  if (click_through_) {
    if (device_bags_) {
      bags_->TakeDeviceGradients();
    } else {
      bags_->Backward(model_->host_input_gradient());
    }
  }
  if (clip_norm_ > 0) {
    // The global norm covers the embedding rows' gradients too.
    const double norm = model_->ClipGradientsByGlobalNorm(
        clip_norm_, click_through_ ? bags_->SquaredGradientNorm() : 0.0);
    if (click_through_ && std::isfinite(norm) && norm > clip_norm_) {
      bags_->ScaleGradients(static_cast<float>(clip_norm_ / norm));
    }
  }
  if (click_through_) {
    RETURN_IF_ERROR(
        ps_->PushTables(TableRowsOf(bags_.get(), /*gradients=*/true), steps, &row_outcomes_));
  }
  return absl::OkStatus();
}

// The rest of the push (async: all of it), and its end.
absl::Status Trainer::PushRest(const std::vector<int64_t>& steps) {
  if (!sync_) {
    ASSIGN_OR_RETURN(push_, ps_->StartPush(steps, grad_src_));
    if (overlap_ && !async_prefetch_) {
      RETURN_IF_ERROR(
          PrefetchPullAfterPush(ps_.get(), push_.get(), grad_src_.size(), step_timeout_));
    }
  }
  absl::Status pushed = push_->Wait(&outcomes_);
  push_.reset();
  return pushed;
}

// The step's outcome counted, and every report_every steps a report.
absl::Status Trainer::Count(const Prefetcher::Batch& batch, const std::vector<int64_t>& steps,
                            float loss, bool* end) {
  *end = CountPushOutcomes(outcomes_, steps, &min_versions_, &tally_);
  tally_.CountStep(batch.rows, loss, stats_);
  // Progressive validation reports at once, each eval_every_steps (the
  // version this batch was computed from).
  const std::optional<WorkerEvaluation> eval =
      progressive_ ? progressive_->Take(*std::min_element(steps.begin(), steps.end()))
                   : std::nullopt;
  if (tally_.local_steps % options_.report_every != 0 && !eval) return absl::OkStatus();
  ReadDeviceMemory();
  bool stop_requested = false;
  // A chief that stays silent fails the run on the third late report.
  absl::Status st = ForgiveLateReport(
      Report(false, &stop_requested, eval ? &*eval : nullptr), &tally_);
  chief_lost_ = !st.ok();
  RETURN_IF_ERROR(st);
  if (stop_requested) *end = true;
  return absl::OkStatus();
}

// The chief itself may be gone (the step failed on its report): a restarted
// one takes the run over from its latest checkpoint. Up to the startup
// timeout for one to answer, asking in short calls (a stop is seen).
// Registers again on the incarnation the step failed on
// (worker/rejoin.h): the chief answers once its rollback is done.
absl::Status Trainer::RegisterAgain(const absl::Status& cause, RegisterWorkerResponse* again) {
  const bool chief_lost = std::exchange(chief_lost_, false);
  return RegisterAfterFailure(chief_.get(), options_.worker, fingerprint_, reg_, chief_lost,
                              startup_timeout_, step_timeout_, stop_, cause, again);
}

// A step that failed as a lost server fails it (refused on the old
// incarnation, or the server gone: any code a call to a dying peer can
// end with, common/rpc/rpc.h MayHaveLostPeer): the chief may be rolling the
// job back to a checkpoint. Asked, it answers once the rollback is done,
// and this worker goes on from the step and data cursor rolled back to,
// with a new client on the new incarnation; else (within 5 s when no
// server was lost) the step's own error stands.
absl::Status Trainer::FollowRollback(const absl::Status& cause) {
  if (!MayHaveLostPeer(cause) && !absl::IsFailedPrecondition(cause) &&
      !absl::IsAborted(cause)) {
    return cause;
  }
  push_.reset();  // abandoned: nothing more of the failed step is sent
  RegisterWorkerResponse again;
  RETURN_IF_ERROR(RegisterAgain(cause, &again));
  LOG_WARN("the job was rolled back to step {} (this worker's step had failed: {}); going on "
           "from there",
           again.start_step(), cause);
  reg_ = again;
  batches_.reset();  // its thread reads the partition
  RETURN_IF_ERROR(partition_->Restore(reg_.has_cursor()
                                          ? DataCursor{reg_.cursor_epoch(), reg_.cursor_position()}
                                          : DataCursor{0, 0}));
  ASSIGN_OR_RETURN(batches_,
                   Prefetcher::Create(partition_.get(), config_.data().prefetch_batches(),
                                      pinned_));
  ps_ = connect_(*placement_, reg_);
  min_versions_.assign(ps_->num_servers(), reg_.start_step());
  pulled_ = PsClient::PullResult();
  early_push_ = absl::OkStatus();
  if (progressive_) progressive_->Restart(reg_.start_step());
  ++rollbacks_;
  // The prefetcher's thread moves the partition's cursor on from here: the
  // cursor it started at is its consumed one (read under its lock; reading
  // the partition's raced with that thread, found by ThreadSanitizer).
  const DataCursor at = batches_->consumed_cursor();
  LOG_INFO("data cursor after the rollback: {} {}, {} {}", partition_->epoch_name(), at.epoch,
           partition_->position_name(), at.position);
  return absl::OkStatus();
}

void Trainer::LogSummary() const {
  const DataCursor cursor = batches_->consumed_cursor();
  LOG_INFO(
      "done after {} local steps ({} examples, data cursor {} {} {} {}, {} stale gradients "
      "dropped, {} rollback(s) followed)",
      tally_.local_steps, tally_.examples, partition_->epoch_name(), cursor.epoch,
      partition_->position_name(), cursor.position, tally_.dropped, rollbacks_);
  LOG_INFO("pulls sent {}: {} of {}",
           async_prefetch_ ? "a step ahead" : "with the previous step's push", prefetched_, pulls_);
  const double total =
      absl::ToDoubleSeconds(tally_.pull + tally_.data + tally_.compute + tally_.push);
  auto share = [total](absl::Duration d) {
    return total > 0 ? 100.0 * absl::ToDoubleSeconds(d) / total : 0.0;
  };
  LOG_INFO(
      "time per step: pull {:.2f} ms ({:.0f}%), waiting for data {:.2f} ms ({:.0f}%), "
      "compute {:.2f} ms ({:.0f}%), push {:.2f} ms ({:.0f}%)",
      Millis(tally_.pull, tally_.local_steps), share(tally_.pull), Millis(tally_.data, tally_.local_steps),
      share(tally_.data), Millis(tally_.compute, tally_.local_steps), share(tally_.compute),
      Millis(tally_.push, tally_.local_steps), share(tally_.push));
}

absl::Status Trainer::Run() {
  RETURN_IF_ERROR(SetUp());
  for (bool end = false; !end;) {
    if (stop_->stopped()) return absl::CancelledError(stop_->reason());
    absl::Status st = TrainStep(&end);
    if (!st.ok()) {
      RETURN_IF_ERROR(FollowRollback(st));
      end = false;  // (a report refused after the servers finished: they start over)
    }
  }
  bool ignored;
  // Progressive validation: the examples since its last evaluation.
  const std::optional<WorkerEvaluation> rest =
      progressive_ ? progressive_->TakeRest() : std::nullopt;
  absl::Status st = Report(true, &ignored, rest ? &*rest : nullptr);
  if (!st.ok()) LOG_WARN("final report to the chief failed: {}", st);
  LogSummary();
  return absl::OkStatus();
}

}  // namespace

absl::Status RunWorker(const TrainingConfig& config, const ClusterSpec& cluster,
                       const WorkerOptions& options, StopSignal* stop,
                       WorkerConnections connections) {
  Trainer trainer(config, cluster, options, stop, std::move(connections));
  return trainer.Run();
}

absl::Status RunWorker(const TrainingConfig& config, const ClusterSpec& cluster,
                       const WorkerOptions& options, StopSignal* stop) {
  return RunWorker(config, cluster, options, stop,
                   GrpcConnections(config, cluster, options.worker));
}

// Pulls and pushes travel as calls of up to rpc.call_bytes (4 MiB), up
// to rpc.calls_in_flight (16) per server in flight together, so no
// message nears gRPC's cap: sync servers aggregate
// per partition and apply each as it lands; async servers hold a push's
// parts until the last is in and apply it as one update, and this worker
// takes an async pull's parts at whatever version each answered (the
// oldest counts). A new client after a rollback: the new incarnation.
WorkerConnections GrpcConnections(const TrainingConfig& config, const ClusterSpec& cluster,
                                  int worker) {
  const absl::Duration rpc_timeout = absl::Milliseconds(config.rpc().rpc_timeout_ms());
  WorkerConnections connections;
  connections.chief =
      std::make_unique<GrpcChiefClient>(cluster.address(kChiefJob, 0), rpc_timeout);
  connections.connect = [&config, &cluster, worker, rpc_timeout](
                            const Placement& placement, const RegisterWorkerResponse& r) {
    auto client = std::make_unique<GrpcPsClient>(cluster, &placement, worker, rpc_timeout);
    client->set_incarnation(r.incarnation());
    // The chief's pulls (evaluation, the saved model) stay float32.
    if (config.rpc().wire_dtype() == "bfloat16") client->set_wire_dtype(DT_BFLOAT16);
    client->set_chunk_bytes(config.rpc().call_bytes());
    client->set_calls_in_flight(config.rpc().calls_in_flight());
    client->set_connections_per_server(config.rpc().connections_per_server());
    client->set_mixed_versions(!IsSyncMode(config));
    client->set_push_timeout(absl::Milliseconds(config.rpc().step_timeout_ms()) + rpc_timeout);
    client->set_session(r.session());
    return std::unique_ptr<PsClient>(std::move(client));
  };
  return connections;
}


}  // namespace pstrain
