#include "ps_server/embedding_table.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/embedding_ids.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/base/tensor.h"

namespace pstrain {
namespace {

// Rows are read at random: with 4 KiB pages a lookup in a table of hundreds
// of megabytes also misses the TLB. Grows `v` to `n` elements, and when that
// takes a new buffer, asks for transparent huge pages over it before the
// old rows are copied in (so they are faulted in as 2 MiB pages; the kernel
// decides, and ignores the advice where THP is off).
template <typename T>
void GrowRows(std::vector<T>* v, size_t n) {
  constexpr size_t kHuge = size_t{2} << 20;
  if (n > v->capacity() && std::max(n, 2 * v->capacity()) * sizeof(T) >= 2 * kHuge) {
    std::vector<T> bigger;
    bigger.reserve(std::max(n, 2 * v->capacity()));
    const uintptr_t begin = reinterpret_cast<uintptr_t>(bigger.data());
    const uintptr_t end = begin + bigger.capacity() * sizeof(T);
    const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1), last = end & ~(kHuge - 1);
    if (last > first) {
      ::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);  // advice only
    }
    bigger.assign(v->begin(), v->end());
    v->swap(bigger);
  }
  v->resize(n);
}

}  // namespace

EmbeddingTable::EmbeddingTable(Options options, const Optimizer* optimizer)
    : options_(std::move(options)), optimizer_(optimizer) {
  optimizer_->InitSlots(options_.dim, &row_slot_init_);
  for (Shard& s : shards_) {
    absl::MutexLock lock(&s.mu);
    s.slots.resize(row_slot_init_.size());
  }
}

absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::Create(
    Options options, const Optimizer* optimizer) {
  if (options.memory_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("table ", options.name, ": a memory budget of ",
                                                   options.memory_rows, " rows"));
  }
  auto table = std::make_unique<EmbeddingTable>(options, optimizer);
  if (options.memory_rows == 0) return table;
  if (options.tier_prefix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", options.name, ": a memory budget needs a place for its rows"));
  }
  Env* env = options.env != nullptr ? options.env : Env::Default();
  RETURN_IF_ERROR(env->CreateDirs(Dirname(options.tier_prefix)));
  table->shard_memory_rows_ =
      static_cast<size_t>(std::max<int64_t>(1, (options.memory_rows + kShards - 1) / kShards));
  for (int k = 0; k < kShards; ++k) {
    Shard& s = table->shards_[k];
    absl::MutexLock lock(&s.mu);
    ASSIGN_OR_RETURN(s.tier,
                     RowTier::Open(env, absl::StrFormat("%s.shard-%02d", options.tier_prefix, k),
                                   options.dim, static_cast<int>(table->row_slot_init_.size())));
  }
  return table;
}

absl::Status EmbeddingTable::Fail(absl::Status st) const {
  absl::MutexLock lock(&failure_mu_);
  if (failure_.ok()) {
    failure_ = absl::Status(st.code(), absl::StrCat("table ", options_.name, ": ", st.message(),
                                                    "; the table has failed: restart the server "
                                                    "from a checkpoint"));
    // (One string: GCC's -O3 warns falsely inside fmt on a string_view.)
    LOG_ERROR("{}", std::string(failure_.message()));
    failed_.store(true, std::memory_order_release);
  }
  return failure_;
}

absl::Status EmbeddingTable::failure() const {
  if (!failed_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&failure_mu_);
  return failure_;
}

int EmbeddingTable::ShardOf(uint64_t id) {
  // Bits independent of the ones that chose the server (ServerForId hashes
  // MixId(id)), so a server's rows spread over all its shards.
  return static_cast<int>(MixId(id ^ 0x6a09e667f3bcc908ULL) >> 60);
}

absl::Status EmbeddingTable::CheckIds(absl::Span<const uint64_t> ids) const {
  if (options_.num_rows <= 0) return absl::OkStatus();
  for (uint64_t id : ids) {
    if (id >= static_cast<uint64_t>(options_.num_rows)) {
      return absl::OutOfRangeError(absl::StrCat("table ", options_.name, ": id ", id,
                                                " out of range [0, ", options_.num_rows, ")"));
    }
  }
  return absl::OkStatus();
}

template <typename F>
void EmbeddingTable::ForEachShardGroup(absl::Span<const uint64_t> ids, F visit) {
  // A counting sort of positions by shard: each shard is locked once.
  const size_t n = ids.size();
  std::vector<uint8_t> shard_of(n);
  std::array<uint32_t, kShards + 1> start{};
  for (size_t i = 0; i < n; ++i) {
    shard_of[i] = static_cast<uint8_t>(ShardOf(ids[i]));
    ++start[shard_of[i] + 1];
  }
  for (int k = 0; k < kShards; ++k) start[k + 1] += start[k];
  std::vector<uint32_t> order(n);
  std::array<uint32_t, kShards> at;
  std::copy(start.begin(), start.begin() + kShards, at.begin());
  for (size_t i = 0; i < n; ++i) order[at[shard_of[i]]++] = static_cast<uint32_t>(i);
  // Past the page cache each row on disk waits on the disk (reads average
  // parallel_read_ns or more): ask for every shard's first, so the reads of
  // the whole call wait together, not one shard's after another's, and
  // read each shard's on the pool. Every 64th call does neither, to time
  // serial reads again (ReadBack).
  const bool fast_reads =
      shard_memory_rows_ > 0 &&
      read_ns_.load(std::memory_order_relaxed) >= options_.parallel_read_ns &&
      read_calls_.fetch_add(1, std::memory_order_relaxed) % 64 != 0;
  if (fast_reads) {
    for (int k = 0; k < kShards; ++k) {
      if (start[k] == start[k + 1]) continue;
      Shard& s = shards_[k];
      absl::MutexLock lock(&s.mu);
      for (uint32_t j = start[k]; j < start[k + 1]; ++j) {
        const uint64_t id = ids[order[j]];
        if (!s.index.contains(id)) s.tier->Prefetch(id);
      }
    }
  }
  for (int k = 0; k < kShards; ++k) {
    if (start[k] == start[k + 1]) continue;
    Shard& s = shards_[k];
    absl::MutexLock lock(&s.mu);
    s.fast_reads = fast_reads;
    visit(&s, order.data() + start[k], static_cast<size_t>(start[k + 1] - start[k]));
  }
}

absl::Status EmbeddingTable::FindRows(Shard* s, absl::Span<const uint64_t> ids,
                                      const uint32_t* pos, size_t count, bool with_slots,
                                      std::vector<int64_t>* rows) {
  // Random rows of a large table are cache misses: find every row of the
  // group first, with the index probes and the rows' lines (and their
  // slots') prefetched ahead, before the caller touches them.
  constexpr size_t kAhead = 32;
  const size_t row_bytes = sizeof(float) * options_.dim;
  rows->resize(count);
  auto prefetch = [row_bytes](const float* p) {
    const char* line = reinterpret_cast<const char*>(p);
    for (size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(line + b);
  };
  // The first kAhead probes too: a group is a few hundred ids (a batch over
  // 16 shards), so they would be an eighth of its misses.
  if (s->tier != nullptr) {
    // The group's rows on disk, read back together first.
    std::vector<uint64_t> on_disk;
    for (size_t j = 0; j < count; ++j) {
      const uint64_t id = ids[pos[j]];
      if (!s->index.contains(id) && s->tier->Find(id) != nullptr) on_disk.push_back(id);
    }
    std::sort(on_disk.begin(), on_disk.end());
    on_disk.erase(std::unique(on_disk.begin(), on_disk.end()), on_disk.end());
    RETURN_IF_ERROR(ReadBack(s, on_disk));
  }
  for (size_t j = 0; j < std::min(kAhead, count); ++j) s->index.prefetch(ids[pos[j]]);
  for (size_t j = 0; j < count; ++j) {
    if (j + kAhead < count) s->index.prefetch(ids[pos[j + kAhead]]);
    auto it = s->index.find(ids[pos[j]]);
    const int64_t row = it == s->index.end() ? int64_t{-1} : static_cast<int64_t>(it->second);
    (*rows)[j] = row;
    if (row < 0) continue;
    const size_t at = static_cast<size_t>(row) * options_.dim;
    prefetch(s->values.data() + at);
    // Lookups and updates write the row's last-touched step (updates its
    // count too): another random line each, prefetched for writing.
    __builtin_prefetch(s->touched.data() + row, 1);
    if (with_slots) {
      __builtin_prefetch(s->updates.data() + row, 1);
      for (const std::vector<float>& slot : s->slots) prefetch(slot.data() + at);
    }
  }
  return absl::OkStatus();
}

int64_t EmbeddingTable::FindOrCreate(Shard* s, uint64_t id, bool create) {
  auto it = s->index.find(id);
  if (it != s->index.end()) return it->second;
  if (!create) return -1;
  if (s->tier != nullptr) s->tier->Erase(id);  // replaced (a checkpoint's row)
  const int dim = options_.dim;
  const uint32_t row = AllocateRow(s);
  const size_t at = static_cast<size_t>(row) * dim;
  InitialRow(options_.seed, id, dim, options_.init_scale, s->values.data() + at);
  for (size_t k = 0; k < s->slots.size(); ++k) {
    std::copy(row_slot_init_[k].begin(), row_slot_init_[k].end(), s->slots[k].begin() + at);
  }
  s->updates[row] = 0;
  s->row_ids[row] = id;
  s->touched[row] = {0, generation()};
  s->index.emplace(id, row);
  if (!s->deleted.empty()) s->deleted.erase(id);
  Used(s, row);
  return row;
}

uint32_t EmbeddingTable::AllocateRow(Shard* s) {
  if (!s->free_rows.empty()) {
    const uint32_t row = s->free_rows.back();
    s->free_rows.pop_back();
    return row;
  }
  const size_t dim = static_cast<size_t>(options_.dim);
  const uint32_t row = static_cast<uint32_t>(s->row_ids.size());
  GrowRows(&s->values, s->values.size() + dim);
  for (auto& slot : s->slots) GrowRows(&slot, slot.size() + dim);
  s->updates.push_back(0);
  s->touched.push_back({});
  s->row_ids.push_back(0);
  if (s->tier != nullptr) s->clock.push_back(kFree);
  return row;
}

absl::Status EmbeddingTable::ReadBack(Shard* s, const std::vector<uint64_t>& ids) {
  if (ids.empty()) return absl::OkStatus();
  const size_t record = static_cast<size_t>(s->tier->record_bytes());
  std::vector<char> records(ids.size() * record);
  // In parallel where reads wait on the disk (past the page cache: tens of
  // microseconds each; ForEachShardGroup asked for them already); from the
  // page cache a read is a copy, which the pool's hand-offs would only
  // slow. Serial reads not asked for ahead are timed.
  const int64_t per_read_ns = read_ns_.load(std::memory_order_relaxed);
  const bool parallel = s->fast_reads && ids.size() >= 4;
  const absl::Time start = absl::Now();
  if (parallel) {
    // Made on first need: a table whose reads stay in the page cache (or
    // an Initialize part's, dropped at once) starts no threads.
    absl::call_once(read_pool_once_,
                    [this] { read_pool_ = std::make_unique<ReadPool>(kReadThreads); });
  }
  if (absl::Status st =
          s->tier->ReadRecords(ids, records.data(), parallel ? read_pool_.get() : nullptr);
      !st.ok()) {
    return Fail(st);
  }
  if (!s->fast_reads) {
    const int64_t sample =
        absl::ToInt64Nanoseconds(absl::Now() - start) / static_cast<int64_t>(ids.size());
    read_ns_.store(per_read_ns + (sample - per_read_ns) / 8, std::memory_order_relaxed);
  }
  std::vector<float*> slots(s->slots.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    const uint64_t id = ids[k];
    const RowTier::Entry* entry = s->tier->Find(id);
    const Touch touch{entry->touched, entry->generation};
    const uint32_t row = AllocateRow(s);  // (may move the rows: pointers after it)
    const size_t at = static_cast<size_t>(row) * options_.dim;
    for (size_t j = 0; j < slots.size(); ++j) slots[j] = s->slots[j].data() + at;
    if (absl::Status st = s->tier->Decode(id, records.data() + k * record,
                                          s->values.data() + at, slots, &s->updates[row]);
        !st.ok()) {
      s->free_rows.push_back(row);
      return Fail(st);
    }
    s->tier->Erase(id);
    s->row_ids[row] = id;
    s->touched[row] = touch;
    s->index.emplace(id, row);
    s->clock[row] = kUsed;
    ++s->disk_reads;
  }
  return absl::OkStatus();
}

bool EmbeddingTable::PeekDisk(const Shard& s, uint64_t id, float* values, OptimizerSlots* slots,
                              int64_t* updates) const {
  if (s.tier == nullptr || s.tier->Find(id) == nullptr) return false;
  const size_t dim = static_cast<size_t>(options_.dim);
  OptimizerSlots scratch;
  OptimizerSlots* into = slots != nullptr ? slots : &scratch;
  into->assign(s.slots.size(), std::vector<float>(dim));
  std::vector<float*> slot_ptrs;
  for (auto& slot : *into) slot_ptrs.push_back(slot.data());
  int64_t count = 0;
  if (absl::Status st = s.tier->Get(id, values, slot_ptrs, &count); !st.ok()) {
    (void)Fail(st);
    return false;
  }
  if (updates != nullptr) *updates = count;
  return true;
}

void EmbeddingTable::Evict(Shard* s) {
  if (s->tier == nullptr) return;
  const size_t dim = static_cast<size_t>(options_.dim);
  std::vector<const float*> slots(s->slots.size());
  while (s->index.size() > shard_memory_rows_) {
    // CLOCK: the hand spares a row used since it last passed (clearing the
    // mark) and takes the first one not used. Two turns at most.
    const size_t n = s->row_ids.size();
    for (;;) {
      if (s->hand >= n) s->hand = 0;
      uint8_t& c = s->clock[s->hand];
      if (c == kLive) break;
      if (c == kUsed) c = kLive;
      ++s->hand;
    }
    const size_t row = s->hand++;
    const uint64_t id = s->row_ids[row];
    for (size_t k = 0; k < slots.size(); ++k) slots[k] = s->slots[k].data() + row * dim;
    if (absl::Status st = s->tier->Put(id, s->values.data() + row * dim, slots, s->updates[row],
                                       s->touched[row].step, s->touched[row].generation);
        !st.ok()) {
      // It stays in memory, over the budget; the next call tries again.
      if (s->disk_write_errors++ % 1000 == 0) {
        LOG_WARN("{}", absl::StrCat("table ", options_.name,
                                    ": a row stays in memory over the budget (",
                                    s->disk_write_errors, " times so far): ", st.message()));
      }
      return;
    }
    s->index.erase(id);
    s->free_rows.push_back(static_cast<uint32_t>(row));
    s->clock[row] = kFree;
    s->touched[row].generation = 0;  // in no delta while free
    ++s->disk_writes;
  }
}

absl::Status EmbeddingTable::Lookup(absl::Span<const uint64_t> ids, int64_t step, float* out) {
  RETURN_IF_ERROR(failure());
  if (absl::Status st = CheckIds(ids); !st.ok()) return st;
  const int dim = options_.dim;
  const int admit = options_.admit_after;
  const size_t row_bytes = sizeof(float) * dim;
  const uint32_t generation = this->generation();
  std::vector<int64_t> rows;
  absl::Status status;
  ForEachShardGroup(
      ids, [&](Shard* s, const uint32_t* pos, size_t count) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        if (!status.ok()) return;
        status = FindRows(s, ids, pos, count, /*with_slots=*/false, &rows);
        if (!status.ok()) return;
        for (size_t j = 0; j < count; ++j) {
          const uint32_t i = pos[j];
          const uint64_t id = ids[i];
          float* dst = out + static_cast<size_t>(i) * dim;
          int64_t row = rows[j];
          if (row < 0) {
            bool create = true;
            if (admit > 1 && s->index.find(id) == s->index.end()) {
              int32_t& seen = s->sightings[id];
              if (++seen >= admit) {
                s->sightings.erase(id);
              } else {
                create = false;
              }
            }
            row = FindOrCreate(s, id, create);  // also finds a duplicate created above
            if (row < 0) {
              std::fill(dst, dst + dim, 0.0f);
              continue;
            }
          }
          s->touched[row] = {step, generation};
          Used(s, row);
          std::memcpy(dst, s->values.data() + static_cast<size_t>(row) * dim, row_bytes);
        }
        Evict(s);
      });
  return status;
}

absl::Status EmbeddingTable::Peek(absl::Span<const uint64_t> ids, float* out) const {
  RETURN_IF_ERROR(failure());
  if (absl::Status st = CheckIds(ids); !st.ok()) return st;
  const size_t dim = static_cast<size_t>(options_.dim);
  for (size_t i = 0; i < ids.size(); ++i) {
    float* dst = out + i * dim;
    const Shard& s = shards_[ShardOf(ids[i])];
    absl::MutexLock lock(&s.mu);
    auto it = s.index.find(ids[i]);
    if (it != s.index.end()) {
      std::copy_n(s.values.begin() + static_cast<size_t>(it->second) * dim, dim, dst);
    } else if (PeekDisk(s, ids[i], dst, nullptr, nullptr)) {
      // read where it lies, not moved
    } else if (failed_.load(std::memory_order_acquire)) {
      return failure();
    } else if (options_.admit_after > 1) {
      std::fill(dst, dst + dim, 0.0f);
    } else {
      InitialRow(options_.seed, ids[i], options_.dim, options_.init_scale, dst);
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::ApplyGradients(absl::Span<const uint64_t> ids, const float* grads,
                                            float scale, float learning_rate, float clip_value,
                                            int64_t step) {
  RETURN_IF_ERROR(failure());
  if (absl::Status st = CheckGradients(ids, grads); !st.ok()) return st;
  const int dim = options_.dim;
  const size_t n = ids.size();
  // Sum duplicates in the order given.
  absl::flat_hash_map<uint64_t, uint32_t> first;
  first.reserve(n);
  std::vector<uint64_t> unique;
  std::vector<float> sum;
  unique.reserve(n);
  sum.reserve(n * dim);
  for (size_t i = 0; i < n; ++i) {
    const float* g = grads + i * dim;
    auto [it, fresh] = first.emplace(ids[i], static_cast<uint32_t>(unique.size()));
    if (fresh) {
      unique.push_back(ids[i]);
      sum.insert(sum.end(), g, g + dim);
    } else {
      float* acc = sum.data() + static_cast<size_t>(it->second) * dim;
      for (int j = 0; j < dim; ++j) acc[j] += g[j];
    }
  }
  if (scale != 1.0f) {
    for (float& v : sum) v *= scale;
  }
  if (clip_value > 0) ClipByValue(sum.data(), static_cast<int64_t>(sum.size()), clip_value);
  const bool needs_admission = options_.admit_after > 1;
  const uint32_t generation = this->generation();
  std::vector<int64_t> rows;
  absl::Status status;
  ForEachShardGroup(
      unique, [&](Shard* s, const uint32_t* pos, size_t count) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        // A tier that fails fails the table: the shards before keep their
        // updates, as no later call can read them.
        if (!status.ok()) return;
        status = FindRows(s, unique, pos, count, /*with_slots=*/true, &rows);
        if (!status.ok()) return;
        for (size_t j = 0; j < count; ++j) {
          const uint32_t i = pos[j];
          const int64_t row =
              rows[j] >= 0 ? rows[j] : FindOrCreate(s, unique[i], !needs_admission);
          if (row < 0) {
            ++s->dropped;
            continue;
          }
          UpdateInfo update;
          update.learning_rate = learning_rate;
          update.count = ++s->updates[row];
          float* values = s->values.data() + static_cast<size_t>(row) * dim;
          optimizer_->ApplyRange(values, values, sum.data() + static_cast<size_t>(i) * dim, dim,
                                 &s->slots, row * static_cast<int64_t>(dim), update);
          s->touched[row] = {step, generation};
          Used(s, row);
        }
        Evict(s);
      });
  return status;
}

absl::Status EmbeddingTable::CheckGradients(absl::Span<const uint64_t> ids,
                                            const float* grads) const {
  if (absl::Status st = CheckIds(ids); !st.ok()) return st;
  const size_t n = ids.size() * options_.dim;
  // The vectorised scan first; the element loop only names the bad row.
  if (AllFinite(absl::MakeConstSpan(grads, n))) return absl::OkStatus();
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(grads[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", options_.name, ": gradient row ", i / options_.dim, " (id ",
                       ids[i / options_.dim], ") contains NaN or Inf"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<EmbeddingTable::Rows> EmbeddingTable::ExportRows() const {
  ASSIGN_OR_RETURN(SavedRows saved, Export(0, /*pin=*/false));
  return std::move(saved.rows);
}

absl::StatusOr<EmbeddingTable::Rows> EmbeddingTable::ExportChangedRows(uint32_t after) const {
  // Generations start at 1: a delta on "generation 0" would be every row.
  ASSIGN_OR_RETURN(SavedRows saved, Export(std::max<uint32_t>(after, 1), /*pin=*/false));
  return std::move(saved.rows);
}

absl::StatusOr<EmbeddingTable::SavedRows> EmbeddingTable::CutRows(uint32_t after) const {
  return Export(after, /*pin=*/true);
}

uint32_t EmbeddingTable::EndGeneration() {
  return generation_.fetch_add(1, std::memory_order_relaxed);
}

void EmbeddingTable::ForgetDeletedThrough(uint32_t through) {
  for (Shard& s : shards_) {
    absl::MutexLock lock(&s.mu);
    absl::erase_if(s.deleted, [through](const auto& d) { return d.second <= through; });
  }
}

namespace {

// The rows on disk of a table's cut (EmbeddingTable::CutRows): each
// shard's pinned rows in turn, read in the file's order.
class DiskRows : public RowSource {
 public:
  DiskRows(std::vector<std::unique_ptr<PinnedRows>> shards, int dim)
      : shards_(std::move(shards)), dim_(static_cast<size_t>(dim)) {
    for (const auto& p : shards_) rows_ += static_cast<int64_t>(p->size());
  }

  int64_t rows() const override { return rows_; }

  absl::Status Next(int64_t n, uint64_t* ids, float* values, const std::vector<float*>& slots,
                    int64_t* updates, int64_t* touched) override {
    std::vector<float*> to = slots;
    while (n > 0 && shard_ < shards_.size()) {
      PinnedRows& p = *shards_[shard_];
      const size_t k = std::min(static_cast<size_t>(n), p.size() - next_);
      if (k == 0) {
        shards_[shard_++].reset();  // read: its tier is free to reuse its segments
        next_ = 0;
        continue;
      }
      RETURN_IF_ERROR(p.Read(next_, next_ + k, values, to, updates));
      for (size_t j = 0; j < k; ++j) {
        ids[j] = p.row(next_ + j).id;
        touched[j] = p.row(next_ + j).touched;
      }
      next_ += k;
      n -= static_cast<int64_t>(k);
      ids += k;
      touched += k;
      updates += k;
      values += k * dim_;
      for (float*& slot : to) slot += k * dim_;
    }
    if (n > 0) return absl::OutOfRangeError("more rows asked for than were cut");
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<PinnedRows>> shards_;
  const size_t dim_;
  int64_t rows_ = 0;
  size_t shard_ = 0, next_ = 0;
};

// /proc/meminfo's MemAvailable in bytes, or 0 when it cannot be read.
int64_t MemAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace

absl::Status EmbeddingTable::CheckExportFits(bool pin) const {
  const Stats st = stats();
  // Each row's values and slots, its id, update count and touched step;
  // pinned, a row on disk is its id, step and place.
  const int64_t copied = pin ? st.rows - st.rows_on_disk : st.rows;
  const int64_t need =
      copied * (RowBytes(options_.dim, static_cast<int>(row_slot_init_.size())) + 24) +
      (st.rows - copied) * static_cast<int64_t>(sizeof(PinnedRows::Row));
  const int64_t limit =
      options_.max_export_bytes > 0 ? options_.max_export_bytes : MemAvailableBytes();
  if (limit <= 0 || need <= limit) return absl::OkStatus();
  if (pin) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "table ", options_.name, ": a save copies the rows in memory and the places of those "
        "on disk first: ", copied, " and ", st.rows - copied, " rows, ", need, " bytes, where ",
        limit, " are available"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "table ", options_.name, ": a save of every row copies them into memory first: ",
      st.rows, " rows, ", need, " bytes, where ", limit, " are available"));
}

absl::StatusOr<EmbeddingTable::SavedRows> EmbeddingTable::Export(uint32_t after, bool pin) const {
  RETURN_IF_ERROR(failure());
  if (after == 0 && shard_memory_rows_ > 0) RETURN_IF_ERROR(CheckExportFits(pin));
  const size_t dim = static_cast<size_t>(options_.dim);
  constexpr uint32_t kOnDisk = ~uint32_t{0};
  SavedRows saved;
  Rows& out = saved.rows;
  out.slots.resize(row_slot_init_.size());
  std::vector<std::unique_ptr<PinnedRows>> pinned;
  for (const Shard& s : shards_) {
    absl::MutexLock lock(&s.mu);
    // (id, memory row or kOnDisk)
    std::vector<std::pair<uint64_t, uint32_t>> rows;
    if (s.tier != nullptr && pin) {
      pinned.push_back(s.tier->Pin(
          [after](const RowTier::Entry& e) { return after == 0 || e.generation > after; }));
    } else if (s.tier != nullptr) {
      for (const auto& [id, entry] : s.tier->entries()) {
        if (after == 0 || entry.generation > after) rows.emplace_back(id, kOnDisk);
      }
    }
    if (after == 0) {
      rows.insert(rows.end(), s.index.begin(), s.index.end());
    } else {
      // A scan of the stamps, in row order (a freed row's stamp is 0).
      for (size_t row = 0; row < s.touched.size(); ++row) {
        if (s.touched[row].generation > after) {
          rows.emplace_back(s.row_ids[row], static_cast<uint32_t>(row));
        }
      }
      const size_t first = out.deleted.size();
      for (const auto& [id, generation] : s.deleted) {
        if (generation > after) out.deleted.push_back(id);
      }
      std::sort(out.deleted.begin() + first, out.deleted.end());
    }
    std::sort(rows.begin(), rows.end());
    const size_t at = out.ids.size();
    out.ids.resize(at + rows.size());
    out.values.resize((at + rows.size()) * dim);
    for (auto& slot : out.slots) slot.resize((at + rows.size()) * dim);
    out.updates.resize(at + rows.size());
    out.touched.resize(at + rows.size());
    std::vector<float*> slots(out.slots.size());
    for (size_t j = 0; j < rows.size(); ++j) {
      const size_t row = rows[j].second, to = (at + j) * dim;
      out.ids[at + j] = rows[j].first;
      if (rows[j].second == kOnDisk) {
        for (size_t k = 0; k < slots.size(); ++k) slots[k] = out.slots[k].data() + to;
        if (absl::Status st = s.tier->Get(rows[j].first, out.values.data() + to, slots,
                                          &out.updates[at + j]);
            !st.ok()) {
          return Fail(st);
        }
        out.touched[at + j] = s.tier->Find(rows[j].first)->touched;
        continue;
      }
      std::copy_n(s.values.begin() + row * dim, dim, out.values.begin() + to);
      for (size_t k = 0; k < out.slots.size(); ++k) {
        std::copy_n(s.slots[k].begin() + row * dim, dim, out.slots[k].begin() + to);
      }
      out.updates[at + j] = s.updates[row];
      out.touched[at + j] = s.touched[row].step;
    }
  }
  int64_t on_disk = 0;
  for (const auto& p : pinned) on_disk += static_cast<int64_t>(p->size());
  if (on_disk > 0) {
    saved.on_disk = std::make_unique<DiskRows>(std::move(pinned), options_.dim);
  }
  return saved;
}

absl::Status EmbeddingTable::ImportRows(absl::Span<const uint64_t> ids, const float* values,
                                        const OptimizerSlots& slots,
                                        absl::Span<const int64_t> updates,
                                        absl::Span<const int64_t> touched) {
  const size_t dim = static_cast<size_t>(options_.dim);
  const size_t n = ids.size();
  if (absl::Status st = CheckIds(ids); !st.ok()) return st;
  if (!slots.empty() && slots.size() != row_slot_init_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("table ", options_.name, ": ", slots.size(),
                                                   " optimizer slots given, the optimizer has ",
                                                   row_slot_init_.size()));
  }
  for (const auto& slot : slots) {
    if (slot.size() != n * dim) {
      return absl::InvalidArgumentError(absl::StrCat("table ", options_.name, ": a slot of ",
                                                     slot.size(), " floats for ", n, " rows"));
    }
  }
  if ((!updates.empty() && updates.size() != n) || (!touched.empty() && touched.size() != n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", options_.name, ": update counts or steps for other than ", n, " rows"));
  }
  for (size_t i = 0; i < n * dim; ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", options_.name, ": a row is not finite"));
    }
  }
  RETURN_IF_ERROR(failure());
  for (size_t i = 0; i < n; ++i) {
    const uint64_t id = ids[i];
    Shard& s = shards_[ShardOf(id)];
    absl::MutexLock lock(&s.mu);
    const size_t row = static_cast<size_t>(FindOrCreate(&s, id, /*create=*/true));
    std::copy_n(values + i * dim, dim, s.values.begin() + row * dim);
    for (size_t k = 0; k < s.slots.size(); ++k) {
      const float* from = slots.empty() ? row_slot_init_[k].data() : slots[k].data() + i * dim;
      std::copy_n(from, dim, s.slots[k].begin() + row * dim);
    }
    s.updates[row] = slots.empty() || updates.empty() ? 0 : updates[i];
    s.touched[row] = {touched.empty() ? 0 : touched[i], generation()};
    s.sightings.erase(id);
    Evict(&s);
  }
  return absl::OkStatus();
}

int64_t EmbeddingTable::Expire(int64_t step, bool force) {
  if (options_.expire_after_steps <= 0) return 0;
  int64_t due = next_sweep_.load();
  if (!force && step < due) return 0;
  // One caller sweeps; the others go on.
  if (!next_sweep_.compare_exchange_strong(
          due, step + std::max<int64_t>(1, options_.expire_after_steps / 4))) {
    return 0;
  }
  const int64_t oldest = step - options_.expire_after_steps;
  const uint32_t generation = this->generation();
  int64_t dropped = 0;
  for (Shard& s : shards_) {
    absl::MutexLock lock(&s.mu);
    for (auto it = s.index.begin(); it != s.index.end();) {
      if (s.touched[it->second].step < oldest) {
        s.deleted[it->first] = generation;
        s.touched[it->second].generation = 0;  // in no delta while free
        s.free_rows.push_back(it->second);
        if (s.tier != nullptr) s.clock[it->second] = kFree;
        s.index.erase(it++);
        ++s.expired;
        ++dropped;
      } else {
        ++it;
      }
    }
    if (s.tier == nullptr) continue;
    std::vector<uint64_t> old;
    for (const auto& [id, entry] : s.tier->entries()) {
      if (entry.touched < oldest) old.push_back(id);
    }
    for (uint64_t id : old) {
      s.tier->Erase(id);
      s.deleted[id] = generation;
    }
    s.expired += static_cast<int64_t>(old.size());
    dropped += static_cast<int64_t>(old.size());
  }
  return dropped;
}

EmbeddingTable::Stats EmbeddingTable::stats() const {
  Stats st;
  const int64_t row_bytes = RowBytes(options_.dim, static_cast<int>(row_slot_init_.size()));
  for (const Shard& s : shards_) {
    absl::MutexLock lock(&s.mu);
    st.rows += static_cast<int64_t>(s.index.size());
    st.pending_ids += static_cast<int64_t>(s.sightings.size());
    st.rows_expired += s.expired;
    st.gradients_dropped += s.dropped;
    if (s.tier == nullptr) continue;
    st.rows_on_disk += static_cast<int64_t>(s.tier->size());
    st.disk_bytes += s.tier->file_bytes();
    st.disk_reads += s.disk_reads;
    st.disk_writes += s.disk_writes;
    st.disk_write_errors += s.disk_write_errors;
  }
  st.bytes = st.rows * row_bytes;
  st.rows += st.rows_on_disk;
  return st;
}

bool EmbeddingTable::ReadRow(uint64_t id, std::vector<float>* values, OptimizerSlots* slots,
                             int64_t* updates) const {
  const Shard& s = shards_[ShardOf(id)];
  absl::MutexLock lock(&s.mu);
  auto it = s.index.find(id);
  if (it == s.index.end()) {
    values->resize(static_cast<size_t>(options_.dim));
    return PeekDisk(s, id, values->data(), slots, updates);
  }
  const size_t at = static_cast<size_t>(it->second) * options_.dim;
  values->assign(s.values.begin() + at, s.values.begin() + at + options_.dim);
  if (slots != nullptr) {
    slots->assign(s.slots.size(), {});
    for (size_t k = 0; k < s.slots.size(); ++k) {
      (*slots)[k].assign(s.slots[k].begin() + at, s.slots[k].begin() + at + options_.dim);
    }
  }
  if (updates != nullptr) *updates = s.updates[it->second];
  return true;
}

}  // namespace pstrain
