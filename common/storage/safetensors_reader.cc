#include "common/storage/safetensors_reader.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace pstrain {
namespace {

constexpr int64_t kMaxHeaderBytes = int64_t{16} << 20;
constexpr int kMaxRank = 8;

// A value from the file, quoted in a message: at most 64 bytes of it.
std::string Quote(const std::string& v) {
  return v.size() <= 64 ? absl::StrCat("\"", v, "\"")
                         : absl::StrCat("\"", v.substr(0, 64), "...\"");
}

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": not a float32 .safetensors file: ", what));
}

bool Printable(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return static_cast<unsigned char>(c) >= 0x20 && c != 0x7f;
  });
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& path, const std::string& name,
                                            const nlohmann::json& e, int64_t data_start) {
  const std::string where = absl::StrCat("tensor ", Quote(name));
  if (!e.is_object()) return Bad(path, absl::StrCat(where, " is not an object"));
  if (!e.contains("dtype") || !e["dtype"].is_string()) {
    return Bad(path, absl::StrCat(where, " has no dtype"));
  }
  const std::string dtype = e["dtype"].get<std::string>();
  if (dtype != "F32") {
    return Bad(path, absl::StrCat(where, " is ", Quote(dtype),
                                  "; pstrain's variables are float32 (F32): convert it first"));
  }
  if (!e.contains("shape") || !e["shape"].is_array()) {
    return Bad(path, absl::StrCat(where, " has no shape"));
  }
  SafetensorsEntry out;
  out.name = name;
  const nlohmann::json& shape = e["shape"];
  if (shape.empty() || shape.size() > kMaxRank) {
    return Bad(path, absl::StrCat(where, " has rank ", shape.size(),
                                  "; expected 1..", kMaxRank, " (a scalar is stored as [1])"));
  }
  int64_t elements = 1;
  for (const nlohmann::json& d : shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 1) {
      // (Its type, not its text: dumping a deeply nested value recurses.)
      return Bad(path, absl::StrCat(where, " has a dimension that is not a positive count (",
                                    d.is_number_integer() ? "<= 0" : d.type_name(), ")"));
    }
    const int64_t dim = d.get<int64_t>();
    if (elements > std::numeric_limits<int64_t>::max() / 4 / dim) {
      return Bad(path, absl::StrCat(where, " has too many elements"));
    }
    elements *= dim;
    out.shape.push_back(dim);
  }
  if (!e.contains("data_offsets") || !e["data_offsets"].is_array() ||
      e["data_offsets"].size() != 2 || !e["data_offsets"][0].is_number_unsigned() ||
      !e["data_offsets"][1].is_number_unsigned()) {
    return Bad(path, absl::StrCat(where, " has no data_offsets [begin, end]"));
  }
  const uint64_t begin = e["data_offsets"][0].get<uint64_t>();
  const uint64_t end = e["data_offsets"][1].get<uint64_t>();
  if (begin > end || end - begin != static_cast<uint64_t>(elements) * 4 ||
      end > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() - data_start)) {
    return Bad(path, absl::StrCat(where, ": data_offsets [", begin, ", ", end, "] do not hold ",
                                  elements, " float32 values"));
  }
  out.offset = data_start + static_cast<int64_t>(begin);
  out.bytes = static_cast<int64_t>(end - begin);
  return out;
}

}  // namespace

absl::StatusOr<SafetensorsIndex> ReadSafetensorsIndex(Env* env, const std::string& path,
                                                      int64_t max_bytes) {
  if (env == Env::Default()) RETURN_IF_ERROR(CheckContainedFile(path, max_bytes));
  ASSIGN_OR_RETURN(const int64_t size, env->FileSize(path));
  if (size > max_bytes) {
    return Bad(path, absl::StrCat("it is ", size, " bytes, more than the ", max_bytes, " allowed"));
  }
  if (size < 8) return Bad(path, "shorter than its 8-byte header length");
  ASSIGN_OR_RETURN(const std::string prefix, env->ReadFileRange(path, 0, 8));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(prefix[i]);
  if (header_len > static_cast<uint64_t>(std::min(kMaxHeaderBytes, size - 8))) {
    return Bad(path, absl::StrCat("a header of ", header_len, " bytes in a file of ", size));
  }
  ASSIGN_OR_RETURN(const std::string header,
                   env->ReadFileRange(path, 8, static_cast<int64_t>(header_len)));
  const nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad(path, "its header is not a JSON object");
  const int64_t data_start = 8 + static_cast<int64_t>(header_len);
  SafetensorsIndex index;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return Bad(path, "__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) return Bad(path, "__metadata__ holds a value that is not text");
        index.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (it.key().empty() || it.key().size() > 1024 || !Printable(it.key())) {
      return Bad(path, "a tensor name is empty, longer than 1024 bytes or not printable");
    }
    ASSIGN_OR_RETURN(SafetensorsEntry e, ParseEntry(path, it.key(), it.value(), data_start));
    index.entries.push_back(std::move(e));
  }
  // (nlohmann's object keeps one value per key: a duplicate name is the
  // last one given; the offsets check below finds the bytes left over.)
  std::sort(index.entries.begin(), index.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.offset != b.offset ? a.offset < b.offset : a.name < b.name;
            });
  int64_t at = data_start;
  for (const SafetensorsEntry& e : index.entries) {
    if (e.offset != at) {
      return Bad(path, absl::StrCat("tensor ", Quote(e.name), " starts at byte ",
                                    e.offset - data_start,
                                    " of the data, not where the one before it ends (",
                                    at - data_start, "): overlapping or a gap"));
    }
    at += e.bytes;
  }
  if (at != size) {
    return Bad(path, absl::StrCat("the tensors end at byte ", at, ", the file at ", size));
  }
  if (index.entries.empty()) return Bad(path, "it holds no tensors");
  return index;
}

absl::StatusOr<std::vector<Tensor>> ReadSafetensors(Env* env, const std::string& path,
                                                    int64_t max_bytes,
                                                    std::vector<std::string>* names) {
  ASSIGN_OR_RETURN(const SafetensorsIndex index, ReadSafetensorsIndex(env, path, max_bytes));
  std::vector<Tensor> tensors;
  tensors.reserve(index.entries.size());
  if (names != nullptr) names->clear();
  for (const SafetensorsEntry& e : index.entries) {
    Tensor t(e.shape);
    RETURN_IF_ERROR(
        env->ReadFileRangeInto(path, e.offset, e.bytes, reinterpret_cast<char*>(t.data())));
    tensors.push_back(std::move(t));
    if (names != nullptr) names->push_back(e.name);
  }
  return tensors;
}

}  // namespace pstrain
