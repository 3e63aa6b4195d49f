// Optimizers applied on the parameter server. An Optimizer updates one
// partition's values in place from an (already aggregated) gradient, keeping
// any per-partition state in OptimizerSlots, so momentum, Adagrad and Adam join
// through the same Apply path with their slots (and sparse, row-wise updates
// address rows of the same buffers). Optimizer objects are immutable and
// thread-safe; the slots of one partition are guarded by that partition's owner.
#ifndef PSTRAIN_PS_SERVER_OPTIMIZER_H_
#define PSTRAIN_PS_SERVER_OPTIMIZER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/config.pb.h"

namespace pstrain {

// Per-partition optimizer state, by slot name ("momentum", "m", "v", ...),
// each the size of the partition. Checkpointed with the variable.
using OptimizerSlots = std::map<std::string, std::vector<float>>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // Names of the slots this optimizer keeps per partition.
  virtual std::vector<std::string> slot_names() const = 0;
  // out[i] = in[i] - update(grad[i]) for the n elements starting at element
  // `offset` of the partition (slots are indexed from there); `in` may equal
  // `out`. Applying a partition in ranges gives the same bits as applying it
  // whole, so the server can apply cache-sized chunks and write a new version
  // beside the one a pull is still reading. `step` is the global step the
  // update completes. Sizes are checked by the caller.
  virtual void ApplyRange(const float* in, float* out, const float* grad, int64_t n,
                          OptimizerSlots* slots, int64_t offset, int64_t step) const = 0;

  // In place over a whole partition.
  void Apply(absl::Span<float> params, absl::Span<const float> grad, OptimizerSlots* slots,
             int64_t step) const {
    ApplyRange(params.data(), params.data(), grad.data(), static_cast<int64_t>(params.size()),
               slots, 0, step);
  }
};

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerConfig& config);

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_OPTIMIZER_H_
