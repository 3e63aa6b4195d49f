#include "common/security/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/security/tls.h"
#include "common/security/tls_watcher.h"
#include "openssl/crypto.h"
#include "openssl/evp.h"
#include "openssl/hmac.h"
#include "openssl/rand.h"

namespace pstrain {
namespace {

constexpr size_t kMinSecretChars = 32;
constexpr char kSignatureScheme[] = "PSTRAIN-HMAC-SHA256 ";

std::string HmacHex(absl::string_view key, absl::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  ::HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
         reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &len);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(mac), len));
}

// What a signature covers, one field a line (no field holds a newline:
// identities and audiences are checked names, the rest are numbers).
std::string StringToSign(absl::string_view identity, absl::string_view audience,
                         absl::string_view method, absl::string_view unix_ms,
                         absl::string_view session_hex, absl::string_view seq) {
  return absl::StrCat("pstrain-call-v1\n", identity, "\n", audience, "\n", method, "\n",
                      unix_ms, "\n", session_hex, "\n", seq);
}

bool IsDigits(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool IsLowerHex(absl::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// The fields of "PSTRAIN-HMAC-SHA256 a=.. t=.. s=.. n=.. sig=..", in that
// order; false when the value is not of that form.
struct SignedFields {
  absl::string_view audience, unix_ms, session_hex, seq, sig;
  int64_t ms = 0;
  uint64_t session = 0;
  uint64_t number = 0;
};
bool ParseSignature(absl::string_view authorization, SignedFields* f) {
  if (!absl::ConsumePrefix(&authorization, kSignatureScheme)) return false;
  std::vector<absl::string_view> parts = absl::StrSplit(authorization, ' ');
  if (parts.size() != 5) return false;
  absl::string_view* fields[] = {&f->audience, &f->unix_ms, &f->session_hex, &f->seq, &f->sig};
  const char* keys[] = {"a=", "t=", "s=", "n=", "sig="};
  for (int i = 0; i < 5; ++i) {
    if (!absl::ConsumePrefix(&parts[i], keys[i])) return false;
    *fields[i] = parts[i];
  }
  return f->audience.size() <= 64 && f->unix_ms.size() <= 18 && IsDigits(f->unix_ms) &&
         absl::SimpleAtoi(f->unix_ms, &f->ms) && f->session_hex.size() == 16 &&
         IsLowerHex(f->session_hex) && absl::SimpleHexAtoi(f->session_hex, &f->session) &&
         f->seq.size() <= 19 && IsDigits(f->seq) && absl::SimpleAtoi(f->seq, &f->number) &&
         f->number > 0 &&
         f->sig.size() == 64 && IsLowerHex(f->sig);
}

uint64_t RandomSession() {
  uint64_t session = 0;
  if (::RAND_bytes(reinterpret_cast<unsigned char*>(&session), sizeof(session)) != 1) {
    // Without OpenSSL's generator a session is still unique enough among
    // one identity's channels within kSignatureMaxAge; the server refuses a
    // repeated (session, number) either way.
    session = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) ^
              (static_cast<uint64_t>(::getpid()) << 32);
  }
  return session;
}

const char* RoleName(Role r) {
  switch (r) {
    case Role::kAnyone:
      return "anyone";
    case Role::kChief:
      return kChiefJob;
    case Role::kPs:
      return kPsJob;
    case Role::kWorker:
      return kWorkerJob;
    case Role::kOperator:
      return kOperatorIdentity;
  }
  return "?";
}

}  // namespace

std::string DeriveToken(absl::string_view secret, absl::string_view identity) {
  return HmacHex(secret, identity);
}

std::string SignCall(absl::string_view key, absl::string_view identity,
                     absl::string_view audience, absl::string_view method, absl::Time signed_at,
                     uint64_t session, uint64_t seq) {
  const std::string ms = absl::StrCat(absl::ToUnixMillis(signed_at));
  const std::string session_hex = absl::StrFormat("%016x", session);
  const std::string number = absl::StrCat(seq);
  return absl::StrCat(kSignatureScheme, "a=", audience, " t=", ms, " s=", session_hex,
                      " n=", number, " sig=",
                      HmacHex(key, StringToSign(identity, audience, method, ms, session_hex,
                                                number)));
}

CallSigner::CallSigner(std::string identity, std::string key, std::string audience)
    : identity_(std::move(identity)),
      key_(std::move(key)),
      audience_(std::move(audience)),
      session_(RandomSession()) {}

std::string CallSigner::Sign(absl::string_view method) {
  const uint64_t seq = seq_.fetch_add(1, std::memory_order_relaxed) + 1;
  return SignCall(key_, identity_, audience_, method, absl::Now(), session_, seq);
}

absl::Status CreateSecretFile(const std::string& path) {
  unsigned char bytes[32];
  if (::RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("no random bytes from OpenSSL for the cluster secret");
  }
  const std::string hex =
      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes), 32)) + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  const bool ok =
      ::write(fd, hex.data(), hex.size()) == static_cast<ssize_t>(hex.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    return absl::DataLossError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadPrivateFile(path, 4096);
  if (!text.ok()) return text.status();
  const std::string trimmed(absl::StripAsciiWhitespace(*text));
  if (trimmed.size() < kMinSecretChars) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", trimmed.size(),
                                                   " characters; a secret or token has at least ",
                                                   kMinSecretChars));
  }
  return trimmed;
}

namespace {
constexpr char kSignedBeforeStart[] = "before this server started";
}  // namespace

bool IsSignedBeforeStart(const absl::Status& status) {
  return absl::IsUnavailable(status) &&
         absl::StrContains(status.message(), kSignedBeforeStart);
}

absl::Status SignedBeforeStartUntilDeadline(const absl::Status& refusal) {
  return absl::DeadlineExceededError(absl::StrCat(
      refusal.message(), "; refused so until the deadline: are the machines' clocks more than ",
      absl::FormatDuration(kStartMargin), " apart (NTP)?"));
}

Authorizer::Authorizer(const std::string& secret, const ClusterSpec& cluster,
                       const std::string& self, bool tls)
    : tls_(tls), has_tokens_(!secret.empty()), self_(self) {
  if (secret.empty() && !tls) return;
  auto add = [&](const Caller& c) {
    tokens_[c.name] = {has_tokens_ ? DeriveToken(secret, c.name) : std::string(), c};
  };
  for (const TaskId& t : cluster.AllTasks()) {
    Caller c;
    c.role = t.job == kChiefJob ? Role::kChief : t.job == kPsJob ? Role::kPs : Role::kWorker;
    c.index = t.index;
    c.name = t.ToString();
    add(c);
  }
  Caller op;
  op.role = Role::kOperator;
  op.name = kOperatorIdentity;
  add(op);
}

bool Authorizer::ShouldLog(std::atomic<int64_t>* last_ms) {
  // At most one line a second of each kind: anyone who reaches the port
  // can make calls.
  const int64_t now = absl::ToUnixMillis(absl::Now());
  int64_t last = last_ms->load(std::memory_order_relaxed);
  return now - last >= 1000 &&
         last_ms->compare_exchange_strong(last, now, std::memory_order_relaxed);
}

absl::Status Authorizer::Deny(const std::string& message) {
  denied_.fetch_add(1, std::memory_order_relaxed);
  if (ShouldLog(&last_denied_log_ms_)) LOG_WARN("{} ({} calls denied in all)", message, denied());
  return absl::PermissionDeniedError(message);
}

absl::StatusOr<Caller> Authorizer::Check(absl::string_view identity,
                                         absl::string_view authorization,
                                         std::initializer_list<Role> allowed,
                                         absl::string_view method) {
  if (!enabled()) return Caller();
  return Authorize(identity, authorization, /*certified=*/false, /*gated=*/false, allowed, method);
}

absl::Status Authorizer::AuthenticateHeaders(absl::string_view identity,
                                             absl::string_view authorization,
                                             absl::string_view cert_cn, absl::string_view method,
                                             bool repeated) {
  if (!enabled()) return absl::OkStatus();
  if (repeated) {
    unauthenticated_.fetch_add(1, std::memory_order_relaxed);
    const char* why = "x-pstrain-identity or authorization given more than once";
    if (ShouldLog(&last_unauthenticated_log_ms_)) {
      LOG_WARN("{} refused: {} ({} unauthenticated calls in all)", method, why, unauthenticated());
    }
    return absl::UnauthenticatedError(absl::StrCat(method, ": unauthenticated (", why, ")"));
  }
  // The verified certificate names the caller; the identity header does not.
  if (tls_ && !cert_cn.empty()) {
    return Authenticate(cert_cn, authorization, /*certified=*/true, method).status();
  }
  return Authenticate(identity, authorization, /*certified=*/false, method).status();
}

const char* Authorizer::CheckSignature(absl::string_view identity, const std::string& key,
                                       absl::string_view authorization,
                                       absl::string_view method, std::string* detail,
                                       absl::StatusCode* code) {
  SignedFields f;
  if (!ParseSignature(authorization, &f)) {
    return absl::StartsWith(authorization, "Bearer ")
               ? "a bearer token, which could be replayed; calls must be signed (this "
                 "client is older than the server)"
               : "no signature";
  }
  const std::string expected =
      HmacHex(key, StringToSign(identity, f.audience, method, f.unix_ms, f.session_hex, f.seq));
  if (CRYPTO_memcmp(f.sig.data(), expected.data(), expected.size()) != 0) {
    return "bad signature";
  }
  if (f.audience != self_) {
    *detail = absl::StrCat("signed for \"", absl::CHexEscape(f.audience), "\", not for this task (",
                           self_, ")");
    return "signed for another task";
  }
  const absl::Time now = absl::Now();
  const absl::Time signed_at = absl::FromUnixMillis(f.ms);
  if (absl::AbsDuration(now - signed_at) > kSignatureMaxAge) {
    const absl::Duration skew = now - signed_at;
    *detail = absl::StrCat("signed ",
                           absl::FormatDuration(absl::Trunc(absl::AbsDuration(skew),
                                                            absl::Seconds(1))),
                           skew > absl::ZeroDuration() ? " before" : " after",
                           " this task's clock says now, more than the ",
                           absl::FormatDuration(kSignatureMaxAge),
                           " allowed: a replayed call, or the machines' clocks disagree (NTP)");
    return "stale signature";
  }
  const absl::Time started = absl::FromUnixMillis(started_ms_.load(std::memory_order_acquire));
  if (signed_at < started - kStartMargin) {
    *code = absl::StatusCode::kUnavailable;
    *detail = absl::StrCat(
        "signed ", absl::FormatDuration(absl::Trunc(started - signed_at, absl::Milliseconds(1))),
        " ", kSignedBeforeStart, " (a call from before a restart, or one that waited for the ",
        "server to come up): sign it again");
    return "signed before this server started";
  }
  switch (replays_.Admit(identity, f.session, f.number, signed_at, now)) {
    case ReplayGuard::Verdict::kNew:
      return nullptr;
    case ReplayGuard::Verdict::kReplayed:
      return "a replayed call";
    case ReplayGuard::Verdict::kBelowWindow:
      *detail = absl::StrCat("call ", f.number, " of its channel, more than ",
                             ReplayGuard::kWindow, " calls behind its newest");
      return "too old a call";
    case ReplayGuard::Verdict::kTooManySessions:
      *code = absl::StatusCode::kResourceExhausted;
      *detail = absl::StrCat("too many channels of ", identity,
                             " signing at once (sessions are kept ",
                             absl::FormatDuration(2 * kSignatureMaxAge),
                             " after their last call); try again later");
      return "too many channels";
  }
  return "unknown";
}

absl::StatusOr<const Caller*> Authorizer::Authenticate(absl::string_view identity,
                                                       absl::string_view authorization,
                                                       bool certified, absl::string_view method) {
  auto it = tokens_.find(identity);
  const char* problem = nullptr;  // why the caller is not authenticated
  std::string detail;             // more about it, when there is more
  absl::StatusCode code = absl::StatusCode::kUnauthenticated;
  if (!certified && tls_) {
    problem = "no client certificate";
  } else if (it == tokens_.end()) {
    problem = certified ? "a certificate for no task of this cluster" : "unknown identity";
  } else if (has_tokens_) {
    problem = CheckSignature(identity, it->second.first, authorization, method, &detail, &code);
  }
  if (problem != nullptr) {
    // A call that waited for this server to start is expected (its caller
    // makes it again): counted and logged apart from the others.
    const bool before_start = code == absl::StatusCode::kUnavailable;
    (before_start ? signed_before_start_ : unauthenticated_).fetch_add(1, std::memory_order_relaxed);
    const std::string why = detail.empty() ? std::string(problem) : detail;
    if (ShouldLog(before_start ? &last_before_start_log_ms_ : &last_unauthenticated_log_ms_)) {
      const std::string who = absl::CHexEscape(identity.substr(0, 64));
      const std::string line =
          absl::StrCat(method, " refused: ",
                       identity.empty() ? why : absl::StrCat(why, " for \"", who, "\""));
      if (before_start) {
        LOG_INFO("{}", line);
      } else {
        LOG_WARN("{} ({} unauthenticated calls in all)", line, unauthenticated());
      }
    }
    std::vector<std::string> needs;
    if (tls_) needs.push_back("a certificate from the cluster's CA (pstrain certs)");
    if (has_tokens_) {
      needs.push_back(
          "calls signed with the key of a task or of the operator (the cluster secret: pstrain "
          "tokens, or the run.secret pstrain launch writes in the output_dir)");
    }
    if (code != absl::StatusCode::kUnauthenticated) {
      return absl::Status(code, absl::StrCat(method, ": ", why));
    }
    return absl::UnauthenticatedError(absl::StrCat(method, ": unauthenticated (", why,
                                                   "); this cluster needs ",
                                                   absl::StrJoin(needs, " and ")));
  }
  return &it->second.second;
}

absl::StatusOr<Caller> Authorizer::Authorize(absl::string_view identity,
                                             absl::string_view authorization, bool certified,
                                             bool gated, std::initializer_list<Role> allowed,
                                             absl::string_view method) {
  const Caller* found = nullptr;
  auto it = tokens_.find(identity);
  if (gated && it != tokens_.end() && (certified || !tls_)) {
    found = &it->second.second;  // its signature was checked as its headers came
  } else {
    absl::StatusOr<const Caller*> who = Authenticate(identity, authorization, certified, method);
    if (!who.ok()) return who.status();
    found = *who;
  }
  const Caller& caller = *found;
  if (std::find(allowed.begin(), allowed.end(), caller.role) == allowed.end()) {
    std::vector<std::string> names;
    for (Role r : allowed) names.push_back(RoleName(r));
    return Deny(absl::StrCat(method, " refused for ", caller.name, ": only ",
                             absl::StrJoin(names, " or "), " may call it"));
  }
  return caller;
}

absl::StatusOr<Caller> Authorizer::Check(const grpc::ServerContextBase& ctx,
                                         std::initializer_list<Role> allowed,
                                         absl::string_view method) {
  if (!enabled()) return Caller();
  const auto& md = ctx.client_metadata();
  auto header = [&md](const char* key) -> absl::string_view {
    auto it = md.find(key);
    return it == md.end() ? absl::string_view()
                          : absl::string_view(it->second.data(), it->second.size());
  };
  // The door checked the signature of the one identity header there is (a
  // call with two is refused there); anything else is checked in full.
  const bool gated = gated_.load(std::memory_order_acquire) && md.count(kIdentityHeader) <= 1 &&
                     md.count("authorization") == 1;
  if (tls_) {
    // The verified certificate names the caller; the identity header does not.
    const std::string cn = PeerCommonName(ctx);
    if (!cn.empty()) return Authorize(cn, header("authorization"), true, gated, allowed, method);
  }
  return Authorize(header(kIdentityHeader), header("authorization"), false, gated, allowed,
                   method);
}

absl::Status Authorizer::CheckWorkerField(const Caller& caller, int worker,
                                          absl::string_view method) {
  if (caller.role == Role::kAnyone) return absl::OkStatus();
  const int own = caller.role == Role::kWorker ? caller.index : -1;
  if (worker == own) return absl::OkStatus();
  return Deny(absl::StrCat(method, " refused for ", caller.name, ": it names worker ", worker,
                           "; a task may only act as itself"));
}

absl::StatusOr<AuthSetup> ResolveAuth(const ClusterSpec& cluster, const std::string& identity,
                                      bool serves, const std::string& secret_file,
                                      const std::string& token_file, bool insecure,
                                      const std::string& bind_host, const TlsFiles& tls_flags,
                                      absl::Duration tls_reload) {
  AuthSetup setup;
  TlsFiles tls_files =
      cluster.tls_dir().empty() ? TlsFiles() : TlsFilesIn(cluster.tls_dir(), identity);
  if (!tls_flags.ca_file.empty()) tls_files.ca_file = tls_flags.ca_file;
  if (!tls_flags.cert_file.empty()) tls_files.cert_file = tls_flags.cert_file;
  if (!tls_flags.key_file.empty()) tls_files.key_file = tls_flags.key_file;
  tls_files.crl_dir = tls_flags.crl_dir;
  if (!tls_files.any() && !tls_files.crl_dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TLS: revocation lists in ", tls_files.crl_dir,
        " but no TLS files (--tls_dir, or the cluster spec's \"pstrain\": {\"tls\": ...})"));
  }
  if (tls_files.any()) {
    absl::StatusOr<TlsConfig> tls = LoadTls(tls_files);
    if (!tls.ok()) {
      return absl::Status(tls.status().code(), absl::StrCat("TLS: ", tls.status().message()));
    }
    if (tls->identity != identity) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TLS: ", tls_files.cert_file, " is the certificate of \"", tls->identity,
          "\", not of this task, ", identity));
    }
    if (tls_reload > absl::ZeroDuration()) {
      // It reads the files again, after noting their stamps.
      absl::StatusOr<std::shared_ptr<TlsWatcher>> watcher =
          TlsWatcher::Start(tls_files, identity, tls_reload);
      if (!watcher.ok()) {
        return absl::Status(watcher.status().code(),
                            absl::StrCat("TLS: ", watcher.status().message()));
      }
      tls->watcher = *std::move(watcher);
    }
    setup.tls = std::make_shared<const TlsConfig>(*std::move(tls));
  }
  const std::string secret_path = !secret_file.empty() ? secret_file : cluster.auth_secret_file();
  if (!secret_path.empty() && (token_file.empty() || serves)) {
    absl::StatusOr<std::string> secret = ReadSecretFile(secret_path);
    if (!secret.ok()) {
      return absl::Status(secret.status().code(),
                          absl::StrCat("cluster secret: ", secret.status().message()));
    }
    setup.secret = *secret;
    setup.own_token = DeriveToken(setup.secret, identity);
  } else if (!token_file.empty()) {
    if (serves) {
      return absl::InvalidArgumentError(
          absl::StrCat(identity,
                       " serves RPCs and so needs the cluster secret (--auth_secret_file or the "
                       "spec's \"pstrain\": {\"auth\": {\"secret_file\": ...}}), not a token"));
    }
    absl::StatusOr<std::string> token = ReadSecretFile(token_file);
    if (!token.ok()) {
      return absl::Status(token.status().code(),
                          absl::StrCat("--auth_token_file: ", token.status().message()));
    }
    setup.own_token = *token;
  } else if (!setup.tls && !insecure && !cluster.insecure() &&
             (!cluster.AllLoopback() || (!bind_host.empty() && !IsLoopbackHost(bind_host)))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cluster spec ", cluster.source(),
        cluster.AllLoopback() ? absl::StrCat(" with --bind=", bind_host, " listens beyond loopback")
                              : std::string(" names hosts other than loopback"),
        " and no authentication is set up: anyone who can "
        "reach a port could read, change or stop the model. Write a secret with 'pstrain "
        "tokens --cluster_spec=SPEC --out=DIR' and name it in the spec (\"pstrain\": {\"auth\": "
        "{\"secret_file\": \"DIR/cluster.secret\"}}), or certificates with 'pstrain certs "
        "--cluster_spec=SPEC --out=DIR' (\"pstrain\": {\"tls\": {\"dir\": \"DIR\"}}), or pass "
        "--insecure on a trusted network"));
  }
  return setup;
}

}  // namespace pstrain
