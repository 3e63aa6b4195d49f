#include "common/security/auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"

namespace pstrain {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/", name, "-", ::getpid());
}

ClusterSpec TwoWorkers() {
  return *ClusterSpec::Parse(
      R"({"chief": ["localhost:1"], "ps": ["localhost:2"], "worker": ["localhost:3", "localhost:4"]})",
      "test");
}

TEST_CASE("tokens are HMAC-SHA256 of the identity under the secret", "[auth]") {
  // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
  CHECK(DeriveToken("Jefe", "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(DeriveToken("s", "worker:0") != DeriveToken("s", "worker:1"));
  CHECK(DeriveToken("s", "worker:0") != DeriveToken("t", "worker:0"));
}

TEST_CASE("secret files are created private and read back; open ones are refused", "[auth]") {
  const std::string path = TempPath("secret");
  ::unlink(path.c_str());
  REQUIRE(CreateSecretFile(path).ok());
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  absl::StatusOr<std::string> secret = ReadSecretFile(path);
  REQUIRE(secret.ok());
  CHECK(secret->size() == 64);
  CHECK_FALSE(CreateSecretFile(path).ok());  // never overwrites a secret
  ::chmod(path.c_str(), 0644);
  absl::StatusOr<std::string> open = ReadSecretFile(path);
  CHECK(absl::IsPermissionDenied(open.status()));
  CHECK(std::string(open.status().message()).find("chmod 600") != std::string::npos);

  const std::string short_path = TempPath("short");
  { std::ofstream(short_path) << "tooshort\n"; }
  ::chmod(short_path.c_str(), 0600);
  CHECK(absl::IsInvalidArgument(ReadSecretFile(short_path).status()));
  CHECK(absl::IsNotFound(ReadSecretFile(TempPath("missing")).status()));
}

TEST_CASE("the authorizer admits the right token in the right role only", "[auth]") {
  const std::string secret(64, 'k');
  Authorizer auth(secret, TwoWorkers());
  REQUIRE(auth.enabled());
  const std::string w1 = "Bearer " + DeriveToken(secret, "worker:1");

  absl::StatusOr<Caller> c = auth.Check("worker:1", w1, {Role::kWorker}, "Push");
  REQUIRE(c.ok());
  CHECK(c->role == Role::kWorker);
  CHECK(c->index == 1);
  CHECK(auth.CheckWorkerField(*c, 1, "Push").ok());
  CHECK(absl::IsPermissionDenied(auth.CheckWorkerField(*c, 0, "Push")));  // acting as worker 0

  // A worker's token is not the chief's.
  CHECK(absl::IsUnauthenticated(auth.Check("chief:0", w1, {Role::kChief}, "Shutdown").status()));
  // The right token, the wrong role.
  absl::StatusOr<Caller> denied = auth.Check("worker:1", w1, {Role::kChief}, "Shutdown");
  CHECK(absl::IsPermissionDenied(denied.status()));
  CHECK(std::string(denied.status().message()).find("only chief") != std::string::npos);
  // No token, a bad one, an unknown identity, a task out of the spec's range.
  CHECK(absl::IsUnauthenticated(auth.Check("worker:1", "", {Role::kWorker}, "Push").status()));
  CHECK(absl::IsUnauthenticated(
      auth.Check("worker:1", "Bearer " + std::string(64, '0'), {Role::kWorker}, "Push").status()));
  CHECK(absl::IsUnauthenticated(
      auth.Check("worker:2", "Bearer " + DeriveToken(secret, "worker:2"), {Role::kWorker}, "Push")
          .status()));
  CHECK(absl::IsUnauthenticated(auth.Check("", w1, {Role::kWorker}, "Push").status()));
  CHECK(auth.unauthenticated() == 5);
  CHECK(auth.denied() == 2);

  // The operator reads status; the chief's calls name worker -1.
  const std::string op = "Bearer " + DeriveToken(secret, kOperatorIdentity);
  CHECK(
      auth.Check(kOperatorIdentity, op, {Role::kChief, Role::kWorker, Role::kOperator}, "GetStatus")
          .ok());
  CHECK(absl::IsPermissionDenied(
      auth.Check(kOperatorIdentity, op, {Role::kChief}, "Initialize").status()));
  absl::StatusOr<Caller> chief =
      auth.Check("chief:0", "Bearer " + DeriveToken(secret, "chief:0"), {Role::kChief}, "Pull");
  REQUIRE(chief.ok());
  CHECK(auth.CheckWorkerField(*chief, -1, "Pull").ok());
  CHECK_FALSE(auth.CheckWorkerField(*chief, 0, "Pull").ok());
}

TEST_CASE("authentication off lets every call pass", "[auth]") {
  Authorizer off;
  CHECK_FALSE(off.enabled());
  absl::StatusOr<Caller> c = off.Check("", "", {Role::kChief}, "Shutdown");
  REQUIRE(c.ok());
  CHECK(c->role == Role::kAnyone);
  CHECK(off.CheckWorkerField(*c, 7, "Push").ok());
}

TEST_CASE("a spec beyond loopback needs a secret or --insecure", "[auth]") {
  ClusterSpec remote = *ClusterSpec::Parse(
      R"({"chief": ["10.0.0.1:1"], "ps": ["10.0.0.2:2"], "worker": ["10.0.0.3:3"]})", "remote");
  absl::StatusOr<AuthSetup> refused = ResolveAuth(remote, "ps:0", true, "", "", false);
  CHECK(absl::IsFailedPrecondition(refused.status()));
  CHECK(std::string(refused.status().message()).find("pstrain tokens") != std::string::npos);
  absl::StatusOr<AuthSetup> insecure = ResolveAuth(remote, "ps:0", true, "", "", true);
  REQUIRE(insecure.ok());
  CHECK(insecure->own_token.empty());
  CHECK(ResolveAuth(TwoWorkers(), "ps:0", true, "", "", false).ok());  // loopback
  // Loopback in the spec, but listening on every interface.
  absl::StatusOr<AuthSetup> bound =
      ResolveAuth(TwoWorkers(), "ps:0", true, "", "", false, "0.0.0.0");
  CHECK(absl::IsFailedPrecondition(bound.status()));
  CHECK(std::string(bound.status().message()).find("--bind=0.0.0.0") != std::string::npos);
  CHECK(ResolveAuth(TwoWorkers(), "ps:0", true, "", "", true, "0.0.0.0").ok());
  // Revocation lists without any TLS files: refused, not ignored.
  TlsFiles lists_only;
  lists_only.crl_dir = "/var/run/pstrain/crl";
  absl::StatusOr<AuthSetup> no_tls =
      ResolveAuth(TwoWorkers(), "ps:0", true, "", "", false, "", lists_only);
  REQUIRE_FALSE(no_tls.ok());
  CHECK(no_tls.status().message().find("no TLS files") != std::string::npos);
  CHECK(ResolveAuth(TwoWorkers(), "ps:0", true, "", "", false, "127.0.0.1").ok());

  const std::string path = TempPath("resolve-secret");
  ::unlink(path.c_str());
  REQUIRE(CreateSecretFile(path).ok());
  absl::StatusOr<AuthSetup> with = ResolveAuth(remote, "worker:0", false, path, "", false);
  REQUIRE(with.ok());
  CHECK(with->own_token == DeriveToken(with->secret, "worker:0"));
  // A worker given only its token; a server needs the secret.
  const std::string token_path = TempPath("worker-token");
  { std::ofstream(token_path) << with->own_token << "\n"; }
  ::chmod(token_path.c_str(), 0600);
  absl::StatusOr<AuthSetup> token_only =
      ResolveAuth(remote, "worker:0", false, "", token_path, false);
  REQUIRE(token_only.ok());
  CHECK(token_only->secret.empty());
  CHECK(token_only->own_token == with->own_token);
  CHECK(absl::IsInvalidArgument(ResolveAuth(remote, "ps:0", true, "", token_path, false).status()));
}

TEST_CASE("the spec's pstrain extras name the secret and insecure", "[auth]") {
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::Parse(
      R"({"chief": ["h:1"], "ps": ["h:2"], "worker": ["h:3"],
          "pstrain": {"auth": {"secret_file": "/etc/pstrain/cluster.secret"}, "insecure": true}})",
      "x");
  REQUIRE(spec.ok());
  CHECK(spec->auth_secret_file() == "/etc/pstrain/cluster.secret");
  CHECK(spec->insecure());
  CHECK_FALSE(spec->AllLoopback());
  for (const char* bad : {R"({"chief": ["h:1"], "pstrain": {"auht": {}}})",
                          R"({"chief": ["h:1"], "pstrain": {"auth": {"secret_file": 3}}})",
                          R"({"chief": ["h:1"], "pstrain": {"auth": {"token": "x"}}})",
                          R"({"chief": ["h:1"], "pstrain": {"insecure": "yes"}})"}) {
    INFO(bad);
    CHECK_FALSE(ClusterSpec::Parse(bad, "x").ok());
  }
  CHECK(IsLoopbackHost("127.0.0.2"));
  CHECK(IsLoopbackHost("localhost"));
  CHECK_FALSE(IsLoopbackHost("128.0.0.1"));
}

}  // namespace
}  // namespace pstrain
