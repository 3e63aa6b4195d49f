// The C interface of the CUDA code (compiled by nvcc, so it sees no Abseil or
// protobuf headers). Each function returns 0 on success, or a CUDA/cuBLAS
// error code with a message written to `error` (NUL-terminated, truncated to
// `error_len`). Thread-safe: no global state beyond the CUDA runtime's.
#ifndef PSTRAIN_WORKER_CUDA_KERNELS_H_
#define PSTRAIN_WORKER_CUDA_KERNELS_H_

#ifdef __cplusplus
extern "C" {
#endif

// Number of usable CUDA devices; the name of device 0 goes to `name`.
int pstrain_cuda_device_count(int* count, char* name, int name_len, char* error, int error_len);

// y[batch, out] = x[batch, in] * w[in, out] + b[out], then ReLU when `relu`.
// Host pointers in and out; device buffers are allocated per call (a test
// path; the training path of issue 4 keeps them resident).
int pstrain_cuda_dense_forward(const float* x, const float* w, const float* b, int batch, int in,
                               int out, int relu, float* y, char* error, int error_len);

#ifdef __cplusplus
}
#endif

#endif  // PSTRAIN_WORKER_CUDA_KERNELS_H_
