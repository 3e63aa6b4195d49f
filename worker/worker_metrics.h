// A worker's Prometheus metrics, read from its WorkerStats at scrape time.
#ifndef PSTRAIN_WORKER_WORKER_METRICS_H_
#define PSTRAIN_WORKER_WORKER_METRICS_H_

#include <memory>

#include "prometheus/collectable.h"
#include "worker/trainer.h"

namespace pstrain {

// `stats` must outlive the collectable.
std::shared_ptr<prometheus::Collectable> WorkerMetrics(const WorkerStats* stats);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_WORKER_METRICS_H_
