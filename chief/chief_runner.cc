#include "chief/chief_runner.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/placement.h"
#include "common/ps_client.h"
#include "common/status_macros.h"
#include "common/tensor_file.h"
#include "nlohmann/json.hpp"
#include "worker/data/loader.h"
#include "worker/model/backend.h"
#include "worker/model/embedding_bag.h"
#include "worker/model/model.h"

namespace pstrain {
namespace {

struct Evaluation {
  int64_t step = 0;
  EvalResult result;
  // Click-through models: AUC and log loss of the held-out clicks.
  std::optional<double> auc;
  double log_loss = 0;
};

// A click-through model's evaluation: the held-out examples in chunks, each
// chunk's bags built from the rows of its ids as the servers hold them now.
absl::Status EvaluateClickThrough(PsClient* ps, Model* model, const ClickThroughConfig& ct,
                                  const Dataset& test, EvalResult* result) {
  const int dim = ct.embedding_dim();
  const EmbeddingBags bags(test.dim, test.id_fields, dim,
                           ct.mean_bags() ? Combiner::kMean : Combiner::kSum);
  constexpr int64_t kChunk = 8192;
  *result = EvalResult();
  double loss = 0;
  std::vector<float> rows, x;
  for (int64_t start = 0; start < test.size; start += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, test.size - start));
    const SparseBatch batch = SparseBatch::OnePerField(
        test.ids.data() + start * test.id_fields, n, test.id_fields);
    const UniqueRows unique = UniqueRows::Of(batch.ids);
    rows.resize(unique.ids.size() * dim);
    RETURN_IF_ERROR(
        ps->PullRows(ct.table(), dim, unique.ids, 0, absl::ZeroDuration(), rows.data()));
    x.resize(static_cast<size_t>(n) * bags.output_dim());
    bags.Forward(batch, unique, rows.data(), test.x.data() + start * test.dim, x.data());
    EvalResult part;
    RETURN_IF_ERROR(model->Evaluate(x.data(), test.y.data() + start, n, &part));
    loss += part.loss * n;
    result->correct += part.correct;
    result->scores.insert(result->scores.end(), part.scores.begin(), part.scores.end());
  }
  result->count = test.size;
  result->loss = test.size > 0 ? loss / static_cast<double>(test.size) : 0;
  return absl::OkStatus();
}

absl::StatusOr<Evaluation> Evaluate(PsClient* ps, Model* model, const TrainingConfig& config,
                                    const Dataset* test, std::vector<Tensor>* params) {
  PsClient::PullResult pulled;
  RETURN_IF_ERROR(ps->PullAll({}, absl::ZeroDuration(), params, &pulled));
  Evaluation e;
  e.step = *std::min_element(pulled.versions.begin(), pulled.versions.end());
  if (test != nullptr) {
    RETURN_IF_ERROR(model->SetParameters(*params));
    if (config.model().has_click_through()) {
      RETURN_IF_ERROR(
          EvaluateClickThrough(ps, model, config.model().click_through(), *test, &e.result));
    } else {
      RETURN_IF_ERROR(model->Evaluate(test->x.data(), test->y.data(), test->size, &e.result));
    }
    if (!e.result.scores.empty()) {
      absl::StatusOr<double> auc = RocAuc(e.result.scores, test->y);
      if (auc.ok()) e.auc = *auc;
      e.log_loss = LogLoss(e.result.scores, test->y);
    }
  }
  return e;
}

}  // namespace

absl::Status RunChief(const TrainingConfig& config, const ClusterSpec& cluster, uint64_t incarnation,
                      Chief* chief, StopSignal* stop) {
  const absl::Duration rpc_timeout = absl::Milliseconds(config.rpc().rpc_timeout_ms());
  const absl::Duration step_timeout = absl::Milliseconds(config.rpc().step_timeout_ms());
  // The chief evaluates on the CPU: it is one process beside the workers,
  // and its numbers should not depend on which device a run had.
  std::unique_ptr<Backend> cpu = NewCpuBackend(config.compute_threads());
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(config.model(), cpu.get()));
  LOG_INFO("model: {}", model->Summary());
  ASSIGN_OR_RETURN(Placement placement,
                   Placement::Compute(model->variables(), cluster.num_ps(),
                                      config.placement().partition_min_bytes(),
                                      config.placement().partition_max_bytes()));
  // One log line per server and per variable.
  for (absl::string_view line : absl::StrSplit(placement.DebugString(), '\n', absl::SkipEmpty())) {
    LOG_INFO("placement: {}", line);
  }
  std::optional<Dataset> test;
  if (HasTestSplit(config.data())) {
    ASSIGN_OR_RETURN(test, LoadDataset(Env::Default(), config.data(), DataSplit::kTest,
                                       model->input_dim(), model->num_labels()));
    LOG_INFO("{} held-out examples for evaluation", test->size);
  }

  PsClient ps(cluster, &placement, /*worker=*/-1, rpc_timeout);
  ps.set_incarnation(incarnation);
  std::vector<Tensor> params = model->Initialize(config.seed());
  RETURN_IF_ERROR(ps.InitializeAll(config, ConfigFingerprint(config), cluster.num_workers(),
                                   /*start_step=*/0, params,
                                   absl::Milliseconds(config.rpc().startup_timeout_ms())));
  LOG_INFO("initialised variables on {} parameter server(s) from seed {}", cluster.num_ps(),
           config.seed());
  chief->MarkInitialized();

  const int64_t max_steps = config.max_steps();
  const int64_t every = config.eval_every_steps() > 0 ? config.eval_every_steps() : max_steps;
  int64_t next_eval = std::min(every, max_steps);
  const absl::Time start = absl::Now();
  for (;;) {
    if (stop->stopped()) {
      chief->RequestStop();
      chief->SetState("stopped");
      return absl::CancelledError(stop->reason());
    }
    const int64_t step = chief->WaitForStep(next_eval, absl::Seconds(1));
    if (absl::Now() - chief->last_progress() > step_timeout + rpc_timeout) {
      chief->RequestStop();
      chief->SetState("failed");
      return absl::DeadlineExceededError(absl::StrCat(
          "no training progress for ", absl::FormatDuration(step_timeout + rpc_timeout),
          " (global step ", step, "): a worker or parameter server is stuck or gone"));
    }
    if (step >= next_eval && step < max_steps) {
      ASSIGN_OR_RETURN(Evaluation e,
                       Evaluate(&ps, model.get(), config, test ? &*test : nullptr, &params));
      chief->SetEval(e.step, e.result.accuracy(), e.result.loss);
      ChiefStatusResponse progress;
      chief->GetStatus(&progress);
      LOG_INFO("step {}/{}: train loss {:.4f}, eval accuracy {:.4f}, eval loss {:.4f}{}, {:.0f} "
               "examples/s",
               e.step, max_steps, progress.train_loss(), e.result.accuracy(), e.result.loss,
               e.auc ? absl::StrFormat(", eval AUC %.4f", *e.auc) : "",
               progress.examples_per_sec());
      while (next_eval <= step) next_eval += every;
      next_eval = std::min(next_eval, max_steps);
    }
    if (step >= max_steps || chief->AllWorkersDone()) break;
  }

  chief->RequestStop();
  if (!chief->WaitForWorkersDone(step_timeout)) {
    LOG_WARN("not every worker reported done within {}", absl::FormatDuration(step_timeout));
  }
  ASSIGN_OR_RETURN(Evaluation final_eval,
                   Evaluate(&ps, model.get(), config, test ? &*test : nullptr, &params));
  chief->SetEval(final_eval.step, final_eval.result.accuracy(), final_eval.result.loss);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);

  Env* env = Env::Default();
  RETURN_IF_ERROR(env->CreateDirs(config.output_dir()));
  TensorMap model_file;
  for (size_t v = 0; v < params.size(); ++v) {
    model_file.emplace(placement.variables()[v].spec.name, params[v]);
  }
  const std::string model_path = JoinPath(config.output_dir(), "model_final.pst");
  RETURN_IF_ERROR(WriteTensorFile(env, model_path, model_file));
  // The servers' own counters: what was applied, dropped as stale, refused.
  int64_t applied = 0, dropped_stale = 0, rejected = 0;
  for (int s = 0; s < ps.num_servers(); ++s) {
    PsStatusResponse status;
    absl::Status st = ps.GetStatus(s, &status);
    if (!st.ok()) {
      LOG_WARN("{}", st);
      continue;
    }
    applied += status.pushes_applied();
    dropped_stale += status.gradients_dropped_stale();
    rejected += status.pushes_rejected();
  }
  LOG_INFO("parameter servers: {} pushes applied, {} gradients dropped as stale, {} refused",
           applied, dropped_stale, rejected);
  ChiefStatusResponse progress;
  chief->GetStatus(&progress);
  nlohmann::json summary = {
      {"global_step", final_eval.step},
      {"max_steps", max_steps},
      {"eval_accuracy", final_eval.result.accuracy()},
      {"eval_loss", final_eval.result.loss},
      {"eval_examples", final_eval.result.count},
      {"eval_auc", final_eval.auc ? nlohmann::json(*final_eval.auc) : nlohmann::json()},
      {"eval_log_loss",
       final_eval.auc ? nlohmann::json(final_eval.log_loss) : nlohmann::json()},
      {"train_loss", progress.train_loss()},
      {"examples_per_sec", progress.examples_per_sec()},
      {"train_seconds", seconds},
      {"mode", IsSyncMode(config) ? "sync" : "async"},
      {"num_ps", cluster.num_ps()},
      {"num_workers", cluster.num_workers()},
      {"pushes_applied", applied},
      {"gradients_dropped_stale", dropped_stale},
      {"pushes_refused", rejected},
  };
  RETURN_IF_ERROR(WriteFileAtomically(env, JoinPath(config.output_dir(), "summary.json"),
                                      summary.dump(2) + "\n"));
  LOG_INFO("training finished at step {} in {:.1f}s: eval accuracy {:.4f}, eval loss {:.4f}; "
           "model written to {}",
           final_eval.step, seconds, final_eval.result.accuracy(), final_eval.result.loss,
           model_path);

  absl::Status st = ps.ShutdownAll("training finished");
  if (!st.ok()) LOG_WARN("shutting down parameter servers: {}", st);
  chief->SetState("finished");
  return absl::OkStatus();
}

}  // namespace pstrain
