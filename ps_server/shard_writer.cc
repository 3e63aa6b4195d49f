#include "ps_server/shard_writer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"
#include "common/base/logging.h"

namespace pstrain {

absl::StatusOr<GetShardResponse> WriteShardSnapshot(const ShardSnapshot& snap) {
  std::vector<ShardTensor> tensors;
  for (const ShardSnapshot::Part& p : snap.parts) {
    ShardTensor t;
    t.variable = p.variable;
    t.partition = p.partition;
    t.shape = p.shape;
    t.updates = p.updates;
    t.data = p.values->data();
    t.elements = static_cast<int64_t>(p.values->size());
    tensors.push_back(t);
    for (size_t s = 0; s < p.slots.size() && s < snap.slot_names.size(); ++s) {
      t.slot = snap.slot_names[s];
      t.data = p.slots[s].data();
      t.elements = static_cast<int64_t>(p.slots[s].size());
      tensors.push_back(t);
    }
  }
  std::vector<ShardRows> rows;
  for (const ShardSnapshot::TableRows& t : snap.tables) {
    ShardRows r;
    r.table = t.table;
    r.dim = t.dim;
    r.rows = static_cast<int64_t>(t.rows.ids.size());
    r.ids = t.rows.ids.data();
    r.values = t.rows.values.data();
    for (const std::vector<float>& slot : t.rows.slots) r.slots.push_back(slot.data());
    r.updates = t.rows.updates.data();
    r.touched = t.rows.touched.data();
    r.delta = snap.rows_base_step >= 0;
    r.deleted = static_cast<int64_t>(t.rows.deleted.size());
    r.deleted_ids = t.rows.deleted.data();
    r.more = t.on_disk.get();
    rows.push_back(std::move(r));
  }
  const absl::Time start = absl::Now();
  int64_t bytes = 0;
  std::vector<CheckpointRows> row_entries;
  absl::StatusOr<std::vector<CheckpointTensor>> entries = WriteShard(
      Env::Default(), snap.dir, snap.shard, snap.num_shards, tensors, &bytes, rows, &row_entries);
  if (!entries.ok()) {
    LOG_WARN("checkpoint step {}: writing shard {} of {} failed: {}", snap.step, snap.shard,
             snap.num_shards, entries.status().ToString());
    return entries.status();
  }
  GetShardResponse r;
  r.set_shard(snap.shard);
  r.set_file(ShardFileName(snap.shard, snap.num_shards));
  r.set_bytes(bytes);
  for (CheckpointTensor& e : *entries) *r.add_tensors() = std::move(e);
  for (const CheckpointRows& e : snap.rows_chain) *r.add_rows() = e;
  for (CheckpointRows& e : row_entries) *r.add_rows() = std::move(e);
  for (const ShardSnapshot::TableRows& t : snap.tables) {
    CheckpointTable* ct = r.add_tables();
    ct->set_name(t.table);
    ct->set_dim(t.dim);
    ct->set_optimizer(t.optimizer);
    for (const std::string& n : t.slot_names) ct->add_slot_names(n);
  }
  for (const WorkerCursor& c : snap.cursors) *r.add_cursors() = c;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  int64_t saved = 0, deleted = 0;
  for (const ShardSnapshot::TableRows& t : snap.tables) {
    saved += static_cast<int64_t>(t.rows.ids.size());
    if (t.on_disk != nullptr) saved += t.on_disk->rows();
    deleted += static_cast<int64_t>(t.rows.deleted.size());
  }
  const std::string what =
      snap.tables.empty() ? std::string()
      : snap.rows_base_step < 0
          ? absl::StrCat(", ", saved, " embedding rows in full")
          : absl::StrCat(", a delta on step ", snap.rows_base_step, ": ", saved,
                         " embedding rows changed, ", deleted, " dropped");
  LOG_INFO("checkpoint step {}: wrote {} ({:.1f} MB{}) in {:.3f} s ({:.2f} GB/s); taking it "
           "paused this server {:.2f} ms",
           snap.step, JoinPath(snap.dir, r.file()), bytes / 1e6, what, seconds,
           seconds > 0 ? bytes / seconds / 1e9 : 0.0, snap.pause_seconds * 1e3);
  return r;
}

}  // namespace pstrain
