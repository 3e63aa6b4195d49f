#include "common/cluster/cluster_spec.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace pstrain {
namespace {

using json = nlohmann::json;

const std::set<std::string>& KnownJobs() {
  static const auto* jobs = new std::set<std::string>{kChiefJob, kPsJob, kWorkerJob};
  return *jobs;
}

// "localhost" and the loopback address name the same endpoint.
std::string CanonicalHost(const std::string& host) {
  if (host == "localhost" || host == "127.0.0.1" || host == "::1") return "loopback";
  return host;
}

absl::Status SpecError(const std::string& source, const std::string& key,
                       const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("cluster spec ", source, ": key ", key, ": ", what));
}

// "pstrain": {"auth": {"secret_file": "auth/cluster.secret"}, "tls": {"dir": "tls"},
//             "insecure": false}
// "pstrain".{"metrics"}: {"job": ["host:port", ...], ...}, checked against
// the cluster by Parse once every job is read.
absl::Status ParseMetrics(const std::string& source, const std::string& key, const json& metrics,
                          std::map<std::string, std::vector<std::string>>* out) {
  if (!metrics.is_object()) {
    return SpecError(source, key,
                     "expected {\"job\": [\"host:port\", ...]}: where each task serves /metrics");
  }
  for (auto it = metrics.begin(); it != metrics.end(); ++it) {
    const std::string job_key = absl::StrCat(key, ".\"", it.key(), "\"");
    if (KnownJobs().count(it.key()) == 0) {
      return SpecError(
          source, job_key,
          absl::StrCat("unknown job; expected one of ", absl::StrJoin(KnownJobs(), ", ")));
    }
    if (!it.value().is_array()) {
      return SpecError(source, job_key, "expected an array of \"host:port\" strings, one per task");
    }
    std::vector<std::string>& addrs = (*out)[it.key()];
    for (size_t i = 0; i < it.value().size(); ++i) {
      const json& entry = it.value()[i];
      const std::string entry_key = absl::StrCat(job_key, "[", i, "]");
      if (!entry.is_string()) {
        return SpecError(source, entry_key, "expected a \"host:port\" string");
      }
      absl::StatusOr<HostPort> hp = ParseHostPort(entry.get<std::string>());
      if (!hp.ok()) return SpecError(source, entry_key, std::string(hp.status().message()));
      addrs.push_back(entry.get<std::string>());
    }
  }
  return absl::OkStatus();
}

absl::Status ParseExtras(const std::string& source, const json& extras,
                         std::string* secret_file, std::string* tls_dir, bool* insecure,
                         std::map<std::string, std::vector<std::string>>* metrics) {
  if (!extras.is_object()) {
    return SpecError(source, "\"pstrain\"", "expected an object of pstrain extras");
  }
  for (auto it = extras.begin(); it != extras.end(); ++it) {
    const std::string key = absl::StrCat("\"pstrain\".\"", it.key(), "\"");
    if (it.key() == "insecure") {
      if (!it.value().is_boolean()) return SpecError(source, key, "expected true or false");
      *insecure = it.value().get<bool>();
    } else if (it.key() == "auth") {
      if (!it.value().is_object()) {
        return SpecError(source, key, "expected {\"secret_file\": \"PATH\"}");
      }
      for (auto a = it.value().begin(); a != it.value().end(); ++a) {
        if (a.key() != "secret_file") {
          return SpecError(source, absl::StrCat(key, ".\"", a.key(), "\""),
                           "unknown key; expected \"secret_file\"");
        }
        if (!a.value().is_string() || a.value().get<std::string>().empty()) {
          return SpecError(source, absl::StrCat(key, ".\"secret_file\""),
                           "expected the path of the cluster secret (pstrain tokens writes one)");
        }
        *secret_file = a.value().get<std::string>();
      }
    } else if (it.key() == "tls") {
      // {"dir": "tls"}: what `pstrain certs --out=tls` wrote.
      if (!it.value().is_object() || it.value().size() != 1 || !it.value().contains("dir") ||
          !it.value()["dir"].is_string() || it.value()["dir"].get<std::string>().empty()) {
        return SpecError(source, key,
                         "expected {\"dir\": \"PATH\"}: the directory pstrain certs wrote");
      }
      *tls_dir = it.value()["dir"].get<std::string>();
    } else if (it.key() == "metrics") {
      RETURN_IF_ERROR(ParseMetrics(source, key, it.value(), metrics));
    } else {
      return SpecError(source, key,
                       "unknown key; expected \"auth\", \"tls\", \"insecure\" or "
                       "\"metrics\"");
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string TaskId::ToString() const { return absl::StrCat(job, ":", index); }

absl::Status ValidateHost(const std::string& host) {
  if (host.empty()) return absl::InvalidArgumentError("empty host name");
  if (host.find(':') != std::string::npos) {  // an IPv6 literal
    in6_addr ignored;
    if (::inet_pton(AF_INET6, host.c_str(), &ignored) == 1) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("\"", host, "\" is not an IPv6 address"));
  }
  // A DNS name (RFC 1123) or an IPv4 literal, which has the same characters.
  if (host.size() > 253) {
    return absl::InvalidArgumentError(
        absl::StrCat("host name of ", host.size(), " characters (at most 253)"));
  }
  for (absl::string_view label : absl::StrSplit(host, '.')) {
    const bool ok_chars = std::all_of(label.begin(), label.end(), [](char c) {
      return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-';
    });
    if (label.empty() || label.size() > 63 || !ok_chars || label.front() == '-' ||
        label.back() == '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", absl::CHexEscape(host),
          "\" is not a host name (dot-separated labels of 1-63 letters, digits and inner "
          "hyphens) or an IP address"));
    }
  }
  return absl::OkStatus();
}

std::string HostPortString(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

absl::StatusOr<HostPort> ParseHostPort(const std::string& address) {
  HostPort hp;
  std::string port_text;
  if (!address.empty() && address[0] == '[') {
    size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("expected \"[ipv6]:port\", got \"", address, "\""));
    }
    hp.host = address.substr(1, close - 1);
    port_text = address.substr(close + 2);
  } else {
    size_t colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected \"host:port\", got \"", address, "\""));
    }
    hp.host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
    if (hp.host.find(':') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected \"host:port\" (IPv6 hosts in brackets), got \"", address, "\""));
    }
  }
  if (absl::Status st = ValidateHost(hp.host); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("in \"", address, "\": ", st.message()));
  }
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected \"host:port\" with a port in 1..65535, got \"", address, "\""));
  }
  hp.port = port;
  return hp;
}

absl::StatusOr<ClusterSpec> ClusterSpec::Parse(const std::string& json_text,
                                               const std::string& source) {
  json doc = json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    // Re-parse with exceptions only to recover the position for the message.
    std::string where;
    try {
      json ignored = json::parse(json_text);
      (void)ignored;
    } catch (const json::parse_error& e) {
      where = absl::StrCat(" at byte ", e.byte);
    } catch (const json::exception& e) {
      // A number too large for a double ("1e999") is out_of_range, not a
      // parse_error: uncaught, it ended the daemon (found by
      // tests/fuzz/cluster_spec_fuzzer).
      where = absl::StrCat(" (", e.what(), ")");
    }
    return absl::InvalidArgumentError(
        absl::StrCat("cluster spec ", source, ": not valid JSON", where,
                     "; expected an object like {\"chief\": [\"host:port\"], \"ps\": [...], "
                     "\"worker\": [...]}"));
  }
  if (!doc.is_object()) {
    return SpecError(source, "(top level)", "expected a JSON object of job name -> addresses");
  }
  ClusterSpec spec;
  spec.source_ = source;
  std::map<std::string, std::string> seen;  // canonical address -> "job[i]"
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& job = it.key();
    if (job == "pstrain") {
      RETURN_IF_ERROR(ParseExtras(source, it.value(), &spec.auth_secret_file_, &spec.tls_dir_,
                                  &spec.insecure_, &spec.metrics_));
      continue;
    }
    if (KnownJobs().count(job) == 0) {
      return SpecError(source, absl::StrCat("\"", job, "\""),
                       absl::StrCat("unknown job; expected one of ",
                                    absl::StrJoin(KnownJobs(), ", "), " (or \"pstrain\" extras)"));
    }
    if (!it.value().is_array() || it.value().empty()) {
      return SpecError(source, absl::StrCat("\"", job, "\""),
                       "expected a non-empty array of \"host:port\" strings");
    }
    std::vector<std::string>& addrs = spec.jobs_[job];
    for (size_t i = 0; i < it.value().size(); ++i) {
      const json& entry = it.value()[i];
      std::string key = absl::StrCat("\"", job, "\"[", i, "]");
      if (!entry.is_string()) {
        return SpecError(source, key, "expected a \"host:port\" string");
      }
      std::string addr = entry.get<std::string>();
      absl::StatusOr<HostPort> hp = ParseHostPort(addr);
      if (!hp.ok()) return SpecError(source, key, std::string(hp.status().message()));
      std::string canonical = absl::StrCat(CanonicalHost(hp->host), ":", hp->port);
      auto [prev, inserted] = seen.emplace(canonical, key);
      if (!inserted) {
        return SpecError(source, key,
                         absl::StrCat("duplicate address \"", addr, "\", already used by ",
                                      prev->second, "; every task needs its own address"));
      }
      addrs.push_back(addr);
    }
  }
  if (spec.num_tasks(kPsJob) == 0) {
    return SpecError(source, "\"ps\"", "missing; expected at least one parameter server");
  }
  if (spec.num_tasks(kWorkerJob) == 0) {
    return SpecError(source, "\"worker\"", "missing; expected at least one worker");
  }
  if (spec.num_tasks(kChiefJob) != 1) {
    return SpecError(source, "\"chief\"", "expected exactly one chief address");
  }
  for (const auto& [job, addrs] : spec.metrics_) {
    const std::string key = absl::StrCat("\"pstrain\".\"metrics\".\"", job, "\"");
    if (static_cast<int>(addrs.size()) != spec.num_tasks(job)) {
      return SpecError(source, key,
                       absl::StrCat(addrs.size(), " address(es) for ", spec.num_tasks(job),
                                    " task(s); expected one per task"));
    }
    for (size_t i = 0; i < addrs.size(); ++i) {
      const HostPort hp = *ParseHostPort(addrs[i]);
      const std::string entry_key = absl::StrCat(key, "[", i, "]");
      auto [prev, inserted] =
          seen.emplace(absl::StrCat(CanonicalHost(hp.host), ":", hp.port), entry_key);
      if (!inserted) {
        return SpecError(source, entry_key,
                         absl::StrCat("duplicate address \"", addrs[i], "\", already used by ",
                                      prev->second, "; every endpoint needs its own port"));
      }
    }
  }
  return spec;
}

std::string ClusterSpec::metrics_address(const std::string& job, int index) const {
  auto it = metrics_.find(job);
  if (it == metrics_.end() || index < 0 || index >= static_cast<int>(it->second.size())) return "";
  return it->second[static_cast<size_t>(index)];
}

absl::StatusOr<ClusterSpec> ClusterSpec::FromFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster spec ", path, ": not a file (a directory?)"));
  }
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cluster spec ", path, ": cannot open file"));
  }
  std::stringstream buf;
  buf << in.rdbuf();
  ASSIGN_OR_RETURN(ClusterSpec spec, Parse(buf.str(), path));
  // Relative secret and TLS paths are relative to the spec file, wherever it is read from.
  for (std::string* p : {&spec.auth_secret_file_, &spec.tls_dir_}) {
    const size_t slash = path.rfind('/');
    if (!p->empty() && (*p)[0] != '/' && slash != std::string::npos) {
      *p = absl::StrCat(path.substr(0, slash + 1), *p);
    }
  }
  return spec;
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a;
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

bool IsThisMachine(const std::string& host) {
  if (IsLoopbackHost(host) || host == "0.0.0.0") return true;
  char name[256] = {0};
  return ::gethostname(name, sizeof(name) - 1) == 0 && host == name;
}

bool ClusterSpec::AllLoopback() const {
  for (const auto& [job, addrs] : jobs_) {
    for (const std::string& addr : addrs) {
      absl::StatusOr<HostPort> hp = ParseHostPort(addr);
      if (!hp.ok() || !IsLoopbackHost(hp->host)) return false;
    }
  }
  return true;
}

int ClusterSpec::num_tasks(const std::string& job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : static_cast<int>(it->second.size());
}

const std::string& ClusterSpec::address(const std::string& job, int index) const {
  return jobs_.at(job).at(index);
}

absl::Status ClusterSpec::ValidateTask(const std::string& job, int index) const {
  if (KnownJobs().count(job) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("cluster spec ", source_, ": job \"", job,
                                                   "\" is unknown; expected one of ",
                                                   absl::StrJoin(KnownJobs(), ", ")));
  }
  int n = num_tasks(job);
  if (index < 0 || index >= n) {
    return absl::InvalidArgumentError(absl::StrCat("cluster spec ", source_, ": key \"", job,
                                                   "\": task index ", index,
                                                   " out of range; expected 0..", n - 1));
  }
  return absl::OkStatus();
}

std::vector<TaskId> ClusterSpec::AllTasks() const {
  std::vector<TaskId> tasks;
  for (const char* job : {kChiefJob, kPsJob, kWorkerJob}) {
    for (int i = 0; i < num_tasks(job); ++i) tasks.push_back(TaskId{job, i});
  }
  return tasks;
}

absl::StatusOr<TaskConfig> ParseTfConfig(const std::string& tf_config) {
  json doc = json::parse(tf_config, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(
        "TF_CONFIG: not a JSON object; expected {\"cluster\": {...}, \"task\": {\"type\": "
        "\"ps\", \"index\": 0}}");
  }
  if (!doc.contains("cluster")) {
    return absl::InvalidArgumentError("TF_CONFIG: key \"cluster\": missing");
  }
  ASSIGN_OR_RETURN(ClusterSpec spec, ClusterSpec::Parse(doc["cluster"].dump(), "TF_CONFIG"));
  if (!doc.contains("task") || !doc["task"].is_object()) {
    return absl::InvalidArgumentError(
        "TF_CONFIG: key \"task\": expected an object {\"type\": ..., \"index\": ...}");
  }
  const json& task = doc["task"];
  if (!task.contains("type") || !task["type"].is_string()) {
    return absl::InvalidArgumentError("TF_CONFIG: key \"task.type\": expected a job name");
  }
  int index = 0;
  if (task.contains("index")) {
    if (!task["index"].is_number_integer()) {
      return absl::InvalidArgumentError("TF_CONFIG: key \"task.index\": expected an integer");
    }
    index = task["index"].get<int>();
  }
  TaskConfig out{std::move(spec), TaskId{task["type"].get<std::string>(), index}};
  RETURN_IF_ERROR(out.cluster.ValidateTask(out.task.job, out.task.index));
  return out;
}

absl::StatusOr<TaskConfig> ResolveTask(const std::string& spec_path, const std::string& job,
                                       int task, const std::string& tf_config,
                                       const std::string& expected_job) {
  TaskConfig out;
  if (!spec_path.empty()) {
    ASSIGN_OR_RETURN(out.cluster, ClusterSpec::FromFile(spec_path));
    out.task = TaskId{job.empty() ? expected_job : job, task};
    RETURN_IF_ERROR(out.cluster.ValidateTask(out.task.job, out.task.index));
  } else if (!tf_config.empty()) {
    ASSIGN_OR_RETURN(out, ParseTfConfig(tf_config));
  } else {
    return absl::InvalidArgumentError(
        "no cluster spec: pass --cluster_spec=FILE (with --task=N) or set TF_CONFIG");
  }
  if (out.task.job != expected_job) {
    return absl::InvalidArgumentError(absl::StrCat("this binary runs job \"", expected_job,
                                                   "\", but the task is \"", out.task.job,
                                                   "\""));
  }
  return out;
}

}  // namespace pstrain
