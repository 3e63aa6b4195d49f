#include "common/sizing.h"

#include <unistd.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc.h"

namespace pstrain {

int64_t PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(pages) * page;
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

absl::Status CheckSharesFitMessages(const std::vector<VariableSpec>& variables,
                                    const Placement& placement, int64_t max_message_bytes) {
  // Headers and names take a little of each message.
  const int64_t limit = max_message_bytes - (int64_t{1} << 20);
  for (int s = 0; s < placement.num_servers(); ++s) {
    const int64_t share = placement.server_bytes()[s];
    if (share <= limit) continue;
    const VariableSpec* biggest = &variables.front();
    for (const VariableSpec& v : variables) {
      if (v.num_elements() > biggest->num_elements()) biggest = &v;
    }
    int64_t total = 0;
    for (int64_t b : placement.server_bytes()) total += b;
    const int64_t servers_needed = (total + limit - 1) / limit;
    return absl::ResourceExhaustedError(absl::StrCat(
        "ps:", s, "'s share of the model is ", FormatBytes(share), " (the largest variable, ",
        biggest->name, ", is ", FormatBytes(biggest->num_elements() * 4),
        "); one message carries at most ", FormatBytes(max_message_bytes),
        " and a pull by the chief (or an async worker) carries a server's whole share: ",
        servers_needed > 100000 ? std::string("make the model smaller")
                                : absl::StrCat("use at least ", servers_needed,
                                               " parameter servers, or a smaller model")));
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

absl::Status CheckModelFits(const std::vector<VariableSpec>& variables,
                            const Placement& placement, const std::string& process) {
  absl::Status st = CheckSharesFitMessages(variables, placement, kMaxMessageBytes);
  if (st.ok()) st = CheckMemory(process, ModelProcessBytes(variables), PhysicalMemoryBytes());
  return st;
}

}  // namespace pstrain
