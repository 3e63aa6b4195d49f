// A parameter server's share of a checkpoint, as taken at a sync step
// boundary (ParameterServer::MaybeSnapshotLocked), and its writing into
// ckpt-<step>/shard-<i>-of-<n> through common/storage/checkpoint.h. Kept apart from
// the server's hot loops (built without their flags). Thread-compatible.
#ifndef PSTRAIN_PS_SERVER_SHARD_WRITER_H_
#define PSTRAIN_PS_SERVER_SHARD_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/ps_service.pb.h"
#include "ps_server/embedding_table.h"
#include "ps_server/optimizer.h"

namespace pstrain {

struct ShardSnapshot {
  int64_t step = 0;
  uint64_t incarnation = 0;  // of the run it belongs to
  std::string dir;  // the ckpt-<step> directory
  int shard = 0;
  int num_shards = 1;
  std::vector<std::string> slot_names;
  struct Part {
    std::string variable;
    int partition = 0;
    std::vector<int64_t> shape;
    int64_t updates = 0;
    std::shared_ptr<const std::vector<float>> values;  // the version buffer itself
    OptimizerSlots slots;                               // a copy
  };
  std::vector<Part> parts;
  // Each embedding table's rows on this server (copied, but for those on
  // disk): every row, or, for a delta, the rows changed since the cut of
  // `rows_base_step` and the ids dropped since.
  struct TableRows {
    std::string table;
    int dim = 0;
    std::string optimizer;  // its kind
    std::vector<std::string> slot_names;
    EmbeddingTable::Rows rows;
    // Its rows on disk, after `rows`: read as the shard is written (a table
    // larger than memory; EmbeddingTable::CutRows). Null: none.
    std::unique_ptr<RowSource> on_disk;
    uint32_t generation = 0;  // the table's generation this cut ended
  };
  std::vector<TableRows> tables;
  // Not OK when a table could not give its rows (its disk tier failed):
  // the shard is not written, this is its error.
  absl::Status rows_error;
  int64_t rows_base_step = -1;  // -1: the rows in full
  // A delta's links before it (the full save first), as written: set by
  // the writer, which knows them once the cut before is written.
  std::vector<CheckpointRows> rows_chain;
  std::vector<WorkerCursor> cursors;
  // How long taking it held the server's lock: the pause a save costs.
  double pause_seconds = 0;
};

// Writes the shard durably and describes it for the chief's manifest (the
// partitions' first rows are left 0: the chief knows the placement; the
// rows' entries are the chain's links before this one, then its own). Logs
// the outcome.
absl::StatusOr<GetShardResponse> WriteShardSnapshot(const ShardSnapshot& snap);

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_SHARD_WRITER_H_
