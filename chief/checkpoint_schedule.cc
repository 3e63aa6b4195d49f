#include "chief/checkpoint_schedule.h"

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "chief/serving_snapshot.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/cluster/config.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"

namespace pstrain {
namespace {

// Commits the checkpoint of `step`: waits for every server's shard, writes
// the manifest (the commit marker) and the pointer, and prunes old ones.
// `total_bytes` gets the shards' size.
absl::Status WriteCheckpointManifest(const RunContext& run, PsClient* ps, int64_t step,
                                     absl::Duration timeout, int64_t* total_bytes) {
  const TrainingConfig& config = run.config;
  const Placement& placement = run.placement;
  const absl::Time start = absl::Now();
  const std::string& dir = config.checkpoint().dir();
  const std::string ckpt_dir = JoinPath(dir, CheckpointDirName(step));
  CheckpointManifest m;
  m.set_step(step);
  m.set_config_fingerprint(run.fingerprint);
  m.set_num_shards(ps->num_servers());
  m.set_num_workers(run.cluster.num_workers());
  m.set_optimizer(OptimizerKindName(config.optimizer()));
  m.set_unix_time_ms(absl::ToUnixMillis(absl::Now()));
  for (const VariablePlacement& vp : placement.variables()) {
    CheckpointVariable* v = m.add_variables();
    v->set_name(vp.spec.name);
    for (int64_t d : vp.spec.shape) v->add_shape(d);
  }
  int64_t bytes = 0;
  std::set<int64_t> chain;  // the earlier checkpoints the servers' rows deltas rest on
  for (int s = 0; s < ps->num_servers(); ++s) {
    GetShardResponse shard;
    RETURN_IF_ERROR(ps->GetShard(s, step, timeout, &shard));
    if (shard.shard() != s) {
      return absl::InternalError(absl::StrCat("server ", s, " wrote shard ", shard.shard()));
    }
    ShardFile* f = m.add_shards();
    f->set_shard(s);
    f->set_file(shard.file());
    f->set_bytes(shard.bytes());
    bytes += shard.bytes();
    for (CheckpointTensor& t : *shard.mutable_tensors()) {
      const VariablePlacement* vp = placement.Find(t.variable());
      if (vp == nullptr || t.partition() < 0 ||
          t.partition() >= static_cast<int>(vp->partitions.size())) {
        return absl::InternalError(absl::StrCat("server ", s, " saved an unknown partition ",
                                                t.variable(), "/", t.partition()));
      }
      t.set_first_row(vp->partitions[t.partition()].row_begin);
      if (!t.slot().empty() &&
          std::find(m.slot_names().begin(), m.slot_names().end(), t.slot()) ==
              m.slot_names().end()) {
        m.add_slot_names(t.slot());
      }
      *m.add_tensors() = std::move(t);
    }
    // Every server heard every worker's push for the step; keep the fullest.
    if (shard.cursors_size() > m.cursors_size()) *m.mutable_cursors() = shard.cursors();
    for (CheckpointRows& r : *shard.mutable_rows()) {
      if (r.shard() != s) {
        return absl::InternalError(absl::StrCat("server ", s, " saved rows as shard ", r.shard()));
      }
      if (!r.checkpoint().empty()) {
        const int64_t link = CheckpointStepOf(r.checkpoint());
        if (link < 0 || link >= step) {
          return absl::InternalError(absl::StrCat("server ", s, " saved rows resting on \"",
                                                  r.checkpoint(), "\""));
        }
        chain.insert(link);
      }
      *m.add_rows() = std::move(r);
    }
    if (s == 0) *m.mutable_tables() = shard.tables();
  }
  *total_bytes = bytes;
  for (int64_t link : chain) m.add_chain(link);
  RETURN_IF_ERROR(WriteManifest(Env::Default(), ckpt_dir, m));
  RETURN_IF_ERROR(CommitAndPrune(Env::Default(), dir, step, config.checkpoint().keep()));
  const std::string rows =
      chain.empty() ? std::string()
                    : absl::StrCat("; its embedding rows are deltas on ", chain.size(),
                                   " earlier checkpoint(s) from ckpt-", *chain.begin());
  LOG_INFO("checkpoint step {}: {} committed ({:.1f} MB in {} shard(s), {:.3f} s after the step's "
           "shards were asked for{})",
           step, ckpt_dir, bytes / 1e6, ps->num_servers(),
           absl::ToDoubleSeconds(absl::Now() - start), rows);
  return absl::OkStatus();
}

}  // namespace

absl::Status CommitCheckpoint(const RunContext& run, PsClient* ps, int64_t step,
                              absl::Duration timeout, Chief* chief) {
  const absl::Time start = absl::Now();
  int64_t bytes = 0;
  absl::Status st = WriteCheckpointManifest(run, ps, step, timeout, &bytes);
  chief->RecordCheckpoint(st.ok(), step, bytes, absl::ToDoubleSeconds(absl::Now() - start));
  const CheckpointConfig& c = run.config.checkpoint();
  if (st.ok() && !c.serving_dir().empty()) {
    // Training goes on without it: the checkpoint is there.
    if (absl::Status snap = WriteServingSnapshot(
            Env::Default(), c.serving_dir(), JoinPath(c.dir(), CheckpointDirName(step)), step);
        !snap.ok()) {
      LOG_WARN("serving snapshot of step {} failed (the checkpoint is committed): {}", step,
               snap);
    }
  }
  return st;
}

CheckpointSchedule::CheckpointSchedule(const RunContext& run, PsClient* ps, Chief* chief,
                                       int64_t start_step, bool adopted)
    : run_(run),
      ps_(ps),
      chief_(chief),
      checkpoints_(!run.config.checkpoint().dir().empty()),
      sync_(IsSyncMode(run.config)),
      max_steps_(run.config.max_steps()),
      every_steps_(run.config.checkpoint().every_steps()),
      period_(absl::Seconds(run.config.checkpoint().every_seconds())),
      last_save_(absl::Now()),
      step_at_save_(start_step),
      step_time_(last_save_),
      last_cut_(start_step),
      committed_(start_step) {
  // Servers adopted at their end: the last step's cut is theirs to commit,
  // unless the earlier process did.
  bool last_committed = false;
  if (adopted && checkpoints_) {
    for (const CheckpointInfo& c : ListCheckpoints(Env::Default(), run.config.checkpoint().dir())
                                       .value_or(std::vector<CheckpointInfo>())) {
      last_committed |= c.step == max_steps_ && c.complete;
    }
  }
  next_ckpt_ =
      adopted && checkpoints_ && sync_ && !last_committed ? max_steps_ : NextAfter(start_step);
}

int64_t CheckpointSchedule::NextAfter(int64_t step) const {
  if (!checkpoints_ || step >= max_steps_) return std::numeric_limits<int64_t>::max();
  if (every_steps_ <= 0) return max_steps_;
  return std::min(max_steps_, (step / every_steps_ + 1) * every_steps_);
}

int64_t CheckpointSchedule::next_sync_cut() const {
  return asked_.empty() ? next_ckpt_ : std::min(next_ckpt_, *asked_.begin());
}

void CheckpointSchedule::Saved(int64_t step, const absl::Status& status) {
  if (status.ok()) {
    last_save_ = absl::Now();
    committed_ = std::max(committed_, step);
    step_at_save_ = step;
    step_time_ = last_save_;
  } else {
    LOG_WARN("checkpoint step {} failed, training goes on (the next one is retried): {}", step,
             status);
  }
}

// One cut now, named by the global step the chief has seen; each server
// holds its pushes while it takes its partitions.
void CheckpointSchedule::AsyncCut(int64_t step) {
  if (step <= last_cut_) return;
  last_cut_ = step;
  std::vector<SnapshotResponse> cuts;
  absl::Status st = ps_->SnapshotAll(step, run_.step_timeout, &cuts);
  if (st.ok()) {
    int64_t held_us = 0;
    std::vector<std::string> versions;
    for (const SnapshotResponse& c : cuts) {
      held_us = std::max(held_us, c.pause_us());
      versions.push_back(absl::StrCat(c.version()));
    }
    LOG_INFO("checkpoint step {}: cut taken, pushes held at most {:.2f} ms; servers at "
             "versions {}",
             step, held_us / 1e3, absl::StrJoin(versions, ", "));
    st = CommitCheckpoint(run_, ps_, step, run_.step_timeout, chief_);
  }
  Saved(step, st);
}

void CheckpointSchedule::CommitDue(int64_t step) {
  // Sync: the servers took each due step's cut at its boundary.
  while (sync_ && next_sync_cut() <= step) {
    const int64_t cut = next_sync_cut();
    Saved(cut, CommitCheckpoint(run_, ps_, cut, run_.step_timeout, chief_));
    asked_.erase(cut);
    if (cut == next_ckpt_) next_ckpt_ = NextAfter(cut);
  }
  if (!sync_ && next_ckpt_ <= step) {
    AsyncCut(step);
    next_ckpt_ = NextAfter(step);
  }
}

void CheckpointSchedule::TimedSave(int64_t step) {
  if (!checkpoints_ || period_ <= absl::ZeroDuration() || absl::Now() - last_save_ < period_ ||
      step >= max_steps_) {
    return;
  }
  last_save_ = absl::Now();  // a failed try is not retried before the next period either
  if (!sync_) {
    AsyncCut(step);
    return;
  }
  const std::optional<int64_t> at = AskCut(step, nullptr);
  if (at.has_value()) {
    LOG_INFO("checkpoint: {} since the last one; the servers cut at step {}",
             absl::FormatDuration(period_), *at);
  }
}

std::optional<int64_t> CheckpointSchedule::AskCut(int64_t step, bool* failed) {
  int64_t furthest = step;
  for (int s = 0; s < ps_->num_servers(); ++s) {
    PsStatusResponse status;
    if (ps_->GetStatus(s, &status).ok()) furthest = std::max(furthest, status.version());
  }
  // Far enough ahead that no server passes it before the request lands:
  // 10 steps, or the steps of 200 ms at the rate since the last save.
  const double seconds = absl::ToDoubleSeconds(absl::Now() - step_time_);
  const double per_second = seconds > 0 ? (step - step_at_save_) / seconds : 0;
  const int64_t at = furthest + std::max<int64_t>(10, static_cast<int64_t>(per_second * 0.2));
  step_at_save_ = step;
  step_time_ = absl::Now();
  if (at >= next_ckpt_ || at >= max_steps_) return std::nullopt;  // a cut comes by then anyway
  std::vector<SnapshotResponse> ignored;
  absl::Status st = ps_->SnapshotAll(at, run_.rpc_timeout, &ignored);
  if (!st.ok()) {
    Saved(at, st);
    if (failed != nullptr) *failed = true;
    return std::nullopt;
  }
  asked_.insert(at);
  return at;
}

std::optional<int64_t> CheckpointSchedule::SaveOnStop(int64_t step) {
  if (!checkpoints_ || step >= max_steps_ || step <= committed_) return std::nullopt;
  if (!sync_) {
    AsyncCut(step);
    return committed_ == step ? std::optional<int64_t>(step) : std::nullopt;
  }
  bool failed = false;
  if (std::optional<int64_t> at = AskCut(step, &failed); at.has_value() || failed) return at;
  // A cut is due before one asked for now would be (or the last step's):
  // that one is the save.
  const int64_t due = next_sync_cut();
  return due <= max_steps_ ? std::optional<int64_t>(due) : std::nullopt;
}

void CheckpointSchedule::Restart(int64_t step) {
  next_ckpt_ = NextAfter(step);
  asked_.clear();
  last_cut_ = step;
  step_at_save_ = step;
  last_save_ = absl::Now();
  step_time_ = last_save_;
  committed_ = step;
}

}  // namespace pstrain
