#include "common/cluster/slurm.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace pstrain {
namespace {

constexpr size_t kMaxHosts = 65536;

absl::Status HostListError(absl::string_view list, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("Slurm host list \"", list, "\": ", what));
}

bool AllDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return true;
}

// The names inside one bracket group: "01-03,07" -> 01 02 03 07.
absl::StatusOr<std::vector<std::string>> ExpandRanges(absl::string_view list,
                                                      absl::string_view ranges) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= ranges.size()) {
    size_t comma = ranges.find(',', start);
    if (comma == absl::string_view::npos) comma = ranges.size();
    const absl::string_view range = ranges.substr(start, comma - start);
    const size_t dash = range.find('-');
    const absl::string_view lo = range.substr(0, dash);
    const absl::string_view hi = dash == absl::string_view::npos ? lo : range.substr(dash + 1);
    uint64_t a = 0, b = 0;
    if (!AllDigits(lo) || !AllDigits(hi) || lo.size() > 9 || hi.size() > 9 ||
        !absl::SimpleAtoi(lo, &a) || !absl::SimpleAtoi(hi, &b) || a > b) {
      return HostListError(list, absl::StrCat("range \"", range,
                                              "\" is not N or LOW-HIGH with LOW <= HIGH"));
    }
    if (out.size() + (b - a + 1) > kMaxHosts) {
      return HostListError(list, absl::StrCat("more than ", kMaxHosts, " hosts"));
    }
    for (uint64_t i = a; i <= b; ++i) {
      std::string n = absl::StrCat(i);
      if (n.size() < lo.size()) n.insert(0, lo.size() - n.size(), '0');
      out.push_back(std::move(n));
    }
    start = comma + 1;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostList(absl::string_view list) {
  if (list.empty()) return HostListError(list, "empty");
  std::vector<std::string> hosts;
  size_t pos = 0;
  while (pos <= list.size()) {
    // One entry: text up to a comma outside brackets.
    std::vector<std::string> names = {""};
    for (;;) {
      if (pos == list.size() || list[pos] == ',') break;
      if (list[pos] == ']') return HostListError(list, "a ']' without its '['");
      if (names[0].size() >= 253) return HostListError(list, "a host name over 253 characters");
      if (list[pos] != '[') {
        for (std::string& n : names) n.push_back(list[pos]);
        ++pos;
        continue;
      }
      const size_t close = list.find(']', pos);
      if (close == absl::string_view::npos) return HostListError(list, "a '[' without its ']'");
      const absl::string_view inner = list.substr(pos + 1, close - pos - 1);
      if (inner.find('[') != absl::string_view::npos) {
        return HostListError(list, "nested '['");
      }
      ASSIGN_OR_RETURN(std::vector<std::string> parts, ExpandRanges(list, inner));
      if (names.size() * parts.size() > kMaxHosts) {
        return HostListError(list, absl::StrCat("more than ", kMaxHosts, " hosts"));
      }
      std::vector<std::string> product;
      product.reserve(names.size() * parts.size());
      for (const std::string& n : names) {
        for (const std::string& p : parts) product.push_back(n + p);
      }
      names = std::move(product);
      pos = close + 1;
    }
    for (std::string& n : names) {
      if (n.empty()) return HostListError(list, "an empty host name");
      if (absl::Status st = ValidateHost(n); !st.ok()) {
        return HostListError(list, std::string(st.message()));
      }
      hosts.push_back(std::move(n));
    }
    if (hosts.size() > kMaxHosts) {
      return HostListError(list, absl::StrCat("more than ", kMaxHosts, " hosts"));
    }
    if (pos == list.size()) break;
    ++pos;  // the comma
    if (pos == list.size()) return HostListError(list, "ends with ','");
  }
  return hosts;
}

absl::StatusOr<std::vector<int>> ExpandTasksPerNode(absl::string_view spec) {
  auto error = [&](absl::string_view part) {
    return absl::InvalidArgumentError(
        absl::StrCat("Slurm tasks per node \"", spec, "\": \"", part,
                     "\" is not N or N(xK), e.g. \"2(x3),1\""));
  };
  std::vector<int> out;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == absl::string_view::npos) comma = spec.size();
    const absl::string_view part = spec.substr(start, comma - start);
    absl::string_view count = part;
    int repeat = 1;
    if (const size_t paren = part.find("(x"); paren != absl::string_view::npos) {
      if (part.back() != ')') return error(part);
      const absl::string_view times = part.substr(paren + 2, part.size() - paren - 3);
      if (!AllDigits(times) || !absl::SimpleAtoi(times, &repeat) || repeat < 1 ||
          repeat > static_cast<int>(kMaxHosts)) {
        return error(part);
      }
      count = part.substr(0, paren);
    }
    int n = 0;
    if (!AllDigits(count) || !absl::SimpleAtoi(count, &n) || n < 1 || n > 4096) {
      return error(part);
    }
    if (out.size() + repeat > kMaxHosts) return error(part);
    out.insert(out.end(), repeat, n);
    start = comma + 1;
  }
  return out;
}

absl::StatusOr<SlurmTask> ResolveSlurmTask(
    const std::function<std::optional<std::string>(const char*)>& getenv,
    const SlurmRoles& roles, const std::string& extras) {
  auto get = [&](const char* name) -> std::optional<std::string> {
    if (auto v = getenv(name); v.has_value() && !v->empty()) return v;
    return std::nullopt;
  };
  // Only srun sets the step's variables: the batch script itself has
  // SLURM_PROCID 0 and the job's task count too, and would wait as a chief
  // for tasks that never start.
  if (!get("SLURM_PROCID").has_value() || !get("SLURM_STEP_ID").has_value()) {
    return absl::FailedPreconditionError(
        "not a task of a Slurm job step (SLURM_PROCID or SLURM_STEP_ID is unset; a batch script "
        "itself is not one): start every task with srun");
  }
  const std::optional<std::string> procid = get("SLURM_PROCID");
  const std::optional<std::string> ntasks = get("SLURM_STEP_NUM_TASKS");
  const std::optional<std::string> nodelist = get("SLURM_STEP_NODELIST");
  const std::optional<std::string> per_node = get("SLURM_STEP_TASKS_PER_NODE");
  for (const auto& [value, name] : {std::pair{&ntasks, "SLURM_STEP_NUM_TASKS"},
                                    std::pair{&nodelist, "SLURM_STEP_NODELIST"},
                                    std::pair{&per_node, "SLURM_STEP_TASKS_PER_NODE"}}) {
    if (!value->has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat("Slurm's environment is incomplete: ", name, " is unset (srun sets it)"));
    }
  }
  SlurmTask out;
  if (!absl::SimpleAtoi(*procid, &out.rank) || out.rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_PROCID \"", *procid, "\" is not a rank"));
  }
  if (!absl::SimpleAtoi(*ntasks, &out.num_tasks) || out.num_tasks < 1 ||
      out.rank >= out.num_tasks) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_STEP_NUM_TASKS \"", *ntasks,
                                                   "\" is not a task count above rank ",
                                                   out.rank));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> nodes, ExpandHostList(*nodelist));
  ASSIGN_OR_RETURN(std::vector<int> tasks_per_node, ExpandTasksPerNode(*per_node));
  int64_t placed = 0;
  for (int n : tasks_per_node) placed += n;
  if (tasks_per_node.size() != nodes.size() || placed != out.num_tasks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Slurm's environment disagrees with itself: ", nodes.size(), " node(s) in \"", *nodelist,
        "\", ", tasks_per_node.size(), " count(s) in tasks per node \"", *per_node, "\" placing ",
        placed, " task(s), SLURM_STEP_NUM_TASKS ", out.num_tasks));
  }

  if (roles.num_ps < 1 || roles.num_workers < -1 || roles.num_workers == 0) {
    return absl::InvalidArgumentError("--ps must be at least 1 and --workers at least 1");
  }
  const int needed = 1 + roles.num_ps + std::max(roles.num_workers, 1);
  if (out.num_tasks < needed ||
      (roles.num_workers > 0 && out.num_tasks != needed)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Slurm gave ", out.num_tasks, " task(s), but 1 chief + ", roles.num_ps, " ps + ",
        roles.num_workers > 0 ? absl::StrCat(roles.num_workers, " worker(s) need exactly ")
                              : std::string("at least 1 worker need "),
        needed, ": ask for --ntasks=", needed,
        roles.num_workers > 0 ? "" : " or more"));
  }
  int max_per_node = 0;
  for (int n : tasks_per_node) max_per_node = std::max(max_per_node, n);
  if (roles.base_port < 1 || roles.base_port + max_per_node - 1 > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--base_port ", roles.base_port, " leaves no room for ", max_per_node,
        " task(s) on one node below port 65536"));
  }

  // Block placement: ranks fill the nodes in order.
  nlohmann::json cluster = nlohmann::json::object();
  int rank = 0;
  for (size_t node = 0; node < nodes.size(); ++node) {
    for (int k = 0; k < tasks_per_node[node]; ++k, ++rank) {
      const char* job = rank == 0 ? kChiefJob : rank <= roles.num_ps ? kPsJob : kWorkerJob;
      cluster[job].push_back(HostPortString(nodes[node], roles.base_port + k));
      if (rank == out.rank) {
        out.node = nodes[node];
        out.task.task = TaskId{job, static_cast<int>(cluster[job].size()) - 1};
        out.node_index = static_cast<int>(node);
        out.local_index = k;
      }
    }
  }
  // The ports assume block placement: check where Slurm really put this rank.
  const std::pair<const char*, std::string> where[] = {
      {"SLURMD_NODENAME", out.node},
      {"SLURM_NODEID", std::to_string(out.node_index)},
      {"SLURM_LOCALID", std::to_string(out.local_index)}};
  for (const auto& [name, expected] : where) {
    if (std::optional<std::string> actual = get(name); actual.has_value() && *actual != expected) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", out.rank, " has ", name, "=", *actual, ", but block placement gives it ",
          expected, " (node ", out.node, ", task ", out.local_index,
          " there): run srun with --distribution=block (the default)"));
    }
  }
  if (!extras.empty()) {
    nlohmann::json e = nlohmann::json::parse(extras, nullptr, false);
    if (e.is_discarded()) return absl::InvalidArgumentError("the spec's extras are not JSON");
    cluster["pstrain"] = e;
  }
  ASSIGN_OR_RETURN(out.task.cluster, ClusterSpec::Parse(cluster.dump(), "Slurm"));
  nlohmann::json tf_config = {
      {"cluster", cluster},
      {"task", {{"type", out.task.task.job}, {"index", out.task.task.index}}}};
  out.tf_config = tf_config.dump();
  return out;
}

}  // namespace pstrain
