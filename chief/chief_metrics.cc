#include "chief/chief_metrics.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster/config.h"
#include "common/observability/monitoring.h"

namespace pstrain {
namespace {

using prometheus::MetricType;

class ChiefCollector : public prometheus::Collectable {
 public:
  explicit ChiefCollector(Chief* chief) : chief_(chief) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    ChiefStatusResponse s;
    chief_->GetStatus(&s);
    const Chief::CheckpointStats c = chief_->checkpoint_stats();
    std::vector<prometheus::MetricFamily> out;
    auto one = [&out](const char* name, const char* help, MetricType type, double value) {
      AddSingle(&out, name, help, type, value);
    };
    one("pstrain_chief_global_step",
        "The global step: what the workers reported, as far as the servers confirm it.", MetricType::Gauge,
        static_cast<double>(s.global_step()));
    one("pstrain_chief_max_steps", "The step training ends at (0: until stopped).",
        MetricType::Gauge,
        RunsUntilStopped(s.max_steps()) ? 0.0 : static_cast<double>(s.max_steps()));
    one("pstrain_chief_workers_registered", "Workers registered with the chief.",
        MetricType::Gauge, s.workers_registered());
    one("pstrain_chief_workers_done", "Workers that reported they are done.", MetricType::Gauge,
        s.workers_done());
    one("pstrain_chief_examples_per_second", "Training examples per second, all workers.",
        MetricType::Gauge, s.examples_per_sec());
    one("pstrain_chief_worker_steps_total", "Steps all workers have reported.",
        MetricType::Counter, static_cast<double>(s.local_steps()));
    prometheus::MetricFamily phases = Family(
        "pstrain_chief_worker_step_seconds_total",
        "Time all workers spent in each phase of their steps, as reported: pull, data, compute, "
        "push (divided by pstrain_chief_worker_steps_total: the mean step's split).",
        MetricType::Counter);
    AddMetric(&phases, {{"phase", "pull"}}, s.pull_seconds());
    AddMetric(&phases, {{"phase", "data"}}, s.data_seconds());
    AddMetric(&phases, {{"phase", "compute"}}, s.compute_seconds());
    AddMetric(&phases, {{"phase", "push"}}, s.push_seconds());
    out.push_back(std::move(phases));
    one("pstrain_chief_train_loss", "Mean training loss of the workers' latest reports.",
        MetricType::Gauge, s.train_loss());
    one("pstrain_chief_seconds_since_progress", "Time since the global step last moved.",
        MetricType::Gauge, absl::ToDoubleSeconds(absl::Now() - chief_->last_progress()));
    if (s.eval_step() >= 0) {
      one("pstrain_chief_eval_step", "The step of the latest evaluation.", MetricType::Gauge,
          static_cast<double>(s.eval_step()));
      // A worker's evaluation has them only where it named them.
      auto reported = [&s](const std::string& name) {
        if (s.eval_metrics_size() == 0) return true;  // the chief's own
        for (const EvalMetric& m : s.eval_metrics()) {
          if (m.name() == name) return true;
        }
        return false;
      };
      if (reported("accuracy")) {
        one("pstrain_chief_eval_accuracy", "Held-out accuracy at the latest evaluation.",
            MetricType::Gauge, s.eval_accuracy());
      }
      if (reported("loss")) {
        one("pstrain_chief_eval_loss", "Held-out loss at the latest evaluation.",
            MetricType::Gauge, s.eval_loss());
      }
    }
    if (s.eval_metrics_size() > 0) {
      prometheus::MetricFamily reported =
          Family("pstrain_chief_eval_metric",
                 "Each metric of the latest evaluation a worker reported (a model the chief does "
                 "not compute), by name; its step is pstrain_chief_eval_step.",
                 MetricType::Gauge);
      for (const EvalMetric& m : s.eval_metrics()) {
        AddMetric(&reported, {{"name", m.name()}, {"worker", std::to_string(s.eval_worker())}},
                  m.value());
      }
      out.push_back(std::move(reported));
    }
    one("pstrain_chief_rollbacks_total",
        "Rollbacks of the running job to a checkpoint: a restarted parameter server's, or an "
        "operator's restore.",
        MetricType::Counter, s.rollbacks());
    one("pstrain_chief_rolled_back_to_step", "The step of the latest rollback (-1: none).",
        MetricType::Gauge, static_cast<double>(s.rolled_back_to()));
    one("pstrain_checkpoints_committed_total", "Checkpoints committed (manifest written).",
        MetricType::Counter, static_cast<double>(c.committed));
    one("pstrain_checkpoint_failures_total", "Checkpoints that failed to commit.",
        MetricType::Counter, static_cast<double>(c.failed));
    one("pstrain_checkpoint_last_step", "The step of the last committed checkpoint (-1: none).",
        MetricType::Gauge, static_cast<double>(c.last_step));
    one("pstrain_checkpoint_last_bytes", "Bytes of the last committed checkpoint.",
        MetricType::Gauge, static_cast<double>(c.last_bytes));
    one("pstrain_checkpoint_last_duration_seconds",
        "From asking for the last checkpoint's shards to its pointer file.", MetricType::Gauge,
        c.last_seconds);
    one("pstrain_checkpoint_last_success_timestamp_seconds",
        "When the last checkpoint was committed, since the Unix epoch (0: never).",
        MetricType::Gauge, c.last_success_unix);
    return out;
  }

 private:
  Chief* const chief_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> ChiefMetrics(Chief* chief) {
  return std::make_shared<ChiefCollector>(chief);
}

std::string ChiefNotReady(Chief* chief, int num_workers) {
  ChiefStatusResponse s;
  chief->GetStatus(&s);
  if (s.state() == "starting") return "initialising the parameter servers";
  if (s.state() == "taking over") return "taking the running job over from its latest checkpoint";
  if (s.workers_registered() < num_workers) {
    return absl::StrCat(s.workers_registered(), " of ", num_workers, " workers registered");
  }
  return "";
}

}  // namespace pstrain
