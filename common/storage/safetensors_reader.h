// Reads the float32 tensors of a .safetensors file (the format of Hugging
// Face's safetensors: a little-endian uint64 header length, a JSON header
// {name: {dtype, shape, data_offsets [begin, end)}, "__metadata__": {...}},
// then the data), as a file another party wrote: a user's script writes one
// from its PyTorch module (pstrain.torch.write_variables) for the chief of
// an external model to initialise the servers from (model { external { ... } }).
//
// The file is checked before anything is allocated for it: a regular file
// (not a FIFO or device, common/storage/env.h CheckContainedFile) of at most
// `max_bytes`, a header of at most 16 MiB that parses, every entry float32
// ("F32") with a shape of rank 1..8 and positive dimensions whose byte
// count matches its offsets, the entries' data back to back without overlap
// or gap and ending at the file's end, names unique, non-empty and printable.
// Each failure is INVALID_ARGUMENT naming the file and the entry.
//
// The tensors come back in the order of their data in the file (which is
// the order the writer chose: pstrain's writer keeps the module's order).
#ifndef PSTRAIN_COMMON_STORAGE_SAFETENSORS_READER_H_
#define PSTRAIN_COMMON_STORAGE_SAFETENSORS_READER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/tensor.h"
#include "common/storage/env.h"

namespace pstrain {

struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // of its data, from the file's start
  int64_t bytes = 0;
};

struct SafetensorsIndex {
  std::vector<SafetensorsEntry> entries;  // in the order of their data
  std::map<std::string, std::string> metadata;
};

// The header alone (names, shapes, where each tensor's data lies).
absl::StatusOr<SafetensorsIndex> ReadSafetensorsIndex(Env* env, const std::string& path,
                                                      int64_t max_bytes);

// Every tensor, values included. `names` (optional) gets their names.
absl::StatusOr<std::vector<Tensor>> ReadSafetensors(Env* env, const std::string& path,
                                                    int64_t max_bytes,
                                                    std::vector<std::string>* names);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_STORAGE_SAFETENSORS_READER_H_
