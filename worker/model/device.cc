#include "worker/model/device.h"

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/model/cpu_ops.h"

namespace pstrain {
namespace {

OpenedDevice Cpu(int threads, std::string reason) {
  OpenedDevice out;
  out.backend = NewCpuBackend(threads);
  out.reason = std::move(reason);
  if (const char* was = std::getenv(cpu::kBlasCoreReplacedEnv); was != nullptr && *was != '\0') {
    absl::StrAppend(&out.reason, "; OpenBLAS had taken this CPU for ", was,
                    " (a VM hiding its model?): pstrain set OPENBLAS_CORETYPE=",
                    cpu::BlasCoreName());
  }
  if (std::string fits = cpu::BlasCoreTypeOverride(); !fits.empty()) {
    out.warning = absl::StrCat("OpenBLAS runs its ", cpu::BlasCoreName(),
                               " kernels on a CPU that has ", fits == "SkylakeX" ? "AVX-512" : "AVX2",
                               " (a VM hiding the CPU's model?): set OPENBLAS_CORETYPE=", fits,
                               " in this process's environment for up to 3x faster CPU compute "
                               "(pstrain launch does so for its tasks)");
  }
  return out;
}

}  // namespace

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
      return Cpu(cpu_threads, "asked for cpu");
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
    return Cpu(cpu_threads,
               absl::StrCat("auto: no usable GPU (",
                            count.ok() ? "no CUDA devices" : count.status().message(),
                            "), so the CPU"));
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
  return Cpu(cpu_threads, absl::StrCat("auto: no CUDA device works (",
                                      absl::StrJoin(failures, "; "), "), so the CPU"));
}

}  // namespace pstrain
