// The disk tier of one shard of an embedding table: the rows that did not
// fit in the table's memory budget, each in a fixed-size record of one file
// (a slab: a record is rewritten where it lies, a freed record's place is
// taken by the next row written, so the file never holds more places than
// the most rows it held at once). The index (id -> place, the row's
// last-touched step and the generation of its last change) stays in memory,
// so expiry and delta saves never scan the file.
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
// its server is killed.
// Written and read through an Env, so tests inject full disks and read
// errors. Not thread-safe: its table's shard lock guards it.
#ifndef PSTRAIN_PS_SERVER_ROW_TIER_H_
#define PSTRAIN_PS_SERVER_ROW_TIER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/storage/env.h"

namespace pstrain {

class RowTier {
 public:
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
  int64_t record_bytes() const { return static_cast<int64_t>(record_.size()); }
  int64_t file_bytes() const { return static_cast<int64_t>(places_) * record_bytes(); }
  const std::string& path() const { return path_; }
  const absl::flat_hash_map<uint64_t, Entry>& entries() const { return index_; }

  // The entry of `id`, or null.
  const Entry* Find(uint64_t id) const {
    auto it = index_.find(id);
    return it == index_.end() ? nullptr : &it->second;
  }
  // Writes row `id` (not in the tier): `values` and each of `slots` (one
  // per optimizer slot) dim floats, into a free place, and indexes it. On
  // an error (a full disk) the row is not in the tier and the place it was
  // written to stays free.
  absl::Status Put(uint64_t id, const float* values, const std::vector<const float*>& slots,
                   int64_t updates, int64_t touched, uint32_t generation);
  // Reads row `id` (in the tier) into `values`, `slots` and `updates`;
  // DATA_LOSS when its record does not check, an I/O error as the Env gives
  // it. The tier is unchanged either way.
  absl::Status Get(uint64_t id, float* values, const std::vector<float*>& slots,
                   int64_t* updates) const;
  // Drops `id` from the tier (its place is free again); false when absent.
  bool Erase(uint64_t id);

 private:
  RowTier(std::string path, std::unique_ptr<RandomRWFile> file, int dim, int num_slots);

  const std::string path_;
  std::unique_ptr<RandomRWFile> file_;
  const int dim_;
  const int num_slots_;
  absl::flat_hash_map<uint64_t, Entry> index_;
  std::vector<uint32_t> free_places_;
  uint32_t places_ = 0;  // records the file holds room for
  mutable std::vector<char> record_;  // one record, reused
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_ROW_TIER_H_
