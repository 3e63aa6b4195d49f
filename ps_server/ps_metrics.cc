#include "ps_server/ps_metrics.h"

#include <string>
#include <utility>
#include <vector>

#include "common/observability/monitoring.h"

namespace pstrain {
namespace {

using prometheus::MetricType;

class PsCollector : public prometheus::Collectable {
 public:
  PsCollector(ParameterServer* ps, const PsServiceImpl* service) : ps_(ps), service_(service) {}

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
    const ParameterServer::Counters counters = ps_->counters();
    prometheus::MetricFamily rejected = Family(
        "pstrain_ps_pushes_rejected_total",
        "Pushes (dense and rows) refused, by reason: incarnation (another run), worker (index "
        "out of range), shape (unknown variable or table; wrong shape, dtype or length), "
        "non_finite, ahead (a step not reached), duplicate, out_of_range (an id outside a "
        "fixed-size table), size (too many ids), malformed, superseded (from a worker process "
        "since restarted).",
        MetricType::Counter);
    for (int r = 0; r < ParameterServer::kNumRejections; ++r) {
      AddMetric(&rejected,
                {{"reason",
                  ParameterServer::RejectionName(static_cast<ParameterServer::Rejection>(r))}},
                static_cast<double>(counters.rejected[static_cast<size_t>(r)]));
    }
    out.push_back(std::move(rejected));
    one("pstrain_ps_pulls_total", "Pulls served.", MetricType::Counter,
        static_cast<double>(s.pulls()));
    one("pstrain_ps_data_calls",
        "Data calls (Pull, Push, PullRows, PushRows) being served now, waiting pulls included.",
        MetricType::Gauge, service_->data_calls());
    one("pstrain_ps_max_data_calls",
        "The most data calls served at once (--max_concurrent_calls); more are refused.",
        MetricType::Gauge, service_->max_calls());
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
    AddSingle(&out, "pstrain_ps_held_pushes_expired_total",
              "Async pushes sent in parts dropped with parts missing at the worker's push "
              "deadline (a worker that died or gave up mid-push).",
              MetricType::Counter, static_cast<double>(s.held_pushes_expired()));
    if (s.tables_size() > 0) {
      prometheus::MetricFamily rows =
          Family("pstrain_embedding_rows", "Embedding rows held on this server.", MetricType::Gauge);
      prometheus::MetricFamily bytes = Family(
          "pstrain_embedding_bytes", "Bytes of embedding rows and their optimizer slots.",
          MetricType::Gauge);
      prometheus::MetricFamily on_disk = Family(
          "pstrain_embedding_rows_on_disk",
          "Embedding rows in the disk tier (of pstrain_embedding_rows): past the table's "
          "memory_budget_bytes.",
          MetricType::Gauge);
      prometheus::MetricFamily disk_bytes = Family(
          "pstrain_embedding_disk_bytes", "Bytes of the table's disk tier files.",
          MetricType::Gauge);
      prometheus::MetricFamily moves = Family(
          "pstrain_embedding_disk_rows_total",
          "Rows moved between memory and the disk tier: direction=\"in\" read back for use, "
          "\"out\" written out past the memory budget, \"refused\" a write the disk refused "
          "(the row stays in memory).",
          MetricType::Counter);
      prometheus::MetricFamily failed = Family(
          "pstrain_embedding_table_failed",
          "1 when the table's disk tier could not give a row back: the server must restart "
          "from a checkpoint.",
          MetricType::Gauge);
      for (const TableStatus& t : s.tables()) {
        AddMetric(&rows, {{"table", t.name()}}, static_cast<double>(t.rows()));
        AddMetric(&bytes, {{"table", t.name()}}, static_cast<double>(t.bytes()));
        AddMetric(&on_disk, {{"table", t.name()}}, static_cast<double>(t.rows_on_disk()));
        AddMetric(&disk_bytes, {{"table", t.name()}}, static_cast<double>(t.disk_bytes()));
        AddMetric(&moves, {{"table", t.name()}, {"direction", "in"}},
                  static_cast<double>(t.disk_reads()));
        AddMetric(&moves, {{"table", t.name()}, {"direction", "out"}},
                  static_cast<double>(t.disk_writes()));
        AddMetric(&moves, {{"table", t.name()}, {"direction", "refused"}},
                  static_cast<double>(t.disk_write_errors()));
        AddMetric(&failed, {{"table", t.name()}}, t.failure().empty() ? 0 : 1);
      }
      out.push_back(std::move(rows));
      out.push_back(std::move(bytes));
      out.push_back(std::move(on_disk));
      out.push_back(std::move(disk_bytes));
      out.push_back(std::move(moves));
      out.push_back(std::move(failed));
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
    const std::vector<ParameterServer::PartitionStats> parts = ps_->partition_stats();
    if (!parts.empty()) {
      prometheus::MetricFamily pushes =
          Family("pstrain_ps_partition_pushes_total",
                 "Gradients for this variable partition that were applied or staged for a step.",
                 MetricType::Counter);
      prometheus::MetricFamily pulls = Family("pstrain_ps_partition_pulls_total",
                                              "Pulls that carried this variable partition.",
                                              MetricType::Counter);
      prometheus::MetricFamily bytes =
          Family("pstrain_ps_partition_bytes_total",
                 "Payload bytes of this variable partition received in pushes and sent in pulls.",
                 MetricType::Counter);
      prometheus::MetricFamily apply =
          Family("pstrain_ps_partition_apply_seconds_total",
                 "Time the optimizer spent updating this variable partition.", MetricType::Counter);
      for (const ParameterServer::PartitionStats& p : parts) {
        const std::string part = std::to_string(p.partition);
        AddMetric(&pushes, {{"variable", p.variable}, {"partition", part}},
                  static_cast<double>(p.pushes));
        AddMetric(&pulls, {{"variable", p.variable}, {"partition", part}},
                  static_cast<double>(p.pulls));
        AddMetric(&bytes, {{"variable", p.variable}, {"partition", part}, {"direction", "push"}},
                  static_cast<double>(p.push_bytes));
        AddMetric(&bytes, {{"variable", p.variable}, {"partition", part}, {"direction", "pull"}},
                  static_cast<double>(p.pull_bytes));
        AddMetric(&apply, {{"variable", p.variable}, {"partition", part}}, p.apply_seconds);
      }
      out.push_back(std::move(pushes));
      out.push_back(std::move(pulls));
      out.push_back(std::move(bytes));
      out.push_back(std::move(apply));
    }
    auto histogram = [&out](const char* name, const char* help, const Histogram& h) {
      prometheus::MetricFamily f = Family(name, help, MetricType::Histogram);
      AddHistogram(&f, {}, h.Read());
      out.push_back(std::move(f));
    };
    histogram("pstrain_ps_apply_seconds",
              "Time of each optimizer update of one partition (sync: of a step's mean gradient).",
              ps_->apply_seconds());
    histogram("pstrain_sync_quorum_wait_seconds",
              "Sync: from a step's first gradient on this server to the step's completion, "
              "the time the quorum kept the earliest worker waiting.",
              ps_->quorum_wait_seconds());
    histogram("pstrain_async_staleness",
              "Async: each admitted push's staleness, the updates applied since the version its "
              "gradient was computed from.",
              ps_->staleness());
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
  const PsServiceImpl* const service_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> PsMetrics(ParameterServer* ps,
                                                   const PsServiceImpl* service) {
  return std::make_shared<PsCollector>(ps, service);
}

}  // namespace pstrain
