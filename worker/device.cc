#include "worker/device.h"

#include "absl/strings/str_cat.h"

#ifdef PSTRAIN_HAVE_CUDA
#include "worker/cuda_kernels.h"
#endif

namespace pstrain {

#ifdef PSTRAIN_HAVE_CUDA

bool BuiltWithCuda() { return true; }

absl::Status CountCudaDevices(int* count, std::string* first_device_name) {
  char name[256] = {0}, error[512] = {0};
  int rc = pstrain_cuda_device_count(count, name, sizeof(name), error, sizeof(error));
  if (rc != 0) return absl::FailedPreconditionError(error);
  if (first_device_name != nullptr) *first_device_name = name;
  return absl::OkStatus();
}

absl::Status CudaDenseForward(const float* x, const float* w, const float* b, int batch, int in,
                              int out, bool relu, float* y) {
  if (batch <= 0 || in <= 0 || out <= 0) return absl::InvalidArgumentError("empty dense layer");
  int count = 0;
  std::string name;
  absl::Status st = CountCudaDevices(&count, &name);
  if (!st.ok()) return st;
  if (count == 0) return absl::FailedPreconditionError("no CUDA device");
  char error[512] = {0};
  if (pstrain_cuda_dense_forward(x, w, b, batch, in, out, relu ? 1 : 0, y, error, sizeof(error)) !=
      0) {
    return absl::InternalError(error);
  }
  return absl::OkStatus();
}

#else  // CPU-only build

bool BuiltWithCuda() { return false; }

absl::Status CountCudaDevices(int* count, std::string* first_device_name) {
  *count = 0;
  return absl::FailedPreconditionError("this build has no CUDA support (CPU-only build)");
}

absl::Status CudaDenseForward(const float* x, const float* w, const float* b, int batch, int in,
                              int out, bool relu, float* y) {
  return absl::FailedPreconditionError("this build has no CUDA support (CPU-only build)");
}

#endif

std::string DescribeCudaDevices() {
  int count = 0;
  std::string name;
  absl::Status st = CountCudaDevices(&count, &name);
  if (!st.ok()) return absl::StrCat("CUDA: none (", st.message(), ")");
  if (count == 0) return "CUDA: no devices";
  return absl::StrCat("CUDA: ", count, " device(s), device 0 is ", name);
}

}  // namespace pstrain
