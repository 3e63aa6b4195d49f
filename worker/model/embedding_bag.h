// The worker's side of embedding tables: a batch's categorical ids as bags,
// the unique ids a worker pulls (and whose gradients it pushes), and
// EmbeddingBags, which turns pulled rows into the model's input (each bag's
// rows summed or averaged, concatenated after the dense features) and the
// model's input gradient back into one gradient row per unique id.
//
// EmbeddingBags runs on the host (the CPU backend's path). On a device,
// DeviceEmbeddingBags runs the same math there (Backend::BagsForward and
// BagsBackward): the pulled rows go up and their gradients come down, the
// model's input is assembled and its gradient reduced on the device.
#ifndef PSTRAIN_WORKER_MODEL_EMBEDDING_BAG_H_
#define PSTRAIN_WORKER_MODEL_EMBEDDING_BAG_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/model/backend.h"

namespace pstrain {

// Bag (example b, field f) holds ids[offsets[b * fields + f],
// offsets[b * fields + f + 1]): any number of ids, none included.
struct SparseBatch {
  int batch = 0;
  int fields = 0;
  std::vector<uint64_t> ids;
  std::vector<int64_t> offsets;  // batch * fields + 1
  // One id per (example, field), as Criteo's categorical columns.
  static SparseBatch OnePerField(const uint64_t* ids, int batch, int fields);
  // An example's ids in places, field after field: `slots[f]` for field f
  // (a multi-hot field's max_values), kNoId (embedding_ids.h) where a cell
  // had fewer values; those are left out of the bags.
  static SparseBatch FromSlots(const uint64_t* ids, int batch, const std::vector<int>& slots);
};

// The distinct ids of a batch in order of first appearance (what a worker
// pulls), and for each id of the batch its row among them.
struct UniqueRows {
  std::vector<uint64_t> ids;
  std::vector<uint32_t> row_of;  // per element of SparseBatch::ids
  static UniqueRows Of(const std::vector<uint64_t>& ids);
};

enum class Combiner { kSum, kMean };

// EmbeddingBag and Concat together: x[b] = [dense[b] | bag(b, 0) | ... |
// bag(b, fields - 1)], each bag the sum (or mean) of its rows, zeros when
// empty.
class EmbeddingBags {
 public:
  EmbeddingBags(int dense_dim, int fields, int dim, Combiner combiner)
      : dense_dim_(dense_dim), fields_(fields), dim_(dim), combiner_(combiner) {}
  int output_dim() const { return dense_dim_ + fields_ * dim_; }
  int dim() const { return dim_; }

  // rows: [unique.ids.size(), dim] as pulled; dense: [batch, dense_dim];
  // x: [batch, output_dim()].
  void Forward(const SparseBatch& batch, const UniqueRows& unique, const float* rows,
               const float* dense, float* x) const;
  // dx: [batch, output_dim()], dL/dx; row_grads: [unique.ids.size(), dim],
  // overwritten with dL/drow (each occurrence adds its bag's gradient,
  // divided by the bag's size for the mean).
  void Backward(const SparseBatch& batch, const UniqueRows& unique, const float* dx,
                float* row_grads) const;

 private:
  const int dense_dim_, fields_, dim_;
  const Combiner combiner_;
};

// EmbeddingBags on a backend's memory, bit for bit the host's numbers (both
// sides are built without fused multiply-adds). A batch whose index is
// inconsistent is refused, changing nothing on the device. Per
// step: Forward stages the batch's index, the pulled rows and the dense
// features (copied into pinned buffers, so the caller's memory is free on
// return) and enqueues the bags into the model's input x (device memory,
// [batch, output_dim()]); after the model's backward pass, Backward
// enqueues each unique row's gradient from dx (the model's input gradient
// on the device) and its download, in host_row_gradients() once the
// backend has synchronised (the model's FinishStep). Buffers grow to the
// largest batch and are reused. The backend must have synchronised between
// two Forwards (FinishStep does, every step): Forward rewrites the pinned
// buffers the previous step's uploads were read from, and waits for nothing.
class DeviceEmbeddingBags {
 public:
  DeviceEmbeddingBags(Backend* backend, int dense_dim, int fields, int dim, Combiner combiner);
  int output_dim() const { return dense_dim_ + fields_ * dim_; }

  absl::Status Forward(const SparseBatch& batch, const UniqueRows& unique, const float* rows,
                       const float* dense, float* x);
  absl::Status Backward(const float* dx);
  // [unique rows of the last Forward, dim].
  const float* host_row_gradients() const { return host_grads_.data(); }

 private:
  Backend* const backend_;
  const int dense_dim_, fields_, dim_;
  const bool mean_;
  int unique_ = 0;
  // Pinned staging: the index (row_of, offsets, occurrence starts and
  // bags), the rows, the dense features; and the row gradients coming back.
  DeviceArray<int32_t> host_index_, index_;
  DeviceArray<float> host_rows_, rows_, host_dense_, dense_, grads_, host_grads_;
  size_t row_of_at_ = 0, offsets_at_ = 0, occ_start_at_ = 0, occ_bag_at_ = 0;
  std::vector<int32_t> next_;  // the counting sort's next slot per row
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_MODEL_EMBEDDING_BAG_H_
