#include "common/storage/tensor_export.h"

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace pstrain {
namespace {

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t ElementBytes(ExportDtype dtype) { return dtype == ExportDtype::kUint64 ? 8 : 4; }

absl::string_view Bytes(const ExportTensor& t) {
  return absl::string_view(static_cast<const char*>(t.data),
                           static_cast<size_t>(Elements(t.shape)) * ElementBytes(t.dtype));
}

absl::Status CheckShape(const ExportTensor& t) {
  for (int64_t d : t.shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat(t.name, ": negative dimension"));
  }
  if (t.data == nullptr && !t.produce && Elements(t.shape) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(t.name, ": no data"));
  }
  return absl::OkStatus();
}

// Appends `t`'s bytes to `f`: its data, or what its producer gives, which
// must be exactly the shape's bytes.
absl::Status AppendTensor(WritableFile* f, const ExportTensor& t) {
  if (!t.produce) return f->Append(Bytes(t));
  const int64_t want = Elements(t.shape) * static_cast<int64_t>(ElementBytes(t.dtype));
  int64_t got = 0;
  RETURN_IF_ERROR(t.produce([&](absl::string_view piece) -> absl::Status {
    got += static_cast<int64_t>(piece.size());
    if (got > want) {
      return absl::InternalError(absl::StrCat(t.name, ": more than its ", want, " bytes"));
    }
    return f->Append(piece);
  }));
  if (got != want) {
    return absl::InternalError(absl::StrCat(t.name, ": ", got, " bytes of its ", want));
  }
  return absl::OkStatus();
}

}  // namespace

std::string NpyHeader(const std::vector<int64_t>& shape, ExportDtype dtype) {
  // A one-element tuple needs its trailing comma: "(4,)".
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";
  std::string dict =
      absl::StrCat("{'descr': '", dtype == ExportDtype::kUint64 ? "<u8" : "<f4",
                   "', 'fortran_order': False, 'shape': (", dims, "), }");
  // Magic (6) + version (2) + length (2) + dict + padding + '\n', a multiple
  // of 64 so the data starts aligned, as NumPy writes it.
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(dict.size() & 0xff));
  out.push_back(static_cast<char>(dict.size() >> 8));
  return out + dict;
}

absl::Status WriteNpy(Env* env, const std::string& path, const ExportTensor& tensor) {
  RETURN_IF_ERROR(CheckShape(tensor));
  const std::string header = NpyHeader(tensor.shape, tensor.dtype);
  if (header.size() - 10 > 0xffff) {
    return absl::InvalidArgumentError(absl::StrCat(tensor.name, ": too many dimensions for .npy"));
  }
  return WriteFileStreamAtomically(env, path, [&](WritableFile* f) -> absl::Status {
    RETURN_IF_ERROR(f->Append(header));
    return AppendTensor(f, tensor);
  });
}

absl::StatusOr<std::string> SafetensorsHeader(
    const std::vector<ExportTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> names;
  int64_t at = 0;
  for (const ExportTensor& t : tensors) {
    RETURN_IF_ERROR(CheckShape(t));
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor name \"", t.name, "\" is empty, reserved or repeated"));
    }
    const int64_t bytes = Elements(t.shape) * static_cast<int64_t>(ElementBytes(t.dtype));
    header[t.name] = {{"dtype", t.dtype == ExportDtype::kUint64 ? "U64" : "F32"},
                      {"shape", t.shape},
                      {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

absl::Status WriteSafetensors(Env* env, const std::string& path,
                              const std::vector<ExportTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(const std::string header, SafetensorsHeader(tensors, metadata));
  return WriteFileStreamAtomically(env, path, [&](WritableFile* f) -> absl::Status {
    RETURN_IF_ERROR(f->Append(header));
    for (const ExportTensor& t : tensors) RETURN_IF_ERROR(AppendTensor(f, t));
    return absl::OkStatus();
  });
}

}  // namespace pstrain
