#include "common/cluster/sizing.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/wire_limits.h"

namespace pstrain {

namespace {

// The least memory.max of this process's cgroup (v2) and of its parents,
// or max where none says a number (none set, "max", not readable).
int64_t CgroupMemoryLimit() {
  int64_t least = std::numeric_limits<int64_t>::max();
  std::ifstream cgroup("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(cgroup, line)) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);  // the v2 hierarchy
  }
  if (path.empty() || path[0] != '/' || path.find("..") != std::string::npos) return least;
  for (;;) {
    std::ifstream max_file("/sys/fs/cgroup" + (path == "/" ? std::string() : path) +
                           "/memory.max");
    std::string value;
    int64_t limit = 0;
    if ((max_file >> value) && absl::SimpleAtoi(value, &limit) && limit > 0) {
      least = std::min(least, limit);
    }
    if (path == "/") return least;
    const size_t slash = path.rfind('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
}

}  // namespace

int64_t PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  const int64_t machine = pages <= 0 || page <= 0 ? std::numeric_limits<int64_t>::max()
                                                  : static_cast<int64_t>(pages) * page;
  return std::min(machine, CgroupMemoryLimit());
}

std::string FormatBytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return absl::StrFormat("%.1f GiB", bytes / double(1 << 30));
  if (bytes >= (int64_t{1} << 20)) return absl::StrFormat("%.1f MiB", bytes / double(1 << 20));
  if (bytes >= (int64_t{1} << 10)) return absl::StrFormat("%.1f KiB", bytes / double(1 << 10));
  return absl::StrCat(bytes, " B");
}

absl::Status CheckMemory(const std::string& what, int64_t bytes, int64_t limit) {
  if (bytes <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(what, " needs at least ", FormatBytes(bytes),
                                                   " of memory; this machine has ",
                                                   FormatBytes(limit)));
}

absl::Status CheckPartitionsFitMessages(const Placement& placement, int64_t max_message_bytes,
                                        int copies) {
  // Headers and names take a little of each message; a resume's Initialize
  // carries a partition's values and its optimizer slots together.
  const int64_t limit = (max_message_bytes - (int64_t{1} << 20)) / std::max(1, copies);
  for (const VariablePlacement& vp : placement.variables()) {
    const int64_t row_bytes = vp.spec.row_elements() * 4;
    for (const Partition& part : vp.partitions) {
      const int64_t bytes = part.num_rows() * row_bytes;
      if (bytes <= limit) continue;
      return absl::ResourceExhaustedError(absl::StrCat(
          "partition ", part.index, " of ", vp.spec.name, " is ", FormatBytes(bytes), " (",
          part.num_rows(), " rows of ", FormatBytes(row_bytes),
          ")", copies > 1 ? absl::StrCat(" x ", copies, " with its optimizer slots") : "",
          "; one message carries at most ", FormatBytes(max_message_bytes), ": ",
          row_bytes > limit
              ? std::string("a single row is larger than that; make the variable narrower")
              : absl::StrCat("set placement.partition_max_bytes to at most ",
                             FormatBytes(limit), " (pulls and pushes travel as calls of whole "
                                                 "partitions)")));
    }
  }
  return absl::OkStatus();
}

int64_t ModelProcessBytes(const std::vector<VariableSpec>& variables) {
  int64_t elements = 0;
  for (const VariableSpec& v : variables) {
    const int64_t n = v.num_elements();
    if (n < 0 || elements > std::numeric_limits<int64_t>::max() / 16 - n) {
      return std::numeric_limits<int64_t>::max();
    }
    elements += n;
  }
  return elements * 4 * 2;
}

int64_t JobInflightBytes(const Placement& placement, int num_workers, int calls_in_flight,
                         int64_t call_bytes, int64_t chief_call_bytes, int wire_bytes_per_float) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const int n = placement.num_servers();
  // Each server's share on the wire (server_bytes() is float32's), and its
  // largest partition: a call carries one at least.
  std::vector<int64_t> share(n, 0), largest_part(n, 0);
  for (int s = 0; s < n && s < static_cast<int>(placement.server_bytes().size()); ++s) {
    share[s] = placement.server_bytes()[s] / 4 * wire_bytes_per_float;
  }
  for (const VariablePlacement& vp : placement.variables()) {
    const int64_t row_bytes = vp.spec.row_elements() * wire_bytes_per_float;
    for (const Partition& part : vp.partitions) {
      if (part.server < 0 || part.server >= n) continue;
      largest_part[part.server] = std::max(largest_part[part.server], part.num_rows() * row_bytes);
    }
  }
  auto add = [](int64_t a, int64_t b) { return a > kMax - b ? kMax : a + b; };
  // One caller's calls in one direction at server s, each of up to `bytes`.
  auto direction = [&](int s, int64_t bytes) {
    const int64_t call = std::max(bytes, largest_part[s]);
    const int64_t in_flight = calls_in_flight > 0 && call > kMax / calls_in_flight
                                  ? kMax
                                  : int64_t{std::max(0, calls_in_flight)} * call;
    return std::min(share[s], in_flight);
  };
  const int64_t worker_directions = 2 * int64_t{std::max(0, num_workers)};
  int64_t need = 0;
  for (int s = 0; s < n; ++s) {
    const int64_t worker = direction(s, call_bytes);
    const int64_t workers = worker_directions > 0 && worker > kMax / worker_directions
                                ? kMax
                                : worker_directions * worker;
    need = std::max(need, add(workers, direction(s, chief_call_bytes)));
  }
  return need;
}

absl::Status CheckModelFits(const std::vector<VariableSpec>& variables,
                            const Placement& placement, const std::string& process) {
  absl::Status st = CheckPartitionsFitMessages(placement, kMaxMessageBytes);
  if (st.ok()) st = CheckMemory(process, ModelProcessBytes(variables), PhysicalMemoryBytes());
  return st;
}

}  // namespace pstrain
