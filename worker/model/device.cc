#include "worker/model/device.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pstrain {

std::string DescribeCudaDevices() {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return absl::StrCat("CUDA: none (", count.status().message(), ")");
  if (*count == 0) return "CUDA: no devices";
  return absl::StrCat("CUDA: ", *count, " device(s), device 0 is ",
                      CudaDeviceName(0).value_or("unknown"));
}

absl::StatusOr<OpenedDevice> OpenDevice(const DeviceSpec& spec, int cpu_threads) {
  OpenedDevice out;
  switch (spec.kind) {
    case DeviceSpec::Kind::kCpu:
      out.backend = NewCpuBackend(cpu_threads);
      out.reason = "asked for cpu";
      return out;
    case DeviceSpec::Kind::kCuda: {
      absl::StatusOr<std::unique_ptr<Backend>> b = NewCudaBackend(spec.index);
      if (!b.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("device cuda:", spec.index,
                         " was asked for but cannot be used: ", b.status().message()));
      }
      out.backend = std::move(*b);
      out.reason = absl::StrCat("asked for cuda:", spec.index);
      return out;
    }
    case DeviceSpec::Kind::kAuto:
      break;
  }
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok() || *count == 0) {
    out.backend = NewCpuBackend(cpu_threads);
    out.reason =
        absl::StrCat("auto: no usable GPU (",
                     count.ok() ? "no CUDA devices" : count.status().message(), "), so the CPU");
    return out;
  }
  std::vector<std::string> failures;
  for (int d = 0; d < *count; ++d) {
    absl::StatusOr<std::unique_ptr<Backend>> b = NewCudaBackend(d);
    if (b.ok()) {
      out.backend = std::move(*b);
      out.reason =
          absl::StrCat("auto: the first working GPU of ", *count, failures.empty() ? "" : " (",
                       absl::StrJoin(failures, "; "), failures.empty() ? "" : ")");
      return out;
    }
    failures.push_back(std::string(b.status().message()));
  }
  out.backend = NewCpuBackend(cpu_threads);
  out.reason =
      absl::StrCat("auto: no CUDA device works (", absl::StrJoin(failures, "; "), "), so the CPU");
  return out;
}

}  // namespace pstrain
