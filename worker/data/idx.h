// MNIST's IDX file format: a big-endian header (magic 0x0000 | type | rank,
// then rank u32 dims) followed by the data. pstrain reads and writes unsigned
// byte IDX files: images [n, rows, cols] and labels [n]. Readers validate the
// header against the file size. Stateless functions; thread-safe.
#ifndef PSTRAIN_WORKER_DATA_IDX_H_
#define PSTRAIN_WORKER_DATA_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/storage/env.h"

namespace pstrain {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // row-major
};

absl::StatusOr<IdxArray> DecodeIdx(const std::string& bytes, const std::string& source);
std::string EncodeIdx(const IdxArray& array);

absl::StatusOr<IdxArray> ReadIdxFile(Env* env, const std::string& path);
absl::Status WriteIdxFile(Env* env, const std::string& path, const IdxArray& array);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_IDX_H_
