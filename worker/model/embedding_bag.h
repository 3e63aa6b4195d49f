// The worker's side of embedding tables: a batch's categorical ids as bags,
// the unique ids a worker pulls (and whose gradients it pushes), and
// EmbeddingBags, which turns pulled rows into the model's input (each bag's
// rows summed or averaged, concatenated after the dense features) and the
// model's input gradient back into one gradient row per unique id.
//
// This runs on the host for both backends: the rows arrive from the servers
// in host memory, the assembled input goes to the device with the batch, and
// the input gradient comes back with the parameter gradients. The bags of a
// batch are a small fraction of a step's work (batch x fields x dim adds).
#ifndef PSTRAIN_WORKER_MODEL_EMBEDDING_BAG_H_
#define PSTRAIN_WORKER_MODEL_EMBEDDING_BAG_H_

#include <cstdint>
#include <vector>

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

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_MODEL_EMBEDDING_BAG_H_
