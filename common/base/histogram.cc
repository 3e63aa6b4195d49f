#include "common/base/histogram.h"

#include <algorithm>
#include <utility>

namespace pstrain {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                       bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  double sum = sum_.load(std::memory_order_relaxed);
  while (!sum_.compare_exchange_weak(sum, sum + value, std::memory_order_relaxed)) {
  }
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> Histogram::SecondsBounds() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
}

}  // namespace pstrain
