#include "chief/summary.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/cluster/config.h"
#include "common/storage/env.h"
#include "common/storage/tensor_file.h"
#include "nlohmann/json.hpp"

namespace pstrain {

absl::Status WriteRunOutputs(const RunContext& run, PsClient* ps, Chief* chief,
                             const Evaluation& final_eval, const std::vector<const float*>& values,
                             double train_seconds) {
  Env* env = Env::Default();
  RETURN_IF_ERROR(env->CreateDirs(run.config.output_dir()));
  std::map<std::string, TensorView> model_file;  // written from `values`, not copied
  for (size_t v = 0; v < values.size(); ++v) {
    const VariableSpec& spec = run.placement.variables()[v].spec;
    model_file.emplace(spec.name, TensorView{spec.shape, values[v]});
  }
  const std::string model_path = JoinPath(run.config.output_dir(), "model_final.pst");
  RETURN_IF_ERROR(WriteTensorFile(env, model_path, model_file));
  // The servers' own counters: what was applied, dropped as stale, refused.
  int64_t applied = 0, dropped_stale = 0, rejected = 0;
  int64_t final_staleness_count = 0;  // async: over every server's admitted pushes
  double final_staleness_sum = 0;
  // Each embedding table's rows and bytes (values and slots) over every server.
  struct TableTotals {
    int64_t rows = 0;
    int64_t bytes = 0;
    // With a memory budget: the disk tier's rows and moves.
    bool tiered = false;
    int64_t rows_on_disk = 0, disk_reads = 0, disk_writes = 0, disk_write_errors = 0;
  };
  std::map<std::string, TableTotals> tables;
  for (const EmbeddingTableConfig& tc : run.config.embedding_tables()) {
    tables[tc.name()].tiered = tc.memory_budget_bytes() > 0;
  }
  for (int s = 0; s < ps->num_servers(); ++s) {
    PsStatusResponse status;
    absl::Status st = ps->GetStatus(s, &status);
    if (!st.ok()) {
      LOG_WARN("{}", st);
      continue;
    }
    applied += status.pushes_applied();
    dropped_stale += status.gradients_dropped_stale();
    rejected += status.pushes_rejected();
    final_staleness_count += status.staleness_count();
    final_staleness_sum += status.staleness_sum();
    for (const TableStatus& t : status.tables()) {
      auto it = tables.find(t.name());
      if (it == tables.end()) continue;
      it->second.rows += t.rows();
      it->second.bytes += t.bytes();
      it->second.rows_on_disk += t.rows_on_disk();
      it->second.disk_reads += t.disk_reads();
      it->second.disk_writes += t.disk_writes();
      it->second.disk_write_errors += t.disk_write_errors();
    }
  }
  LOG_INFO("parameter servers: {} pushes applied, {} gradients dropped as stale, {} refused",
           applied, dropped_stale, rejected);
  nlohmann::json table_totals = nlohmann::json::object();
  for (const auto& [name, totals] : tables) {
    table_totals[name] = {{"rows", totals.rows}, {"bytes", totals.bytes}};
    if (totals.tiered) {
      table_totals[name]["rows_on_disk"] = totals.rows_on_disk;
      table_totals[name]["disk_reads"] = totals.disk_reads;
      table_totals[name]["disk_writes"] = totals.disk_writes;
      table_totals[name]["disk_write_errors"] = totals.disk_write_errors;
    }
  }
  ChiefStatusResponse progress;
  chief->GetStatus(&progress);
  // Where a worker's step went, per step on average over every worker's.
  auto per_step_ms = [&progress](double seconds) {
    return progress.local_steps() > 0 ? 1000.0 * seconds / progress.local_steps() : 0.0;
  };
  const bool evaluated = final_eval.result.count > 0;
  // A model the chief does not compute: the workers' latest evaluation.
  const std::optional<Chief::WorkerEval> worker_eval =
      evaluated ? std::nullopt : chief->latest_worker_eval();
  auto worker_metric = [&worker_eval](const char* name) {
    std::optional<double> v = worker_eval ? worker_eval->Get(name) : std::nullopt;
    return v ? nlohmann::json(*v) : nlohmann::json();
  };
  nlohmann::json worker_metrics = nlohmann::json::object();
  if (worker_eval) {
    for (const auto& [name, value] : worker_eval->metrics) worker_metrics[name] = value;
  }
  nlohmann::json summary = {
      {"global_step", final_eval.step},
      {"max_steps", RunsUntilStopped(run.config.max_steps())
                        ? nlohmann::json()  // until stopped
                        : nlohmann::json(run.config.max_steps())},
      // The chief's evaluation, else the workers' latest (its "accuracy"
      // and "loss"); null where nothing was evaluated.
      {"eval_accuracy",
       evaluated ? nlohmann::json(final_eval.result.accuracy()) : worker_metric("accuracy")},
      {"eval_loss", evaluated ? nlohmann::json(final_eval.result.loss) : worker_metric("loss")},
      {"eval_examples", worker_eval ? worker_eval->examples : final_eval.result.count},
      {"eval_step", evaluated ? nlohmann::json(final_eval.step)
                    : worker_eval ? nlohmann::json(worker_eval->step)
                                  : nlohmann::json()},
      // Every metric of a worker's evaluation, by name ({} without one),
      // and who ran it (null: the chief, or nobody).
      {"eval_metrics", worker_metrics},
      {"eval_worker", worker_eval ? nlohmann::json(worker_eval->worker) : nlohmann::json()},
      // (Or a worker's: progressive validation, a PyTorch worker's metrics.)
      {"eval_auc", final_eval.auc ? nlohmann::json(*final_eval.auc) : worker_metric("auc")},
      {"eval_log_loss",
       final_eval.auc ? nlohmann::json(final_eval.log_loss) : worker_metric("log_loss")},
      {"train_loss", progress.train_loss()},
      {"examples_per_sec", progress.examples_per_sec()},
      {"worker_steps", progress.local_steps()},
      {"step_time_ms",
       {{"pull", per_step_ms(progress.pull_seconds())},
        {"data", per_step_ms(progress.data_seconds())},
        {"compute", per_step_ms(progress.compute_seconds())},
        {"push", per_step_ms(progress.push_seconds())}}},
      {"train_seconds", train_seconds},
      {"mode", IsSyncMode(run.config) ? "sync" : "async"},
      // Async: the mean staleness of the pushes the servers admitted
      // (updates applied between a push's pull and its own), since they
      // started; null in sync mode.
      {"async_staleness_mean",
       final_staleness_count > 0
           ? nlohmann::json(final_staleness_sum / static_cast<double>(final_staleness_count))
           : nlohmann::json()},
      {"num_ps", run.cluster.num_ps()},
      {"num_workers", run.cluster.num_workers()},
      {"pushes_applied", applied},
      {"gradients_dropped_stale", dropped_stale},
      {"pushes_refused", rejected},
      {"embedding_tables", table_totals},
  };
  RETURN_IF_ERROR(WriteFileAtomically(env, JoinPath(run.config.output_dir(), "summary.json"),
                                      summary.dump(2) + "\n"));
  LOG_INFO("training finished at step {} in {:.1f}s: {}; model written to {}", final_eval.step,
           train_seconds,
           evaluated ? absl::StrFormat("eval accuracy %.4f, eval loss %.4f",
                                       final_eval.result.accuracy(), final_eval.result.loss)
           : worker_eval
               ? absl::StrCat("worker ", worker_eval->worker, "'s evaluation at step ",
                              worker_eval->step, ": ", worker_eval->MetricsLine())
               : absl::StrFormat("no held-out data to evaluate on, train loss %.4f",
                                 progress.train_loss()),
           model_path);
  return absl::OkStatus();
}

}  // namespace pstrain
