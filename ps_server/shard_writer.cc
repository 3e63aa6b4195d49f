#include "ps_server/shard_writer.h"

#include <utility>

#include "absl/time/clock.h"
#include "common/checkpoint.h"
#include "common/env.h"
#include "common/logging.h"

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
  const absl::Time start = absl::Now();
  int64_t bytes = 0;
  absl::StatusOr<std::vector<CheckpointTensor>> entries =
      WriteShard(Env::Default(), snap.dir, snap.shard, snap.num_shards, tensors, &bytes);
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
  for (const WorkerCursor& c : snap.cursors) *r.add_cursors() = c;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  LOG_INFO("checkpoint step {}: wrote {} ({:.1f} MB) in {:.3f} s ({:.2f} GB/s); taking it "
           "paused this server {:.2f} ms",
           snap.step, JoinPath(snap.dir, r.file()), bytes / 1e6, seconds,
           seconds > 0 ? bytes / seconds / 1e9 : 0.0, snap.pause_seconds * 1e3);
  return r;
}

}  // namespace pstrain
