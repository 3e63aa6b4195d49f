// Where the local tasks of a launch serve /metrics, as a Prometheus file_sd
// targets file (<output_dir>/metrics_targets.json): rewritten, atomically,
// whenever a task reports an address, so a scrape job that reads the file
// follows the tasks across restarts, whose ports are picked afresh.
//   scrape_configs:
//     - job_name: pstrain
//       honor_labels: true
//       file_sd_configs: [{files: [/path/to/output_dir/metrics_targets.json]}]
// Not thread-safe (the launcher's one thread).
#ifndef PSTRAIN_TOOLS_METRICS_TARGETS_H_
#define PSTRAIN_TOOLS_METRICS_TARGETS_H_

#include <map>
#include <string>

#include "absl/status/status.h"

namespace pstrain {

class MetricsTargets {
 public:
  explicit MetricsTargets(std::string path) : path_(std::move(path)) {}

  // Task `task` ("ps:0") serves at `url` ("http://127.0.0.1:38805/metrics");
  // rewrites the file. A url that is not scheme://host:port/path is refused.
  absl::Status Set(const std::string& task, const std::string& url);
  // No targets: written as a launch starts (an earlier run's ports are gone
  // before its tasks report theirs) and as it ends (Prometheus stops
  // scraping tasks that are no more).
  absl::Status Clear();

  // The file's content: one target group per task, labelled pstrain_task
  // ("ps:0", as pstrain prometheus-config labels its targets), its scheme
  // and path in Prometheus' __scheme__ and __metrics_path__.
  std::string Json() const;
  const std::string& path() const { return path_; }

 private:
  const std::string path_;
  std::map<std::string, std::string> urls_;  // by task
};

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_METRICS_TARGETS_H_
