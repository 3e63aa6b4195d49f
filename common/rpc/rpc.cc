#include "common/rpc/rpc.h"

#include <algorithm>
#include <chrono>

#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/support/client_interceptor.h"
#include "common/cluster/cluster_spec.h"
#include "common/rpc/rpc_stats.h"
#include "common/rpc/server_gate.h"
#include "common/base/shutdown.h"
#include "common/security/tls.h"
#include "common/base/tsan_handoff.h"

namespace pstrain {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

grpc::Status AwaitCall(grpc::ClientContext* context,
                       const std::function<void(std::function<void(grpc::Status)>)>& start,
                       StopSignal* stop) {
  absl::Notification done;
  grpc::Status status;
  const HandoffToken handoff;  // the start, through gRPC's core, before the callback
  handoff.Release();
  start([&](grpc::Status st) {
    handoff.Acquire();
    status = std::move(st);
    done.Notify();
  });
  const absl::Time guard = absl::FromChrono(context->deadline()) + absl::Seconds(5);
  for (;;) {
    absl::Duration wait = guard - absl::Now();
    if (stop != nullptr) wait = std::min(wait, absl::Milliseconds(50));
    if (done.WaitForNotificationWithTimeout(wait)) return status;
    const bool stopped = stop != nullptr && stop->stopped();
    if (!stopped && absl::Now() < guard) continue;
    context->TryCancel();
    done.WaitForNotification();
    return stopped ? grpc::Status(grpc::StatusCode::CANCELLED, stop->reason()) : status;
  }
}

bool MayHaveLostPeer(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
         absl::IsUnknown(status) || absl::IsInternal(status);
}

namespace {

// Transport settings for bulk tensors, shared by channels and servers.
// PSTRAIN_GRPC_ARGS="name=int,..." overrides or adds integer arguments, for
// tuning experiments with `pstrain bench`.
std::vector<std::pair<std::string, int>> TransportArgs() {
  std::vector<std::pair<std::string, int>> args;
  if (const char* env = std::getenv("PSTRAIN_GRPC_ARGS")) {
    for (absl::string_view kv : absl::StrSplit(env, ',', absl::SkipEmpty())) {
      std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
      int v = 0;
      if (absl::SimpleAtoi(p.second, &v)) args.emplace_back(p.first, v);
    }
  }
  return args;
}

struct CallIdentity {
  std::string identity;
  std::string key;  // its token (common/security/auth.h DeriveToken)
};

absl::Mutex identity_mu;
CallIdentity* call_identity ABSL_GUARDED_BY(identity_mu) = nullptr;
std::shared_ptr<const TlsConfig> transport_tls ABSL_GUARDED_BY(identity_mu);

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsConfig* tls) {
  return tls ? TlsChannelCredentials(*tls) : grpc::InsecureChannelCredentials();
}

// Adds the process's identity and the call's signature to its initial
// metadata.
class IdentityInterceptor final : public grpc::experimental::Interceptor {
 public:
  IdentityInterceptor(CallSigner* signer, absl::string_view method)
      : signer_(signer), method_(method) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      std::multimap<std::string, std::string>* md = methods->GetSendInitialMetadata();
      md->emplace(kIdentityHeader, signer_->identity());
      md->emplace("authorization", signer_->Sign(method_));
    }
    methods->Proceed();
  }

 private:
  CallSigner* const signer_;  // the channel's, which outlives its calls
  const std::string method_;  // "Push", of gRPC's "/pstrain.PsService/Push"
};

class IdentityInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  IdentityInterceptorFactory(const CallIdentity& id, const std::string& peer)
      : signer_(id.identity, id.key, peer) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    absl::string_view method = info->method() == nullptr ? "" : info->method();
    const size_t slash = method.rfind('/');
    if (slash != absl::string_view::npos) method.remove_prefix(slash + 1);
    return new IdentityInterceptor(&signer_, method);
  }

 private:
  CallSigner signer_;  // this channel's session
};

}  // namespace

void SetCallCredentials(const std::string& identity, const std::string& token) {
  absl::MutexLock lock(&identity_mu);
  if (token.empty()) {
    call_identity = nullptr;
    return;
  }
  // Channels keep a pointer for their lifetime: identities are never freed.
  call_identity = new CallIdentity{identity, token};
}

void SetTransportSecurity(std::shared_ptr<const TlsConfig> tls) {
  absl::MutexLock lock(&identity_mu);
  transport_tls = std::move(tls);
}

std::shared_ptr<const TlsConfig> TransportSecurity() {
  absl::MutexLock lock(&identity_mu);
  return transport_tls;
}

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address,
                                             const std::string& peer, int connection) {
  grpc::ChannelArguments args;
  // gRPC keys its shared connections by address and channel arguments, so
  // an argument of the project's own (gRPC passes unknown ones through)
  // gives each index its own connection.
  if (connection > 0) args.SetInt("pstrain.connection", connection);
  for (const auto& [name, value] : TransportArgs()) args.SetInt(name, value);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Reconnect quickly after a peer restarts instead of gRPC's default 1-120 s backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // The connect timeout per attempt (gRPC: 20 s), which also paces retries
  // to a peer that is not listening yet; 1 s is ample for a cluster network.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  // After a failed connect the channel re-resolves the name; gRPC's default
  // cooldown between resolutions (30 s) would keep a peer that came up late
  // unreachable for seconds.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 200);
  const CallIdentity* id;
  std::shared_ptr<const TlsConfig> tls;
  {
    absl::MutexLock lock(&identity_mu);
    id = call_identity;
    tls = transport_tls;
  }
  // The server must prove it is the task dialled, not just any of the cluster's.
  if (tls && !peer.empty()) args.SetSslTargetNameOverride(TaskAltName(peer));
  if (id == nullptr) {
    return grpc::CreateCustomChannel(address, ChannelCredentials(tls.get()), args);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  // Each channel signs its calls for the task it dials (`peer`; "" for an
  // address alone, which a server with authentication refuses).
  factories.push_back(std::make_unique<IdentityInterceptorFactory>(*id, peer));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      address, ChannelCredentials(tls.get()), args, std::move(factories));
}

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(absl::ToInt64Microseconds(timeout)));
}

absl::Status RetryWithBackoff(const std::string& what, absl::Duration total,
                              const std::function<absl::Status()>& attempt,
                              absl::Duration max_backoff) {
  const absl::Time deadline = absl::Now() + total;
  absl::Duration backoff = std::min(absl::Milliseconds(50), max_backoff);
  absl::Status last;
  for (int tries = 1;; ++tries) {
    last = attempt();
    if (last.ok()) return last;
    const bool retryable = absl::IsUnavailable(last) || absl::IsDeadlineExceeded(last);
    const absl::Time now = absl::Now();
    if (!retryable || now >= deadline) {
      return absl::Status(last.code(), absl::StrCat(what, " failed after ", tries, " attempt(s) in ",
                                                    absl::FormatDuration(total - (deadline - now)),
                                                    ": ", last.message()));
    }
    // Backoff between attempts of a failed call (not a readiness poll: callers
    // use wait_for_ready, so an attempt itself blocks until the peer is up).
    absl::SleepFor(std::min(deadline - now, backoff));
    backoff = std::min(backoff * 2, max_backoff);
  }
}

absl::Status RetrySignedBeforeStart(absl::Time deadline,
                                    const std::function<absl::Status()>& attempt,
                                    StopSignal* stop) {
  absl::Duration backoff = absl::Milliseconds(50);
  absl::Status refused;  // the last such refusal
  for (;;) {
    absl::Status st = attempt();
    if (!IsSignedBeforeStart(st)) {
      // A last try cut short by the deadline: the refusal says more.
      return !refused.ok() && absl::IsDeadlineExceeded(st) ? SignedBeforeStartUntilDeadline(refused)
                                                            : st;
    }
    refused = st;
    if (absl::Now() + backoff >= deadline) return SignedBeforeStartUntilDeadline(refused);
    if (stop == nullptr) {
      absl::SleepFor(backoff);
    } else if (stop->WaitFor(backoff)) {
      return absl::CancelledError(stop->reason());
    }
    backoff = std::min(2 * backoff, absl::Seconds(1));
  }
}

int64_t DefaultInflightBytes(int64_t memory_bytes) {
  return std::clamp<int64_t>(memory_bytes / 8, kMinInflightBytes, ServerLimits().inflight_bytes);
}

int64_t JobInflightQuota(int64_t job_bytes, int64_t memory_bytes, int processes) {
  const int64_t floor = DefaultInflightBytes(memory_bytes);
  return std::max(floor, std::min(job_bytes, memory_bytes / 2 / std::max(1, processes)));
}

absl::Status ValidateServerLimits(const ServerLimits& limits) {
  if (limits.inflight_bytes < kMinInflightBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("in-flight memory limit of ", limits.inflight_bytes >> 20,
                     " MiB is below the minimum of ", kMinInflightBytes >> 20,
                     " MiB (twice the largest message, ", kMaxMessageBytes >> 20, " MiB)"));
  }
  if (limits.threads < 4 || limits.threads > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("RPC thread limit ", limits.threads, " is outside [4, 65536]"));
  }
  for (auto [name, value] : {std::pair{"handshake timeout", limits.handshake_timeout},
                             std::pair{"keepalive", limits.keepalive}}) {
    if (value < absl::Milliseconds(kMinPeerTimeoutMs) ||
        value > absl::Milliseconds(kMaxPeerTimeoutMs)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", name, " of ", absl::FormatDuration(value), " is outside [",
          absl::FormatDuration(absl::Milliseconds(kMinPeerTimeoutMs)), ", ",
          absl::FormatDuration(absl::Milliseconds(kMaxPeerTimeoutMs)), "]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(const std::string& address,
                                                          grpc::Service* service,
                                                          const std::string& bind_host,
                                                          const ServerLimits& limits,
                                                          Authorizer* auth) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  if (absl::Status st = ValidateServerLimits(limits); !st.ok()) return st;
  if (!bind_host.empty()) {
    if (absl::Status st = ValidateHost(bind_host); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--bind: ", st.message()));
    }
  }
  const std::string listen = HostPortString(bind_host.empty() ? hp->host : bind_host, hp->port);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  const std::shared_ptr<const TlsConfig> tls = TransportSecurity();
  builder.AddListeningPort(listen, GatedServerCredentials(tls.get(), auth), &bound_port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  grpc::ResourceQuota quota("pstrain-server");
  quota.Resize(static_cast<size_t>(limits.inflight_bytes));
  quota.SetMaxThreads(limits.threads);
  builder.SetResourceQuota(quota);
  // Two tasks must never share a port silently (gRPC enables SO_REUSEPORT by default).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A peer that stalls half-way is dropped. gRPC's defaults: 120 s for the
  // handshake; a server pings after 2 h, and only connections with a call
  // open, so one that finished its handshake and then went silent would
  // stay open as long as the process.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(limits.handshake_timeout)));
  const int keepalive_ms = static_cast<int>(absl::ToInt64Milliseconds(limits.keepalive));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, keepalive_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  for (const auto& [name, value] : TransportArgs()) builder.AddChannelArgument(name, value);
  builder.RegisterService(service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(ServerStatsInterceptor());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, ": the port is in use, or the host is not an "
                     "address of this machine (--bind=0.0.0.0 listens on all of them)"));
  }
  return server;
}

}  // namespace pstrain
