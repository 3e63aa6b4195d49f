#include "tools/prometheus_config.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pstrain {
namespace {

// Prometheus' duration: digits and a unit (ms, s, m, h), at least 1 ms.
bool IsDuration(const std::string& d) {
  size_t digits = 0;
  while (digits < d.size() && absl::ascii_isdigit(static_cast<unsigned char>(d[digits]))) {
    ++digits;
  }
  if (digits == 0 || digits > 9) return false;
  const std::string unit = d.substr(digits);
  if (unit != "ms" && unit != "s" && unit != "m" && unit != "h") return false;
  return d.find_first_not_of('0') < digits;  // not zero
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
                     "\": expected a Prometheus duration such as 500ms, 5s or 1m"));
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
                  "\n    honor_labels: true\n    metrics_path: /metrics\n    static_configs:\n");
  for (const std::string& t : targets) out += t;
  return out;
}

}  // namespace pstrain
