// Choosing the backend a worker computes on, from "auto", "cpu" or
// "cuda:N" (the config's `device`, or the worker's --device flag). "auto"
// takes the first CUDA device that works (it must run a kernel) and falls
// back to the CPU otherwise; the choice and its reason are returned for the
// log. An explicit "cuda:N" that does not work is an error, never a silent
// fall-back. Thread-safe.
#ifndef PSTRAIN_WORKER_MODEL_DEVICE_H_
#define PSTRAIN_WORKER_MODEL_DEVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/cluster/config.h"
#include "worker/model/backend.h"

namespace pstrain {

struct OpenedDevice {
  std::unique_ptr<Backend> backend;
  std::string reason;  // why this device: "asked for cpu", "auto: no CUDA device (...)"
  // Set when the CPU was chosen and OpenBLAS runs kernels older than the CPU
  // (cpu::BlasCoreTypeOverride): what to set, for the log.
  std::string warning;
};

// `cpu_threads` is the BLAS thread count when the choice is the CPU.
absl::StatusOr<OpenedDevice> OpenDevice(const DeviceSpec& spec, int cpu_threads);

// One line for the log: "CUDA: 1 device(s), device 0 is NVIDIA H100 ..." or why none.
std::string DescribeCudaDevices();

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_MODEL_DEVICE_H_
