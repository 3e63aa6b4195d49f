#include "tools/prometheus_config.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/security/tls.h"

namespace pstrain {
namespace {

// A Prometheus duration: one or more number-unit pairs, the units in the
// order y, w, d, h, m, s, ms, each at most once ("1m30s", "500ms"), and not
// zero in all.
bool IsDuration(const std::string& d) {
  static const char* const kUnits[] = {"y", "w", "d", "h", "m", "s", "ms"};
  size_t at = 0;
  int next_unit = 0;  // units must come in kUnits order
  bool nonzero = false;
  while (at < d.size()) {
    size_t digits = 0;
    while (at + digits < d.size() &&
           absl::ascii_isdigit(static_cast<unsigned char>(d[at + digits]))) {
      ++digits;
    }
    if (digits == 0 || digits > 9) return false;
    nonzero = nonzero || d.substr(at, digits).find_first_not_of('0') != std::string::npos;
    at += digits;
    // The longest unit that matches here ("ms" before "m").
    int unit = -1;
    for (int u = next_unit; u < 7; ++u) {
      const std::string name = kUnits[u];
      if (d.compare(at, name.size(), name) == 0 &&
          (unit < 0 || name.size() > std::string(kUnits[unit]).size())) {
        unit = u;
      }
    }
    if (unit < 0) return false;
    at += std::string(kUnits[unit]).size();
    next_unit = unit + 1;
  }
  return nonzero;
}

bool IsScrapeJobName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> RenderPrometheusConfig(const ClusterSpec& spec,
                                                   const PrometheusConfigOptions& options) {
  if (!IsDuration(options.scrape_interval)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--scrape_interval \"", options.scrape_interval,
                     "\": expected a Prometheus duration such as 500ms, 5s, 1m30s or 1d"));
  }
  if (!IsScrapeJobName(options.job_name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--job_name \"", options.job_name, "\": expected 1-64 letters, digits, _ or -"));
  }
  std::vector<std::string> targets, missing;
  for (const TaskId& id : spec.AllTasks()) {
    const std::string address = spec.metrics_address(id.job, id.index);
    if (address.empty()) {
      missing.push_back(id.ToString());
      continue;
    }
    const HostPort hp = *ParseHostPort(address);  // validated by the spec's parser
    if (hp.host == "0.0.0.0" || hp.host == "::") {
      return absl::InvalidArgumentError(
          absl::StrCat(spec.source(), ": ", id.ToString(), "'s metrics address ", address,
                       " is a wildcard, not one a scraper can reach: name the task's host"));
    }
    targets.push_back(absl::StrCat("      - targets: [\"", address, "\"]\n",
                                   "        labels: {pstrain_task: \"", id.ToString(), "\"}\n"));
  }
  if (targets.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.source(),
                     " names no metrics address: add \"pstrain\": {\"metrics\": {\"chief\": "
                     "[\"HOST:PORT\"], \"ps\": [...], \"worker\": [...]}}, one address per task"));
  }
  std::string out = absl::StrCat(
      "# Prometheus configuration for the pstrain cluster in ", spec.source(), "\n",
      "# (pstrain prometheus-config). Run: prometheus --config.file=THIS_FILE\n");
  if (!missing.empty()) {
    absl::StrAppend(&out, "# Not scraped (the spec names no metrics address): ",
                    absl::StrJoin(missing, ", "), "\n");
  }
  absl::StrAppend(&out, "global:\n  scrape_interval: ", options.scrape_interval,
                  "\n  evaluation_interval: ", options.scrape_interval,
                  "\nscrape_configs:\n  - job_name: ", options.job_name,
                  "\n    honor_labels: true\n    metrics_path: /metrics\n");
  const std::string& tls_dir = options.tls_dir.empty() ? spec.tls_dir() : options.tls_dir;
  if (!spec.tls_dir().empty()) {
    if (tls_dir.find_first_of("\"\\") != std::string::npos ||
        std::any_of(tls_dir.begin(), tls_dir.end(),
                    [](char c) { return static_cast<unsigned char>(c) < 0x20; })) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TLS directory \"", absl::CHexEscape(tls_dir),
          "\": quotes, backslashes and control characters cannot go into the YAML as they are"));
    }
    // Every task's certificate names kMetricsAltName (pstrain certs), so one
    // server_name checks them all, whatever their hosts.
    const TlsFiles files = TlsFilesIn(tls_dir, kMonitorIdentity);
    absl::StrAppend(&out, "    scheme: https\n    tls_config:\n      ca_file: \"", files.ca_file,
                    "\"\n      cert_file: \"", files.cert_file, "\"\n      key_file: \"",
                    files.key_file, "\"\n      server_name: ", kMetricsAltName, "\n");
  }
  absl::StrAppend(&out, "    static_configs:\n");
  for (const std::string& t : targets) out += t;
  return out;
}

}  // namespace pstrain
