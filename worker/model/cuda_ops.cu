// The CUDA twins of cpu_ops.h (contract in cuda_ops.h): cuBLAS for the
// matrix products, our own kernels for everything else, all enqueued on the
// context's one stream. Deterministic: no atomics, and every reduction runs
// in a fixed order (one thread per column for SumRows, one thread per row for
// the losses, in the CPU's order), so a step gives the same bits every run.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include <vector>

#include "worker/model/cpu_ops.h"
#include "worker/model/cuda_ops.h"

struct PstrainCudaContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  std::vector<cudaEvent_t> events;  // pstrain_cuda_event_*, created on first use
};

namespace {

constexpr int kThreads = 256;
constexpr long long kMaxBlocks = 65535;

int Fail(PstrainCudaError* err, int code, const char* what, const char* detail) {
  if (err != nullptr) snprintf(err->message, sizeof(err->message), "%s: %s", what, detail);
  return code == 0 ? -1 : code;
}

int CudaCheck(cudaError_t e, PstrainCudaError* err, const char* what) {
  if (e == cudaSuccess) return 0;
  return Fail(err, static_cast<int>(e), what, cudaGetErrorString(e));
}

int BlasCheck(cublasStatus_t s, PstrainCudaError* err, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return 0;
  return Fail(err, static_cast<int>(s), what, cublasGetStatusString(s));
}

// Grid for a grid-stride loop over n elements.
unsigned Blocks(long long n) {
  long long b = (n + kThreads - 1) / kThreads;
  if (b > kMaxBlocks) b = kMaxBlocks;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

int LaunchCheck(PstrainCudaError* err, const char* what) {
  return CudaCheck(cudaGetLastError(), err, what);
}

#define GRID_STRIDE(i, n)                                                                    \
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<long long>(blockDim.x) * gridDim.x)

__global__ void NopKernel() {}

// One thread per element of x: a dense feature, or one column of one bag,
// summed over the bag's ids in order (__fadd_rn / __fmul_rn: no contraction
// into FMAs, so the float rounding is the CPU's).
__global__ void BagsForwardKernel(const float* rows, const int32_t* row_of, const int32_t* offsets,
                                  const float* dense, int batch, int fields, int dim, int dense_dim,
                                  int mean, float* x) {
  const long long width = dense_dim + static_cast<long long>(fields) * dim;
  GRID_STRIDE(i, batch * width) {
    const long long b = i / width;
    const int c = static_cast<int>(i % width);
    if (c < dense_dim) {
      x[i] = dense[b * dense_dim + c];
      continue;
    }
    const int f = (c - dense_dim) / dim, j = (c - dense_dim) % dim;
    const long long bag = b * fields + f;
    const int32_t begin = offsets[bag], end = offsets[bag + 1];
    float acc = 0.0f;
    for (int32_t k = begin; k < end; ++k) {
      acc = __fadd_rn(acc, rows[static_cast<long long>(row_of[k]) * dim + j]);
    }
    if (mean && end - begin > 1)
      acc = __fmul_rn(acc, __fdiv_rn(1.0f, static_cast<float>(end - begin)));
    x[i] = acc;
  }
}

// One thread per element of the row gradients: its row's occurrences in
// increasing order, as the CPU accumulates them.
__global__ void BagsBackwardKernel(const float* dx, const int32_t* offsets,
                                   const int32_t* occ_start, const int32_t* occ_bag, int unique,
                                   int fields, int dim, int dense_dim, int mean, float* row_grads) {
  const long long width = dense_dim + static_cast<long long>(fields) * dim;
  GRID_STRIDE(i, static_cast<long long>(unique) * dim) {
    const long long u = i / dim;
    const int j = static_cast<int>(i % dim);
    float acc = 0.0f;
    for (int32_t t = occ_start[u]; t < occ_start[u + 1]; ++t) {
      const int32_t bag = occ_bag[t];
      const int32_t n = offsets[bag + 1] - offsets[bag];
      const float scale = mean && n > 1 ? __fdiv_rn(1.0f, static_cast<float>(n)) : 1.0f;
      const float g = dx[(bag / fields) * width + dense_dim + (bag % fields) * dim + j];
      acc = __fadd_rn(acc, __fmul_rn(scale, g));
    }
    row_grads[i] = acc;
  }
}

// One thread per example and pair (i > j): the dot in k's order.
__global__ void PairwiseDotsKernel(const float* t, int batch, int vectors, int dim, float* out,
                                   int out_ld) {
  const long long pairs = static_cast<long long>(vectors) * (vectors - 1) / 2;
  GRID_STRIDE(n, batch * pairs) {
    const long long b = n / pairs;
    const int p = static_cast<int>(n % pairs);
    int i = 1;
    while ((i + 1) * i / 2 <= p) ++i;  // the row of pair p: i (i - 1) / 2 <= p < (i + 1) i / 2
    const int j = p - i * (i - 1) / 2;
    const float* v = t + b * vectors * dim;
    float acc = 0.0f;
    for (int k = 0; k < dim; ++k) acc = __fadd_rn(acc, __fmul_rn(v[i * dim + k], v[j * dim + k]));
    out[b * out_ld + p] = acc;
  }
}

// One thread per element of dt: its vector's pairs in increasing j.
__global__ void PairwiseDotsGradKernel(const float* t, const float* dout, int dout_ld, int batch,
                                       int vectors, int dim, float* dt) {
  const long long per = static_cast<long long>(vectors) * dim;
  GRID_STRIDE(n, batch * per) {
    const long long b = n / per;
    const int i = static_cast<int>((n % per) / dim), k = static_cast<int>(n % dim);
    const float* v = t + b * per;
    const float* g = dout + b * dout_ld;
    float acc = 0.0f;
    for (int j = 0; j < vectors; ++j) {
      if (j == i) continue;
      const int p = i > j ? i * (i - 1) / 2 + j : j * (j - 1) / 2 + i;
      acc = __fadd_rn(acc, __fmul_rn(g[p], v[j * dim + k]));
    }
    dt[n] = acc;
  }
}

__global__ void ScaleKernel(float* c, int m, int n, int ldc, float beta) {
  GRID_STRIDE(i, static_cast<long long>(m) * n) {
    const long long r = i / n, col = i % n;
    c[r * ldc + col] *= beta;
  }
}

__global__ void BroadcastRowsKernel(const float* row, int rows, int cols, float* out) {
  GRID_STRIDE(i, static_cast<long long>(rows) * cols) { out[i] = row[i % cols]; }
}

// Column sums, deterministic and without atomics: a block of kSumLanes x 32
// threads takes 32 columns; lane y adds rows y, y + kSumLanes, ... in order,
// and the lanes are then added in a fixed tree. Each warp reads 32
// consecutive floats of one row. The old one-thread-per-column loop (the
// CPU's order, bitwise) ran 16 blocks for 4096 columns on a 132-SM card and
// took 2.9% of a 4096-wide step; this one fills the card.
constexpr int kSumLanes = 32;

__global__ void SumRowsKernel(const float* x, int rows, int cols, float* out) {
  __shared__ float partial[kSumLanes][33];  // 33: no bank conflicts on the column read
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < cols) {
    for (int r = threadIdx.y; r < rows; r += kSumLanes) s += x[static_cast<long long>(r) * cols + c];
  }
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  for (int half = kSumLanes / 2; half > 0; half /= 2) {
    if (threadIdx.y < half) partial[threadIdx.y][threadIdx.x] += partial[threadIdx.y + half][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && c < cols) out[c] = partial[0][threadIdx.x];
}

// Rounded as the CPU's loops (built with -ffp-contract=off): no FMAs.
__global__ void MultiplyKernel(const float* a, const float* b, long long n, float* y) {
  GRID_STRIDE(i, n) { y[i] = __fmul_rn(a[i], b[i]); }
}

__global__ void MultiplyAddKernel(const float* a, const float* b, long long n, float* y) {
  GRID_STRIDE(i, n) { y[i] = __fadd_rn(y[i], __fmul_rn(a[i], b[i])); }
}

__global__ void AddKernel(const float* a, long long n, float* y) {
  GRID_STRIDE(i, n) { y[i] = __fadd_rn(y[i], a[i]); }
}

__global__ void ReluKernel(const float* x, long long n, float* y) {
  GRID_STRIDE(i, n) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; }
}

__global__ void ReluGradKernel(const float* y, const float* dy, long long n, float* dx) {
  GRID_STRIDE(i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

__global__ void GeluKernel(const float* x, long long n, float* y) {
  GRID_STRIDE(i, n) { y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * kInvSqrt2)); }
}

__global__ void GeluGradKernel(const float* x, const float* dy, long long n, float* dx) {
  GRID_STRIDE(i, n) {
    const float v = x[i];
    const float cdf = 0.5f * (1.0f + erff(v * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

__global__ void DropoutKernel(const float* x, long long n, float rate, uint64_t seed, float* y) {
  const float scale = 1.0f / (1.0f - rate);
  GRID_STRIDE(i, n) {
    y[i] = pstrain::cpu::DropoutKeep(seed, static_cast<uint64_t>(i), rate) ? x[i] * scale : 0.0f;
  }
}

// One thread per row, the CPU's loop (cpu::SoftmaxCrossEntropy).
__global__ void SoftmaxXentKernel(const float* logits, const int32_t* labels, int rows, int classes,
                                  float divisor, float* dlogits, double* row_loss,
                                  int32_t* predicted) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* l = logits + static_cast<long long>(r) * classes;
  int arg = 0;
  float max = l[0];
  for (int c = 1; c < classes; ++c) {
    if (l[c] > max) {
      max = l[c];
      arg = c;
    }
  }
  double sum = 0;
  for (int c = 0; c < classes; ++c) sum += exp(static_cast<double>(l[c] - max));
  const double log_sum = log(sum);
  const int label = labels[r];
  if (row_loss != nullptr) row_loss[r] = log_sum - static_cast<double>(l[label] - max);
  if (predicted != nullptr) predicted[r] = arg;
  if (dlogits != nullptr) {
    float* d = dlogits + static_cast<long long>(r) * classes;
    for (int c = 0; c < classes; ++c) {
      d[c] = static_cast<float>(exp(static_cast<double>(l[c] - max) - log_sum)) / divisor;
    }
    d[label] -= 1.0f / divisor;
  }
}

// One thread per row, the CPU's loop (cpu::SigmoidCrossEntropy).
__global__ void SigmoidXentKernel(const float* logits, const int32_t* labels, int rows, int classes,
                                  float divisor, float* dlogits, double* row_loss,
                                  int32_t* predicted) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* l = logits + static_cast<long long>(r) * classes;
  double loss = 0;
  int arg = 0;
  for (int c = 0; c < classes; ++c) {
    const double t =
        classes == 1 ? static_cast<double>(labels[r] != 0) : static_cast<double>(labels[r] == c);
    const double v = l[c];
    loss += fmax(v, 0.0) - v * t + log1p(exp(-fabs(v)));
    if (dlogits != nullptr) {
      const double p = 1.0 / (1.0 + exp(-v));
      dlogits[static_cast<long long>(r) * classes + c] = static_cast<float>(p - t) / divisor;
    }
    if (l[c] > l[arg]) arg = c;
  }
  if (row_loss != nullptr) row_loss[r] = loss;
  if (predicted != nullptr) predicted[r] = classes == 1 ? (l[0] > 0.0f ? 1 : 0) : arg;
}

}  // namespace

extern "C" {

int pstrain_cuda_device_count(int* count, PstrainCudaError* err) {
  *count = 0;
  cudaError_t e = cudaGetDeviceCount(count);
  if (e != cudaSuccess) {
    *count = 0;
    return CudaCheck(e, err, "cudaGetDeviceCount");
  }
  return 0;
}

int pstrain_cuda_device_name(int device, char* name, int name_len, PstrainCudaError* err) {
  cudaDeviceProp prop;
  if (int rc = CudaCheck(cudaGetDeviceProperties(&prop, device), err, "cudaGetDeviceProperties")) {
    return rc;
  }
  if (name != nullptr && name_len > 0) {
    snprintf(name, name_len, "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
             prop.totalGlobalMem / 1073741824.0);
  }
  return 0;
}

void pstrain_cuda_destroy(PstrainCudaContext* ctx) {
  if (ctx == nullptr) return;
  cudaSetDevice(ctx->device);
  for (cudaEvent_t e : ctx->events) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (ctx->blas != nullptr) cublasDestroy(ctx->blas);
  if (ctx->stream != nullptr) cudaStreamDestroy(ctx->stream);
  delete ctx;
}

int pstrain_cuda_create(int device, PstrainCudaContext** out, PstrainCudaError* err) {
  *out = nullptr;
  PstrainCudaContext* ctx = new PstrainCudaContext;
  ctx->device = device;
  int rc = CudaCheck(cudaSetDevice(device), err, "cudaSetDevice");
  if (rc == 0) {
    rc = CudaCheck(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking), err,
                   "cudaStreamCreateWithFlags");
  }
  if (rc == 0) rc = BlasCheck(cublasCreate(&ctx->blas), err, "cublasCreate");
  if (rc == 0) rc = BlasCheck(cublasSetStream(ctx->blas, ctx->stream), err, "cublasSetStream");
  // Plain FP32: no TF32 tensor-core rounding, so results match the CPU closely.
  if (rc == 0) {
    rc = BlasCheck(cublasSetMathMode(ctx->blas, CUBLAS_DEFAULT_MATH), err, "cublasSetMathMode");
  }
  if (rc == 0) {
    NopKernel<<<1, 1, 0, ctx->stream>>>();
    rc = LaunchCheck(err, "probe kernel");
  }
  if (rc == 0) rc = CudaCheck(cudaStreamSynchronize(ctx->stream), err, "probe kernel");
  if (rc != 0) {
    pstrain_cuda_destroy(ctx);
    return rc;
  }
  *out = ctx;
  return 0;
}

int pstrain_cuda_malloc(PstrainCudaContext* ctx, size_t bytes, void** ptr, PstrainCudaError* err) {
  *ptr = nullptr;
  if (int rc = CudaCheck(cudaSetDevice(ctx->device), err, "cudaSetDevice")) return rc;
  cudaError_t e = cudaMalloc(ptr, bytes);
  if (e != cudaSuccess) {
    *ptr = nullptr;
    char what[64];
    snprintf(what, sizeof(what), "cudaMalloc(%zu bytes)", bytes);
    return CudaCheck(e, err, what);
  }
  return 0;
}

void pstrain_cuda_free(PstrainCudaContext* ctx, void* ptr) {
  if (ptr == nullptr) return;
  if (ctx != nullptr) cudaSetDevice(ctx->device);
  cudaFree(ptr);
}

int pstrain_cuda_host_alloc(PstrainCudaContext* ctx, size_t bytes, void** ptr,
                            PstrainCudaError* err) {
  *ptr = nullptr;
  if (int rc = CudaCheck(cudaSetDevice(ctx->device), err, "cudaSetDevice")) return rc;
  cudaError_t e = cudaHostAlloc(ptr, bytes, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    *ptr = nullptr;
    char what[64];
    snprintf(what, sizeof(what), "cudaHostAlloc(%zu bytes)", bytes);
    return CudaCheck(e, err, what);
  }
  return 0;
}

void pstrain_cuda_host_free(PstrainCudaContext* ctx, void* ptr) {
  (void)ctx;
  if (ptr != nullptr) cudaFreeHost(ptr);
}

int pstrain_cuda_memory_info(PstrainCudaContext* ctx, size_t* free_bytes, size_t* total_bytes,
                             PstrainCudaError* err) {
  if (int rc = CudaCheck(cudaSetDevice(ctx->device), err, "cudaSetDevice")) return rc;
  return CudaCheck(cudaMemGetInfo(free_bytes, total_bytes), err, "cudaMemGetInfo");
}

int pstrain_cuda_copy_to_device(PstrainCudaContext* ctx, void* dst, const void* src, size_t bytes,
                                PstrainCudaError* err) {
  if (bytes == 0) return 0;
  return CudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream), err,
                   "cudaMemcpyAsync(host to device)");
}

int pstrain_cuda_copy_to_host(PstrainCudaContext* ctx, void* dst, const void* src, size_t bytes,
                              PstrainCudaError* err) {
  if (bytes == 0) return 0;
  return CudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx->stream), err,
                   "cudaMemcpyAsync(device to host)");
}

int pstrain_cuda_copy_device(PstrainCudaContext* ctx, void* dst, const void* src, size_t bytes,
                             PstrainCudaError* err) {
  if (bytes == 0 || dst == src) return 0;
  return CudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream), err,
                   "cudaMemcpyAsync(device to device)");
}

int pstrain_cuda_copy_matrix(PstrainCudaContext* ctx, const float* src, int src_ld, float* dst,
                             int dst_ld, int rows, int cols, PstrainCudaError* err) {
  if (rows <= 0 || cols <= 0) return 0;
  if (src_ld < cols || dst_ld < cols) {
    return Fail(err, -1, "pstrain_cuda_copy_matrix", "a leading dimension below the columns");
  }
  return CudaCheck(cudaMemcpy2DAsync(dst, sizeof(float) * dst_ld, src, sizeof(float) * src_ld,
                                     sizeof(float) * cols, rows, cudaMemcpyDeviceToDevice,
                                     ctx->stream),
                   err, "cudaMemcpy2DAsync(device to device)");
}

int pstrain_cuda_pairwise_dots(PstrainCudaContext* ctx, const float* t, int batch, int vectors,
                               int dim, float* out, int out_ld, PstrainCudaError* err) {
  const long long n = static_cast<long long>(batch) * vectors * (vectors - 1) / 2;
  if (n <= 0) return 0;
  PairwiseDotsKernel<<<Blocks(n), kThreads, 0, ctx->stream>>>(t, batch, vectors, dim, out, out_ld);
  return LaunchCheck(err, "pairwise dots kernel");
}

int pstrain_cuda_pairwise_dots_grad(PstrainCudaContext* ctx, const float* t, const float* dout,
                                    int dout_ld, int batch, int vectors, int dim, float* dt,
                                    PstrainCudaError* err) {
  const long long n = static_cast<long long>(batch) * vectors * dim;
  if (n <= 0) return 0;
  PairwiseDotsGradKernel<<<Blocks(n), kThreads, 0, ctx->stream>>>(t, dout, dout_ld, batch,
                                                                  vectors, dim, dt);
  return LaunchCheck(err, "pairwise dots gradient kernel");
}

int pstrain_cuda_bags_forward(PstrainCudaContext* ctx, const float* rows, const int32_t* row_of,
                              const int32_t* offsets, const float* dense, int batch, int fields,
                              int dim, int dense_dim, int mean, float* x, PstrainCudaError* err) {
  const long long n =
      static_cast<long long>(batch) * (dense_dim + static_cast<long long>(fields) * dim);
  if (n <= 0) return 0;
  BagsForwardKernel<<<Blocks(n), kThreads, 0, ctx->stream>>>(rows, row_of, offsets, dense, batch,
                                                             fields, dim, dense_dim, mean, x);
  return LaunchCheck(err, "bags forward kernel");
}

int pstrain_cuda_bags_backward(PstrainCudaContext* ctx, const float* dx, const int32_t* offsets,
                               const int32_t* occ_start, const int32_t* occ_bag, int unique,
                               int fields, int dim, int dense_dim, int mean, float* row_grads,
                               PstrainCudaError* err) {
  const long long n = static_cast<long long>(unique) * dim;
  if (n <= 0) return 0;
  BagsBackwardKernel<<<Blocks(n), kThreads, 0, ctx->stream>>>(
      dx, offsets, occ_start, occ_bag, unique, fields, dim, dense_dim, mean, row_grads);
  return LaunchCheck(err, "bags backward kernel");
}

int pstrain_cuda_synchronize(PstrainCudaContext* ctx, PstrainCudaError* err) {
  return CudaCheck(cudaStreamSynchronize(ctx->stream), err, "cudaStreamSynchronize");
}

int pstrain_cuda_event_record(PstrainCudaContext* ctx, int index, PstrainCudaError* err) {
  if (index < 0 || index >= 4096) {
    return Fail(err, -1, "pstrain_cuda_event_record", "event index out of [0, 4096)");
  }
  if (static_cast<size_t>(index) >= ctx->events.size()) ctx->events.resize(index + 1, nullptr);
  if (ctx->events[index] == nullptr) {
    // An event belongs to the device current when it is made: the stream's.
    if (int rc = CudaCheck(cudaSetDevice(ctx->device), err, "cudaSetDevice")) return rc;
    // No timing: the lightest kind. Waiting on it spins, as
    // cudaStreamSynchronize does (no cudaEventBlockingSync: a layer's wait is
    // short, and waking from a sleep would add to it).
    if (int rc = CudaCheck(cudaEventCreateWithFlags(&ctx->events[index], cudaEventDisableTiming),
                           err, "cudaEventCreateWithFlags")) {
      ctx->events[index] = nullptr;
      return rc;
    }
  }
  return CudaCheck(cudaEventRecord(ctx->events[index], ctx->stream), err, "cudaEventRecord");
}

int pstrain_cuda_event_wait(PstrainCudaContext* ctx, int index, PstrainCudaError* err) {
  if (index < 0 || static_cast<size_t>(index) >= ctx->events.size() ||
      ctx->events[index] == nullptr) {
    return 0;  // never recorded: nothing to wait for
  }
  return CudaCheck(cudaEventSynchronize(ctx->events[index]), err, "cudaEventSynchronize");
}

// Row-major C[m, n] is column-major C^T[n, m], and C^T = op(B)^T op(A)^T: so
// cuBLAS computes with B first, (n, m, k) as its (m, n, k), and the same
// leading dimensions; each operand's transpose flag carries over unchanged.
int pstrain_cuda_gemm(PstrainCudaContext* ctx, int trans_a, int trans_b, int m, int n, int k,
                      float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                      float* c, int ldc, PstrainCudaError* err) {
  if (m <= 0 || n <= 0) return 0;
  if (k <= 0) {
    if (beta == 1.0f) return 0;
    ScaleKernel<<<Blocks(static_cast<long long>(m) * n), kThreads, 0, ctx->stream>>>(c, m, n, ldc,
                                                                                     beta);
    return LaunchCheck(err, "gemm scale kernel");
  }
  return BlasCheck(cublasSgemm(ctx->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                               trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda,
                               &beta, c, ldc),
                   err, "cublasSgemm");
}

int pstrain_cuda_broadcast_rows(PstrainCudaContext* ctx, const float* row, int rows, int cols,
                                float* out, PstrainCudaError* err) {
  const long long n = static_cast<long long>(rows) * cols;
  if (n <= 0) return 0;
  BroadcastRowsKernel<<<Blocks(n), kThreads, 0, ctx->stream>>>(row, rows, cols, out);
  return LaunchCheck(err, "broadcast kernel");
}

int pstrain_cuda_sum_rows(PstrainCudaContext* ctx, const float* x, int rows, int cols, float* out,
                          PstrainCudaError* err) {
  if (cols <= 0) return 0;
  SumRowsKernel<<<(cols + 31) / 32, dim3(32, kSumLanes), 0, ctx->stream>>>(x, rows, cols, out);
  return LaunchCheck(err, "sum-rows kernel");
}

int pstrain_cuda_multiply(PstrainCudaContext* ctx, const float* a, const float* b, int64_t n,
                          float* y, PstrainCudaError* err) {
  if (n <= 0) return 0;
  MultiplyKernel<<<Blocks(n), kThreads, 0, ctx->stream>>>(a, b, n, y);
  return LaunchCheck(err, "multiply kernel");
}

int pstrain_cuda_multiply_add(PstrainCudaContext* ctx, const float* a, const float* b, int64_t n,
                              float* y, PstrainCudaError* err) {
  if (n <= 0) return 0;
  MultiplyAddKernel<<<Blocks(n), kThreads, 0, ctx->stream>>>(a, b, n, y);
  return LaunchCheck(err, "multiply-add kernel");
}

int pstrain_cuda_add(PstrainCudaContext* ctx, const float* a, int64_t n, float* y,
                     PstrainCudaError* err) {
  if (n <= 0) return 0;
  AddKernel<<<Blocks(n), kThreads, 0, ctx->stream>>>(a, n, y);
  return LaunchCheck(err, "add kernel");
}

int pstrain_cuda_relu(PstrainCudaContext* ctx, const float* x, int64_t n, float* y,
                      PstrainCudaError* err) {
  if (n <= 0) return 0;
  ReluKernel<<<Blocks(n), kThreads, 0, ctx->stream>>>(x, n, y);
  return LaunchCheck(err, "relu kernel");
}

int pstrain_cuda_relu_grad(PstrainCudaContext* ctx, const float* y, const float* dy, int64_t n,
                           float* dx, PstrainCudaError* err) {
  if (n <= 0) return 0;
  ReluGradKernel<<<Blocks(n), kThreads, 0, ctx->stream>>>(y, dy, n, dx);
  return LaunchCheck(err, "relu gradient kernel");
}

int pstrain_cuda_gelu(PstrainCudaContext* ctx, const float* x, int64_t n, float* y,
                      PstrainCudaError* err) {
  if (n <= 0) return 0;
  GeluKernel<<<Blocks(n), kThreads, 0, ctx->stream>>>(x, n, y);
  return LaunchCheck(err, "gelu kernel");
}

int pstrain_cuda_gelu_grad(PstrainCudaContext* ctx, const float* x, const float* dy, int64_t n,
                           float* dx, PstrainCudaError* err) {
  if (n <= 0) return 0;
  GeluGradKernel<<<Blocks(n), kThreads, 0, ctx->stream>>>(x, dy, n, dx);
  return LaunchCheck(err, "gelu gradient kernel");
}

int pstrain_cuda_dropout(PstrainCudaContext* ctx, const float* x, int64_t n, float rate,
                         uint64_t seed, float* y, PstrainCudaError* err) {
  if (n <= 0) return 0;
  DropoutKernel<<<Blocks(n), kThreads, 0, ctx->stream>>>(x, n, rate, seed, y);
  return LaunchCheck(err, "dropout kernel");
}

int pstrain_cuda_dropout_grad(PstrainCudaContext* ctx, const float* dy, int64_t n, float rate,
                              uint64_t seed, float* dx, PstrainCudaError* err) {
  if (n <= 0) return 0;
  DropoutKernel<<<Blocks(n), kThreads, 0, ctx->stream>>>(dy, n, rate, seed, dx);
  return LaunchCheck(err, "dropout gradient kernel");
}

int pstrain_cuda_softmax_cross_entropy(PstrainCudaContext* ctx, const float* logits,
                                       const int32_t* labels, int rows, int classes, float divisor,
                                       float* dlogits, double* row_loss, int32_t* predicted,
                                       PstrainCudaError* err) {
  if (rows <= 0) return 0;
  SoftmaxXentKernel<<<(rows + 127) / 128, 128, 0, ctx->stream>>>(
      logits, labels, rows, classes, divisor, dlogits, row_loss, predicted);
  return LaunchCheck(err, "softmax cross-entropy kernel");
}

int pstrain_cuda_sigmoid_cross_entropy(PstrainCudaContext* ctx, const float* logits,
                                       const int32_t* labels, int rows, int classes, float divisor,
                                       float* dlogits, double* row_loss, int32_t* predicted,
                                       PstrainCudaError* err) {
  if (rows <= 0) return 0;
  SigmoidXentKernel<<<(rows + 127) / 128, 128, 0, ctx->stream>>>(
      logits, labels, rows, classes, divisor, dlogits, row_loss, predicted);
  return LaunchCheck(err, "sigmoid cross-entropy kernel");
}

}  // extern "C"
