#include "tools/metrics_targets.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/storage/env.h"
#include "nlohmann/json.hpp"

namespace pstrain {
namespace {

struct Url {
  std::string scheme, host_port, path;
};

bool ParseUrl(const std::string& url, Url* u) {
  const size_t sep = url.find("://");
  if (sep == std::string::npos) return false;
  u->scheme = url.substr(0, sep);
  const size_t slash = url.find('/', sep + 3);
  u->host_port = url.substr(sep + 3, slash == std::string::npos ? std::string::npos
                                                                : slash - sep - 3);
  u->path = slash == std::string::npos ? "/metrics" : url.substr(slash);
  return (u->scheme == "http" || u->scheme == "https") &&
         u->host_port.find(':') != std::string::npos && u->host_port.find(' ') == std::string::npos;
}

}  // namespace

absl::Status MetricsTargets::Set(const std::string& task, const std::string& url) {
  Url u;
  if (!ParseUrl(url, &u)) {
    return absl::InvalidArgumentError(absl::StrCat("metrics of ", task, ": not a URL: ", url));
  }
  urls_[task] = url;
  return WriteFileAtomically(Env::Default(), path_, Json());
}

absl::Status MetricsTargets::Clear() {
  urls_.clear();
  return WriteFileAtomically(Env::Default(), path_, Json());
}

std::string MetricsTargets::Json() const {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& [task, url] : urls_) {
    Url u;
    if (!ParseUrl(url, &u)) continue;
    // As pstrain prometheus-config labels its static targets (the series
    // carry their own job and task labels: honor_labels).
    groups.push_back({{"targets", {u.host_port}},
                      {"labels",
                       {{"pstrain_task", task},
                        {"__scheme__", u.scheme},
                        {"__metrics_path__", u.path}}}});
  }
  return groups.dump(1) + "\n";
}

}  // namespace pstrain
