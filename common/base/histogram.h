// A histogram with fixed bucket bounds for metrics (common/observability/monitoring.h:
// AddHistogram), observed from any thread without a lock.
#ifndef PSTRAIN_COMMON_BASE_HISTOGRAM_H_
#define PSTRAIN_COMMON_BASE_HISTOGRAM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace pstrain {

// Upper bounds are Prometheus' `le` (a value lands in the first bucket whose
// bound is >= it).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);

  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf (the count)
    double sum = 0;
  };
  Snapshot Read() const;

  // 100 us .. 60 s: RPC latencies, waits, applies.
  static std::vector<double> SecondsBounds();

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // one per bound, then +Inf
  std::atomic<double> sum_{0};
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_BASE_HISTOGRAM_H_
