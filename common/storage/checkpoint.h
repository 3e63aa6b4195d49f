// Sharded checkpoints: the one reader and writer, used by the parameter
// servers (shards), the chief (manifest, pointer, pruning, resume) and
// `pstrain checkpoint`. Layout under a checkpoint directory DIR:
//   DIR/ckpt-<step>/shard-<i>-of-<n>  "PSTSHRD1", then raw little-endian
//                                      float32 tensors, each at a 64-byte
//                                      aligned offset (values and slots of
//                                      every partition server i held)
//   DIR/ckpt-<step>/manifest          the CheckpointManifest in protobuf text
//                                      format, then "crc32c: <8 hex digits>\n"
//                                      over the text; written last (the
//                                      commit marker), atomically
//   DIR/checkpoint                     "latest: ckpt-<step>\n" and one
//                                      "kept: ckpt-<step>" line per kept one,
//                                      replaced atomically
// Every tensor's CRC32C is in the manifest, so a torn, truncated or
// corrupted shard is found before anything is loaded from it. Every write
// goes through Env (temp file, fsync, rename, fsync the directory).
// Stateless functions; thread-safe.
#ifndef PSTRAIN_COMMON_STORAGE_CHECKPOINT_H_
#define PSTRAIN_COMMON_STORAGE_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/storage/env.h"
#include "common/storage/tensor_export.h"
#include "proto/checkpoint.pb.h"

namespace pstrain {

std::string CheckpointDirName(int64_t step);  // "ckpt-<step>"
// The step of a checkpoint directory's name, canonical ("ckpt-<step>", no
// sign or leading zeros); -1 for any other name.
int64_t CheckpointStepOf(absl::string_view name);
// The checkpoint of `step` beside `ckpt_dir` (in the same directory).
std::string SiblingCheckpointDir(const std::string& ckpt_dir, int64_t step);
std::string ShardFileName(int shard, int num_shards);  // "shard-<i>-of-<n>"
constexpr char kManifestFile[] = "manifest";
constexpr char kPointerFile[] = "checkpoint";
// The largest manifest and pointer file read: a manifest lists every
// partition of every variable and slot (about 200 bytes each), so 256 MiB is
// a million partitions; a pointer names a few checkpoints. Larger ones, and
// anything that is not a regular file in its directory, are refused before
// they are read (CheckContainedFile).
constexpr int64_t kMaxManifestBytes = int64_t{256} << 20;
constexpr int64_t kMaxPointerBytes = int64_t{1} << 20;

// One tensor a server writes into its shard; `data` holds `elements` floats.
struct ShardTensor {
  std::string variable;
  int partition = 0;
  std::string slot;  // "" for the values
  std::vector<int64_t> shape;
  int64_t first_row = 0;
  int64_t updates = 0;
  const float* data = nullptr;
  int64_t elements = 0;
};

// Rows a shard's writer reads a chunk at a time, as it writes them (a table
// larger than memory: the rows its server keeps on disk).
class RowSource {
 public:
  virtual ~RowSource() = default;
  virtual int64_t rows() const = 0;
  // The next `n` rows (at most those left): ids, n x dim floats of values
  // and of each slot, update counts and last-touched steps. An error (the
  // disk cannot give a row back) fails the shard.
  virtual absl::Status Next(int64_t n, uint64_t* ids, float* values,
                            const std::vector<float*>& slots, int64_t* updates,
                            int64_t* touched) = 0;
};

// One server's rows of an embedding table to write: `rows` ids, and for
// each rows x dim floats of values and of every slot (the table's slot
// order), an update count and the step it was last touched at; then, when
// `more` is set, its rows after these, read as they are written. A delta
// (the rows changed since the server's save before) also has the `deleted`
// ids dropped since.
struct ShardRows {
  std::string table;
  int dim = 0;
  int64_t rows = 0;
  const uint64_t* ids = nullptr;
  const float* values = nullptr;
  std::vector<const float*> slots;
  const int64_t* updates = nullptr;
  const int64_t* touched = nullptr;
  bool delta = false;
  int64_t deleted = 0;
  const uint64_t* deleted_ids = nullptr;
  RowSource* more = nullptr;
};

// Writes shard `shard` of `num_shards` into `ckpt_dir` (created if needed),
// tensor by tensor, then each table's rows (temp file, fsync, rename, fsync
// the directory), and returns its entries for the manifest (offset, length,
// CRC32C, shard), the rows' entries in `row_entries` (one per table, when
// given) and the file's size in `bytes`.
absl::StatusOr<std::vector<CheckpointTensor>> WriteShard(
    Env* env, const std::string& ckpt_dir, int shard, int num_shards,
    const std::vector<ShardTensor>& tensors, int64_t* bytes,
    const std::vector<ShardRows>& rows = {}, std::vector<CheckpointRows>* row_entries = nullptr);

// The manifest, atomically, with its CRC line.
absl::Status WriteManifest(Env* env, const std::string& ckpt_dir,
                           const CheckpointManifest& manifest);
// NOT_FOUND when there is none (an incomplete checkpoint); DATA_LOSS when its
// CRC, its text or its own consistency (steps, shards, ranges) is wrong.
absl::StatusOr<CheckpointManifest> ReadManifest(Env* env, const std::string& ckpt_dir);

// One tensor's floats, its length and CRC32C checked.
absl::StatusOr<std::vector<float>> ReadCheckpointTensor(Env* env, const std::string& ckpt_dir,
                                                        const CheckpointManifest& manifest,
                                                        const CheckpointTensor& tensor);

// Every problem of the checkpoint at `ckpt_dir`, one line each: no or a bad
// manifest, a missing or wrong-sized shard, a tensor whose bytes fail their
// CRC, a variable whose partitions do not cover it, a missing slot. Empty:
// the checkpoint is good. `progress` (optional) is told the bytes checked so
// far and in all after each tensor and row range (the CLI's progress line).
using CheckpointProgress = std::function<void(int64_t done, int64_t total)>;
std::vector<std::string> VerifyCheckpoint(Env* env, const std::string& ckpt_dir,
                                          const CheckpointProgress& progress = nullptr);

struct CheckpointInfo {
  int64_t step = 0;
  std::string path;
  bool complete = false;  // a manifest that reads back
  int64_t bytes = 0;      // every file in it
  int64_t unix_time_ms = 0;
  std::vector<int64_t> chain;  // the earlier checkpoints its rows are read from
};
// The ckpt-<step> directories in `dir`, by ascending step.
absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(Env* env, const std::string& dir);

// Replaces DIR/checkpoint.
absl::Status WritePointer(Env* env, const std::string& dir, int64_t latest,
                          const std::vector<int64_t>& kept);
// The step DIR/checkpoint names as latest; NOT_FOUND without one.
absl::StatusOr<int64_t> ReadPointer(Env* env, const std::string& dir);

// After a checkpoint at `latest` is complete: keeps the newest `keep`
// complete ones up to it and the chains of their rows (the earlier
// checkpoints they read, complete or not), deletes the other older ones
// and any incomplete one older than it that no kept one needs, and
// rewrites the pointer. Never deletes `latest`.
absl::Status CommitAndPrune(Env* env, const std::string& dir, int64_t latest, int keep);

// A rollback to `step`: the checkpoints of `dir` past it belong to the
// timeline abandoned, so a later --resume must not take them. Each is
// renamed ckpt-<n>.rolled-back (.rolled-back-2, ... if taken), kept for
// inspection, out of ListCheckpoints' sight; the pointer is rewritten to
// the newest complete one left (or removed with none). `moved` gets the
// new names.
absl::Status SetAsideCheckpointsAfter(Env* env, const std::string& dir, int64_t step,
                                      std::vector<std::string>* moved);

// The newest checkpoint in `dir` that verifies. Each newer one that does not
// is described in `skipped` ("ckpt-300: shard-1-of-2: ..."), so the caller
// can log why it fell back. NOT_FOUND when none is good.
absl::StatusOr<std::string> LatestGoodCheckpoint(Env* env, const std::string& dir,
                                                 std::vector<std::string>* skipped);

// A checkpoint's variables reassembled whole from their partitions, with
// their optimizer slots (in manifest.slot_names order) and update counts.
struct RestoredVariable {
  std::vector<int64_t> shape;
  std::vector<float> values;
  std::vector<std::vector<float>> slots;
  int64_t updates = 0;  // the most any of its partitions had
};
// An embedding table's rows from every shard, concatenated (ids unique).
struct RestoredTable {
  int dim = 0;
  std::string optimizer;  // the kind whose slots these are
  std::vector<uint64_t> ids;
  std::vector<float> values;               // ids.size() x dim
  std::vector<std::vector<float>> slots;   // the table's slot_names order
  std::vector<int64_t> updates, touched;
};
struct RestoredCheckpoint {
  CheckpointManifest manifest;
  std::map<std::string, RestoredVariable> variables;
  std::map<std::string, RestoredTable> tables;
};
// `progress` (optional), as for VerifyCheckpoint: the bytes of variables
// read so far and in all, after each tensor; called from the reading
// threads, one call at a time.
absl::StatusOr<RestoredCheckpoint> LoadCheckpoint(Env* env, const std::string& ckpt_dir,
                                                  const CheckpointProgress& progress = nullptr);
// The variables' values alone (and update counts): neither their optimizer
// slots (`slots` empty) nor the embedding rows (`tables` empty) are read.
absl::StatusOr<RestoredCheckpoint> LoadCheckpointVariables(Env* env, const std::string& ckpt_dir);

// A restore's read (the chief's, of a table that need not fit in its
// memory): as LoadCheckpoint, but each table's rows are only checked, read
// a chunk at a time (every range and its CRC32C; not that no id is in two
// servers' rows, which needs them all), and not kept: `tables` has each
// table's dim, optimizer and slot count, no rows. StreamTableRows gives them.
absl::StatusOr<RestoredCheckpoint> LoadCheckpointForRestore(
    Env* env, const std::string& ckpt_dir, const CheckpointProgress& progress = nullptr);

// Which columns of a table's rows a stream reads (and checks): the ids
// alone; the ids and values; or all (the slots, update counts and touched
// steps too). The others are left empty in each chunk.
enum class RowColumns { kIds, kValues, kAll };

// Table `table`'s rows of the checkpoint at `ckpt_dir` (whose manifest is
// `m`), every server's chain replayed, given to `fn` at most `chunk_rows`
// at a time, in bounded memory: each row once, as LoadCheckpoint has them,
// with the columns of `read`. NOT_FOUND when the checkpoint has no such
// table; DATA_LOSS as LoadCheckpoint's for the columns read, but a range's
// CRC32C is checked at its end, once its rows were given
// (LoadCheckpointForRestore checks them all first).
absl::Status StreamTableRows(Env* env, const std::string& ckpt_dir, const CheckpointManifest& m,
                             const std::string& table, int64_t chunk_rows,
                             const std::function<absl::Status(const RestoredTable&)>& fn,
                             RowColumns read = RowColumns::kAll);

// Table `table`'s rows in the checkpoint at `ckpt_dir` (manifest `m`),
// counted from their ids a chunk at a time, nothing kept.
absl::StatusOr<int64_t> CountTableRows(Env* env, const std::string& ckpt_dir,
                                       const CheckpointManifest& m, const std::string& table);
// Their ids (`ids`) or their values, in StreamTableRows' order, for an
// ExportTensor written as they are read (a table larger than memory); `m`
// must outlive the producer.
ExportProducer TableColumn(Env* env, const std::string& ckpt_dir, const CheckpointManifest* m,
                           const std::string& table, bool ids);

// What a table of a checkpoint changed since the checkpoint of step `since`
// (beside it, in its rows' chain): the rows changed since (as they stand)
// and the ids dropped since and not back, sorted; or, `full`, every row,
// when some server's chain starts after `since` (or `since` < 0). With
// `full_rows` false a full table's rows are not read (`rows` has its dim,
// optimizer and slot count only): StreamTableRows gives them, in bounded
// memory (a table larger than memory).
struct TableChanges {
  bool full = false;
  RestoredTable rows;
  std::vector<uint64_t> deleted;
};
absl::StatusOr<std::map<std::string, TableChanges>> LoadTableChanges(Env* env,
                                                                     const std::string& ckpt_dir,
                                                                     int64_t since,
                                                                     bool full_rows = true);

// The newest checkpoint in `dir` that loads whole, read once (LoadCheckpoint
// checks as it reads what VerifyCheckpoint checks); `path` gets where it is.
// Each newer one that does not load is described in `skipped`. NOT_FOUND when
// none does. `progress` is each attempt's. `for_restore`: each read as
// LoadCheckpointForRestore reads it (the rows checked, not kept).
absl::StatusOr<RestoredCheckpoint> LoadLatestGoodCheckpoint(
    Env* env, const std::string& dir, std::vector<std::string>* skipped, std::string* path,
    const CheckpointProgress& progress = nullptr, bool for_restore = false);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_STORAGE_CHECKPOINT_H_
