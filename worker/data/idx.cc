#include "worker/data/idx.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace pstrain {
namespace {

constexpr uint8_t kUnsignedByte = 0x08;

uint32_t ReadBigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

void AppendBigEndian32(std::string* out, uint32_t v) {
  out->push_back(static_cast<char>(v >> 24));
  out->push_back(static_cast<char>(v >> 16));
  out->push_back(static_cast<char>(v >> 8));
  out->push_back(static_cast<char>(v));
}

}  // namespace

absl::StatusOr<IdxArray> DecodeIdx(const std::string& bytes, const std::string& source) {
  auto bad = [&source](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("IDX file ", source, ": ", what));
  };
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < 4 || p[0] != 0 || p[1] != 0) return bad("bad magic (expected 00 00 type rank)");
  if (p[2] != kUnsignedByte) {
    return bad(absl::StrCat("element type 0x", absl::Hex(p[2]), " unsupported; expected 0x08"));
  }
  const int rank = p[3];
  if (rank < 1 || rank > 4) return bad(absl::StrCat("rank ", rank, " unsupported; expected 1..4"));
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (bytes.size() < header) return bad("truncated header");
  IdxArray out;
  uint64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    uint32_t d = ReadBigEndian32(p + 4 + 4 * i);
    out.dims.push_back(d);
    n *= d;
    if (n > (uint64_t{1} << 36)) return bad("dimensions too large");
  }
  if (bytes.size() - header != n) {
    return bad(absl::StrCat("header promises ", n, " bytes of data, file has ",
                            bytes.size() - header));
  }
  out.data.assign(p + header, p + header + n);
  return out;
}

std::string EncodeIdx(const IdxArray& array) {
  std::string out;
  out.push_back(0);
  out.push_back(0);
  out.push_back(static_cast<char>(kUnsignedByte));
  out.push_back(static_cast<char>(array.dims.size()));
  for (int64_t d : array.dims) AppendBigEndian32(&out, static_cast<uint32_t>(d));
  out.append(reinterpret_cast<const char*>(array.data.data()), array.data.size());
  return out;
}

absl::StatusOr<IdxArray> ReadIdxFile(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, env->ReadFile(path));
  return DecodeIdx(bytes, path);
}

absl::Status WriteIdxFile(Env* env, const std::string& path, const IdxArray& array) {
  return WriteFileAtomically(env, path, EncodeIdx(array));
}

}  // namespace pstrain
