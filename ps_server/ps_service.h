// gRPC adapter for the parameter server: unpacks each RPC, calls
// ParameterServer, converts the status. Holds no state of its own beyond the
// stop signal raised by the Shutdown RPC. Thread-safe (gRPC calls handlers
// concurrently; ParameterServer is thread-safe).
//
// Pull, Push, PullRows and PushRows are raw callback methods: their tensors
// travel as frames (common/rpc/wire_frame.h), decoded in place on the way in
// (row pushes: copied out once) and sent from the server's version buffers
// (rows: the memory they were gathered into) on the way out, and a waiting Pull or PullRows parks in ParameterServer
// without a thread; a client that cancels releases it at once. The other
// methods are plain protobuf ones.
//
// Every call is authenticated and authorized first (common/security/auth.h): only the
// chief may Initialize, Shutdown, Snapshot, GetShard and LoadRows; only
// workers push; workers and the chief pull; anyone authenticated reads
// GetStatus. A worker's requests must name itself. A refused call changes
// nothing.
//
// At most `max_calls` data calls (Pull, Push, PullRows, PushRows) are served
// at once, a waiting Pull included; one more is refused at once with
// RESOURCE_EXHAUSTED, before its request is looked at.
#ifndef PSTRAIN_PS_SERVER_PS_SERVICE_H_
#define PSTRAIN_PS_SERVER_PS_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <set>
#include <utility>

#include "absl/synchronization/mutex.h"

#include "common/security/auth.h"
#include "common/base/shutdown.h"
#include "proto/ps_service.grpc.pb.h"
#include "ps_server/parameter_server.h"

namespace pstrain {

// Whose refused pushes from a replaced incarnation were logged (a worker that
// has not yet followed a rollback): one line per worker and incarnation,
// where each of its calls until it re-registers used to warn. Thread-safe.
class ReplacedIncarnationLog {
 public:
  // True the first time for `worker` of `incarnation`.
  bool First(int worker, uint64_t incarnation);

 private:
  absl::Mutex mu_;
  std::set<std::pair<int, uint64_t>> seen_ ABSL_GUARDED_BY(mu_);
};

class PsServiceImpl final
    : public PsService::WithRawCallbackMethod_Pull<PsService::WithRawCallbackMethod_Push<
          PsService::WithRawCallbackMethod_PullRows<
              PsService::WithRawCallbackMethod_PushRows<PsService::Service>>>> {
 public:
  // A worker keeps up to rpc.calls_in_flight (16) pull calls and as many
  // push calls in flight to a server, so the default leaves room for 2048
  // workers per server; each waiting pull holds about a kilobyte.
  static constexpr int kDefaultMaxCalls = 65536;
  // `auth` (authentication off when default-constructed) outlives this.
  PsServiceImpl(ParameterServer* ps, StopSignal* stop, Authorizer* auth,
                int max_calls = kDefaultMaxCalls)
      : ps_(ps), stop_(stop), auth_(auth), max_calls_(max_calls) {}

  grpc::Status Initialize(grpc::ServerContext* ctx, const InitializeRequest* req,
                          InitializeResponse* resp) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                 grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                 grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* PullRows(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* PushRows(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;
  // Data calls being served now (what max_calls bounds), and the bound.
  int data_calls() const { return calls_.load(std::memory_order_acquire); }
  int max_calls() const { return max_calls_; }

  grpc::Status GetStatus(grpc::ServerContext* ctx, const PsStatusRequest* req,
                         PsStatusResponse* resp) override;
  // Holds a server thread while it waits (the chief's one call per save).
  grpc::Status GetShard(grpc::ServerContext* ctx, const GetShardRequest* req,
                        GetShardResponse* resp) override;
  grpc::Status Snapshot(grpc::ServerContext* ctx, const SnapshotRequest* req,
                        SnapshotResponse* resp) override;
  grpc::Status LoadRows(grpc::ServerContext* ctx, const LoadRowsRequest* req,
                        LoadRowsResponse* resp) override;
  grpc::Status Shutdown(grpc::ServerContext* ctx, const ShutdownRequest* req,
                        ShutdownResponse* resp) override;

 private:
  friend class CallSlot;
  ParameterServer* const ps_;
  StopSignal* const stop_;
  Authorizer* const auth_;
  const int max_calls_;
  std::atomic<int> calls_{0};  // data calls being served
  ReplacedIncarnationLog replaced_log_;
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_PS_SERVICE_H_
