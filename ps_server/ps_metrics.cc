#include "ps_server/ps_metrics.h"

#include <string>
#include <utility>
#include <vector>

#include "common/monitoring.h"

namespace pstrain {
namespace {

using prometheus::MetricType;

class PsCollector : public prometheus::Collectable {
 public:
  explicit PsCollector(ParameterServer* ps) : ps_(ps) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    PsStatusResponse s;
    ps_->GetStatus(&s);
    const ParameterServer::CheckpointStats c = ps_->checkpoint_stats();
    std::vector<prometheus::MetricFamily> out;
    auto one = [&out](const char* name, const char* help, MetricType type, double value) {
      AddSingle(&out, name, help, type, value);
    };
    one("pstrain_ps_initialized", "1 once the chief has installed the model.", MetricType::Gauge,
        s.initialized() ? 1 : 0);
    one("pstrain_ps_version", "Updates applied (sync: the step; async: the pushes).",
        MetricType::Gauge, static_cast<double>(s.version()));
    one("pstrain_ps_pushes_applied_total", "Worker pushes whose gradients reached the model.",
        MetricType::Counter, static_cast<double>(s.pushes_applied()));
    one("pstrain_ps_gradients_dropped_stale_total",
        "Sync gradients that arrived after their step (backup workers).", MetricType::Counter,
        static_cast<double>(s.gradients_dropped_stale()));
    one("pstrain_ps_pushes_rejected_total",
        "Pushes refused (bad shape, non-finite, wrong incarnation, ...).", MetricType::Counter,
        static_cast<double>(s.pushes_rejected()));
    one("pstrain_ps_pulls_total", "Pulls served.", MetricType::Counter,
        static_cast<double>(s.pulls()));
    prometheus::MetricFamily payload =
        Family("pstrain_ps_payload_bytes_total",
               "Tensor payload bytes received in pushes and sent in pulls.", MetricType::Counter);
    AddMetric(&payload, {{"direction", "push"}}, static_cast<double>(s.push_payload_bytes()));
    AddMetric(&payload, {{"direction", "pull"}}, static_cast<double>(s.pull_payload_bytes()));
    out.push_back(std::move(payload));
    prometheus::MetricFamily copied =
        Family("pstrain_ps_copied_bytes_total",
               "Bytes this server copied in user space to move the payload.", MetricType::Counter);
    AddMetric(&copied, {{"direction", "push"}}, static_cast<double>(s.push_copied_bytes()));
    AddMetric(&copied, {{"direction", "pull"}}, static_cast<double>(s.pull_copied_bytes()));
    out.push_back(std::move(copied));
    if (s.tables_size() > 0) {
      prometheus::MetricFamily rows =
          Family("pstrain_embedding_rows", "Embedding rows held on this server.", MetricType::Gauge);
      prometheus::MetricFamily bytes = Family(
          "pstrain_embedding_bytes", "Bytes of embedding rows and their optimizer slots.",
          MetricType::Gauge);
      for (const TableStatus& t : s.tables()) {
        AddMetric(&rows, {{"table", t.name()}}, static_cast<double>(t.rows()));
        AddMetric(&bytes, {{"table", t.name()}}, static_cast<double>(t.bytes()));
      }
      out.push_back(std::move(rows));
      out.push_back(std::move(bytes));
    }
    const std::vector<bool> waiting = ps_->SyncWaitingOn();
    if (!waiting.empty()) {
      prometheus::MetricFamily f = Family(
          "pstrain_sync_waiting_on",
          "1 for each worker whose gradient the open sync step still waits for on this server.",
          MetricType::Gauge);
      for (size_t w = 0; w < waiting.size(); ++w) {
        AddMetric(&f, {{"worker", std::to_string(w)}}, waiting[w] ? 1 : 0);
      }
      out.push_back(std::move(f));
    }
    one("pstrain_checkpoint_shards_written_total", "Checkpoint shards this server wrote.",
        MetricType::Counter, static_cast<double>(c.written));
    one("pstrain_checkpoint_shard_failures_total", "Checkpoint shards that failed to write.",
        MetricType::Counter, static_cast<double>(c.failed));
    one("pstrain_checkpoint_last_shard_bytes", "Size of the last shard written.",
        MetricType::Gauge, static_cast<double>(c.bytes));
    one("pstrain_checkpoint_last_write_seconds", "Time the last shard took to write.",
        MetricType::Gauge, c.seconds);
    one("pstrain_checkpoint_last_pause_seconds",
        "How long taking the last shard's snapshot paused training on this server.",
        MetricType::Gauge, c.pause_seconds);
    one("pstrain_checkpoint_last_shard_success_timestamp_seconds",
        "When the last shard was written, since the Unix epoch (0: never).", MetricType::Gauge,
        c.last_success_unix);
    return out;
  }

 private:
  ParameterServer* const ps_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> PsMetrics(ParameterServer* ps) {
  return std::make_shared<PsCollector>(ps);
}

}  // namespace pstrain
