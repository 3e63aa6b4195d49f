// The boundary between gRPC and the rest of pstrain: status conversion,
// channels, deadlines and retry with backoff. Core code returns absl::Status
// and never includes gRPC; service and client adapters use these helpers.
// All functions are thread-safe.
#ifndef PSTRAIN_COMMON_RPC_RPC_H_
#define PSTRAIN_COMMON_RPC_RPC_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/wire_limits.h"  // kMaxMessageBytes
#include "common/security/auth.h"  // kIdentityHeader
#include "grpcpp/grpcpp.h"

namespace pstrain {

class StopSignal;
struct TlsConfig;

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& what);

// Whether a call that ended with `status` may have lost its peer (a process
// gone, restarting or unreachable) rather than been answered by it:
// UNAVAILABLE and DEADLINE_EXCEEDED, and the two codes gRPC's C core can
// also end a call with when the peer dies under it: UNKNOWN ("Stream
// removed", grpc/grpc#34076) and INTERNAL (a stream reset mid-message).
// Callers that act on it (a worker asking the chief whether the job was
// rolled back) must learn the truth from elsewhere: this only says "maybe".
bool MayHaveLostPeer(const absl::Status& status);

// What every call from this process carries from now on (common/security/auth.h):
// the identity ("worker:3") and a signature made with its token (its key)
// for the task the call's channel dials. Empty token: nothing (no
// authentication). Set once at start-up, before the first channel.
void SetCallCredentials(const std::string& identity, const std::string& token);

// Mutual TLS (common/security/tls.h) for every channel this process opens and every
// server it starts from now on; null: plaintext. Set once at start-up,
// before the first channel.
void SetTransportSecurity(std::shared_ptr<const TlsConfig> tls);
std::shared_ptr<const TlsConfig> TransportSecurity();

// One channel per peer, reused for every call to it. Its calls are signed
// for `peer` ("ps:1", "chief:0"), the task it dials (SetCallCredentials): a
// server with authentication refuses calls signed for any other task, so a
// channel without `peer` reaches only servers without it. Over TLS a channel to
// a task (`peer`: "ps:1", "chief:0") accepts only that task's certificate
// (common/security/tls.h TaskAltName); without `peer`, any server certificate of the
// cluster CA naming the address's host. Channels to one address share a
// TCP connection within a process (gRPC's subchannel pool) unless their
// `connection` differs: each index is a connection of its own, which a
// client uses to spread its calls to one peer over several connections.
std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address,
                                             const std::string& peer = "",
                                             int connection = 0);

// Sets a deadline `timeout` from now on `context`.
void SetDeadline(grpc::ClientContext* context, absl::Duration timeout);

// Makes a callback-API call and waits for it: `start(done)` starts it on
// `context` with `done` as its completion callback. gRPC ends the call by
// the context's deadline; past it and 5 s more (a stuck library) the call is
// cancelled, after which gRPC runs the callback promptly. With `stop` (not
// null), a stop raised meanwhile cancels the call within 50 ms and the
// result is CANCELLED with the stop's reason. Under TSan the start is
// ordered before the callback (common/base/tsan_handoff.h).
grpc::Status AwaitCall(grpc::ClientContext* context,
                       const std::function<void(std::function<void(grpc::Status)>)>& start,
                       StopSignal* stop = nullptr);

// Calls `attempt` until it returns OK, a non-retryable error, or `total` has
// passed. UNAVAILABLE and DEADLINE_EXCEEDED are retried with exponential
// backoff (50 ms doubling to 2 s) waited on a condition, not sleep-polled
// in a loop without bound. The last error is returned, prefixed with `what`.
absl::Status RetryWithBackoff(const std::string& what, absl::Duration total,
                              const std::function<absl::Status()>& attempt,
                              absl::Duration max_backoff = absl::Seconds(2));

// Makes `attempt` again while a server refuses it as signed before it
// started (common/security/auth.h IsSignedBeforeStart: a call signed, then
// kept waiting for a server that came up since), freshly signed each time,
// backing off 50 ms doubling to 1 s, until `deadline`; `stop` (may be null)
// ends the wait CANCELLED. Refused so until the deadline, or a last try cut
// short by it: SignedBeforeStartUntilDeadline. Any other result is returned.
absl::Status RetrySignedBeforeStart(absl::Time deadline,
                                    const std::function<absl::Status()>& attempt,
                                    StopSignal* stop = nullptr);

// What one server may hold at once. gRPC's resource quota bounds the memory
// of the messages its transports are receiving and sending: as it fills,
// gRPC shrinks the flow-control windows (senders slow down), and past it
// cancels calls with RESOURCE_EXHAUSTED ("Buffers full") and closes idle
// connections. Its thread quota bounds the threads of the synchronous
// handlers; a call that finds none free is refused with RESOURCE_EXHAUSTED.
// A connection is closed when its peer has not finished the handshake (TLS,
// then HTTP/2's preface and SETTINGS) within `handshake_timeout`, or leaves
// a keepalive ping unanswered for `keepalive` (pinged after as long quiet):
// a peer that stalls or dies half-way holds nothing for longer.
struct ServerLimits {
  // At least kMinInflightBytes, so a message of the largest size fits.
  int64_t inflight_bytes = int64_t{2} << 30;
  int threads = 256;
  absl::Duration handshake_timeout = absl::Seconds(20);
  // At least the longest a push may wait (rpc.step_timeout_ms +
  // rpc.rpc_timeout_ms, 70 s by default): a worker paused (SIGSTOP) no
  // longer than that keeps its connections.
  absl::Duration keepalive = absl::Seconds(120);
};
// The range of both durations above, in milliseconds (the daemons' flags).
inline constexpr int64_t kMinPeerTimeoutMs = 100;
inline constexpr int64_t kMaxPeerTimeoutMs = 86400000;
inline constexpr int64_t kMinInflightBytes = int64_t{2} * kMaxMessageBytes;
absl::Status ValidateServerLimits(const ServerLimits& limits);
// The daemons' in-flight memory when --max_inflight_mib is not given, on a
// machine (or in a container) with `memory_bytes`: an eighth of it, at
// least kMinInflightBytes (two messages of the largest size) and at most
// ServerLimits' 2 GiB.
int64_t DefaultInflightBytes(int64_t memory_bytes);
// The in-flight memory for a job whose data calls need `job_bytes` at one
// server (JobInflightBytes, common/cluster/sizing.h) on a machine with
// `memory_bytes`: the default above, raised to the job's need up to half
// the machine shared among the `processes` on it that take a quota (its
// servers and the chief), so that gRPC neither shrinks its windows nor
// resets calls a job makes by design, and floods at all of them together
// still cannot take the machine's memory.
int64_t JobInflightQuota(int64_t job_bytes, int64_t memory_bytes, int processes = 1);

// Builds a server listening on `address` (host:port: the task's own address,
// so a task the spec puts on 127.0.0.1 is not reachable from other hosts)
// with pstrain's limits (message sizes, `limits`). A non-empty `bind_host` (e.g. "0.0.0.0" inside a
// container whose spec names a service address) replaces the host. Fails
// with a clear status when the address cannot be bound. With `auth` (which
// must outlive the server), every call is authenticated from its headers
// before its body is read (common/rpc/server_gate.h): an unauthenticated
// caller takes none of the in-flight memory the others need.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(const std::string& address,
                                                          grpc::Service* service,
                                                          const std::string& bind_host = "",
                                                          const ServerLimits& limits = {},
                                                          Authorizer* auth = nullptr);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_RPC_RPC_H_
