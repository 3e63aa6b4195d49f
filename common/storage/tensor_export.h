// Writers of the two formats `pstrain checkpoint export` produces, for
// readers outside pstrain:
//   .npy          NumPy's format, version 1.0: "\x93NUMPY", 1, 0, a
//                 little-endian uint16 header length, a Python dict literal
//                 ('<f4' or '<u8', C order, the shape) padded with spaces to
//                 a multiple of 64 bytes with the magic, then the raw data
//   .safetensors  a little-endian uint64 header length, a JSON header
//                 ({name: {dtype F32|U64, shape, data_offsets [begin, end)}} and
//                 an optional "__metadata__" of strings), padded with spaces
//                 to a multiple of 8 bytes, then the tensors back to back in
//                 the header's order
// Both are written through Env, streamed tensor by tensor, to "path.tmp",
// fsynced and renamed over `path`: a reader never sees half a file.
#ifndef PSTRAIN_COMMON_STORAGE_TENSOR_EXPORT_H_
#define PSTRAIN_COMMON_STORAGE_TENSOR_EXPORT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/storage/env.h"

namespace pstrain {

// A tensor to write: float32, or uint64 (an embedding table's ids); `data`
// holds the product of `shape` elements, little-endian.
enum class ExportDtype { kFloat32, kUint64 };
// Gives a tensor's bytes in order, a piece at a time, to `append`.
using ExportProducer =
    std::function<absl::Status(const std::function<absl::Status(absl::string_view)>& append)>;
struct ExportTensor {
  std::string name;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  ExportDtype dtype = ExportDtype::kFloat32;
  // Instead of `data` (a tensor larger than memory: a table's rows read as
  // they are written): exactly the shape's bytes, else the write fails.
  ExportProducer produce;
};

// The bytes before the data of a .npy file for an array of `shape`.
std::string NpyHeader(const std::vector<int64_t>& shape,
                      ExportDtype dtype = ExportDtype::kFloat32);
absl::Status WriteNpy(Env* env, const std::string& path, const ExportTensor& tensor);

// The length prefix and JSON header of a .safetensors file (names must be
// unique and not "__metadata__").
absl::StatusOr<std::string> SafetensorsHeader(const std::vector<ExportTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata);
absl::Status WriteSafetensors(Env* env, const std::string& path,
                              const std::vector<ExportTensor>& tensors,
                              const std::map<std::string, std::string>& metadata);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_STORAGE_TENSOR_EXPORT_H_
