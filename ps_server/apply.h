// Gradients as a push brings them, and the two ways the server applies
// them: a sync step's mean of its workers' gradients (ApplyMean) and an
// async push's gradients one by one (ApplyEach). These are the server's hot
// loops (built with -O3, see BUILD.bazel): gradients are read where the
// transport left them (a SegmentedBytes view of the received slices) or from
// a worker's staging buffer, a cache-sized chunk at a time, and the result is
// written into a spare version buffer, so no pull ever waits for an apply.
//
// What it owns: nothing; it works on partitions (server_model.h) under their
// `apply_mu`, which it takes, and takes their `mu` only to swap buffers.
// Who calls it: ParameterServer, never under its own lock.
#ifndef PSTRAIN_PS_SERVER_APPLY_H_
#define PSTRAIN_PS_SERVER_APPLY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/base/histogram.h"
#include "common/base/segmented_bytes.h"
#include "proto/ps_service.pb.h"
#include "ps_server/optimizer.h"
#include "ps_server/server_model.h"

namespace pstrain {

// A gradient located in a push's payload: its partition (the header
// checked against it), the bytes and where it starts in them.
struct GradientRef {
  PartitionState* partition;
  const SegmentedBytes* bytes;
  int64_t offset;
  bool bfloat16;  // the wire's reduced precision; float32 otherwise
  int64_t byte_size() const { return partition->size * (bfloat16 ? 2 : 4); }
};

// Resolves and checks a push's gradient headers against `model` (known
// partition, shape, dtype, each once, bytes present). Touches no tensor
// data. The bytes are `frame` (a frame's payload, tensors in order) or, when
// that is null, `contents`[i] for gradient i (contents inside the protos).
absl::Status LocateGradients(const ServerModel& model, const PushRequest& header,
                             const SegmentedBytes* frame,
                             const std::vector<SegmentedBytes>* contents,
                             std::vector<GradientRef>* grads);

// Whether every value of `g` is finite (no NaN or Inf).
bool AllFinite(const GradientRef& g);
// The first of `grads` that holds a NaN or Inf, or nullptr.
const GradientRef* FirstNonFinite(const std::vector<GradientRef>& grads);

// A gradient over `model`'s bound (max_gradient_norm +
// max_relative_gradient_norm * the L2 norm of its partition's current
// values): which, its L2 norm and the bound.
struct OverBound {
  const PartitionState* partition = nullptr;
  double norm = 0;
  double bound = 0;
};
// The first of `grads` over the bound; none (partition null) when every
// one is within it, or when `model` sets no bound (then nothing is read).
OverBound FirstOverBound(const ServerModel& model, const std::vector<GradientRef>& grads);
// "gradient for dense0/kernel has L2 norm 3.1e+07, above the bound 12.5
// (optimizer.max_gradient_norm + max_relative_gradient_norm x its values' norm)".
std::string OverBoundMessage(const OverBound& over);

// Sync: sums partition `p`'s gradients of `workers` (in index order: the
// sum is bitwise the same on every run), averages them and applies the mean
// at `step`'s rate into a spare buffer, which it returns (the caller
// publishes it with the step). Each gradient comes from its worker's staging
// buffer, except `direct_worker`'s when `direct` is given: that one is read
// from the received bytes (the push that completed the quorum). Counts the
// time in the partition's total and in `apply_seconds`.
PartitionState::Buffer ApplyMean(const ServerModel& model, PartitionState* p,
                                 const std::vector<int>& workers, int64_t step,
                                 Histogram* apply_seconds, const GradientRef* direct = nullptr,
                                 int direct_worker = -1);

// Async: applies each of `grads` from its bytes as update `update` (its
// count set per partition) and publishes it; returns the bytes applied.
int64_t ApplyEach(const ServerModel& model, const std::vector<GradientRef>& grads,
                  UpdateInfo update, Histogram* apply_seconds);

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_APPLY_H_
