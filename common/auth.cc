#include "common/auth.h"

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
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/logging.h"
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

absl::Status WritePrivateFile(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  // An existing temp file keeps its mode through O_CREAT: make it private.
  const bool ok =
      ::fchmod(fd, 0600) == 0 &&
      ::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()) &&
      ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::DataLossError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(err)));
  }
  std::string text;
  if (S_ISREG(st.st_mode) && st.st_size <= 4096) {
    text.resize(st.st_size);
    if (::read(fd, text.data(), text.size()) != st.st_size) text.clear();
  }
  ::close(fd);
  if (!S_ISREG(st.st_mode) || st.st_size > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(path,
                                                   ": not a secret file (a regular file "
                                                   "of at most 4096 bytes)"));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return absl::PermissionDeniedError(
        absl::StrFormat("%s: open to group or others (mode %03o); a secret must be private: "
                        "chmod 600 %s",
                        path, st.st_mode & 0777, path));
  }
  text = std::string(absl::StripAsciiWhitespace(text));
  if (text.size() < kMinSecretChars) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", text.size(), " characters; a secret or token has at least ", kMinSecretChars));
  }
  return text;
}

Authorizer::Authorizer(const std::string& secret, const ClusterSpec& cluster) {
  if (secret.empty()) return;
  for (const TaskId& t : cluster.AllTasks()) {
    Caller c;
    c.role = t.job == kChiefJob ? Role::kChief : t.job == kPsJob ? Role::kPs : Role::kWorker;
    c.index = t.index;
    c.name = t.ToString();
    tokens_[c.name] = {DeriveToken(secret, c.name), c};
  }
  Caller op;
  op.role = Role::kOperator;
  op.name = kOperatorIdentity;
  tokens_[op.name] = {DeriveToken(secret, op.name), op};
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
  auto it = tokens_.find(identity);
  const std::string& expected = it == tokens_.end() ? std::string() : it->second.first;
  const bool bearer = absl::ConsumePrefix(&authorization, "Bearer ");
  if (it == tokens_.end() || !bearer || authorization.size() != expected.size() ||
      CRYPTO_memcmp(authorization.data(), expected.data(), expected.size()) != 0) {
    unauthenticated_.fetch_add(1, std::memory_order_relaxed);
    if (ShouldLog(&last_unauthenticated_log_ms_)) {
      const std::string who = absl::CHexEscape(identity.substr(0, 64));
      LOG_WARN("{} refused: {} ({} unauthenticated calls in all)", method,
               it == tokens_.end() ? absl::StrCat("unknown identity \"", who, "\"")
                                   : absl::StrCat("wrong or missing token for ", who),
               unauthenticated());
    }
    return absl::UnauthenticatedError(absl::StrCat(
        method, ": unauthenticated (", it == tokens_.end() ? "unknown identity" : "bad token",
        "); this cluster needs the token of a task or of the operator (pstrain tokens)"));
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
  return Check(header(kIdentityHeader), header("authorization"), allowed, method);
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
                                      const std::string& bind_host) {
  AuthSetup setup;
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
  } else if (!insecure && !cluster.insecure() &&
             (!cluster.AllLoopback() || (!bind_host.empty() && !IsLoopbackHost(bind_host)))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cluster spec ", cluster.source(),
        cluster.AllLoopback() ? absl::StrCat(" with --bind=", bind_host, " listens beyond loopback")
                              : std::string(" names hosts other than loopback"),
        " and no authentication is set up: anyone who can "
        "reach a port could read, change or stop the model. Write a secret with 'pstrain "
        "tokens --cluster_spec=SPEC --out=DIR' and name it in the spec (\"pstrain\": {\"auth\": "
        "{\"secret_file\": \"DIR/cluster.secret\"}}), or pass --insecure on a trusted network"));
  }
  return setup;
}

}  // namespace pstrain
