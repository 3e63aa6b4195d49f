#include "ps_server/row_tier.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/crc32c.h"
#include "common/base/status_macros.h"

namespace pstrain {
namespace {

constexpr size_t kIdAt = 0, kUpdatesAt = 8, kCrcAt = 16, kHeader = 24;

uint32_t RecordCrc(const std::vector<char>& record) {
  // Everything but the CRC itself: the id and count, then the floats.
  return Crc32cExtend(Crc32c(record.data(), kCrcAt), record.data() + kHeader,
                      record.size() - kHeader);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RowTier>> RowTier::Open(Env* env, std::string path, int dim,
                                                        int num_slots) {
  if (dim <= 0 || num_slots < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk tier ", path, ": rows of ", dim, " floats, ", num_slots, " slots"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<RandomRWFile> file, env->NewRandomRWFile(path));
  RETURN_IF_ERROR(env->DeleteFile(path));
  return std::unique_ptr<RowTier>(new RowTier(std::move(path), std::move(file), dim, num_slots));
}

RowTier::RowTier(std::string path, std::unique_ptr<RandomRWFile> file, int dim, int num_slots)
    : path_(std::move(path)),
      file_(std::move(file)),
      dim_(dim),
      num_slots_(num_slots),
      record_(kHeader + sizeof(float) * static_cast<size_t>(dim) * (1 + num_slots)) {}

absl::Status RowTier::Put(uint64_t id, const float* values,
                          const std::vector<const float*>& slots, int64_t updates,
                          int64_t touched, uint32_t generation) {
  if (index_.contains(id)) {
    return absl::InternalError(absl::StrCat("disk tier ", path_, ": row ", id, " written twice"));
  }
  uint32_t place;
  if (!free_places_.empty()) {
    place = free_places_.back();
  } else if (places_ == std::numeric_limits<uint32_t>::max()) {
    return absl::ResourceExhaustedError(absl::StrCat("disk tier ", path_, ": full at ", places_,
                                                     " rows"));
  } else {
    place = places_;
  }
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(dim_);
  std::memcpy(record_.data() + kIdAt, &id, 8);
  std::memcpy(record_.data() + kUpdatesAt, &updates, 8);
  std::memset(record_.data() + kCrcAt, 0, 8);
  char* floats = record_.data() + kHeader;
  std::memcpy(floats, values, row_bytes);
  for (int k = 0; k < num_slots_; ++k) {
    std::memcpy(floats + row_bytes * (1 + k), slots[k], row_bytes);
  }
  const uint32_t crc = RecordCrc(record_);
  std::memcpy(record_.data() + kCrcAt, &crc, 4);
  RETURN_IF_ERROR(file_->Write(static_cast<int64_t>(place) * record_bytes(),
                               absl::string_view(record_.data(), record_.size())));
  if (!free_places_.empty()) {
    free_places_.pop_back();
  } else {
    ++places_;
  }
  index_.emplace(id, Entry{place, generation, touched});
  return absl::OkStatus();
}

absl::Status RowTier::Get(uint64_t id, float* values, const std::vector<float*>& slots,
                          int64_t* updates) const {
  auto it = index_.find(id);
  if (it == index_.end()) {
    return absl::InternalError(absl::StrCat("disk tier ", path_, ": no row ", id));
  }
  const int64_t offset = static_cast<int64_t>(it->second.place) * record_bytes();
  RETURN_IF_ERROR(file_->Read(offset, record_bytes(), record_.data()));
  uint64_t stored_id;
  uint32_t crc;
  std::memcpy(&stored_id, record_.data() + kIdAt, 8);
  std::memcpy(&crc, record_.data() + kCrcAt, 4);
  std::memset(record_.data() + kCrcAt, 0, 4);
  if (stored_id != id || crc != RecordCrc(record_)) {
    return absl::DataLossError(absl::StrCat("disk tier ", path_, ": the record of row ", id,
                                            " at offset ", offset, " is damaged (",
                                            stored_id != id ? "another id" : "checksum",
                                            " mismatch)"));
  }
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(dim_);
  const char* floats = record_.data() + kHeader;
  std::memcpy(values, floats, row_bytes);
  for (int k = 0; k < num_slots_; ++k) {
    std::memcpy(slots[k], floats + row_bytes * (1 + k), row_bytes);
  }
  std::memcpy(updates, record_.data() + kUpdatesAt, 8);
  return absl::OkStatus();
}

bool RowTier::Erase(uint64_t id) {
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  free_places_.push_back(it->second.place);
  index_.erase(it);
  return true;
}

}  // namespace pstrain
