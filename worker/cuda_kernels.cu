// CUDA side of the worker's device code: cuBLAS for the matrix product, our
// own kernel for bias + ReLU. See cuda_kernels.h for the contract.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include "worker/cuda_kernels.h"

namespace {

void SetError(char* error, int error_len, const char* what, const char* detail) {
  if (error != nullptr && error_len > 0) snprintf(error, error_len, "%s: %s", what, detail);
}

__global__ void BiasReluKernel(float* y, const float* b, int rows, int cols, int relu) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long n = static_cast<long long>(rows) * cols;
  if (i >= n) return;
  float v = y[i] + b[i % cols];
  y[i] = (relu && v < 0.0f) ? 0.0f : v;
}

// Frees device buffers on every exit path.
struct DeviceBuffers {
  float* p[4] = {nullptr, nullptr, nullptr, nullptr};
  ~DeviceBuffers() {
    for (float* q : p) {
      if (q != nullptr) cudaFree(q);
    }
  }
};

}  // namespace

extern "C" int pstrain_cuda_device_count(int* count, char* name, int name_len, char* error,
                                         int error_len) {
  *count = 0;
  cudaError_t err = cudaGetDeviceCount(count);
  if (err != cudaSuccess) {
    *count = 0;
    SetError(error, error_len, "cudaGetDeviceCount", cudaGetErrorString(err));
    return static_cast<int>(err);
  }
  if (*count > 0 && name != nullptr && name_len > 0) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      snprintf(name, name_len, "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
               prop.totalGlobalMem / 1073741824.0);
    }
  }
  return 0;
}

extern "C" int pstrain_cuda_dense_forward(const float* x, const float* w, const float* b, int batch,
                                          int in, int out, int relu, float* y, char* error,
                                          int error_len) {
  DeviceBuffers buf;
  const size_t sizes[4] = {sizeof(float) * batch * in, sizeof(float) * in * out,
                           sizeof(float) * out, sizeof(float) * batch * out};
  for (int i = 0; i < 4; ++i) {
    cudaError_t err = cudaMalloc(&buf.p[i], sizes[i]);
    if (err != cudaSuccess) {
      SetError(error, error_len, "cudaMalloc", cudaGetErrorString(err));
      return static_cast<int>(err);
    }
  }
  const float* host[3] = {x, w, b};
  for (int i = 0; i < 3; ++i) {
    cudaError_t err = cudaMemcpy(buf.p[i], host[i], sizes[i], cudaMemcpyHostToDevice);
    if (err != cudaSuccess) {
      SetError(error, error_len, "cudaMemcpy", cudaGetErrorString(err));
      return static_cast<int>(err);
    }
  }
  cublasHandle_t handle;
  cublasStatus_t bst = cublasCreate(&handle);
  if (bst != CUBLAS_STATUS_SUCCESS) {
    SetError(error, error_len, "cublasCreate", cublasGetStatusString(bst));
    return static_cast<int>(bst);
  }
  // Row-major y = x * w is column-major y^T = w^T * x^T: swap the operands.
  const float one = 1.0f, zero = 0.0f;
  bst = cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, out, batch, in, &one, buf.p[1], out, buf.p[0],
                    in, &zero, buf.p[3], out);
  cublasDestroy(handle);
  if (bst != CUBLAS_STATUS_SUCCESS) {
    SetError(error, error_len, "cublasSgemm", cublasGetStatusString(bst));
    return static_cast<int>(bst);
  }
  const long long n = static_cast<long long>(batch) * out;
  const int threads = 256;
  BiasReluKernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads>>>(buf.p[3], buf.p[2],
                                                                                 batch, out, relu);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaMemcpy(y, buf.p[3], sizes[3], cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) {
    SetError(error, error_len, "bias/relu kernel", cudaGetErrorString(err));
    return static_cast<int>(err);
  }
  return 0;
}
