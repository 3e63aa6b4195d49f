// A parameter server's Prometheus metrics, read from the server at scrape
// time (the training path only keeps its counters, as before).
#ifndef PSTRAIN_PS_SERVER_PS_METRICS_H_
#define PSTRAIN_PS_SERVER_PS_METRICS_H_

#include <memory>

#include "prometheus/collectable.h"
#include "ps_server/parameter_server.h"
#include "ps_server/ps_service.h"

namespace pstrain {

// `ps` and `service` (its data calls) must outlive the collectable.
std::shared_ptr<prometheus::Collectable> PsMetrics(ParameterServer* ps,
                                                   const PsServiceImpl* service);

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_PS_METRICS_H_
