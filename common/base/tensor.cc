#include "common/base/tensor.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/segmented_bytes.h"

namespace pstrain {

static_assert(sizeof(float) == 4, "float32 expected");

int64_t NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor::Tensor(std::vector<int64_t> shape)
    : shape_(std::move(shape)), values_(NumElements(shape_), 0.0f) {}

Tensor::Tensor(std::vector<int64_t> shape, std::vector<float> values)
    : shape_(std::move(shape)), values_(std::move(values)) {}

std::string Tensor::ShapeString() const { return absl::StrCat("[", absl::StrJoin(shape_, ","), "]"); }

void ToProto(absl::Span<const int64_t> shape, absl::Span<const float> values, TensorProto* proto) {
  proto->set_dtype(DT_FLOAT);
  proto->clear_shape();
  for (int64_t d : shape) proto->add_shape(d);
  // x86-64 and aarch64 are little-endian, which is the wire's byte order.
  proto->set_content(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

int64_t DenseFloatBytes(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > kMaxTensorElements / d)) return -1;
    n *= d;
  }
  return n * 4;
}

absl::StatusOr<Tensor> FromProto(const TensorProto& proto) {
  if (proto.dtype() != DT_FLOAT) {
    return absl::InvalidArgumentError(absl::StrCat("tensor dtype ", proto.dtype(),
                                                   " unsupported; expected DT_FLOAT"));
  }
  if (proto.row_ids_size() != 0) {
    return absl::InvalidArgumentError("sparse rows are not accepted for a dense variable");
  }
  std::vector<int64_t> shape(proto.shape().begin(), proto.shape().end());
  const int64_t bytes = DenseFloatBytes(shape);
  if (bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor shape [", absl::StrJoin(shape, ","), "] invalid or too large"));
  }
  const int64_t n = bytes / 4;
  if (static_cast<int64_t>(proto.content().size()) != n * 4) {
    return absl::InvalidArgumentError(absl::StrCat("tensor content is ", proto.content().size(),
                                                   " bytes; shape needs ", n * 4));
  }
  std::vector<float> values(n);
  if (n > 0) std::memcpy(values.data(), proto.content().data(), n * 4);
  return Tensor(std::move(shape), std::move(values));
}

bool AllFinite(absl::Span<const float> values) {
  // The vectorised scan (an early-exit isfinite loop stays scalar).
  return AllFiniteUnaligned(reinterpret_cast<const char*>(values.data()),
                            static_cast<int64_t>(values.size()));
}

}  // namespace pstrain
