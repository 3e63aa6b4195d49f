// What the RPCs this process served did, counted by a gRPC interceptor on
// every server StartServer builds (common/rpc/rpc.h): per method, calls by
// status code, a latency histogram, and the bytes each way. Lock-free on the
// call path (atomics; a method's record is found once per call, under a
// reader lock). Read at scrape time by the monitoring endpoint
// (common/observability/monitoring.h: RpcMetrics).
//
// Calls made are not intercepted: an interceptor on the workers' channels
// cost ~3% of the demo's throughput (six interleaved runs each), while the
// server's cost none measurable; a worker's own time split (pull, push)
// says what its calls cost it.
#ifndef PSTRAIN_COMMON_RPC_RPC_STATS_H_
#define PSTRAIN_COMMON_RPC_RPC_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/base/histogram.h"
#include "grpcpp/support/server_interceptor.h"

namespace pstrain {

class RpcStats {
 public:
  struct Method {
    explicit Method(std::string service, std::string name);
    const std::string service;                        // "pstrain.PsService"
    const std::string name;                           // "Push"
    std::array<std::atomic<uint64_t>, 17> by_code{};  // grpc::StatusCode 0..16
    Histogram seconds{Histogram::SecondsBounds()};
    std::atomic<uint64_t> sent_bytes{0};
    std::atomic<uint64_t> received_bytes{0};
  };

  // The record of "/package.Service/Method" (created on first use; lives as
  // long as this object).
  Method* Find(const char* full_method);
  // Every method seen, in name order.
  std::vector<const Method*> Methods() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Method>> methods_ ABSL_GUARDED_BY(mu_);
};

// The RPCs this process served.
RpcStats& ServerRpcStats();

// The interceptor that counts them (installed by common/rpc/rpc.h's StartServer).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> ServerStatsInterceptor();

// The gRPC name of a status code ("OK", "DEADLINE_EXCEEDED"), as the code
// label of the metrics.
const char* StatusCodeName(int code);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_RPC_RPC_STATS_H_
