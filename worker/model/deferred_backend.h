// A test backend: a device as the model sees one. Test-only.
#ifndef PSTRAIN_WORKER_MODEL_DEFERRED_BACKEND_H_
#define PSTRAIN_WORKER_MODEL_DEFERRED_BACKEND_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "worker/model/backend.h"

namespace pstrain::testing {

// A device as the model sees one: memory that is not the host's, and every
// operation enqueued, run only when Synchronize or a WaitEvent reaches it
// (on the CPU's code, so the numbers are the CPU backend's, bit for bit).
// A copy to the host is therefore complete only after the mark behind it.
class DeferredBackend : public Backend {
 public:
  DeferredBackend() : cpu_(NewCpuBackend(1)) {}

  std::string Describe() const override { return "deferred cpu"; }
  bool host_memory() const override { return false; }
  absl::StatusOr<void*> Allocate(size_t bytes) override { return cpu_->Allocate(bytes); }
  void Free(void* ptr) override { cpu_->Free(ptr); }
  absl::StatusOr<void*> AllocateHost(size_t bytes) override { return cpu_->AllocateHost(bytes); }
  void FreeHost(void* ptr) override { cpu_->FreeHost(ptr); }
  absl::Status MemoryInfo(size_t* used, size_t* total) override {
    return cpu_->MemoryInfo(used, total);
  }

  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    return Enqueue([=] { return cpu_->CopyToDevice(dst, src, bytes); });
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    download_bytes_ += bytes;
    return Enqueue([=] { return cpu_->CopyToHost(dst, src, bytes); });
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    return Enqueue([=] { return cpu_->CopyOnDevice(dst, src, bytes); });
  }
  absl::Status CopyMatrix(const float* src, int src_ld, float* dst, int dst_ld, int rows,
                          int cols) override {
    return Enqueue([=] { return cpu_->CopyMatrix(src, src_ld, dst, dst_ld, rows, cols); });
  }
  absl::Status Synchronize() override { return RunUntil(queue_.size()); }
  absl::Status RecordEvent(int index) override {
    marks_[index] = ran_ + queue_.size();  // reached once every op so far has run
    return absl::OkStatus();
  }
  absl::Status WaitEvent(int index) override {
    ++waits_;
    auto it = marks_.find(index);
    if (it == marks_.end()) return absl::OkStatus();
    const size_t target = it->second;
    marks_.erase(it);
    return RunUntil(target > ran_ ? target - ran_ : 0);
  }

  absl::Status Gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                    const float* b, int ldb, float beta, float* c, int ldc) override {
    return Enqueue(
        [=] { return cpu_->Gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
  }
  absl::Status BroadcastRows(const float* row, int rows, int cols, float* out) override {
    return Enqueue([=] { return cpu_->BroadcastRows(row, rows, cols, out); });
  }
  absl::Status SumRows(const float* x, int rows, int cols, float* out) override {
    return Enqueue([=] { return cpu_->SumRows(x, rows, cols, out); });
  }
  absl::Status Multiply(const float* a, const float* b, int64_t n, float* y) override {
    return Enqueue([=] { return cpu_->Multiply(a, b, n, y); });
  }
  absl::Status MultiplyAdd(const float* a, const float* b, int64_t n, float* y) override {
    return Enqueue([=] { return cpu_->MultiplyAdd(a, b, n, y); });
  }
  absl::Status Add(const float* a, int64_t n, float* y) override {
    return Enqueue([=] { return cpu_->Add(a, n, y); });
  }
  absl::Status Relu(const float* x, int64_t n, float* y) override {
    return Enqueue([=] { return cpu_->Relu(x, n, y); });
  }
  absl::Status ReluGrad(const float* y, const float* dy, int64_t n, float* dx) override {
    return Enqueue([=] { return cpu_->ReluGrad(y, dy, n, dx); });
  }
  absl::Status Gelu(const float* x, int64_t n, float* y) override {
    return Enqueue([=] { return cpu_->Gelu(x, n, y); });
  }
  absl::Status GeluGrad(const float* x, const float* dy, int64_t n, float* dx) override {
    return Enqueue([=] { return cpu_->GeluGrad(x, dy, n, dx); });
  }
  absl::Status Dropout(const float* x, int64_t n, float rate, uint64_t seed, float* y) override {
    return Enqueue([=] { return cpu_->Dropout(x, n, rate, seed, y); });
  }
  absl::Status DropoutGrad(const float* dy, int64_t n, float rate, uint64_t seed,
                           float* dx) override {
    return Enqueue([=] { return cpu_->DropoutGrad(dy, n, rate, seed, dx); });
  }
  absl::Status SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                   int classes, float divisor, float* dlogits, double* row_loss,
                                   int32_t* predicted) override {
    return Enqueue([=] {
      return cpu_->SoftmaxCrossEntropy(logits, labels, rows, classes, divisor, dlogits, row_loss,
                                       predicted);
    });
  }
  absl::Status SigmoidCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                   int classes, float divisor, float* dlogits, double* row_loss,
                                   int32_t* predicted) override {
    return Enqueue([=] {
      return cpu_->SigmoidCrossEntropy(logits, labels, rows, classes, divisor, dlogits, row_loss,
                                       predicted);
    });
  }

  absl::Status PairwiseDots(const float* t, int batch, int vectors, int dim, float* out,
                            int out_ld) override {
    return Enqueue([=] { return cpu_->PairwiseDots(t, batch, vectors, dim, out, out_ld); });
  }
  absl::Status PairwiseDotsGrad(const float* t, const float* dout, int dout_ld, int batch,
                                int vectors, int dim, float* dt) override {
    return Enqueue(
        [=] { return cpu_->PairwiseDotsGrad(t, dout, dout_ld, batch, vectors, dim, dt); });
  }
  absl::Status BagsForward(const float* rows, const int32_t* row_of, const int32_t* offsets,
                           const float* dense, int batch, int fields, int dim, int dense_dim,
                           bool mean, float* x) override {
    return Enqueue([=] {
      return cpu_->BagsForward(rows, row_of, offsets, dense, batch, fields, dim, dense_dim, mean,
                               x);
    });
  }
  absl::Status BagsBackward(const float* dx, const int32_t* offsets, const int32_t* occ_start,
                            const int32_t* occ_bag, int unique, int fields, int dim, int dense_dim,
                            bool mean, float* row_grads) override {
    return Enqueue([=] {
      return cpu_->BagsBackward(dx, offsets, occ_start, occ_bag, unique, fields, dim, dense_dim,
                                mean, row_grads);
    });
  }

  size_t queued() const { return queue_.size(); }  // enqueued, not yet run
  int waits() const { return waits_; }
  size_t download_bytes() const { return download_bytes_; }

 private:
  absl::Status Enqueue(std::function<absl::Status()> op) {
    queue_.push_back(std::move(op));
    return absl::OkStatus();
  }
  absl::Status RunUntil(size_t count) {
    for (size_t i = 0; i < count && !queue_.empty(); ++i) {
      std::function<absl::Status()> op = std::move(queue_.front());
      queue_.pop_front();
      ++ran_;
      if (absl::Status st = op(); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  std::unique_ptr<Backend> cpu_;
  std::deque<std::function<absl::Status()>> queue_;
  size_t ran_ = 0;               // operations run so far
  std::map<int, size_t> marks_;  // event -> operations that must have run
  int waits_ = 0;
  size_t download_bytes_ = 0;
};

}  // namespace pstrain::testing

#endif  // PSTRAIN_WORKER_MODEL_DEFERRED_BACKEND_H_
