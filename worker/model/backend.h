// A compute backend: where the model library's memory lives and where its
// operations run. Two implementations: the CPU (host memory, OpenBLAS and the
// loops of cpu_ops.h) and CUDA (device memory, one stream, cuBLAS and the
// kernels of cuda_ops.cu). Layers are written once against this interface.
//
// Operations mirror cpu_ops.h (see there for the math); pointers are the
// backend's memory ("device memory": host memory on the CPU). On CUDA they are
// enqueued on one stream and run in order; Synchronize() waits for them, and
// copies to the host are complete only after it. Every failure is a Status
// naming the call; nothing aborts. A backend belongs to one thread at a time.
#ifndef PSTRAIN_WORKER_MODEL_BACKEND_H_
#define PSTRAIN_WORKER_MODEL_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pstrain {

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu (OpenBLAS, 2 threads)" or "cuda:0 (NVIDIA H100 ...)".
  virtual std::string Describe() const = 0;
  // True when device memory is host memory (no copies needed).
  virtual bool host_memory() const = 0;

  // Device memory, and host memory for staging (pinned on CUDA, so copies
  // run at full speed and asynchronously). Zero bytes gives a valid pointer.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  virtual absl::StatusOr<void*> AllocateHost(size_t bytes) = 0;
  virtual void FreeHost(void* ptr) = 0;
  // Device memory in use on the whole device and its size; the CPU reports
  // what this backend allocated and 0.
  virtual absl::Status MemoryInfo(size_t* used_bytes, size_t* total_bytes) = 0;

  virtual absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  // A block of `rows` x `cols` floats on the device, from rows `src_ld`
  // floats apart to rows `dst_ld` apart (a matrix's columns into another's).
  virtual absl::Status CopyMatrix(const float* src, int src_ld, float* dst, int dst_ld, int rows,
                                  int cols) = 0;
  virtual absl::Status Synchronize() = 0;
  // A mark in the stream: RecordEvent(index) (index >= 0, reusable once
  // waited for) notes how far the operations enqueued so far reach, and
  // WaitEvent(index) blocks until the device has run them, so a copy to the
  // host enqueued before the mark is complete while later operations may
  // still run. The CPU runs everything as it is called: both return at once.
  virtual absl::Status RecordEvent(int index) = 0;
  virtual absl::Status WaitEvent(int index) = 0;

  virtual absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                            const float* a, int lda, const float* b, int ldb, float beta, float* c,
                            int ldc) = 0;
  virtual absl::Status BroadcastRows(const float* row, int rows, int cols, float* out) = 0;
  virtual absl::Status SumRows(const float* x, int rows, int cols, float* out) = 0;
  virtual absl::Status Multiply(const float* a, const float* b, int64_t n, float* y) = 0;
  virtual absl::Status MultiplyAdd(const float* a, const float* b, int64_t n, float* y) = 0;
  virtual absl::Status Add(const float* a, int64_t n, float* y) = 0;
  virtual absl::Status Relu(const float* x, int64_t n, float* y) = 0;
  virtual absl::Status ReluGrad(const float* y, const float* dy, int64_t n, float* dx) = 0;
  virtual absl::Status Gelu(const float* x, int64_t n, float* y) = 0;
  virtual absl::Status GeluGrad(const float* x, const float* dy, int64_t n, float* dx) = 0;
  virtual absl::Status Dropout(const float* x, int64_t n, float rate, uint64_t seed, float* y) = 0;
  virtual absl::Status DropoutGrad(const float* dy, int64_t n, float rate, uint64_t seed,
                                   float* dx) = 0;
  virtual absl::Status SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                           int classes, float divisor, float* dlogits,
                                           double* row_loss, int32_t* predicted) = 0;
  virtual absl::Status SigmoidCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                           int classes, float divisor, float* dlogits,
                                           double* row_loss, int32_t* predicted) = 0;
  // DLRM's pairwise dot products and their gradient (cpu_ops.h).
  virtual absl::Status PairwiseDots(const float* t, int batch, int vectors, int dim, float* out,
                                    int out_ld) = 0;
  virtual absl::Status PairwiseDotsGrad(const float* t, const float* dout, int dout_ld, int batch,
                                        int vectors, int dim, float* dt) = 0;
  // Embedding bags into the model's input and back (cpu_ops.h).
  virtual absl::Status BagsForward(const float* rows, const int32_t* row_of, const int32_t* offsets,
                                   const float* dense, int batch, int fields, int dim,
                                   int dense_dim, bool mean, float* x) = 0;
  virtual absl::Status BagsBackward(const float* dx, const int32_t* offsets,
                                    const int32_t* occ_start, const int32_t* occ_bag, int unique,
                                    int fields, int dim, int dense_dim, bool mean,
                                    float* row_grads) = 0;
};

// The CPU backend; `threads` is OpenBLAS's thread count (process-wide).
std::unique_ptr<Backend> NewCpuBackend(int threads);

// True when this binary was built with CUDA (nvcc found, not --config=cpu_only).
bool BuiltWithCuda();
// Number of CUDA devices, or why there are none (FAILED_PRECONDITION).
absl::StatusOr<int> CudaDeviceCount();
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)".
absl::StatusOr<std::string> CudaDeviceName(int device);
// A backend on CUDA device `device`, checked to run a kernel. In a CPU-only
// build: FAILED_PRECONDITION saying so.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device);

// Memory of a backend, released on destruction. Move-only. Grows on demand
// and never shrinks, so a buffer sized for the largest batch is allocated
// once and reused for every step.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(Backend* backend, bool host = false) : backend_(backend), host_(host) {}
  DeviceArray(DeviceArray&& other) noexcept { *this = std::move(other); }
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    Release();
    backend_ = other.backend_;
    host_ = other.host_;
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { Release(); }

  // Makes room for at least `count` elements; the contents are lost when it grows.
  absl::Status Reserve(size_t count) {
    if (data_ != nullptr && count <= size_) return absl::OkStatus();
    Release();
    absl::StatusOr<void*> p =
        host_ ? backend_->AllocateHost(count * sizeof(T)) : backend_->Allocate(count * sizeof(T));
    if (!p.ok()) return p.status();
    data_ = static_cast<T*>(*p);
    size_ = count;
    return absl::OkStatus();
  }
  T* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void Release() {
    if (data_ == nullptr) return;
    if (host_) {
      backend_->FreeHost(data_);
    } else {
      backend_->Free(data_);
    }
    data_ = nullptr;
    size_ = 0;
  }

  Backend* backend_ = nullptr;
  bool host_ = false;
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_MODEL_BACKEND_H_
