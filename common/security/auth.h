// Who is calling, and may they: authentication by per-identity keys and
// authorization by role, for every RPC a daemon serves.
//
// A cluster has one secret (`pstrain tokens` writes it, mode 0600; `pstrain
// launch` makes one per run when the spec names none). Each identity's key
// (its "token") is HMAC-SHA256(secret, identity) in hex; the identities are
// the tasks ("chief:0", "ps:1", "worker:3") and "operator" (a person's
// tools: status and restore). Every call carries two metadata entries,
//   x-pstrain-identity: worker:3
//   authorization: PSTRAIN-HMAC-SHA256 a=ps:1 t=<unix ms> s=<session> n=<seq> sig=<hex>
// where sig is HMAC-SHA256 under the caller's key of the identity, the task
// called (a), the method, the signing time (t), the channel's session (64
// random bits) and the call's number in it (n, from 1). The serving daemon,
// which holds the secret, recomputes the signature and compares in constant
// time, admits it only when it names this task, was signed within
// kSignatureMaxAge of its own clock, and its (session, number) is new
// (common/security/replay_guard.h): a call captured on the wire can be made
// neither again nor at another task. A server checks this from the call's
// headers, before its message is read (common/rpc/server_gate.h). The body is not signed: without TLS
// an attacker on the path can still change a call in flight (docs/security.md).
// A task that serves nothing (a worker) can be given only its own key, so it
// cannot act as anyone else.
//
// Without a secret authentication is off: every call passes (a daemon started
// so on loopback warns at start). A cluster spec naming any non-loopback
// host needs a secret, TLS or an explicit --insecure.
#ifndef PSTRAIN_COMMON_SECURITY_AUTH_H_
#define PSTRAIN_COMMON_SECURITY_AUTH_H_

#include <atomic>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/cluster/cluster_spec.h"
#include "common/security/replay_guard.h"
#include "common/storage/env.h"  // WritePrivateFile, ReadPrivateFile
#include "common/security/tls.h"
#include "grpcpp/grpcpp.h"

namespace pstrain {

// The metadata key naming the caller ("worker:3"); every call carries it
// (common/rpc/rpc.h SetCallCredentials).
inline constexpr char kIdentityHeader[] = "x-pstrain-identity";

inline constexpr char kOperatorIdentity[] = "operator";

// HMAC-SHA256(secret, identity), 64 lowercase hex digits.
std::string DeriveToken(absl::string_view secret, absl::string_view identity);

// How far a call's signing time may be from the serving daemon's clock,
// either way: the clocks of a cluster's machines must agree this well (NTP),
// and within kStartMargin for calls to pass at once after a server starts.
inline constexpr absl::Duration kSignatureMaxAge = absl::Minutes(5);

// A server admits only calls signed after it started, less this margin (a
// call queued while its channel connected; clocks a little apart): its
// memory of calls seen starts with it, so a call captured before a restart
// must not pass. Such a call is refused UNAVAILABLE ("sign it again"): a
// caller that signed and then waited for the server (InitializeAll, a
// worker's first RegisterWorker) makes it again, freshly signed.
inline constexpr absl::Duration kStartMargin = absl::Seconds(2);
// Whether `status` is that refusal.
bool IsSignedBeforeStart(const absl::Status& status);
// What a caller that kept getting it (`refusal`) until its deadline returns:
// DEADLINE_EXCEEDED, saying so (so that it is not taken for the refusal).
absl::Status SignedBeforeStartUntilDeadline(const absl::Status& refusal);

// The authorization value of call `seq` (from 1) of `session`, made by
// `identity` with its `key` (DeriveToken) at `signed_at`, for method
// `method` ("Push", the last part of gRPC's path) of task `audience`.
std::string SignCall(absl::string_view key, absl::string_view identity,
                     absl::string_view audience, absl::string_view method, absl::Time signed_at,
                     uint64_t session, uint64_t seq);

// Signs one channel's calls: its own random session, numbers counting up.
// Thread-safe.
class CallSigner {
 public:
  CallSigner(std::string identity, std::string key, std::string audience);
  const std::string& identity() const { return identity_; }
  // The authorization value for the next call to `method`, signed now.
  std::string Sign(absl::string_view method);

 private:
  const std::string identity_;
  const std::string key_;
  const std::string audience_;
  const uint64_t session_;
  std::atomic<uint64_t> seq_{0};
};

// A new random secret (32 bytes, as 64 hex digits) at `path`, created with
// mode 0600; fails if the file exists.
absl::Status CreateSecretFile(const std::string& path);
// A secret or token file's content, whitespace trimmed. Refused when it is
// shorter than 32 characters or readable by group or others (chmod 600).
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

enum class Role { kAnyone, kChief, kPs, kWorker, kOperator };

struct Caller {
  Role role = Role::kAnyone;  // kAnyone: authentication is off
  int index = -1;             // the task index, for chief, ps and worker
  std::string name;           // "worker:3", "operator"; "" when off
};

// Verifies calls against the cluster secret. Thread-safe.
class Authorizer {
 public:
  Authorizer() = default;  // authentication off
  // For the daemon serving as task `self` ("ps:0"). With `tls` the caller is
  // the verified client certificate's common name (common/security/tls.h),
  // and a call without a certificate is unauthenticated; with a `secret` the
  // call must also carry that identity's signature, made for `self`. Off
  // when neither.
  Authorizer(const std::string& secret, const ClusterSpec& cluster, const std::string& self,
             bool tls = false);

  bool enabled() const { return !tokens_.empty(); }

  // The caller of `ctx`, when its signature for `method` is right, fresh
  // and new (else UNAUTHENTICATED) and its role is one of `allowed` (else
  // PERMISSION_DENIED). Both refusals are counted and name `method` (logged
  // at most once a second). With authentication off: Role::kAnyone.
  absl::StatusOr<Caller> Check(const grpc::ServerContextBase& ctx,
                               std::initializer_list<Role> allowed, absl::string_view method);
  absl::StatusOr<Caller> Check(absl::string_view identity, absl::string_view authorization,
                               std::initializer_list<Role> allowed, absl::string_view method);

  // Any task or the operator (reads such as GetStatus).
  absl::StatusOr<Caller> CheckAuthenticated(const grpc::ServerContextBase& ctx,
                                            absl::string_view method) {
    return Check(ctx, {Role::kChief, Role::kPs, Role::kWorker, Role::kOperator}, method);
  }

  // Authenticates a call from its headers alone, before its body is read:
  // `identity` and `authorization` are its x-pstrain-identity and
  // authorization headers, `cert_cn` the verified client certificate's
  // common name ("" without one) and `method` the last part of its path.
  // The same refusals as Check's, counted and logged the same way. A server
  // started with this Authorizer (common/rpc/rpc.h StartServer) runs it on
  // every call as its headers arrive and marks it gated (MarkGated): Check
  // then verifies only the role, the signature having been checked (and its
  // nonce spent) at the door, so every server whose handlers use a gated
  // Authorizer must be started with it. OK when authentication is off.
  // `repeated`: the call carried either header more than once (gRPC keeps
  // both; the handler would read another than the door): refused.
  absl::Status AuthenticateHeaders(absl::string_view identity, absl::string_view authorization,
                                   absl::string_view cert_cn, absl::string_view method,
                                   bool repeated = false);
  // Called as the server starts listening: from now on Check leaves the
  // signature to AuthenticateHeaders, and calls signed before now (less
  // kStartMargin) are refused.
  // Once: a second server started with it keeps the first's start.
  void MarkGated() {
    if (!gated_.exchange(true, std::memory_order_acq_rel)) {
      started_ms_.store(absl::ToUnixMillis(absl::Now()), std::memory_order_release);
    }
  }

  // A request's `worker` field must name the calling worker itself (the
  // chief's calls carry -1). Counted as denied otherwise.
  absl::Status CheckWorkerField(const Caller& caller, int worker, absl::string_view method);

  int64_t unauthenticated() const { return unauthenticated_.load(std::memory_order_relaxed); }
  // Calls refused as signed before this server started (kStartMargin).
  int64_t signed_before_start() const {
    return signed_before_start_.load(std::memory_order_relaxed);
  }
  int64_t denied() const { return denied_.load(std::memory_order_relaxed); }

 private:
  // Who `identity` is, when its credentials are good (see Check).
  absl::StatusOr<const Caller*> Authenticate(absl::string_view identity,
                                             absl::string_view authorization, bool certified,
                                             absl::string_view method);
  // Authenticate (unless `gated`: checked at the door), then the role.
  absl::StatusOr<Caller> Authorize(absl::string_view identity, absl::string_view authorization,
                                   bool certified, bool gated,
                                   std::initializer_list<Role> allowed, absl::string_view method);
  absl::Status Deny(const std::string& message);
  bool ShouldLog(std::atomic<int64_t>* last_ms);

  // Why `authorization` is not a valid signature of `identity` (whose key
  // is `key`) for `method` of this task, now; nullptr when it is. `detail`
  // says more where there is more; `code` is set where the refusal is not
  // UNAUTHENTICATED (too many sessions: RESOURCE_EXHAUSTED).
  const char* CheckSignature(absl::string_view identity, const std::string& key,
                             absl::string_view authorization, absl::string_view method,
                             std::string* detail, absl::StatusCode* code);

  bool tls_ = false;
  bool has_tokens_ = false;
  std::atomic<bool> gated_{false};
  std::string self_;
  // Calls signed before it, less kStartMargin, are refused. Set before any
  // call is served (MarkGated, as the server starts).
  std::atomic<int64_t> started_ms_{absl::ToUnixMillis(absl::Now())};
  ReplayGuard replays_{kSignatureMaxAge};
  // identity -> its token ("" without a secret) and who it is
  std::map<std::string, std::pair<std::string, Caller>, std::less<>> tokens_;
  std::atomic<int64_t> unauthenticated_{0};
  std::atomic<int64_t> denied_{0};
  std::atomic<int64_t> last_unauthenticated_log_ms_{0};
  std::atomic<int64_t> signed_before_start_{0};
  std::atomic<int64_t> last_before_start_log_ms_{0};
  std::atomic<int64_t> last_denied_log_ms_{0};
};

// What a daemon authenticates with, from the flags (which win) and the
// cluster spec's extras.
struct AuthSetup {
  std::string secret;     // empty: this task verifies no tokens
  std::string own_token;  // empty: no tokens on calls
  std::shared_ptr<const TlsConfig> tls;  // null: plaintext
};

// Resolves a task's credentials: the secret from `secret_file` (else the
// spec's), or only its own token from `token_file`. A task that serves RPCs
// (`serves`) needs the secret. Mutual TLS: the files in the spec's TLS dir
// for `identity`, each replaced by the one `tls_flags` names (and its
// crl_dir, the revocation lists' directory, which needs TLS files); the
// certificate must be `identity`'s own; with `tls_reload` above zero its
// files are watched for renewal that often (TlsWatcher). With neither a secret nor TLS, a
// spec naming a non-loopback host, or a `bind_host` (--bind) that is not
// loopback, is refused unless `insecure` (or the spec's "insecure": true).
absl::StatusOr<AuthSetup> ResolveAuth(const ClusterSpec& cluster, const std::string& identity,
                                      bool serves, const std::string& secret_file,
                                      const std::string& token_file, bool insecure,
                                      const std::string& bind_host = "",
                                      const TlsFiles& tls_flags = TlsFiles(),
                                      absl::Duration tls_reload = absl::ZeroDuration());

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_SECURITY_AUTH_H_
