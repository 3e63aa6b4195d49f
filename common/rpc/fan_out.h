// Calls to several servers at once, each started through the window of its
// server (common/rpc/call_window.h) and each with a deadline, and waited for
// together: the fan-out under GrpcPsClient's pulls, pushes, row calls and
// admin calls. Stateless; what a call refers to must live until its `done`
// has run (CallAll waits for every one, on the caller's stack).
#ifndef PSTRAIN_COMMON_RPC_FAN_OUT_H_
#define PSTRAIN_COMMON_RPC_FAN_OUT_H_

#include <atomic>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/rpc/call_window.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace pstrain {

// Runs `start(done)`, which starts one call that runs `done` with its
// status, through `window` (null: at once). `done` frees the call's place
// in the window and then runs `ended` (after which the call's owner may be
// freed); a call whose `cancelled` is set before its turn comes ends there
// with CANCELLED, without being started.
void StartInWindow(CallWindow* window, const std::atomic<bool>* cancelled,
                   std::function<void(std::function<void(grpc::Status)>)> start,
                   std::function<void(grpc::Status)> ended);

// A unary call of `method` on `stub` with `call`'s context, request and
// response, for StartInWindow.
template <typename Call>
std::function<void(std::function<void(grpc::Status)>)> RawCall(grpc::GenericStub* stub,
                                                               const char* method, Call* call) {
  return [stub, method, call](std::function<void(grpc::Status)> done) {
    stub->UnaryCall(&call->context, method, grpc::StubOptions(), &call->request, &call->response,
                    std::move(done));
  };
}

// Starts n calls with `start(c, ctx, done)` and waits for all of them.
// Each context carries `timeout` as its deadline, counted from now also for
// a call that waits in its window (`window(c)`: the window of call c's
// server; none: every call starts at once); the wait itself is bounded a
// little beyond it. Returns the first failure (by call index), named name(c).
absl::Status CallAll(int n, absl::Duration timeout, bool wait_for_ready,
                     const std::function<std::string(int)>& name,
                     const std::function<void(int, grpc::ClientContext*,
                                              std::function<void(grpc::Status)>)>& start,
                     const std::function<CallWindow*(int)>& window = nullptr);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_RPC_FAN_OUT_H_
