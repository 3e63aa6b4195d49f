#include "ps_server/row_tier.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/crc32c.h"
#include "common/base/status_macros.h"

namespace pstrain {
namespace {

constexpr size_t kIdAt = 0, kUpdatesAt = 8, kCrcAt = 16, kHeader = 24;

uint32_t RecordCrc(const char* record, size_t bytes) {
  // Everything but the CRC itself: the id and count, then the floats.
  return Crc32cExtend(Crc32c(record, kCrcAt), record + kHeader, bytes - kHeader);
}

// Row `id` from its record `r` (changed: its CRC zeroed) into values[at,
// at + dim) and each slots[k][at, ...), and its update count; DATA_LOSS
// naming the row when the record is not id's or does not check.
absl::Status DecodeRecord(const std::string& path, int dim, int num_slots, int64_t record_bytes,
                          uint64_t id, int64_t offset, char* r, float* values,
                          float* const* slots, size_t at, int64_t* updates) {
  uint64_t stored_id;
  uint32_t crc;
  std::memcpy(&stored_id, r + kIdAt, 8);
  std::memcpy(&crc, r + kCrcAt, 4);
  std::memset(r + kCrcAt, 0, 4);
  if (stored_id != id || crc != RecordCrc(r, static_cast<size_t>(record_bytes))) {
    return absl::DataLossError(absl::StrCat("disk tier ", path, ": the record of row ", id,
                                            " at offset ", offset, " is damaged (",
                                            stored_id != id ? "another id" : "checksum",
                                            " mismatch)"));
  }
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(dim);
  std::memcpy(values + at, r + kHeader, row_bytes);
  for (int k = 0; k < num_slots; ++k) {
    std::memcpy(slots[k] + at, r + kHeader + row_bytes * (1 + k), row_bytes);
  }
  std::memcpy(updates, r + kUpdatesAt, 8);
  return absl::OkStatus();
}

}  // namespace

ReadPool::ReadPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

ReadPool::~ReadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

bool ReadPool::Claim(Job** job, int* i) {
  while (!jobs_.empty()) {
    Job* j = jobs_.front();
    if (j->next < j->n) {
      *job = j;
      *i = j->next++;
      return true;
    }
    jobs_.pop_front();  // every index claimed; its caller waits for them to run
  }
  return false;
}

void ReadPool::Loop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    Job* job = nullptr;
    int i = 0;
    auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !jobs_.empty(); };
    mu_.Await(absl::Condition(&work));
    if (stop_) return;
    if (!Claim(&job, &i)) continue;
    mu_.Unlock();
    (*job->fn)(i);
    mu_.Lock();
    ++job->done;  // the job's caller returns once all are done: its last use here
  }
}

void ReadPool::ParallelFor(int n, const std::function<void(int)>& fn) {
  if (n <= 1 || threads_.empty()) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  Job job;
  job.fn = &fn;
  job.n = n;
  absl::MutexLock lock(&mu_);
  jobs_.push_back(&job);
  // The caller works too, on its own job's indices.
  while (job.next < job.n) {
    const int i = job.next++;
    mu_.Unlock();
    fn(i);
    mu_.Lock();
    ++job.done;
  }
  auto all_done = [&job]() { return job.done == job.n; };
  mu_.Await(absl::Condition(&all_done));
  // Claimed whole, so no thread will look at it again; drop it if the
  // threads did not.
  for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
    if (*it == &job) {
      jobs_.erase(it);
      break;
    }
  }
}

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
      record_bytes_(static_cast<int64_t>(kHeader + sizeof(float) * static_cast<size_t>(dim) *
                                                       (1 + num_slots))),
      per_segment_(static_cast<uint32_t>(std::max<int64_t>(1, kSegmentBytes / record_bytes_))),
      live_(1, 0),
      open_records_(static_cast<size_t>(per_segment_ * record_bytes_)),
      record_(static_cast<size_t>(record_bytes_)) {}

absl::Status RowTier::Put(uint64_t id, const float* values,
                          const std::vector<const float*>& slots, int64_t updates,
                          int64_t touched, uint32_t generation) {
  if (index_.contains(id)) {
    return absl::InternalError(absl::StrCat("disk tier ", path_, ": row ", id, " written twice"));
  }
  RETURN_IF_ERROR(MakeRoom());
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(dim_);
  char* r = OpenSlot();  // built where it goes
  std::memcpy(r + kIdAt, &id, 8);
  std::memcpy(r + kUpdatesAt, &updates, 8);
  std::memset(r + kCrcAt, 0, 8);
  std::memcpy(r + kHeader, values, row_bytes);
  for (int k = 0; k < num_slots_; ++k) {
    std::memcpy(r + kHeader + row_bytes * (1 + k), slots[k], row_bytes);
  }
  const uint32_t crc = RecordCrc(r, static_cast<size_t>(record_bytes_));
  std::memcpy(r + kCrcAt, &crc, 4);
  Entry entry;
  entry.generation = generation;
  entry.touched = touched;
  Commit(id, entry);
  return absl::OkStatus();
}

absl::Status RowTier::MakeRoom() {
  if (open_count_ < per_segment_) return absl::OkStatus();
  RETURN_IF_ERROR(Seal());
  // Garbage is only made by reads and erases, so looking once a segment
  // suffices; a failure leaves every record where it was.
  RETURN_IF_ERROR(Compact());
  if (open_count_ == per_segment_) RETURN_IF_ERROR(Seal());
  return absl::OkStatus();
}

char* RowTier::OpenSlot() {
  return open_records_.data() + static_cast<size_t>(open_count_ * record_bytes_);
}

void RowTier::Commit(uint64_t id, Entry entry) {
  entry.place = open_ * per_segment_ + open_count_;
  ++open_count_;
  ++live_[open_];
  index_[id] = entry;
}

absl::Status RowTier::Seal() {
  if (open_count_ > 0) {
    RETURN_IF_ERROR(file_->Write(OffsetOf(open_ * per_segment_),
                                 absl::string_view(open_records_.data(),
                                                   static_cast<size_t>(open_count_ *
                                                                       record_bytes_))));
  }
  if (live_[open_] == 0 && open_count_ > 0) free_segments_.push_back(open_);
  if (!free_segments_.empty() && !pinned()) {
    open_ = free_segments_.back();
    free_segments_.pop_back();
  } else {
    if ((live_.size() + 1) * per_segment_ > std::numeric_limits<uint32_t>::max()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("disk tier ", path_, ": full at ", live_.size(), " segments"));
    }
    open_ = static_cast<uint32_t>(live_.size());
    live_.push_back(0);
  }
  open_count_ = 0;
  return absl::OkStatus();
}

absl::Status RowTier::Compact() {
  if (compacting_ || pinned()) return absl::OkStatus();
  const int64_t places = static_cast<int64_t>(live_.size()) * per_segment_;
  const int64_t garbage = places - static_cast<int64_t>(index_.size()) -
                          static_cast<int64_t>(per_segment_ - open_count_);
  if (2 * garbage <= places) return absl::OkStatus();
  uint32_t seg = open_;
  for (uint32_t s = 0; s < live_.size(); ++s) {
    if (s != open_ && live_[s] > 0 && (seg == open_ || live_[s] < live_[seg])) seg = s;
  }
  if (seg == open_) return absl::OkStatus();
  std::vector<char> records(static_cast<size_t>(per_segment_ * record_bytes_));
  RETURN_IF_ERROR(file_->Read(OffsetOf(seg * per_segment_), per_segment_ * record_bytes_,
                              records.data()));
  compacting_ = true;
  absl::Status status;
  for (uint32_t k = 0; k < per_segment_ && live_[seg] > 0 && status.ok(); ++k) {
    const char* r = records.data() + static_cast<size_t>(k * record_bytes_);
    uint64_t id;
    std::memcpy(&id, r + kIdAt, 8);
    auto it = index_.find(id);
    if (it == index_.end() || it->second.place != seg * per_segment_ + k) continue;
    status = MakeRoom();
    if (!status.ok()) break;
    std::memcpy(OpenSlot(), r, static_cast<size_t>(record_bytes_));
    Commit(id, it->second);
    --live_[seg];
  }
  compacting_ = false;
  if (live_[seg] == 0) free_segments_.push_back(seg);
  return status;
}

absl::Status RowTier::ReadRecord(uint32_t place, char* dst) const {
  if (SegmentOf(place) == open_) {
    std::memcpy(dst,
                open_records_.data() +
                    static_cast<size_t>((place - open_ * per_segment_) * record_bytes_),
                static_cast<size_t>(record_bytes_));
    return absl::OkStatus();
  }
  return file_->Read(OffsetOf(place), record_bytes_, dst);
}

absl::Status RowTier::Get(uint64_t id, float* values, const std::vector<float*>& slots,
                          int64_t* updates) const {
  auto it = index_.find(id);
  if (it == index_.end()) {
    return absl::InternalError(absl::StrCat("disk tier ", path_, ": no row ", id));
  }
  RETURN_IF_ERROR(ReadRecord(it->second.place, record_.data()));
  return Decode(id, record_.data(), values, slots, updates);
}

absl::Status RowTier::ReadRecords(const std::vector<uint64_t>& ids, char* out,
                                  ReadPool* pool) const {
  std::vector<uint32_t> places(ids.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    auto it = index_.find(ids[k]);
    if (it == index_.end()) {
      return absl::InternalError(absl::StrCat("disk tier ", path_, ": no row ", ids[k]));
    }
    places[k] = it->second.place;
  }
  std::vector<absl::Status> status(ids.size());
  auto read = [&](int k) {
    status[k] = ReadRecord(places[k], out + static_cast<size_t>(k * record_bytes_));
  };
  if (pool == nullptr) {
    for (size_t k = 0; k < ids.size(); ++k) read(static_cast<int>(k));
  } else {
    pool->ParallelFor(static_cast<int>(ids.size()), read);
  }
  for (const absl::Status& st : status) RETURN_IF_ERROR(st);
  return absl::OkStatus();
}

absl::Status RowTier::Decode(uint64_t id, char* r, float* values, const std::vector<float*>& slots,
                             int64_t* updates) const {
  const Entry* e = Find(id);
  return DecodeRecord(path_, dim_, num_slots_, record_bytes_, id,
                      e != nullptr ? OffsetOf(e->place) : -1, r, values, slots.data(), 0,
                      updates);
}

void RowTier::Prefetch(uint64_t id) const {
  const Entry* e = Find(id);
  if (e == nullptr || SegmentOf(e->place) == open_) return;  // in memory
  file_->Prefetch(OffsetOf(e->place), record_bytes_);
}

bool RowTier::Erase(uint64_t id) {
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  const uint32_t seg = SegmentOf(it->second.place);
  index_.erase(it);
  if (--live_[seg] == 0 && seg != open_) free_segments_.push_back(seg);
  return true;
}

std::unique_ptr<PinnedRows> RowTier::Pin(const std::function<bool(const Entry&)>& select) const {
  std::unique_ptr<PinnedRows> pin(new PinnedRows());
  pin->path_ = path_;
  pin->file_ = file_;
  pin->pins_ = pins_;
  pin->dim_ = dim_;
  pin->num_slots_ = num_slots_;
  pin->record_bytes_ = record_bytes_;
  pin->per_segment_ = per_segment_;
  for (const auto& [id, entry] : index_) {
    if (select(entry)) pin->rows_.push_back({id, entry.touched, entry.place});
  }
  pin->open_ = open_;
  const size_t open_bytes = static_cast<size_t>(open_count_ * record_bytes_);
  pin->open_records_.assign(open_records_.begin(), open_records_.begin() + open_bytes);
  pins_->fetch_add(1, std::memory_order_acq_rel);
  return pin;
}

PinnedRows::~PinnedRows() {
  if (pins_ != nullptr) pins_->fetch_sub(1, std::memory_order_acq_rel);
}

absl::Status PinnedRows::Read(size_t begin, size_t end, float* values,
                              const std::vector<float*>& slots, int64_t* updates) {
  if (!sorted_) {
    std::sort(rows_.begin(), rows_.end(),
              [](const Row& a, const Row& b) { return a.place < b.place; });
    sorted_ = true;
  }
  const int64_t span_records = std::max<int64_t>(1, (int64_t{1} << 20) / record_bytes_);
  const size_t dim = static_cast<size_t>(dim_);
  std::vector<char> record(static_cast<size_t>(record_bytes_));
  for (size_t i = begin; i < end;) {
    const uint32_t first = rows_[i].place;
    // A run of rows whose records lie in one span of the file (or the open
    // segment's copy).
    const bool open = first / per_segment_ == open_;
    size_t j = i + 1;
    while (j < end && (rows_[j].place / per_segment_ == open_) == open &&
           rows_[j].place - first < span_records) {
      ++j;
    }
    // Record `first` in memory: in the open segment's copy, or read with
    // the rest of the span.
    const char* base;
    if (open) {
      base = open_records_.data() +
             static_cast<size_t>((first - open_ * per_segment_) * record_bytes_);
    } else {
      const int64_t n = (rows_[j - 1].place - first + 1) * record_bytes_;
      span_.resize(static_cast<size_t>(n));
      RETURN_IF_ERROR(file_->Read(first * record_bytes_, n, span_.data()));
      base = span_.data();
    }
    for (; i < j; ++i) {
      // (Decoded from a copy: DecodeRecord zeroes the CRC it checks.)
      std::memcpy(record.data(),
                  base + static_cast<size_t>((rows_[i].place - first) * record_bytes_),
                  record.size());
      RETURN_IF_ERROR(DecodeRecord(path_, dim_, num_slots_, record_bytes_, rows_[i].id,
                                   rows_[i].place * record_bytes_, record.data(), values,
                                   slots.data(), (i - begin) * dim, updates + (i - begin)));
    }
  }
  return absl::OkStatus();
}

}  // namespace pstrain
