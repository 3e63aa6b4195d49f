// What the worker can compute on. The CUDA build links cuda_kernels.cu; the
// CPU-only build (no nvcc, or --define=pstrain_cuda=off) answers every CUDA
// call with a clear FAILED_PRECONDITION. Thread-safe.
#ifndef PSTRAIN_WORKER_DEVICE_H_
#define PSTRAIN_WORKER_DEVICE_H_

#include <string>

#include "absl/status/status.h"

namespace pstrain {

bool BuiltWithCuda();

// Number of usable CUDA devices, or why there are none.
absl::Status CountCudaDevices(int* count, std::string* first_device_name);

// One line for the log: "CUDA: 1 device(s), NVIDIA H100 ..." or the reason there is none.
std::string DescribeCudaDevices();

// y[batch, out] = x * w + b (then ReLU when `relu`) on CUDA device 0.
absl::Status CudaDenseForward(const float* x, const float* w, const float* b, int batch, int in,
                              int out, bool relu, float* y);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DEVICE_H_
