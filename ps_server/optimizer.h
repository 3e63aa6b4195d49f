// Optimizers applied on the parameter server. An Optimizer updates one
// partition's values from an (already aggregated) gradient, keeping its
// per-element state in OptimizerSlots beside the values: momentum's
// velocity, Adagrad's accumulator, Adam's two moments, FTRL's z and n. A
// sparse, row-wise update addresses the rows of the same slot buffers, so
// a row that is not pushed keeps its value and its slots. Optimizer objects
// are immutable and thread-safe; the slots of one partition are guarded by
// that partition's owner.
//
// The learning rate of each update comes from LearningRate (warm-up, then
// constant, step or cosine decay, scaled by the linear scaling rule), so the
// optimizers themselves carry only their own hyperparameters.
#ifndef PSTRAIN_PS_SERVER_OPTIMIZER_H_
#define PSTRAIN_PS_SERVER_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/config.pb.h"

namespace pstrain {

// Per-partition optimizer state: one buffer per slot, in slot_names()
// order, each the size of the partition. Checkpointed with the variable.
using OptimizerSlots = std::vector<std::vector<float>>;

// What one update needs besides the tensors.
struct UpdateInfo {
  float learning_rate = 0;  // of this update (scheduled, scaled)
  // Updates of this partition (or row) so far, this one included: 1, 2, ...
  // Adam's bias correction uses it.
  int64_t count = 1;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // Names of the slots this optimizer keeps per element.
  virtual std::vector<std::string> slot_names() const = 0;
  // Sizes every slot to n elements at its initial value.
  virtual void InitSlots(int64_t n, OptimizerSlots* slots) const;
  // out[i] = update of in[i] by grad[i], for the n elements starting at
  // element `offset` of the partition (slots are indexed from there); `in`
  // may equal `out`. Applying a partition in ranges gives the same bits as
  // applying it whole, so the server can apply cache-sized chunks and write a
  // new version beside the one a pull is still reading. Sizes (slots
  // included, see InitSlots) are checked by the caller.
  virtual void ApplyRange(const float* in, float* out, const float* grad, int64_t n,
                          OptimizerSlots* slots, int64_t offset,
                          const UpdateInfo& update) const = 0;

  // In place over a whole partition.
  void Apply(absl::Span<float> params, absl::Span<const float> grad, OptimizerSlots* slots,
             const UpdateInfo& update) const {
    ApplyRange(params.data(), params.data(), grad.data(), static_cast<int64_t>(params.size()),
               slots, 0, update);
  }
};

// From a config checked by ValidateAndFillDefaults (common/cluster/config.h).
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerConfig& config);

// The learning rate of each update, from the optimizer's config (see
// LearningRateSchedule in proto/config.proto).
class LearningRate {
 public:
  // `global_batch`: examples in one update (for the linear scaling rule);
  // `max_steps`: the run's length (the cosine's default span).
  static absl::StatusOr<LearningRate> Create(const OptimizerConfig& config, int64_t global_batch,
                                             int64_t max_steps);
  // The rate of update t, t = 0, 1, ... (the global step before it).
  float At(int64_t t) const;
  float base() const { return base_; }

 private:
  LearningRateSchedule schedule_;
  double base_ = 0;
  int64_t decay_steps_ = 0;
};

// Clips every element of g[0, n) into [-limit, limit].
void ClipByValue(float* g, int64_t n, float limit);

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_OPTIMIZER_H_
