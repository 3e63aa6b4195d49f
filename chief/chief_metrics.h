// The chief's Prometheus metrics, read from its state at scrape time, and
// its readiness (every worker registered).
#ifndef PSTRAIN_CHIEF_CHIEF_METRICS_H_
#define PSTRAIN_CHIEF_CHIEF_METRICS_H_

#include <memory>
#include <string>

#include "chief/chief_state.h"
#include "prometheus/collectable.h"

namespace pstrain {

// `chief` must outlive the collectable.
std::shared_ptr<prometheus::Collectable> ChiefMetrics(Chief* chief);
// "" once every worker has registered and training runs; else why not.
std::string ChiefNotReady(Chief* chief, int num_workers);

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_CHIEF_METRICS_H_
