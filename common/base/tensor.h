// A dense float32 tensor in host memory, and its conversion to and from the
// wire's TensorProto. Conversion from the wire validates everything (dtype,
// shape, byte count, size limits) and never trusts the peer. Not thread-safe;
// callers synchronise.
#ifndef PSTRAIN_COMMON_BASE_TENSOR_H_
#define PSTRAIN_COMMON_BASE_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/tensor.pb.h"

namespace pstrain {

// The largest tensor accepted from the wire (elements).
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 31;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::vector<int64_t> shape);  // zero-filled
  Tensor(std::vector<int64_t> shape, std::vector<float> values);

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t num_elements() const { return static_cast<int64_t>(values_.size()); }
  float* data() { return values_.data(); }
  const float* data() const { return values_.data(); }
  std::vector<float>& values() { return values_; }
  const std::vector<float>& values() const { return values_; }
  absl::Span<const float> span() const { return values_; }
  std::string ShapeString() const;  // "[784,128]"

 private:
  std::vector<int64_t> shape_;
  std::vector<float> values_;
};

int64_t NumElements(absl::Span<const int64_t> shape);

// Bytes of a dense float32 tensor of `shape` from the wire, or -1 when the
// shape is invalid (a negative dim, or more than kMaxTensorElements).
int64_t DenseFloatBytes(absl::Span<const int64_t> shape);

// Appends `values` with `shape` to `proto` (dense).
void ToProto(absl::Span<const int64_t> shape, absl::Span<const float> values, TensorProto* proto);
inline void ToProto(const Tensor& t, TensorProto* proto) { ToProto(t.shape(), t.span(), proto); }

// Validates and decodes a dense TensorProto. Sparse (row_ids) is refused here.
absl::StatusOr<Tensor> FromProto(const TensorProto& proto);

// True when every value is finite (no NaN or Inf).
bool AllFinite(absl::Span<const float> values);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_BASE_TENSOR_H_
