// The CUDA backend: a thin C++ face over the C interface of cuda_ops.h,
// turning its error codes into Status. In a CPU-only build (no nvcc, or
// --config=cpu_only) every entry point says so with FAILED_PRECONDITION.
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/model/backend.h"

#ifdef PSTRAIN_HAVE_CUDA
#include "worker/model/cuda_ops.h"
#endif

namespace pstrain {

#ifdef PSTRAIN_HAVE_CUDA
namespace {

// CUDA's out-of-memory codes (cudaErrorMemoryAllocation = 2,
// CUBLAS_STATUS_ALLOC_FAILED = 3) become RESOURCE_EXHAUSTED; everything else INTERNAL.
absl::Status FromCuda(int rc, const PstrainCudaError& err, bool allocation = false) {
  if (rc == 0) return absl::OkStatus();
  if (allocation) return absl::ResourceExhaustedError(err.message);
  return absl::InternalError(err.message);
}

class CudaBackend : public Backend {
 public:
  CudaBackend(int device, PstrainCudaContext* ctx, std::string name)
      : device_(device), ctx_(ctx), name_(std::move(name)) {}
  ~CudaBackend() override { pstrain_cuda_destroy(ctx_); }

  std::string Describe() const override { return absl::StrCat("cuda:", device_, " (", name_, ")"); }
  bool host_memory() const override { return false; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    PstrainCudaError err{};
    void* p = nullptr;
    RETURN_IF_ERROR(
        FromCuda(pstrain_cuda_malloc(ctx_, bytes == 0 ? 1 : bytes, &p, &err), err, true));
    return p;
  }
  void Free(void* ptr) override { pstrain_cuda_free(ctx_, ptr); }
  absl::StatusOr<void*> AllocateHost(size_t bytes) override {
    PstrainCudaError err{};
    void* p = nullptr;
    RETURN_IF_ERROR(
        FromCuda(pstrain_cuda_host_alloc(ctx_, bytes == 0 ? 1 : bytes, &p, &err), err, true));
    return p;
  }
  void FreeHost(void* ptr) override { pstrain_cuda_host_free(ctx_, ptr); }
  absl::Status MemoryInfo(size_t* used_bytes, size_t* total_bytes) override {
    PstrainCudaError err{};
    size_t free_bytes = 0;
    RETURN_IF_ERROR(FromCuda(pstrain_cuda_memory_info(ctx_, &free_bytes, total_bytes, &err), err));
    *used_bytes = *total_bytes - free_bytes;
    return absl::OkStatus();
  }

  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    return Call(pstrain_cuda_copy_to_device, dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    return Call(pstrain_cuda_copy_to_host, dst, src, bytes);
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    return Call(pstrain_cuda_copy_device, dst, src, bytes);
  }
  absl::Status CopyMatrix(const float* src, int src_ld, float* dst, int dst_ld, int rows,
                          int cols) override {
    return Call(pstrain_cuda_copy_matrix, src, src_ld, dst, dst_ld, rows, cols);
  }
  absl::Status Synchronize() override { return Call(pstrain_cuda_synchronize); }
  absl::Status RecordEvent(int index) override { return Call(pstrain_cuda_event_record, index); }
  absl::Status WaitEvent(int index) override { return Call(pstrain_cuda_event_wait, index); }

  absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    return Call(pstrain_cuda_gemm, trans_a ? 1 : 0, trans_b ? 1 : 0, m, n, k, alpha, a, lda, b, ldb,
                beta, c, ldc);
  }
  absl::Status BroadcastRows(const float* row, int rows, int cols, float* out) override {
    return Call(pstrain_cuda_broadcast_rows, row, rows, cols, out);
  }
  absl::Status SumRows(const float* x, int rows, int cols, float* out) override {
    return Call(pstrain_cuda_sum_rows, x, rows, cols, out);
  }
  absl::Status Multiply(const float* a, const float* b, int64_t n, float* y) override {
    return Call(pstrain_cuda_multiply, a, b, n, y);
  }
  absl::Status MultiplyAdd(const float* a, const float* b, int64_t n, float* y) override {
    return Call(pstrain_cuda_multiply_add, a, b, n, y);
  }
  absl::Status Add(const float* a, int64_t n, float* y) override {
    return Call(pstrain_cuda_add, a, n, y);
  }
  absl::Status Relu(const float* x, int64_t n, float* y) override {
    return Call(pstrain_cuda_relu, x, n, y);
  }
  absl::Status ReluGrad(const float* y, const float* dy, int64_t n, float* dx) override {
    return Call(pstrain_cuda_relu_grad, y, dy, n, dx);
  }
  absl::Status Gelu(const float* x, int64_t n, float* y) override {
    return Call(pstrain_cuda_gelu, x, n, y);
  }
  absl::Status GeluGrad(const float* x, const float* dy, int64_t n, float* dx) override {
    return Call(pstrain_cuda_gelu_grad, x, dy, n, dx);
  }
  absl::Status Dropout(const float* x, int64_t n, float rate, uint64_t seed, float* y) override {
    return Call(pstrain_cuda_dropout, x, n, rate, seed, y);
  }
  absl::Status DropoutGrad(const float* dy, int64_t n, float rate, uint64_t seed,
                           float* dx) override {
    return Call(pstrain_cuda_dropout_grad, dy, n, rate, seed, dx);
  }
  absl::Status SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                   int classes, float divisor, float* dlogits, double* row_loss,
                                   int32_t* predicted) override {
    return Call(pstrain_cuda_softmax_cross_entropy, logits, labels, rows, classes, divisor, dlogits,
                row_loss, predicted);
  }
  absl::Status SigmoidCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                   int classes, float divisor, float* dlogits, double* row_loss,
                                   int32_t* predicted) override {
    return Call(pstrain_cuda_sigmoid_cross_entropy, logits, labels, rows, classes, divisor, dlogits,
                row_loss, predicted);
  }
  absl::Status PairwiseDots(const float* t, int batch, int vectors, int dim, float* out,
                            int out_ld) override {
    return Call(pstrain_cuda_pairwise_dots, t, batch, vectors, dim, out, out_ld);
  }
  absl::Status PairwiseDotsGrad(const float* t, const float* dout, int dout_ld, int batch,
                                int vectors, int dim, float* dt) override {
    return Call(pstrain_cuda_pairwise_dots_grad, t, dout, dout_ld, batch, vectors, dim, dt);
  }
  absl::Status BagsForward(const float* rows, const int32_t* row_of, const int32_t* offsets,
                           const float* dense, int batch, int fields, int dim, int dense_dim,
                           bool mean, float* x) override {
    return Call(pstrain_cuda_bags_forward, rows, row_of, offsets, dense, batch, fields, dim,
                dense_dim, mean ? 1 : 0, x);
  }
  absl::Status BagsBackward(const float* dx, const int32_t* offsets, const int32_t* occ_start,
                            const int32_t* occ_bag, int unique, int fields, int dim, int dense_dim,
                            bool mean, float* row_grads) override {
    return Call(pstrain_cuda_bags_backward, dx, offsets, occ_start, occ_bag, unique, fields, dim,
                dense_dim, mean ? 1 : 0, row_grads);
  }

 private:
  // Calls fn(ctx_, args..., &err) and converts its result.
  template <typename Fn, typename... Args>
  absl::Status Call(Fn fn, Args... args) {
    PstrainCudaError err{};
    return FromCuda(fn(ctx_, args..., &err), err);
  }

  const int device_;
  PstrainCudaContext* const ctx_;
  const std::string name_;
};

}  // namespace

bool BuiltWithCuda() { return true; }

absl::StatusOr<int> CudaDeviceCount() {
  PstrainCudaError err{};
  int count = 0;
  if (pstrain_cuda_device_count(&count, &err) != 0) {
    return absl::FailedPreconditionError(err.message);
  }
  return count;
}

absl::StatusOr<std::string> CudaDeviceName(int device) {
  PstrainCudaError err{};
  char name[256] = {0};
  if (pstrain_cuda_device_name(device, name, sizeof(name), &err) != 0) {
    return absl::FailedPreconditionError(err.message);
  }
  return std::string(name);
}

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return count.status();
  if (device < 0 || device >= *count) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", device, " does not exist (", *count, " CUDA device(s) visible)"));
  }
  std::string name = CudaDeviceName(device).value_or("unknown device");
  PstrainCudaError err{};
  PstrainCudaContext* ctx = nullptr;
  if (pstrain_cuda_create(device, &ctx, &err) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cuda:", device, ": ", err.message));
  }
  return std::unique_ptr<Backend>(new CudaBackend(device, ctx, std::move(name)));
}

#else  // CPU-only build

namespace {
constexpr char kNoCuda[] = "this build has no CUDA support (CPU-only build)";
}  // namespace

bool BuiltWithCuda() { return false; }
absl::StatusOr<int> CudaDeviceCount() { return absl::FailedPreconditionError(kNoCuda); }
absl::StatusOr<std::string> CudaDeviceName(int) { return absl::FailedPreconditionError(kNoCuda); }
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int) {
  return absl::FailedPreconditionError(kNoCuda);
}

#endif

}  // namespace pstrain
