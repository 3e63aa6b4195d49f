// A file of named float32 tensors, each record guarded by a CRC32C, used for
// the exported final model. Layout (little-endian):
//   "PSTENSR1" | count:u64 | records... | crc32c of everything before:u32
//   record = name_len:u32 name rank:u32 dims:i64[rank] crc32c(data):u32 data
// Reading verifies every CRC and every length; a truncated or corrupted file
// is refused with DATA_LOSS. Stateless functions; thread-safe.
#ifndef PSTRAIN_COMMON_STORAGE_TENSOR_FILE_H_
#define PSTRAIN_COMMON_STORAGE_TENSOR_FILE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/storage/env.h"
#include "common/base/tensor.h"

namespace pstrain {

using TensorMap = std::map<std::string, Tensor>;

std::string EncodeTensorFile(const TensorMap& tensors);
absl::StatusOr<TensorMap> DecodeTensorFile(const std::string& bytes, const std::string& source);

// Written atomically through `env` (temp file, fsync, rename, fsync dir),
// record by record from the tensors themselves: no copy of them, and no
// encoded file in memory (a final model may be gigabytes).
absl::Status WriteTensorFile(Env* env, const std::string& path, const TensorMap& tensors);
// A tensor in memory the file does not own (a model's parameter block).
struct TensorView {
  std::vector<int64_t> shape;
  const float* data = nullptr;  // the product of shape's elements
};
absl::Status WriteTensorFile(Env* env, const std::string& path,
                             const std::map<std::string, TensorView>& tensors);
absl::StatusOr<TensorMap> ReadTensorFile(Env* env, const std::string& path);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_STORAGE_TENSOR_FILE_H_
