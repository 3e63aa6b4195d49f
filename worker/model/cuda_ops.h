// The C interface of the model library's CUDA code (cuda_ops.cu, compiled by
// nvcc, so it sees no Abseil or protobuf headers). Every operation mirrors
// its CPU twin in cpu_ops.h (same arguments, same math, same row-major
// layout) on device pointers, enqueued on the context's stream; nothing
// blocks except pstrain_cuda_synchronize and the allocation calls.
//
// Every function returns 0 on success; on failure it returns the CUDA or
// cuBLAS error code and writes "call: message" (e.g. "cublasSgemm:
// CUBLAS_STATUS_EXECUTION_FAILED") into err->message. Kernel launches are
// checked with cudaGetLastError, so a bad launch is reported by the call
// that made it; errors raised while a kernel runs surface at the next
// synchronize. Nothing aborts.
//
// A context belongs to one thread at a time (one stream, one cuBLAS handle).
#ifndef PSTRAIN_WORKER_MODEL_CUDA_OPS_H_
#define PSTRAIN_WORKER_MODEL_CUDA_OPS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct PstrainCudaError {
  char message[512];
} PstrainCudaError;

typedef struct PstrainCudaContext PstrainCudaContext;

// Number of CUDA devices; 0 with an error when there is no driver.
int pstrain_cuda_device_count(int* count, PstrainCudaError* err);
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" into name.
int pstrain_cuda_device_name(int device, char* name, int name_len, PstrainCudaError* err);

// Selects `device`, creates a non-blocking stream and a cuBLAS handle bound
// to it (FP32 math: no TF32), and checks that the device runs a kernel.
int pstrain_cuda_create(int device, PstrainCudaContext** ctx, PstrainCudaError* err);
void pstrain_cuda_destroy(PstrainCudaContext* ctx);

// Device memory (cudaMalloc / cudaFree) and pinned host memory
// (cudaHostAlloc / cudaFreeHost).
int pstrain_cuda_malloc(PstrainCudaContext* ctx, size_t bytes, void** ptr, PstrainCudaError* err);
void pstrain_cuda_free(PstrainCudaContext* ctx, void* ptr);
int pstrain_cuda_host_alloc(PstrainCudaContext* ctx, size_t bytes, void** ptr,
                            PstrainCudaError* err);
void pstrain_cuda_host_free(PstrainCudaContext* ctx, void* ptr);
// Bytes of device memory in use by this process's allocations, and the total.
int pstrain_cuda_memory_info(PstrainCudaContext* ctx, size_t* free_bytes, size_t* total_bytes,
                             PstrainCudaError* err);

// Asynchronous copies on the context's stream (host memory should be pinned).
int pstrain_cuda_copy_to_device(PstrainCudaContext* ctx, void* dst, const void* src, size_t bytes,
                                PstrainCudaError* err);
int pstrain_cuda_copy_to_host(PstrainCudaContext* ctx, void* dst, const void* src, size_t bytes,
                              PstrainCudaError* err);
int pstrain_cuda_copy_device(PstrainCudaContext* ctx, void* dst, const void* src, size_t bytes,
                             PstrainCudaError* err);
// rows x cols floats from rows src_ld floats apart to rows dst_ld apart,
// device to device (cudaMemcpy2DAsync).
int pstrain_cuda_copy_matrix(PstrainCudaContext* ctx, const float* src, int src_ld, float* dst,
                             int dst_ld, int rows, int cols, PstrainCudaError* err);
// Waits for everything enqueued on the stream.
int pstrain_cuda_synchronize(PstrainCudaContext* ctx, PstrainCudaError* err);
// Records the context's event `index` (created on first use, 0 <= index <
// 4096) on the stream; pstrain_cuda_event_wait blocks until the stream has
// run everything enqueued before that record (at once for an event never
// recorded).
int pstrain_cuda_event_record(PstrainCudaContext* ctx, int index, PstrainCudaError* err);
int pstrain_cuda_event_wait(PstrainCudaContext* ctx, int index, PstrainCudaError* err);

// The operations of cpu_ops.h, on device pointers.
int pstrain_cuda_gemm(PstrainCudaContext* ctx, int trans_a, int trans_b, int m, int n, int k,
                      float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                      float* c, int ldc, PstrainCudaError* err);
int pstrain_cuda_broadcast_rows(PstrainCudaContext* ctx, const float* row, int rows, int cols,
                                float* out, PstrainCudaError* err);
int pstrain_cuda_sum_rows(PstrainCudaContext* ctx, const float* x, int rows, int cols, float* out,
                          PstrainCudaError* err);
int pstrain_cuda_multiply(PstrainCudaContext* ctx, const float* a, const float* b, int64_t n,
                          float* y, PstrainCudaError* err);
int pstrain_cuda_multiply_add(PstrainCudaContext* ctx, const float* a, const float* b, int64_t n,
                              float* y, PstrainCudaError* err);
int pstrain_cuda_add(PstrainCudaContext* ctx, const float* a, int64_t n, float* y,
                     PstrainCudaError* err);
int pstrain_cuda_relu(PstrainCudaContext* ctx, const float* x, int64_t n, float* y,
                      PstrainCudaError* err);
int pstrain_cuda_relu_grad(PstrainCudaContext* ctx, const float* y, const float* dy, int64_t n,
                           float* dx, PstrainCudaError* err);
int pstrain_cuda_gelu(PstrainCudaContext* ctx, const float* x, int64_t n, float* y,
                      PstrainCudaError* err);
int pstrain_cuda_gelu_grad(PstrainCudaContext* ctx, const float* x, const float* dy, int64_t n,
                           float* dx, PstrainCudaError* err);
int pstrain_cuda_dropout(PstrainCudaContext* ctx, const float* x, int64_t n, float rate,
                         uint64_t seed, float* y, PstrainCudaError* err);
int pstrain_cuda_dropout_grad(PstrainCudaContext* ctx, const float* dy, int64_t n, float rate,
                              uint64_t seed, float* dx, PstrainCudaError* err);
// labels, dlogits, row_loss (double) and predicted are device pointers;
// dlogits, row_loss and predicted may be null.
int pstrain_cuda_softmax_cross_entropy(PstrainCudaContext* ctx, const float* logits,
                                       const int32_t* labels, int rows, int classes, float divisor,
                                       float* dlogits, double* row_loss, int32_t* predicted,
                                       PstrainCudaError* err);
int pstrain_cuda_sigmoid_cross_entropy(PstrainCudaContext* ctx, const float* logits,
                                       const int32_t* labels, int rows, int classes, float divisor,
                                       float* dlogits, double* row_loss, int32_t* predicted,
                                       PstrainCudaError* err);

// DLRM's dot interaction: cpu::PairwiseDots and cpu::PairwiseDotsGrad (same
// arguments, device pointers), summed in the CPU's order without fused
// multiply-adds: the CPU's results bit for bit.
int pstrain_cuda_pairwise_dots(PstrainCudaContext* ctx, const float* t, int batch, int vectors,
                               int dim, float* out, int out_ld, PstrainCudaError* err);
int pstrain_cuda_pairwise_dots_grad(PstrainCudaContext* ctx, const float* t, const float* dout,
                                    int dout_ld, int batch, int vectors, int dim, float* dt,
                                    PstrainCudaError* err);
// Embedding bags: cpu::BagsForward and cpu::BagsBackward (same arguments,
// device pointers), the sums in the CPU's order with no fused multiply-add,
// so the results are the CPU's bit for bit.
int pstrain_cuda_bags_forward(PstrainCudaContext* ctx, const float* rows, const int32_t* row_of,
                              const int32_t* offsets, const float* dense, int batch, int fields,
                              int dim, int dense_dim, int mean, float* x, PstrainCudaError* err);
int pstrain_cuda_bags_backward(PstrainCudaContext* ctx, const float* dx, const int32_t* offsets,
                               const int32_t* occ_start, const int32_t* occ_bag, int unique,
                               int fields, int dim, int dense_dim, int mean, float* row_grads,
                               PstrainCudaError* err);

#ifdef __cplusplus
}
#endif

#endif  // PSTRAIN_WORKER_MODEL_CUDA_OPS_H_
