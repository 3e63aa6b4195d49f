// The chief's TensorBoard events (<output_dir>/events): training scalars
// (loss, examples/s, step time, learning rate, async staleness) at most once
// a second at the chief's global step, which only grows (TensorBoard drops
// points of a tag whose step goes back), and evaluation scalars at the step
// evaluated. A failure to write is logged once and never stops training.
// Not thread-safe: the driver's thread alone calls it.
#ifndef PSTRAIN_CHIEF_TRAINING_EVENTS_H_
#define PSTRAIN_CHIEF_TRAINING_EVENTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "chief/chief_state.h"
#include "chief/evaluation.h"
#include "common/observability/event_writer.h"

namespace pstrain {

class TrainingEvents {
 public:
  // Opens the event file; without one (logged), every write does nothing.
  TrainingEvents(const std::string& output_dir, int64_t start_step);

  // From the servers' status, as the driver polls it: ps:0's learning rate
  // (every server runs the same schedule), and every server's async
  // staleness totals, when all answered (a point's staleness is the mean
  // over the pushes since the last point).
  void set_learning_rate(float rate) { learning_rate_ = rate; }
  void SetStalenessTotals(int64_t count, double sum);

  // The training scalars at `step`, from the chief's progress, unless the
  // last point was under a second ago or at this step or later.
  void WriteTrainScalars(int64_t step, Chief* chief);
  void WriteEvalScalars(const Evaluation& e);
  // Scalars of one step: e.g. a worker's evaluation, "eval/<metric>".
  void Write(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  void Sync();

 private:
  std::unique_ptr<EventWriter> events_;  // null: none (could not write)
  int64_t step_at_scalars_;
  absl::Time time_at_scalars_;
  float learning_rate_ = 0;
  int64_t staleness_count_ = 0, staleness_count_at_scalars_ = 0;
  double staleness_sum_ = 0, staleness_sum_at_scalars_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_TRAINING_EVENTS_H_
