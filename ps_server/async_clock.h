// The async run's clock on one parameter server: how many updates are
// admitted and not yet applied (so that max_steps is exact while pushes
// apply concurrently), each update's number in the run (its ticket, which
// fixes its learning rate), each worker's applied pushes (the SSP clock the
// staleness bound and a worker's read-your-writes pull read), and where each
// worker's data stood at its last admitted push (a checkpoint's cursors).
//
// What it owns: those counts and cursors; the server's version stays the
// server's (sync and async both advance it). Who calls it: ParameterServer
// only, under its lock (the member is guarded by ParameterServer::mu_);
// thread-compatible.
#ifndef PSTRAIN_PS_SERVER_ASYNC_CLOCK_H_
#define PSTRAIN_PS_SERVER_ASYNC_CLOCK_H_

#include <cstdint>
#include <vector>

#include "ps_server/optimizer.h"
#include "ps_server/server_model.h"

namespace pstrain {

class AsyncClock {
 public:
  // A new run of `num_workers` workers: nothing admitted or applied, no
  // cursor.
  void Reset(int num_workers);
  int num_workers() const { return static_cast<int>(applied_.size()); }

  // --- Admission ---
  // Admits worker `w`'s push computed at `step` with the server at
  // `version`: its ticket (the update's 1-based number in the run, counting
  // those admitted before it), and `cursor` becomes the worker's (where its
  // data stands once this push is in). 0, admitting nothing, when the
  // updates applied and in flight already reach `max_steps` (> 0).
  int64_t Admit(int w, int64_t version, int64_t max_steps, const StepCursor& cursor);
  // An admitted update that will never be applied (refused, dropped).
  void Abandon() { --in_flight_; }
  // Worker `w`'s admitted update applied: returns `w`'s applied pushes.
  int64_t Applied(int w);
  // Updates admitted and not yet applied or abandoned.
  int64_t in_flight() const { return in_flight_; }

  // --- The workers' clocks ---
  // Worker `w`'s applied pushes (0 for a worker out of range).
  int64_t pushes(int w) const;
  // The slowest worker's applied pushes, and which workers are at it.
  int64_t Slowest() const;
  std::vector<int> SlowestWorkers() const;
  // Whether worker `w` is at most `bound` pushes ahead of the slowest
  // (`bound` <= 0: no bound).
  bool WithinBound(int w, int64_t bound) const;
  const std::vector<StepCursor>& cursors() const { return cursors_; }

  // Update `ticket`'s rate: the schedule's at ticket - 1, divided, where the
  // model asks, by its staleness (the updates applied since the version
  // `step` it was computed from).
  static UpdateInfo Update(const ServerModel& model, int64_t ticket, int64_t step);

 private:
  int64_t in_flight_ = 0;
  std::vector<int64_t> applied_;
  std::vector<StepCursor> cursors_;
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_ASYNC_CLOCK_H_
