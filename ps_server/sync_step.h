// The open sync step of one parameter server (SyncReplicasOptimizer
// semantics, per partition as TensorFlow's per-variable accumulators do):
// for each partition, whose gradients are in and whose are on their way
// (being staged), and whether its quorum of `replicas` gradients was
// reached (closed); how many partitions are still open; on a server that
// holds no partition, which workers pushed; the step's clock (from its first
// gradient here, with the deadline that starts) and the error of a step that
// failed at its deadline; and where each worker's data stood when it pushed.
//
// What it owns: that bookkeeping, no tensor (the gradients are staged in
// the partitions, the sum is apply.h's). Who calls it: ParameterServer
// only, under its lock (the member is guarded by ParameterServer::mu_);
// thread-compatible. Partitions are named by their index in the model's
// partition order.
#ifndef PSTRAIN_PS_SERVER_SYNC_STEP_H_
#define PSTRAIN_PS_SERVER_SYNC_STEP_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ps_server/server_model.h"

namespace pstrain {

class SyncStep {
 public:
  // A new run: `partitions` partitions, `workers` workers, `replicas`
  // gradients a step aggregates; the step's clock stopped, no failure.
  void Reset(int partitions, int workers, int replicas);

  // --- One partition's quorum (`i`: the partition's index) ---
  // Whether worker `w`'s gradient for `i` is in or on its way.
  bool Has(int i, int w) const { return slots_[i].arrived[w] || slots_[i].in_flight[w]; }
  bool Closed(int i) const { return slots_[i].closed; }
  int Count(int i) const { return slots_[i].count; }
  // Marks `w`'s gradient for `i` on its way; returns whether it will
  // complete the quorum when it arrives (every other gradient is in).
  bool Begin(int i, int w);
  // `w`'s gradient for `i` is no longer on its way (arrived or refused).
  void End(int i, int w) { slots_[i].in_flight[w] = 0; }
  // `w`'s gradient for `i` arrived: true when it completes the quorum.
  bool Arrive(int i, int w);
  // Closes `i` with the gradients in: their workers, in index order.
  std::vector<int> Close(int i);

  // --- The step ---
  int open() const { return open_; }
  // `n` closed partitions were applied; true when none is open now.
  bool Applied(int n);
  // Opens every partition for the next step; returns the fewest gradients
  // a partition of the step applied (the step's contributors), at most
  // `replicas`.
  int NextStep();
  // The fewest gradients of an open partition (`replicas` when none is).
  int FewestOpen() const;
  // Workers whose gradient some open partition lacks (on its way counts as
  // lacking), in index order.
  std::vector<int> Missing() const;
  // For each worker, whether the step still waits for its gradient: an open
  // partition lacks it and it is not on its way; on a server holding no
  // partition, whether it has not pushed.
  std::vector<bool> WaitingOn() const;

  // --- A server holding no partition: the step completes on the quorum ---
  bool PushedEmpty(int w) const { return empty_[w] != 0; }
  // Records `w`'s push; returns how many workers pushed for the step.
  int PushEmpty(int w);
  int EmptyCount() const;
  void ClearEmpty();

  // --- The step's clock and its outcome ---
  // A gradient of the step arrived at `now`: the first starts the clock,
  // and with a `deadline` (non-zero) the step's deadline. Returns whether
  // it set a deadline (the timer must wake for it).
  bool Started(absl::Time now, absl::Duration deadline);
  absl::Time deadline() const { return deadline_; }
  void ClearDeadline() { deadline_ = absl::InfiniteFuture(); }
  // The step completed at `now`: how long since its first gradient (none
  // when none came), and the clock stops for the next step.
  std::optional<absl::Duration> Completed(absl::Time now);
  const absl::Status& failure() const { return failure_; }
  void Fail(absl::Status why) { failure_ = std::move(why); }

  // --- Where each worker's data stood ---
  void SetCursor(int w, StepCursor cursor) { cursors_[w] = cursor; }
  // The open step's cursors, as its pushes said.
  const std::vector<StepCursor>& cursors() const { return cursors_; }
  // As of the latest completed step each worker pushed to.
  const std::vector<StepCursor>& completed_cursors() const { return completed_cursors_; }
  // The step completed: its cursors become the completed ones.
  void CommitCursors();

 private:
  struct Slot {
    std::vector<char> arrived;
    std::vector<char> in_flight;
    int count = 0;  // arrived
    bool closed = false;
    int closed_count = 0;  // gradients the closed partition applies
  };
  int replicas_ = 0;
  std::vector<Slot> slots_;
  int open_ = 0;
  std::vector<char> empty_;
  absl::Time first_gradient_ = absl::InfiniteFuture();
  absl::Time deadline_ = absl::InfiniteFuture();
  absl::Status failure_;
  std::vector<StepCursor> cursors_;
  std::vector<StepCursor> completed_cursors_;
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_SYNC_STEP_H_
