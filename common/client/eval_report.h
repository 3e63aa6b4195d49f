// A worker's own evaluation in its progress report (ProgressReport.eval,
// eval_step, eval_examples): what the chief takes, checked by the worker
// before it sends one and by the chief when one arrives.
#ifndef PSTRAIN_COMMON_CLIENT_EVAL_REPORT_H_
#define PSTRAIN_COMMON_CLIENT_EVAL_REPORT_H_

#include "absl/status/status.h"
#include "proto/chief_service.pb.h"

namespace pstrain {

inline constexpr int kMaxEvalMetrics = 16;
inline constexpr int kMaxEvalMetricName = 64;

// OK for a report without metrics, or with 1..kMaxEvalMetrics of them, each
// named once by 1..kMaxEvalMetricName letters, digits and underscores (not
// starting with a digit: a TensorBoard tag and a Prometheus label value as
// it is), each value finite, the step and the examples >= 0. Else
// INVALID_ARGUMENT naming the first bad one.
absl::Status CheckEvalReport(const ProgressReport& report);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CLIENT_EVAL_REPORT_H_
