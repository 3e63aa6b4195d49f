// The disk tier of one shard of an embedding table: the rows that did not
// fit in the table's memory budget, as fixed-size records in one file.
//
// The file is a log of segments of kSegmentBytes (a few hundred records):
// rows moved out are gathered in the open segment in memory and written
// with one write when it is full, so moving rows out costs one system call
// per segment, not per row (a write per row made the tier 3x slower than
// memory at a 90% hit rate). A row read back is read where it lies (from
// the open segment while it is there) and its place becomes garbage; a
// segment with no live record is reused whole, and when garbage passes half
// the file the emptiest segment's live records are moved into the open one,
// so the file stays within about twice the rows it holds (and a few
// segments). The index (id -> place, the row's last-touched step and the
// generation of its last change) stays in memory, so expiry and delta saves
// never scan the file. A checkpoint's cut pins the tier (PinnedRows, below):
// its writer reads the records where they lie, and until it is done no
// segment is reused or compacted.
//
// A record: id (u64), update count (i64), CRC32C of the rest (u32), 4 bytes
// of zeros, then the row's values and each optimizer slot (dim floats
// each), little-endian as in memory. A record read back is checked against
// its CRC and its id: a torn or damaged record is DATA_LOSS, never a row
// with other values.
//
// The file is a cache of the table, not a store: nothing is fsynced, and a
// restarted server starts it empty and reloads rows from a checkpoint. It
// is unlinked as soon as it is open, so it leaves nothing behind, even when
// its server is killed. Written and read through an Env, so tests inject
// full disks and read errors: a segment the disk refuses stays in memory
// and the rows after it are refused (they stay in their table's memory)
// until a write succeeds. Not thread-safe: its table's shard lock guards it.
#ifndef PSTRAIN_PS_SERVER_ROW_TIER_H_
#define PSTRAIN_PS_SERVER_ROW_TIER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/storage/env.h"

namespace pstrain {

// Threads that run a caller's tasks beside it (the tiers' reads of rows not
// in memory: past the page cache each waits on the disk, and a disk serves
// several at once). Thread-safe; the destructor joins the threads.
class ReadPool {
 public:
  explicit ReadPool(int threads);
  ~ReadPool();
  ReadPool(const ReadPool&) = delete;
  ReadPool& operator=(const ReadPool&) = delete;

  // Runs fn(0), ..., fn(n - 1) on the pool's threads and the caller's, and
  // returns once all have run.
  void ParallelFor(int n, const std::function<void(int)>& fn);

 private:
  struct Job {
    const std::function<void(int)>* fn = nullptr;
    int n = 0;
    int next = 0;  // the next index to claim
    int done = 0;
  };
  // Claims an index of the first job with one left, or returns false.
  bool Claim(Job** job, int* i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();

  absl::Mutex mu_;
  std::deque<Job*> jobs_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

class PinnedRows;

class RowTier {
 public:
  // A segment's size (at least one record).
  static constexpr int64_t kSegmentBytes = 64 << 10;

  struct Entry {
    uint32_t place = 0;       // record index in the file
    uint32_t generation = 0;  // of the row's last change (EmbeddingTable)
    int64_t touched = 0;      // the step it was last touched at
  };

  // Creates (or truncates) `path` for rows of `dim` floats with
  // `num_slots` optimizer slots, and unlinks it.
  static absl::StatusOr<std::unique_ptr<RowTier>> Open(Env* env, std::string path, int dim,
                                                       int num_slots);

  size_t size() const { return index_.size(); }
  int64_t record_bytes() const { return record_bytes_; }
  // The file's length (its segments, the open one included).
  int64_t file_bytes() const {
    return static_cast<int64_t>(live_.size()) * per_segment_ * record_bytes_;
  }
  const std::string& path() const { return path_; }
  const absl::flat_hash_map<uint64_t, Entry>& entries() const { return index_; }

  // The entry of `id`, or null.
  const Entry* Find(uint64_t id) const {
    auto it = index_.find(id);
    return it == index_.end() ? nullptr : &it->second;
  }
  // Adds row `id` (not in the tier): `values` and each of `slots` (one per
  // optimizer slot) dim floats. An error (a full disk: the open segment
  // could not be written) leaves the row out of the tier.
  absl::Status Put(uint64_t id, const float* values, const std::vector<const float*>& slots,
                   int64_t updates, int64_t touched, uint32_t generation);
  // Reads row `id` (in the tier) into `values`, `slots` and `updates`;
  // DATA_LOSS when its record does not check, an I/O error as the Env gives
  // it. The tier is unchanged either way.
  absl::Status Get(uint64_t id, float* values, const std::vector<float*>& slots,
                   int64_t* updates) const;
  // The records of `ids` (each in the tier, no id twice) into out[k *
  // record_bytes(), ...), read in parallel on `pool` (may be null); then
  // Decode gives each row. An I/O error as the Env gives it.
  absl::Status ReadRecords(const std::vector<uint64_t>& ids, char* out, ReadPool* pool) const;
  // Row `id` from its record (as ReadRecords read it; the record is
  // changed), checked as Get checks it.
  absl::Status Decode(uint64_t id, char* record, float* values, const std::vector<float*>& slots,
                      int64_t* updates) const;
  // Drops `id` from the tier (its place becomes garbage); false when absent.
  bool Erase(uint64_t id);
  // A hint that row `id` (in the tier) will be read soon: the disk may
  // start reading its record now (RandomRWFile::Prefetch).
  void Prefetch(uint64_t id) const;

  // The rows whose entries `select` keeps, as they stand, for a reader off
  // the table's lock (a checkpoint's writer): while the PinnedRows lives,
  // the tier reuses no segment and compacts none, so every record pinned
  // stays where it lies (new records go to new segments at the file's end).
  std::unique_ptr<PinnedRows> Pin(const std::function<bool(const Entry&)>& select) const;

 private:
  RowTier(std::string path, std::unique_ptr<RandomRWFile> file, int dim, int num_slots);

  uint32_t SegmentOf(uint32_t place) const { return place / per_segment_; }
  int64_t OffsetOf(uint32_t place) const { return static_cast<int64_t>(place) * record_bytes_; }
  // Room for one more record in the open segment: when it is full, writes
  // it and opens another (compacting where garbage is past half the file).
  absl::Status MakeRoom();
  // Where the open segment's next record goes (after MakeRoom).
  char* OpenSlot();
  // Indexes the record just put at OpenSlot() as `id`'s (its place set here).
  void Commit(uint64_t id, Entry entry);
  // Writes the open segment (when it holds records) and opens another: a
  // segment with no live record, else a new one at the file's end.
  absl::Status Seal();
  // Moves the live records of the emptiest sealed segment into the open
  // one, when garbage is more than half the file.
  absl::Status Compact();
  // Record `place`'s bytes into `dst`, from the open segment or the file.
  absl::Status ReadRecord(uint32_t place, char* dst) const;
  // Whether a PinnedRows of this tier lives.
  bool pinned() const { return pins_->load(std::memory_order_acquire) > 0; }

  const std::string path_;
  // Shared with PinnedRows, which may outlive the tier.
  std::shared_ptr<RandomRWFile> file_;
  std::shared_ptr<std::atomic<int>> pins_ = std::make_shared<std::atomic<int>>(0);
  const int dim_;
  const int num_slots_;
  const int64_t record_bytes_;
  const uint32_t per_segment_;  // records a segment holds
  absl::flat_hash_map<uint64_t, Entry> index_;
  std::vector<uint32_t> live_;  // per segment: its live records
  std::vector<uint32_t> free_segments_;  // sealed, no live record
  uint32_t open_ = 0;        // the open segment
  uint32_t open_count_ = 0;  // records appended to it
  std::vector<char> open_records_;  // its contents
  bool compacting_ = false;
  mutable std::vector<char> record_;  // one record read by Get, reused
};

// Rows of a tier pinned at a cut (RowTier::Pin): their ids, last-touched
// steps and places, and a copy of the open segment's records, read back
// off the table's lock (the file through pread, at places no write
// touches while the pin lives). Thread-compatible; the tier may change, or
// be gone, meanwhile.
class PinnedRows {
 public:
  struct Row {
    uint64_t id = 0;
    int64_t touched = 0;
    uint32_t place = 0;
  };
  ~PinnedRows();
  PinnedRows(const PinnedRows&) = delete;
  PinnedRows& operator=(const PinnedRows&) = delete;

  size_t size() const { return rows_.size(); }
  // Row i, in the order Read gives them (the file's, once Read was called).
  const Row& row(size_t i) const { return rows_[i]; }
  // Rows [begin, end) into values[(i - begin) x dim ...), each slot alike,
  // and updates[i - begin], read in the file's order (spans of up to 1 MiB:
  // sequential reads); each record checked as RowTier::Get checks it
  // (DATA_LOSS naming the row), an I/O error as the Env gives it.
  absl::Status Read(size_t begin, size_t end, float* values, const std::vector<float*>& slots,
                    int64_t* updates);

 private:
  friend class RowTier;
  PinnedRows() = default;

  std::string path_;
  std::shared_ptr<RandomRWFile> file_;
  std::shared_ptr<std::atomic<int>> pins_;
  int dim_ = 0;
  int num_slots_ = 0;
  int64_t record_bytes_ = 0;
  uint32_t per_segment_ = 0;
  std::vector<Row> rows_;
  bool sorted_ = false;  // rows_ by place (sorted by the first Read, off the lock)
  // The open segment at the cut: its index, and its records (in memory).
  uint32_t open_ = 0;
  std::vector<char> open_records_;
  std::vector<char> span_;  // a span of records read, reused
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_ROW_TIER_H_
