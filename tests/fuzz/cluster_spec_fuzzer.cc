// libFuzzer target: the cluster spec and TF_CONFIG parsers never crash, and
// what they accept is self-consistent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/cluster/cluster_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pstrain::ClusterSpec> spec = pstrain::ClusterSpec::Parse(text, "fuzz");
  if (spec.ok()) {
    for (const pstrain::TaskId& t : spec->AllTasks()) {
      if (!spec->ValidateTask(t.job, t.index).ok()) std::abort();
      if (!pstrain::ParseHostPort(spec->address(t.job, t.index)).ok()) std::abort();
    }
    (void)spec->AllLoopback();
  }
  (void)pstrain::ParseTfConfig(text);
  return 0;
}
