// `pstrain prometheus-config`: a Prometheus configuration that scrapes every
// task of a cluster spec whose "pstrain": {"metrics": ...} extras name where
// it serves /metrics. One scrape job; honor_labels keeps pstrain's own `job`
// and `task` labels on every series (Prometheus would otherwise rename them
// exported_job and exported_task), and each target carries `pstrain_task`
// ("ps:1") so that `up` says which task a failed scrape was. In a cluster
// with mutual TLS it scrapes over HTTPS with the scraper's certificate
// (monitor.crt), checking each task's certificate for kMetricsAltName.
#ifndef PSTRAIN_TOOLS_PROMETHEUS_CONFIG_H_
#define PSTRAIN_TOOLS_PROMETHEUS_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/cluster/cluster_spec.h"

namespace pstrain {

struct PrometheusConfigOptions {
  std::string job_name = "pstrain";
  std::string scrape_interval = "5s";  // a Prometheus duration: 500ms, 5s, 1m
  // With mutual TLS (the spec's "pstrain": {"tls": ...}): the directory
  // where Prometheus reads ca.crt, monitor.crt and monitor.key; empty: the
  // spec's TLS directory.
  std::string tls_dir;
};

// The YAML (a whole prometheus.yml). INVALID_ARGUMENT when the spec names no
// metrics address, or names a wildcard host (0.0.0.0, ::) no scraper can
// reach, or an option is malformed. Tasks without an address are listed in
// a comment.
absl::StatusOr<std::string> RenderPrometheusConfig(const ClusterSpec& spec,
                                                   const PrometheusConfigOptions& options);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_PROMETHEUS_CONFIG_H_
