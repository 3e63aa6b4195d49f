// Embedding rows in a checkpoint (checkpoint.h's layout). Each server's rows
// of a table are a chain of links in the manifest: a full save, then deltas
// (the rows changed since the link before, and the ids dropped), the earlier
// links in the shard files of earlier checkpoints beside this one
// (proto/checkpoint.proto, CheckpointRows). Here they are written (a
// table's columns filled a chunk of rows at a time), checked, read and
// replayed. Internal to the checkpoint library (checkpoint.cc); stateless,
// thread-safe.
#ifndef PSTRAIN_COMMON_STORAGE_CHECKPOINT_ROWS_H_
#define PSTRAIN_COMMON_STORAGE_CHECKPOINT_ROWS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"
#include "proto/checkpoint.pb.h"

namespace pstrain {
namespace checkpoint_internal {

inline constexpr char kShardMagic[8] = {'P', 'S', 'T', 'S', 'H', 'R', 'D', '1'};
// Every range of a shard starts at a multiple of this.
inline constexpr int64_t kAlign = 64;

// The columns of `r` (ids, values, each slot, update counts, touched
// steps), each at the next kAlign offset from `*at` on as WriteShard lays
// them out, holding its rows in memory and then r.more's, read a chunk at a
// time and written in place: one pass over rows that do not fit in memory.
// Each column's CRC32C is extended chunk by chunk, in row order. `*at` ends
// past the last column; `e` gets the ranges.
absl::Status WriteRowColumns(WritableFile* file, const ShardRows& r, int64_t* at,
                             CheckpointRows* e);

// a + b for byte totals of lengths a manifest states (negative ones count
// as 0; the sum stops at the largest int64 instead of overflowing).
int64_t SaturatingAdd(int64_t a, int64_t b);

// [offset, offset + length) lies in a shard of `shard_bytes`, past its magic
// (computed without overflow: the manifest is outside input).
bool RangeFits(int64_t offset, int64_t length, int64_t shard_bytes);

// The manifest's rows entries, checked before any byte is read: each names
// a listed table, a shard, counts, and byte ranges that fit them (this
// checkpoint's own also its shard file's size; an earlier checkpoint's are
// checked against its file when read); each (table, shard) chain is one full
// link, then deltas by ascending step, ending with this checkpoint's own;
// `chain` lists exactly the earlier checkpoints the links name.
absl::Status CheckRowEntries(const CheckpointManifest& m);

// The links of each (table, shard) chain, in the manifest's (replay) order.
using RowChains = std::map<std::pair<std::string, int>, std::vector<const CheckpointRows*>>;
RowChains ChainsOf(const CheckpointManifest& m);

// The bytes `r`'s ranges name (summed saturating), for progress lines.
int64_t RowsBytes(const CheckpointRows& r);

// Replays `links` (one chain of `m`, whose checkpoint is `ckpt_dir`) and
// appends the rows the server held at `m`'s step to `out`, whose dim and
// slot count are set. DATA_LOSS naming the file and what is wrong: a missing
// or refused file (a link's checkpoint pruned or not beside this one), a
// range past its end, a CRC mismatch, an id twice in one link.
absl::Status ReadRowChain(Env* env, const std::string& ckpt_dir, const CheckpointManifest& m,
                          const std::vector<const CheckpointRows*>& links, RestoredTable* out);

// Gets a chunk of a table's rows (StreamRowChain); an error stops it.
using RowChunkFn = std::function<absl::Status(const RestoredTable& chunk)>;

// Every link of a chain read `chunk_rows` rows at a time and checked (its
// ranges, each one's CRC32C), nothing kept: what ReadRowChain checks of the
// bytes, in bounded memory, for rows StreamRowChain gives later.
absl::Status CheckRowChain(Env* env, const std::string& ckpt_dir, const CheckpointManifest& m,
                           const std::vector<const CheckpointRows*>& links, int dim,
                           int64_t chunk_rows);

// The rows of a chain as ReadRowChain replays them, given to `fn` a chunk
// of at most `chunk_rows` at a time without holding the chain (a table that
// need not fit in memory): each row once, from the last link that holds it,
// unless a later link dropped it; only the delta links' ids are kept
// meanwhile. Only the columns of `read` are read, and each one's CRC32C is
// checked at its end, after its rows were given: check the chain first
// (CheckRowChain) where a damaged chain must give nothing.
absl::Status StreamRowChain(Env* env, const std::string& ckpt_dir, const CheckpointManifest& m,
                            const std::vector<const CheckpointRows*>& links, int dim,
                            int64_t chunk_rows, const RowChunkFn& fn,
                            RowColumns read = RowColumns::kAll);

// The step of the checkpoint holding a chain's full save (`m`'s own step
// for a chain of one link, or none).
int64_t FirstLinkStep(const CheckpointManifest& m,
                      const std::vector<const CheckpointRows*>& links);

// What changed in one chain since the checkpoint of step `since` (at or
// after its full save): the rows of its links after that step, replayed,
// appended to `out`, and the ids dropped since and not back appended
// (sorted) to `deleted`.
absl::Status ReadRowChainSince(Env* env, const std::string& ckpt_dir,
                               const CheckpointManifest& m,
                               const std::vector<const CheckpointRows*>& links, int64_t since,
                               RestoredTable* out, std::vector<uint64_t>* deleted);

// DATA_LOSS when an id of `table` appears twice (sorts `ids`).
absl::Status CheckUniqueIds(const std::string& table, std::vector<uint64_t>* ids);

}  // namespace checkpoint_internal
}  // namespace pstrain

#endif  // PSTRAIN_COMMON_STORAGE_CHECKPOINT_ROWS_H_
