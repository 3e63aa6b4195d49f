// One server's share of an embedding table: rows of `dim` floats addressed
// by 64-bit ids, each with its optimizer slots, its own update count (Adam's
// bias correction is per row) and the step it was last touched at.
//
// A hashed table (num_rows 0) creates a row on first touch, with the value
// InitialRow gives from the table's seed and the id alone, so a row starts
// the same on any server in any order; a fixed-size table refuses ids out of
// [0, num_rows) and creates its rows the same way, lazily. Optional
// admission (a row is created only once its id was looked up k times;
// until then it reads as zeros and its gradients are dropped) and expiry (a
// row untouched for n steps is dropped), both off by default.
//
// A memory budget (Options::memory_rows, off by default) keeps at most that
// many rows in memory; the others live in a disk tier (row_tier.h, one file
// per shard, named Options::tier_prefix + ".shard-NN"), chosen by CLOCK (an
// approximation of least recently used: a row used since the hand last
// passed it is spared once). A row used while on disk is read back into
// memory first (where reads wait on the disk, a call's rows on disk are
// asked of it together, every shard's, and each shard's read in parallel by
// a pool of kReadThreads), so every lookup and update works on memory rows;
// a row lives in exactly one tier, values and slots together, and moving it
// never changes a bit of it. A row the disk cannot take (a full disk) stays
// in memory, over the budget, and is counted; a row the disk cannot give
// back (a read error, a damaged record) fails the table: that call and
// every later one return the error, and the server must restart from a
// checkpoint (the tier is a cache, no store: it starts empty).
//
// Concurrency: rows live in 16 shards by a hash of the id, each with its
// own mutex, so lookups and updates of different rows run in parallel; a
// request locks each shard it touches once. Every request is checked whole
// before any row changes.
#ifndef PSTRAIN_PS_SERVER_EMBEDDING_TABLE_H_
#define PSTRAIN_PS_SERVER_EMBEDDING_TABLE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"
#include "ps_server/optimizer.h"
#include "ps_server/row_tier.h"

namespace pstrain {

class EmbeddingTable {
 public:
  struct Options {
    std::string name;
    int dim = 0;
    int64_t num_rows = 0;  // 0: hashed
    float init_scale = 0;
    uint64_t seed = 0;  // TableSeed(run seed, name)
    int64_t expire_after_steps = 0;
    int admit_after = 0;
    // The most rows kept in memory (0: all); the rest in a disk tier of
    // files named `tier_prefix` + ".shard-NN" (their directory created;
    // the files unlinked once open), through `env` (null: Env::Default()).
    int64_t memory_rows = 0;
    std::string tier_prefix;
    Env* env = nullptr;
    // With a memory budget: an export of every row copies them all into
    // memory, so one that would take more than this many bytes is refused
    // (0: the memory available when it starts, /proc/meminfo's
    // MemAvailable).
    int64_t max_export_bytes = 0;
    // Rows on disk are read in parallel when a serial read takes this long
    // on average (past the page cache); 0: always in parallel (tests).
    int64_t parallel_read_ns = 10000;
  };
  struct Stats {
    int64_t rows = 0;   // in memory and on disk
    int64_t bytes = 0;  // values and slots in memory
    int64_t pending_ids = 0;  // seen, not yet admitted
    int64_t rows_expired = 0;
    int64_t gradients_dropped = 0;  // rows pushed that had no row (not admitted)
    // The disk tier (all 0 without a memory budget): rows there (of `rows`),
    // the bytes of its files, rows read back into memory and written out,
    // and rows the disk refused (kept in memory).
    int64_t rows_on_disk = 0;
    int64_t disk_bytes = 0;
    int64_t disk_reads = 0;
    int64_t disk_writes = 0;
    int64_t disk_write_errors = 0;
  };

  // The bytes of a row's values and its `num_slots` optimizer slots (what
  // Stats::bytes and a memory budget count).
  static int64_t RowBytes(int dim, int num_slots) {
    return int64_t{4} * dim * (1 + static_cast<int64_t>(num_slots));
  }

  // A table with a memory budget (its disk tier opened), or without one.
  static absl::StatusOr<std::unique_ptr<EmbeddingTable>> Create(Options options,
                                                                const Optimizer* optimizer);
  // `optimizer` must outlive the table. No memory budget (Create opens one).
  EmbeddingTable(Options options, const Optimizer* optimizer);

  const Options& options() const { return options_; }
  int dim() const { return options_.dim; }
  const std::string& name() const { return options_.name; }

  // Copies the rows of `ids` into out[i * dim, (i + 1) * dim), creating the
  // ones that do not exist yet (admission permitting; a row not admitted
  // reads as zeros), and marks them touched at `step`. Refuses, changing
  // nothing, when an id is outside a fixed-size table.
  absl::Status Lookup(absl::Span<const uint64_t> ids, int64_t step, float* out);
  // Reads the rows of `ids` into `out` as Lookup would, changing nothing: a
  // row that does not exist reads as it would be created (or zeros where
  // admission would not create it yet), and no row is marked touched. For
  // readers outside training (the chief's evaluation), whose timing must
  // not change what training does.
  absl::Status Peek(absl::Span<const uint64_t> ids, float* out) const;

  // Applies gradient rows grads[i * dim, ...) for `ids`: duplicate ids are
  // summed first (in the order given), the sum is multiplied by `scale` and
  // clipped into [-clip_value, clip_value] (0: no clip), and each distinct
  // row gets one optimizer update at `learning_rate` with its own count; a
  // row that does not exist is created first (a hashed table's row admitted
  // or not needing admission) or its gradient is dropped and counted. Rows
  // not named keep their values and slots. Refuses, changing nothing, ids
  // outside a fixed-size table and non-finite gradients.
  absl::Status ApplyGradients(absl::Span<const uint64_t> ids, const float* grads, float scale,
                              float learning_rate, float clip_value, int64_t step);

  // What ApplyGradients refuses: ids outside a fixed-size table, non-finite
  // gradients (for callers that hold gradients to apply later).
  absl::Status CheckGradients(absl::Span<const uint64_t> ids, const float* grads) const;

  // Drops rows last touched before step - expire_after_steps; returns how
  // many. A no-op without expiry. A sweep visits every row, so it runs at
  // most every expire_after_steps / 4 steps (a row lives at most 1.25 x
  // expire_after_steps untouched); `force` sweeps now.
  int64_t Expire(int64_t step, bool force = false);

  Stats stats() const;

  // Every row, for a checkpoint: ids ascending within each of the table's
  // shards (each shard locked while it is copied), with values, slots (the
  // optimizer's order), update counts and last-touched steps. Admission
  // sightings are not kept: ids not yet admitted start counting again.
  struct Rows {
    std::vector<uint64_t> ids;
    std::vector<float> values;
    OptimizerSlots slots;
    std::vector<int64_t> updates, touched;
    std::vector<uint64_t> deleted;  // ExportChangedRows: ids dropped, ascending per shard
  };
  // A row the disk tier cannot give back fails the export (and the table);
  // with a memory budget, RESOURCE_EXHAUSTED when the copy would not fit in
  // memory (Options::max_export_bytes), the table unchanged.
  absl::StatusOr<Rows> ExportRows() const;

  // Incremental saves. Every change to a row (created, looked up, updated,
  // imported) and every row dropped (expired) is stamped with the table's
  // current generation, which starts at 1; EndGeneration() starts the next
  // one and returns the one that ended. A save calls it while no row
  // changes (a checkpoint's cut), so generation g holds exactly the changes
  // between save g - 1 and save g.
  uint32_t EndGeneration();
  // The rows changed in generations after `after` (as ExportRows has them),
  // and in `deleted` the ids dropped since then that are not rows again:
  // what a save after the one that ended generation `after` must add to it.
  absl::StatusOr<Rows> ExportChangedRows(uint32_t after) const;
  // Forgets the dropped ids stamped `through` or earlier: no save to come
  // is a delta on a save before that.
  void ForgetDeletedThrough(uint32_t through);
  // A checkpoint's rows, cut while no row changes: `after` 0, every row (as
  // ExportRows), else those changed since generation `after` and the ids
  // dropped (as ExportChangedRows). The rows in memory are copied into
  // `rows`; with a memory budget the rows on disk are not: `on_disk` reads
  // them where they lie as the shard is written, off the table's locks (the
  // disk tier pinned meanwhile: RowTier::Pin), so a table larger than
  // memory is saved in full without copying it. Ids ascending within each
  // shard's rows in memory, then each shard's rows on disk in the file's
  // order. RESOURCE_EXHAUSTED when even the cut would not fit in memory (as
  // ExportRows, counting 24 bytes a row on disk), the table unchanged.
  struct SavedRows {
    Rows rows;
    std::unique_ptr<RowSource> on_disk;  // null: no rows on disk
  };
  absl::StatusOr<SavedRows> CutRows(uint32_t after) const;
  // Sets rows from a checkpoint, creating them where absent; `slots` empty
  // gives the rows fresh optimizer state (update counts 0), else it must
  // have one buffer per slot of ids.size() x dim. `updates` and `touched`
  // are per id (empty: 0). Refuses, changing nothing, ids outside a
  // fixed-size table, wrong sizes and non-finite values.
  absl::Status ImportRows(absl::Span<const uint64_t> ids, const float* values,
                          const OptimizerSlots& slots, absl::Span<const int64_t> updates,
                          absl::Span<const int64_t> touched);

  // OK, or why the table failed (its disk tier could not give a row back).
  absl::Status failure() const;

  // Row `id` and its slots, if it exists (tests, checkpoints; false also
  // when the disk tier cannot give it back).
  bool ReadRow(uint64_t id, std::vector<float>* values, OptimizerSlots* slots = nullptr,
               int64_t* updates = nullptr) const;

 private:
  static constexpr int kShards = 16;
  struct Touch {
    int64_t step = 0;
    uint32_t generation = 0;  // 0: a free row, in no delta
  };
  struct Shard {
    mutable absl::Mutex mu;
    absl::flat_hash_map<uint64_t, uint32_t> index ABSL_GUARDED_BY(mu);  // id -> row
    std::vector<float> values ABSL_GUARDED_BY(mu);  // row-major, dim per row
    OptimizerSlots slots ABSL_GUARDED_BY(mu);       // each row-major like values
    std::vector<int64_t> updates ABSL_GUARDED_BY(mu);
    // The step each row was last touched at, and the generation of its last
    // change, side by side: a lookup writes both in one cache line.
    std::vector<Touch> touched ABSL_GUARDED_BY(mu);
    std::vector<uint64_t> row_ids ABSL_GUARDED_BY(mu);
    absl::flat_hash_map<uint64_t, uint32_t> deleted ABSL_GUARDED_BY(mu);  // id -> generation
    std::vector<uint32_t> free_rows ABSL_GUARDED_BY(mu);
    absl::flat_hash_map<uint64_t, int32_t> sightings ABSL_GUARDED_BY(mu);  // admission
    int64_t expired ABSL_GUARDED_BY(mu) = 0;
    int64_t dropped ABSL_GUARDED_BY(mu) = 0;
    // With a memory budget: the rows past it, and per memory row its CLOCK
    // state (kFree, kLive, kUsed) and the hand.
    std::unique_ptr<RowTier> tier ABSL_GUARDED_BY(mu);
    std::vector<uint8_t> clock ABSL_GUARDED_BY(mu);
    size_t hand ABSL_GUARDED_BY(mu) = 0;
    int64_t disk_reads ABSL_GUARDED_BY(mu) = 0;
    int64_t disk_writes ABSL_GUARDED_BY(mu) = 0;
    int64_t disk_write_errors ABSL_GUARDED_BY(mu) = 0;
    // This call's rows on disk were asked for ahead and are read on the
    // pool (ForEachShardGroup), else read serially and timed (ReadBack).
    bool fast_reads ABSL_GUARDED_BY(mu) = false;
  };
  enum : uint8_t { kFree = 0, kLive = 1, kUsed = 2 };

  static int ShardOf(uint64_t id);
  absl::Status CheckIds(absl::Span<const uint64_t> ids) const;
  // (*rows)[j]: the row of ids[pos[j]] in `s` (read back from the disk
  // tier when there), or -1 when absent; prefetches the rows found (and
  // their slots when `with_slots`). An error when the tier fails.
  absl::Status FindRows(Shard* s, absl::Span<const uint64_t> ids, const uint32_t* pos,
                        size_t count, bool with_slots, std::vector<int64_t>* rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);
  // The row of `id` in `s` (in memory), created if `create`; -1 when
  // absent. A created row replaces one of `id` in the disk tier.
  int64_t FindOrCreate(Shard* s, uint64_t id, bool create) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);
  // A free memory row of `s` (its contents unspecified).
  uint32_t AllocateRow(Shard* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);
  // Rows `ids` (each on disk, no id twice) moved from the disk tier into
  // memory, read in parallel; an error (which fails the table) when the
  // disk cannot give one back.
  absl::Status ReadBack(Shard* s, const std::vector<uint64_t>& ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);
  // Reads row `id` of the disk tier into `values` (and `slots`, `updates`
  // where not null) without moving it; false when it is not on disk or
  // cannot be read (which fails the table).
  bool PeekDisk(const Shard& s, uint64_t id, float* values, OptimizerSlots* slots,
                int64_t* updates) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // With a tier: marks memory row `row` of `s` used.
  void Used(Shard* s, int64_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    if (s->tier != nullptr) s->clock[static_cast<size_t>(row)] = kUsed;
  }
  // Moves rows of `s` to its disk tier until its memory holds at most its
  // share of the budget (or the disk refuses one).
  void Evict(Shard* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);
  // Records the first error that fails the table, and returns it.
  absl::Status Fail(absl::Status st) const;
  // Calls visit(shard, positions, count) for the positions of `ids` in each
  // shard, with that shard locked (once per call).
  template <typename F>
  void ForEachShardGroup(absl::Span<const uint64_t> ids, F visit);
  // Whether a copy of every row fits (Options::max_export_bytes); `pin`:
  // of those in memory and the places of those on disk (CutRows).
  absl::Status CheckExportFits(bool pin) const;
  // ExportRows (every row) and ExportChangedRows (`after` > 0), or with
  // `pin` CutRows.
  absl::StatusOr<SavedRows> Export(uint32_t after, bool pin) const;
  uint32_t generation() const { return generation_.load(std::memory_order_relaxed); }

  const Options options_;
  const Optimizer* const optimizer_;
  OptimizerSlots row_slot_init_;  // one row's initial slot values
  std::array<Shard, kShards> shards_;
  std::atomic<int64_t> next_sweep_{0};
  size_t shard_memory_rows_ = 0;  // each shard's share of the budget (0: none)
  // With a memory budget: threads that read rows on disk in parallel (made
  // on first need).
  static constexpr int kReadThreads = 8;
  absl::once_flag read_pool_once_;
  std::unique_ptr<ReadPool> read_pool_;
  // A serial read's time, a moving average refreshed by the calls that read
  // serially (every 64th past the page cache; Options::parallel_read_ns).
  std::atomic<int64_t> read_ns_{0};
  std::atomic<uint64_t> read_calls_{0};
  mutable std::atomic<bool> failed_{false};
  mutable absl::Mutex failure_mu_;
  mutable absl::Status failure_ ABSL_GUARDED_BY(failure_mu_);
  // Changed only while no row changes (EndGeneration); read under the
  // shards' locks, which order it.
  std::atomic<uint32_t> generation_{1};
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_EMBEDDING_TABLE_H_
