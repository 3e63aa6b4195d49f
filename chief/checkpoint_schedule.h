// The chief's checkpoint phase. The servers take each checkpoint's cut
// (sync: at the step boundary every_steps and the last step name, or at a
// step the time trigger asked them for; async: when the chief asks, holding
// pushes while they copy), and each writes its shard; the chief commits the
// checkpoint: it waits for every shard, writes the manifest (the commit
// marker) and the pointer, and prunes old ones. A failed checkpoint is
// logged and retried at the next one; training goes on.
//
// CheckpointSchedule owns when: the next step due, the cuts asked for, the
// time of the last save. Not thread-safe: the driver's thread alone calls it.
#ifndef PSTRAIN_CHIEF_CHECKPOINT_SCHEDULE_H_
#define PSTRAIN_CHIEF_CHECKPOINT_SCHEDULE_H_

#include <cstdint>
#include <optional>
#include <set>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "chief/chief_state.h"
#include "chief/run_context.h"
#include "common/client/ps_client.h"

namespace pstrain {

// Commits the checkpoint of `step` (waiting up to `timeout` for each
// server's shard), its outcome recorded for the chief's metrics.
absl::Status CommitCheckpoint(const RunContext& run, PsClient* ps, int64_t step,
                              absl::Duration timeout, Chief* chief);

class CheckpointSchedule {
 public:
  // From `start_step`. `adopted`: the servers had finished the run when an
  // earlier chief process died (RunStart::adopted); the last step's cut is
  // theirs to commit, unless that process did.
  CheckpointSchedule(const RunContext& run, PsClient* ps, Chief* chief, int64_t start_step,
                     bool adopted);

  // The next step whose cut the sync servers take on their own: the driver
  // wakes for it.
  int64_t next_sync_cut() const;
  // Commits what is due once the global step is `step`: sync, every cut
  // taken at or before it; async, a cut now when every_steps says so.
  void CommitDue(int64_t step);
  // checkpoint.every_seconds: async, a cut at once; sync, asks every server
  // for a cut a few steps past the furthest one, committed when reached.
  void TimedSave(int64_t step);
  // A run stopped at `step` saves what it trained since its last
  // checkpoint: async, a cut now, committed before this returns; sync, a
  // cut the servers are asked for a few steps past the furthest one (or
  // the one due before it), which CommitDue commits once the workers reach
  // it. Returns the step whose commit the stop waits for (committed()
  // reaches it), or nullopt where there is nothing to save or the ask failed
  // (logged).
  std::optional<int64_t> SaveOnStop(int64_t step);
  // The newest step committed by this schedule, or the start step.
  int64_t committed() const { return committed_; }
  // After a rollback to `step`: the schedule from there.
  void Restart(int64_t step);

 private:
  int64_t NextAfter(int64_t step) const;
  void AsyncCut(int64_t step);
  // Sync: asks every server for a cut past the furthest one's version, by
  // a margin at the rate since step_at_save_; nullopt where a due cut comes
  // first or the ask failed (then *failed, where given, is set).
  std::optional<int64_t> AskCut(int64_t step, bool* failed);
  void Saved(int64_t step, const absl::Status& status);

  const RunContext& run_;
  PsClient* const ps_;
  Chief* const chief_;
  const bool checkpoints_;  // checkpoint.dir is set
  const bool sync_;
  const int64_t max_steps_;
  const int64_t every_steps_;
  const absl::Duration period_;
  int64_t next_ckpt_;
  // Sync: cut steps the time trigger asked the servers for.
  std::set<int64_t> asked_;
  absl::Time last_save_;
  // The step of the last save or ask, and when: the rate of steps since.
  int64_t step_at_save_;
  absl::Time step_time_;
  // Async: the last cut's step. Never cut at or before it: after a resume
  // that is the checkpoint resumed from, whose files a new cut would replace.
  int64_t last_cut_;
  int64_t committed_;
};

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_CHECKPOINT_SCHEDULE_H_
