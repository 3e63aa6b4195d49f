// The CPU backend: host memory and the functions of cpu_ops.h. Copies are
// memcpy; nothing is asynchronous, so Synchronize() has nothing to wait for.
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "worker/model/backend.h"
#include "worker/model/cpu_ops.h"

namespace pstrain {
namespace {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(int threads) : threads_(threads < 1 ? 1 : threads) {
    cpu::SetBlasThreads(threads_);
  }

  std::string Describe() const override {
    return absl::StrCat("cpu (OpenBLAS, ", threads_, threads_ == 1 ? " thread)" : " threads)");
  }
  bool host_memory() const override { return true; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    // 64-byte alignment for vector loads; aligned_alloc wants a multiple.
    const size_t rounded = ((bytes == 0 ? 1 : bytes) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    }
    allocated_ += rounded;
    sizes_[p] = rounded;
    return p;
  }
  void Free(void* ptr) override {
    if (ptr == nullptr) return;
    auto it = sizes_.find(ptr);
    if (it != sizes_.end()) {
      allocated_ -= it->second;
      sizes_.erase(it);
    }
    std::free(ptr);
  }
  absl::StatusOr<void*> AllocateHost(size_t bytes) override { return Allocate(bytes); }
  void FreeHost(void* ptr) override { Free(ptr); }
  absl::Status MemoryInfo(size_t* used_bytes, size_t* total_bytes) override {
    *used_bytes = allocated_;
    *total_bytes = 0;
    return absl::OkStatus();
  }

  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes);
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes);
  }
  absl::Status CopyMatrix(const float* src, int src_ld, float* dst, int dst_ld, int rows,
                          int cols) override {
    for (int r = 0; r < rows; ++r) {
      std::memcpy(dst + static_cast<size_t>(r) * dst_ld, src + static_cast<size_t>(r) * src_ld,
                  sizeof(float) * cols);
    }
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status RecordEvent(int) override { return absl::OkStatus(); }
  absl::Status WaitEvent(int) override { return absl::OkStatus(); }

  absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    cpu::Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return absl::OkStatus();
  }
  absl::Status BroadcastRows(const float* row, int rows, int cols, float* out) override {
    cpu::BroadcastRows(row, rows, cols, out);
    return absl::OkStatus();
  }
  absl::Status SumRows(const float* x, int rows, int cols, float* out) override {
    cpu::SumRows(x, rows, cols, out);
    return absl::OkStatus();
  }
  absl::Status Multiply(const float* a, const float* b, int64_t n, float* y) override {
    cpu::Multiply(a, b, n, y);
    return absl::OkStatus();
  }
  absl::Status MultiplyAdd(const float* a, const float* b, int64_t n, float* y) override {
    cpu::MultiplyAdd(a, b, n, y);
    return absl::OkStatus();
  }
  absl::Status Add(const float* a, int64_t n, float* y) override {
    cpu::Add(a, n, y);
    return absl::OkStatus();
  }
  absl::Status Relu(const float* x, int64_t n, float* y) override {
    cpu::Relu(x, n, y);
    return absl::OkStatus();
  }
  absl::Status ReluGrad(const float* y, const float* dy, int64_t n, float* dx) override {
    cpu::ReluGrad(y, dy, n, dx);
    return absl::OkStatus();
  }
  absl::Status Gelu(const float* x, int64_t n, float* y) override {
    cpu::Gelu(x, n, y);
    return absl::OkStatus();
  }
  absl::Status GeluGrad(const float* x, const float* dy, int64_t n, float* dx) override {
    cpu::GeluGrad(x, dy, n, dx);
    return absl::OkStatus();
  }
  absl::Status Dropout(const float* x, int64_t n, float rate, uint64_t seed, float* y) override {
    cpu::Dropout(x, n, rate, seed, y);
    return absl::OkStatus();
  }
  absl::Status DropoutGrad(const float* dy, int64_t n, float rate, uint64_t seed,
                           float* dx) override {
    cpu::DropoutGrad(dy, n, rate, seed, dx);
    return absl::OkStatus();
  }
  absl::Status SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                   int classes, float divisor, float* dlogits, double* row_loss,
                                   int32_t* predicted) override {
    cpu::SoftmaxCrossEntropy(logits, labels, rows, classes, divisor, dlogits, row_loss, predicted);
    return absl::OkStatus();
  }
  absl::Status SigmoidCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                   int classes, float divisor, float* dlogits, double* row_loss,
                                   int32_t* predicted) override {
    cpu::SigmoidCrossEntropy(logits, labels, rows, classes, divisor, dlogits, row_loss, predicted);
    return absl::OkStatus();
  }
  absl::Status PairwiseDots(const float* t, int batch, int vectors, int dim, float* out,
                            int out_ld) override {
    cpu::PairwiseDots(t, batch, vectors, dim, out, out_ld);
    return absl::OkStatus();
  }
  absl::Status PairwiseDotsGrad(const float* t, const float* dout, int dout_ld, int batch,
                                int vectors, int dim, float* dt) override {
    cpu::PairwiseDotsGrad(t, dout, dout_ld, batch, vectors, dim, dt);
    return absl::OkStatus();
  }
  absl::Status BagsForward(const float* rows, const int32_t* row_of, const int32_t* offsets,
                           const float* dense, int batch, int fields, int dim, int dense_dim,
                           bool mean, float* x) override {
    cpu::BagsForward(rows, row_of, offsets, dense, batch, fields, dim, dense_dim, mean, x);
    return absl::OkStatus();
  }
  absl::Status BagsBackward(const float* dx, const int32_t* offsets, const int32_t* occ_start,
                            const int32_t* occ_bag, int unique, int fields, int dim, int dense_dim,
                            bool mean, float* row_grads) override {
    cpu::BagsBackward(dx, offsets, occ_start, occ_bag, unique, fields, dim, dense_dim, mean,
                      row_grads);
    return absl::OkStatus();
  }

 private:
  static absl::Status Copy(void* dst, const void* src, size_t bytes) {
    if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }

  const int threads_;
  size_t allocated_ = 0;                     // bytes live
  std::unordered_map<void*, size_t> sizes_;  // live allocations
};

}  // namespace

std::unique_ptr<Backend> NewCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace pstrain
