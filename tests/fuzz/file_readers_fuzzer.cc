// libFuzzer target: the readers of files a user hands pstrain (IDX data,
// tensor files) never crash, and what they accept encodes back to a file
// they read the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "worker/data/idx.h"
#include "common/storage/tensor_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pstrain::IdxArray> idx = pstrain::DecodeIdx(bytes, "fuzz");
  if (idx.ok()) {
    absl::StatusOr<pstrain::IdxArray> back = pstrain::DecodeIdx(pstrain::EncodeIdx(*idx), "re");
    if (!back.ok() || back->data != idx->data || back->dims != idx->dims) std::abort();
  }
  absl::StatusOr<pstrain::TensorMap> tensors = pstrain::DecodeTensorFile(bytes, "fuzz");
  if (tensors.ok()) {
    absl::StatusOr<pstrain::TensorMap> back =
        pstrain::DecodeTensorFile(pstrain::EncodeTensorFile(*tensors), "re");
    if (!back.ok() || back->size() != tensors->size()) std::abort();
  }
  return 0;
}
