#include "tools/prometheus_config.h"

#include <string>
#include <vector>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

ClusterSpec Spec(const std::string& metrics) {
  auto spec = ClusterSpec::Parse(
      R"({"chief": ["10.0.0.1:2220"], "ps": ["10.0.0.2:2221"], "worker": ["10.0.0.3:2222"],
          "pstrain": {"insecure": true, "metrics": )" + metrics + "}}",
      "spec.json");
  REQUIRE(spec.ok());
  return *spec;
}

std::string ErrorOf(const absl::StatusOr<std::string>& r) {
  REQUIRE_FALSE(r.ok());
  CHECK(absl::IsInvalidArgument(r.status()));
  return std::string(r.status().message());
}

TEST_CASE("one scrape job lists every task the spec gives a metrics address", "[prometheus]") {
  PrometheusConfigOptions o;
  o.scrape_interval = "2s";
  auto yaml = RenderPrometheusConfig(
      Spec(R"({"chief": ["10.0.0.1:9100"], "ps": ["10.0.0.2:9100"]})"), o);
  REQUIRE(yaml.ok());
  CHECK(yaml->find("  scrape_interval: 2s\n") != std::string::npos);
  CHECK(yaml->find("  - job_name: pstrain\n    honor_labels: true\n") != std::string::npos);
  CHECK(yaml->find("      - targets: [\"10.0.0.1:9100\"]\n"
                   "        labels: {pstrain_task: \"chief:0\"}\n"
                   "      - targets: [\"10.0.0.2:9100\"]\n"
                   "        labels: {pstrain_task: \"ps:0\"}\n") != std::string::npos);
  // The worker has no address: said in a comment, not scraped.
  CHECK(yaml->find("# Not scraped (the spec names no metrics address): worker:0\n") !=
        std::string::npos);
  CHECK(yaml->find("10.0.0.3") == std::string::npos);
}

TEST_CASE("with mutual TLS the scrape job uses HTTPS and the scraper's certificate",
          "[prometheus][tls]") {
  auto spec = ClusterSpec::Parse(
      R"({"chief": ["10.0.0.1:2220"], "ps": ["10.0.0.2:2221"], "worker": ["10.0.0.3:2222"],
          "pstrain": {"tls": {"dir": "/etc/pstrain/tls"},
                      "metrics": {"chief": ["10.0.0.1:9100"]}}})",
      "spec.json");
  REQUIRE(spec.ok());
  PrometheusConfigOptions o;
  auto yaml = RenderPrometheusConfig(*spec, o);
  REQUIRE(yaml.ok());
  CHECK(yaml->find("    metrics_path: /metrics\n"
                   "    scheme: https\n"
                   "    tls_config:\n"
                   "      ca_file: \"/etc/pstrain/tls/ca.crt\"\n"
                   "      cert_file: \"/etc/pstrain/tls/monitor.crt\"\n"
                   "      key_file: \"/etc/pstrain/tls/monitor.key\"\n"
                   "      server_name: metrics.pstrain\n"
                   "    static_configs:\n") != std::string::npos);
  o.tls_dir = "/srv/prometheus/pstrain";  // where the scraper keeps them
  yaml = RenderPrometheusConfig(*spec, o);
  REQUIRE(yaml.ok());
  CHECK(yaml->find("cert_file: \"/srv/prometheus/pstrain/monitor.crt\"") != std::string::npos);
  // A path that would break out of its YAML string is refused.
  o.tls_dir = "/srv/a\"b";
  CHECK(ErrorOf(RenderPrometheusConfig(*spec, o)).find("quotes") != std::string::npos);
  // Without TLS: plain HTTP, as before.
  yaml = RenderPrometheusConfig(Spec(R"({"chief": ["10.0.0.1:9100"]})"), o);
  REQUIRE(yaml.ok());
  CHECK(yaml->find("scheme") == std::string::npos);
  CHECK(yaml->find("tls_config") == std::string::npos);
}

TEST_CASE("prometheus-config refuses what Prometheus could not use", "[prometheus]") {
  PrometheusConfigOptions o;
  auto no_metrics = ClusterSpec::Parse(
      R"({"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"], "worker": ["127.0.0.1:3"]})", "s.json");
  REQUIRE(no_metrics.ok());
  CHECK(ErrorOf(RenderPrometheusConfig(*no_metrics, o)).find("s.json names no metrics address") !=
        std::string::npos);
  CHECK(ErrorOf(RenderPrometheusConfig(Spec(R"({"ps": ["0.0.0.0:9100"]})"), o))
            .find("ps:0's metrics address 0.0.0.0:9100 is a wildcard") != std::string::npos);
  const ClusterSpec good = Spec(R"({"ps": ["10.0.0.2:9100"]})");
  for (const char* interval :
       {"", "5", "0s", "5 s", "-1s", "s", "10000000000s", "1s1m", "1m1m", "1x", "0m0s"}) {
    o.scrape_interval = interval;
    INFO(interval);
    CHECK(ErrorOf(RenderPrometheusConfig(good, o)).find("--scrape_interval") != std::string::npos);
  }
  for (const char* interval : {"500ms", "5s", "1m30s", "1d", "2w", "1h0m", "1y2w3d4h5m6s7ms"}) {
    o.scrape_interval = interval;
    INFO(interval);
    CHECK(RenderPrometheusConfig(good, o).ok());
  }
  for (const std::string& name : std::vector<std::string>{"", "a b", "x:y", "\"q\"",
                                                           std::string(65, 'j')}) {
    o.job_name = name;
    INFO(name);
    CHECK(ErrorOf(RenderPrometheusConfig(good, o)).find("--job_name") != std::string::npos);
  }
}

}  // namespace
}  // namespace pstrain
