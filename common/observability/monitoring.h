// The monitoring endpoint every daemon can serve on a port of its own:
//   GET /metrics   Prometheus text exposition (format 0.0.4) of a registry
//   GET /healthz   200 "ok" while the process runs
//   GET /readyz    200 "ready", or 503 with the reason it is not ready yet
// A small HTTP/1.0 server on one thread: one request per connection, the
// TLS handshake and the headers bounded (8 KiB) and read with a deadline
// (2 s), every connection served a step at a time as its socket is ready
// (poll), so a slow or hostile client holds only its own connection and
// never touches the training path; at kMaxClients open at once, the oldest
// is closed for a new one. In a cluster with mutual TLS it serves HTTPS with the
// task's certificate, and /metrics only to a client that shows a
// certificate of the cluster CA (Prometheus with monitor.crt); the probes
// (/healthz, /readyz) answer without one, as Kubernetes' HTTPS probes send
// none. Metrics are
// gathered at scrape time by the collectables (prometheus::Collectable: a
// prometheus::Registry, or a daemon's own that reads its counters), so
// nothing on the training path pays for them.
#ifndef PSTRAIN_COMMON_OBSERVABILITY_MONITORING_H_
#define PSTRAIN_COMMON_OBSERVABILITY_MONITORING_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <vector>

#include "absl/status/statusor.h"
#include "common/security/auth.h"
#include "common/rpc/rpc_stats.h"
#include "common/security/tls.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace pstrain {

class MonitoringServer {
 public:
  // Ready: empty when ready, else why not (the body of a 503).
  using ReadyFn = std::function<std::string()>;

  using Labels = std::vector<std::pair<std::string, std::string>>;

  // Listens on `address` ("host:port"; port 0 picks a free one) and serves
  // until destroyed. `labels` (e.g. job and task) go on every metric. With
  // `tls` it serves HTTPS (see above), with renewed certificates as its
  // watcher takes them.
  static absl::StatusOr<std::unique_ptr<MonitoringServer>> Start(
      const std::string& address,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables, ReadyFn ready,
      Labels labels = {}, std::shared_ptr<const TlsConfig> tls = nullptr);
  ~MonitoringServer();

  int port() const { return port_; }
  // "http://host:port/metrics", or https.
  std::string url() const;

  // The response to one request line's path (for tests): status code and
  // body. `certified`: the client showed a certificate of the cluster CA, or
  // the endpoint is plain HTTP (where /metrics needs none).
  struct Response {
    int status = 200;
    std::string content_type;
    std::string body;
  };
  Response Handle(const std::string& path, bool certified) const;

  // Connections served at once; one more closes the oldest.
  static constexpr size_t kMaxClients = 64;

 private:
  struct Client;
  MonitoringServer() = default;
  void Serve();
  void Accept(std::vector<std::unique_ptr<Client>>* clients);
  bool StartTls(Client* c);
  // Takes `c` as far as its socket allows now.
  void Advance(Client* c);
  // `c`'s phase ran out of time.
  void Expire(Client* c);
  // Makes the response to `c`'s request (as far as it came).
  void Respond(Client* c);

  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  ReadyFn ready_;
  Labels labels_;
  std::shared_ptr<const TlsConfig> tls_;  // null: plain HTTP
  // The serving thread's HTTPS context, made from https_source_ (tls_, or
  // what its watcher took last).
  std::shared_ptr<ssl_ctx_st> https_;
  std::shared_ptr<const TlsConfig> https_source_;
  std::string host_;
  int listen_fd_ = -1;
  int port_ = 0;
  // Refused over HTTPS: handshakes that failed (plaintext, a certificate of
  // another CA, too slow) and /metrics asked without a client certificate.
  std::atomic<int64_t> failed_handshakes_{0};
  std::atomic<int64_t> shed_{0};  // connections closed to make room
  mutable std::atomic<int64_t> uncertified_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// The standard process metrics, read from /proc at scrape time:
// process_cpu_seconds_total, process_resident_memory_bytes,
// process_open_fds, process_threads, process_start_time_seconds.
std::shared_ptr<prometheus::Collectable> ProcessMetrics();

// pstrain_rpc_refused_total{reason="unauthenticated"|"permission_denied"}:
// calls `auth` refused (common/security/auth.h). `auth` must outlive the collectable.
std::shared_ptr<prometheus::Collectable> RefusalMetrics(const Authorizer* auth);

// The RPCs this process served (common/rpc/rpc_stats.h), by service, method
// and status code:
//   pstrain_rpc_server_handled_total{service,method,code}
//   pstrain_rpc_server_handling_seconds{service,method} (histogram)
//   pstrain_rpc_server_received_bytes_total / _sent_bytes_total{service,method}
std::shared_ptr<prometheus::Collectable> RpcMetrics();

// Building blocks for collectables: a family of one type, and one metric of
// it with labels and a value (counter, gauge or untyped).
prometheus::MetricFamily Family(const std::string& name, const std::string& help,
                                prometheus::MetricType type);
void AddMetric(prometheus::MetricFamily* family,
               std::vector<std::pair<std::string, std::string>> labels, double value);
// One histogram metric (family->type must be Histogram).
void AddHistogram(prometheus::MetricFamily* family,
                  std::vector<std::pair<std::string, std::string>> labels,
                  const Histogram::Snapshot& histogram);
// Appends a family holding one metric without labels.
void AddSingle(std::vector<prometheus::MetricFamily>* out, const std::string& name,
               const std::string& help, prometheus::MetricType type, double value);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_OBSERVABILITY_MONITORING_H_
