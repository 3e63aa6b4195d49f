#include "common/storage/tensor_file.h"

#include <cstring>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/crc32c.h"
#include "common/base/status_macros.h"

namespace pstrain {
namespace {

constexpr char kMagic[] = "PSTENSR1";
constexpr size_t kMagicLen = 8;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

class Reader {
 public:
  Reader(const std::string& bytes, size_t end) : bytes_(bytes), end_(end) {}
  template <typename T>
  bool Get(T* v) {
    if (end_ - pos_ < sizeof(T)) return false;
    std::memcpy(v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetBytes(size_t n, const char** p) {
    if (end_ - pos_ < n) return false;
    *p = bytes_.data() + pos_;
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }
  void set_pos(size_t p) { pos_ = p; }

 private:
  const std::string& bytes_;
  size_t end_;
  size_t pos_ = 0;
};

// The file's bytes in order to `sink`, which also extends the file's CRC
// over them; the tensors in name order.
absl::Status Encode(const std::map<std::string, TensorView>& tensors,
                    const std::function<absl::Status(absl::string_view)>& sink) {
  uint32_t file_crc = 0;
  auto emit = [&](absl::string_view bytes) {
    file_crc = Crc32cExtend(file_crc, bytes.data(), bytes.size());
    return sink(bytes);
  };
  std::string head(kMagic, kMagicLen);
  Put<uint64_t>(&head, tensors.size());
  RETURN_IF_ERROR(emit(head));
  head.clear();
  for (const auto& [name, t] : tensors) {
    Put<uint32_t>(&head, name.size());
    head.append(name);
    Put<uint32_t>(&head, t.shape.size());
    size_t elements = 1;
    for (int64_t d : t.shape) {
      Put<int64_t>(&head, d);
      elements *= static_cast<size_t>(d);
    }
    const size_t nbytes = elements * sizeof(float);
    Put<uint32_t>(&head, Crc32c(t.data, nbytes));
    RETURN_IF_ERROR(emit(head));
    head.clear();
    RETURN_IF_ERROR(emit(absl::string_view(reinterpret_cast<const char*>(t.data), nbytes)));
  }
  Put<uint32_t>(&head, file_crc);
  return sink(head);
}

std::map<std::string, TensorView> Views(const TensorMap& tensors) {
  std::map<std::string, TensorView> views;
  for (const auto& [name, t] : tensors) views.emplace(name, TensorView{t.shape(), t.data()});
  return views;
}

}  // namespace

std::string EncodeTensorFile(const TensorMap& tensors) {
  std::string out;
  (void)Encode(Views(tensors), [&out](absl::string_view bytes) {
    out.append(bytes.data(), bytes.size());
    return absl::OkStatus();
  });
  return out;
}

absl::StatusOr<TensorMap> DecodeTensorFile(const std::string& bytes, const std::string& source) {
  auto corrupt = [&source](const std::string& what) {
    return absl::DataLossError(absl::StrCat("tensor file ", source, ": ", what));
  };
  if (bytes.size() < kMagicLen + 8 + 4 || bytes.compare(0, kMagicLen, kMagic) != 0) {
    return corrupt("not a pstrain tensor file (bad magic or too short)");
  }
  const size_t body = bytes.size() - 4;
  uint32_t file_crc;
  std::memcpy(&file_crc, bytes.data() + body, 4);
  if (Crc32c(bytes.data(), body) != file_crc) return corrupt("file checksum mismatch");
  Reader r(bytes, body);
  r.set_pos(kMagicLen);
  uint64_t count;
  if (!r.Get(&count)) return corrupt("truncated header");
  TensorMap out;
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t name_len, rank, crc;
    const char* p;
    if (!r.Get(&name_len) || !r.GetBytes(name_len, &p)) return corrupt("truncated record name");
    std::string name(p, name_len);
    if (!r.Get(&rank) || rank > 16) return corrupt(absl::StrCat(name, ": bad rank"));
    std::vector<int64_t> shape(rank);
    int64_t n = 1;
    for (uint32_t k = 0; k < rank; ++k) {
      if (!r.Get(&shape[k]) || shape[k] < 0 || (shape[k] > 0 && n > kMaxTensorElements / shape[k])) {
        return corrupt(absl::StrCat(name, ": bad shape"));
      }
      n *= shape[k];
    }
    if (!r.Get(&crc) || !r.GetBytes(n * sizeof(float), &p)) {
      return corrupt(absl::StrCat(name, ": truncated data"));
    }
    if (Crc32c(p, n * sizeof(float)) != crc) return corrupt(absl::StrCat(name, ": CRC32C mismatch"));
    std::vector<float> values(n);
    if (n > 0) std::memcpy(values.data(), p, n * sizeof(float));
    if (!out.emplace(name, Tensor(std::move(shape), std::move(values))).second) {
      return corrupt(absl::StrCat("duplicate tensor ", name));
    }
  }
  if (r.pos() != body) return corrupt("trailing bytes after the last record");
  return out;
}

absl::Status WriteTensorFile(Env* env, const std::string& path, const TensorMap& tensors) {
  return WriteTensorFile(env, path, Views(tensors));
}

absl::Status WriteTensorFile(Env* env, const std::string& path,
                             const std::map<std::string, TensorView>& tensors) {
  return WriteFileStreamAtomically(env, path, [&tensors](WritableFile* file) {
    return Encode(tensors, [file](absl::string_view bytes) { return file->Append(bytes); });
  });
}

absl::StatusOr<TensorMap> ReadTensorFile(Env* env, const std::string& path) {
  // A regular file in its directory (a FIFO would hang the read, a device
  // never end); its header is checked against its size when decoded.
  RETURN_IF_ERROR(CheckContainedFile(path, std::numeric_limits<int64_t>::max()));
  ASSIGN_OR_RETURN(std::string bytes, env->ReadFile(path));
  return DecodeTensorFile(bytes, path);
}

}  // namespace pstrain
