#include "worker/worker_metrics.h"

#include <utility>
#include <vector>

#include "common/observability/monitoring.h"

namespace pstrain {
namespace {

using prometheus::MetricType;

class WorkerCollector : public prometheus::Collectable {
 public:
  explicit WorkerCollector(const WorkerStats* stats) : stats_(stats) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const WorkerStats& s = *stats_;
    std::vector<prometheus::MetricFamily> out;
    auto one = [&out](const char* name, const char* help, MetricType type, double value) {
      AddSingle(&out, name, help, type, value);
    };
    one("pstrain_worker_registered", "1 once the worker has registered with the chief.",
        MetricType::Gauge, s.registered ? 1 : 0);
    one("pstrain_worker_steps_total", "Steps this worker computed and pushed.",
        MetricType::Counter, static_cast<double>(s.steps.load()));
    const double examples = static_cast<double>(s.examples.load());
    one("pstrain_worker_examples_total", "Training examples this worker consumed.",
        MetricType::Counter, examples);
    const double pull = s.pull_ns.load() / 1e9, data = s.data_ns.load() / 1e9,
                 compute = s.compute_ns.load() / 1e9, push = s.push_ns.load() / 1e9;
    const double busy = pull + data + compute + push;
    one("pstrain_worker_examples_per_second",
        "Examples per second over the time spent in steps so far.", MetricType::Gauge,
        busy > 0 ? examples / busy : 0);
    one("pstrain_worker_gradients_dropped_stale_total",
        "Sync gradients the servers dropped as stale (backup workers).", MetricType::Counter,
        static_cast<double>(s.gradients_dropped_stale.load()));
    prometheus::MetricFamily phases =
        Family("pstrain_worker_step_seconds_total",
               "Time spent in each phase of a step: pull (parameters), data (waiting for the "
               "next batch), compute (forward, backward, embedding rows), push (gradients).",
               MetricType::Counter);
    AddMetric(&phases, {{"phase", "pull"}}, pull);
    AddMetric(&phases, {{"phase", "data"}}, data);
    AddMetric(&phases, {{"phase", "compute"}}, compute);
    AddMetric(&phases, {{"phase", "push"}}, push);
    out.push_back(std::move(phases));
    if (const int64_t total = s.device_memory_total.load(); total > 0) {
      one("pstrain_worker_device_memory_used_bytes",
          "GPU memory in use on this worker's device (all processes), as of the last report.",
          MetricType::Gauge, static_cast<double>(s.device_memory_used.load()));
      one("pstrain_worker_device_memory_total_bytes", "Memory of this worker's GPU.",
          MetricType::Gauge, static_cast<double>(total));
    }
    return out;
  }

 private:
  const WorkerStats* const stats_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> WorkerMetrics(const WorkerStats* stats) {
  return std::make_shared<WorkerCollector>(stats);
}

}  // namespace pstrain
