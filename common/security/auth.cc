#include "common/security/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  ::HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
         reinterpret_cast<const unsigned char*>(identity.data()), identity.size(), mac, &len);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(mac), len));
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

Authorizer::Authorizer(const std::string& secret, const ClusterSpec& cluster, bool tls)
    : tls_(tls), has_tokens_(!secret.empty()) {
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
  return Authorize(identity, authorization, /*certified=*/false, allowed, method);
}

absl::StatusOr<Caller> Authorizer::Authorize(absl::string_view identity,
                                             absl::string_view authorization, bool certified,
                                             std::initializer_list<Role> allowed,
                                             absl::string_view method) {
  auto it = tokens_.find(identity);
  const char* problem = nullptr;  // why the caller is not authenticated
  if (!certified && tls_) {
    problem = "no client certificate";
  } else if (it == tokens_.end()) {
    problem = certified ? "a certificate for no task of this cluster" : "unknown identity";
  } else if (has_tokens_) {
    const std::string& expected = it->second.first;
    const bool bearer = absl::ConsumePrefix(&authorization, "Bearer ");
    if (!bearer || authorization.size() != expected.size() ||
        CRYPTO_memcmp(authorization.data(), expected.data(), expected.size()) != 0) {
      problem = "bad token";
    }
  }
  if (problem != nullptr) {
    unauthenticated_.fetch_add(1, std::memory_order_relaxed);
    if (ShouldLog(&last_unauthenticated_log_ms_)) {
      const std::string who = absl::CHexEscape(identity.substr(0, 64));
      LOG_WARN("{} refused: {} ({} unauthenticated calls in all)", method,
               identity.empty() ? std::string(problem)
                                : absl::StrCat(problem, " for \"", who, "\""),
               unauthenticated());
    }
    std::vector<std::string> needs;
    if (tls_) needs.push_back("a certificate from the cluster's CA (pstrain certs)");
    if (has_tokens_) needs.push_back("the token of a task or of the operator (pstrain tokens)");
    return absl::UnauthenticatedError(absl::StrCat(method, ": unauthenticated (", problem,
                                                   "); this cluster needs ",
                                                   absl::StrJoin(needs, " and ")));
  }
  const Caller& caller = it->second.second;
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
  if (tls_) {
    // The verified certificate names the caller; the identity header does not.
    const std::string cn = PeerCommonName(ctx);
    if (!cn.empty()) return Authorize(cn, header("authorization"), true, allowed, method);
  }
  return Authorize(header(kIdentityHeader), header("authorization"), false, allowed, method);
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
