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

// A call of `identity` to ps:0, signed now with the key the secret gives it.
std::string Signed(const std::string& secret, const std::string& identity,
                   const std::string& method, uint64_t seq, const std::string& audience = "ps:0",
                   absl::Time at = absl::Now()) {
  return SignCall(DeriveToken(secret, identity), identity, audience, method, at, 7, seq);
}

TEST_CASE("a call signed before the server started is refused, to be signed again", "[auth]") {
  const std::string secret(64, 'k');
  const absl::Time before = absl::Now() - kStartMargin - absl::Seconds(1);
  Authorizer auth(secret, TwoWorkers(), "ps:0");
  auth.MarkGated();  // the server starts: calls signed before it are not its own
  // Captured before a restart (or made, then kept waiting): fresh enough by
  // age, and new to this process's memory of calls, but not let through.
  absl::Status st = auth.AuthenticateHeaders(
      "chief:0", Signed(secret, "chief:0", "Shutdown", 1, "ps:0", before), "", "Shutdown");
  CHECK(absl::IsUnavailable(st));
  CHECK(IsSignedBeforeStart(st));
  CHECK(std::string(st.message()).find("sign it again") != std::string::npos);
  CHECK(auth.signed_before_start() == 1);  // counted apart from the unauthenticated
  CHECK(auth.unauthenticated() == 0);
  // Signed within the margin (a call queued while its channel connected),
  // or after the start: admitted.
  const absl::Time within = absl::Now() - kStartMargin + absl::Milliseconds(500);
  CHECK(auth.AuthenticateHeaders("chief:0", Signed(secret, "chief:0", "Shutdown", 2, "ps:0", within),
                                 "", "Shutdown")
            .ok());
  CHECK(auth.AuthenticateHeaders("chief:0", Signed(secret, "chief:0", "Shutdown", 3), "", "Shutdown")
            .ok());
  // Other refusals are not mistaken for it.
  CHECK_FALSE(IsSignedBeforeStart(
      auth.AuthenticateHeaders("chief:0", Signed(secret, "chief:0", "Shutdown", 3), "", "Shutdown")));
  CHECK_FALSE(IsSignedBeforeStart(absl::UnavailableError("connection refused")));
  // A caller refused so until its deadline says so, and is not taken for
  // the refusal by a caller it passes the status on to.
  const absl::Status until = SignedBeforeStartUntilDeadline(st);
  CHECK(absl::IsDeadlineExceeded(until));
  CHECK_FALSE(IsSignedBeforeStart(until));
  CHECK(std::string(until.message()).find("clocks") != std::string::npos);
  // A call carrying either header twice: refused, whatever the signature.
  absl::Status twice = auth.AuthenticateHeaders(
      "worker:0", Signed(secret, "worker:0", "Push", 1), "", "Push", /*repeated=*/true);
  CHECK(absl::IsUnauthenticated(twice));
  CHECK(std::string(twice.message()).find("more than once") != std::string::npos);
}

TEST_CASE("the authorizer admits the right signature in the right role only", "[auth]") {
  const std::string secret(64, 'k');
  Authorizer auth(secret, TwoWorkers(), "ps:0");
  REQUIRE(auth.enabled());

  absl::StatusOr<Caller> c = auth.Check("worker:1", Signed(secret, "worker:1", "Push", 1),
                                        {Role::kWorker}, "Push");
  REQUIRE(c.ok());
  CHECK(c->role == Role::kWorker);
  CHECK(c->index == 1);
  CHECK(auth.CheckWorkerField(*c, 1, "Push").ok());
  CHECK(absl::IsPermissionDenied(auth.CheckWorkerField(*c, 0, "Push")));  // acting as worker 0

  // A worker's signature is not the chief's.
  CHECK(absl::IsUnauthenticated(
      auth.Check("chief:0", Signed(secret, "worker:1", "Shutdown", 2), {Role::kChief}, "Shutdown")
          .status()));
  // The right signature, the wrong role.
  absl::StatusOr<Caller> denied = auth.Check(
      "worker:1", Signed(secret, "worker:1", "Shutdown", 3), {Role::kChief}, "Shutdown");
  CHECK(absl::IsPermissionDenied(denied.status()));
  CHECK(std::string(denied.status().message()).find("only chief") != std::string::npos);
  // No signature, a bad one, an unknown identity, a task out of the spec's range.
  CHECK(absl::IsUnauthenticated(auth.Check("worker:1", "", {Role::kWorker}, "Push").status()));
  std::string bad = Signed(secret, "worker:1", "Push", 4);
  bad.back() = bad.back() == '0' ? '1' : '0';
  CHECK(absl::IsUnauthenticated(auth.Check("worker:1", bad, {Role::kWorker}, "Push").status()));
  CHECK(absl::IsUnauthenticated(
      auth.Check("worker:2", Signed(secret, "worker:2", "Push", 1), {Role::kWorker}, "Push")
          .status()));
  CHECK(absl::IsUnauthenticated(
      auth.Check("", Signed(secret, "worker:1", "Push", 5), {Role::kWorker}, "Push").status()));
  CHECK(auth.unauthenticated() == 5);
  CHECK(auth.denied() == 2);

  // The operator reads status; the chief's calls name worker -1.
  CHECK(auth.Check(kOperatorIdentity, Signed(secret, kOperatorIdentity, "GetStatus", 1),
                   {Role::kChief, Role::kWorker, Role::kOperator}, "GetStatus")
            .ok());
  CHECK(absl::IsPermissionDenied(
      auth.Check(kOperatorIdentity, Signed(secret, kOperatorIdentity, "Initialize", 2),
                 {Role::kChief}, "Initialize")
          .status()));
  absl::StatusOr<Caller> chief =
      auth.Check("chief:0", Signed(secret, "chief:0", "Pull", 1), {Role::kChief}, "Pull");
  REQUIRE(chief.ok());
  CHECK(auth.CheckWorkerField(*chief, -1, "Pull").ok());
  CHECK_FALSE(auth.CheckWorkerField(*chief, 0, "Pull").ok());
}

// The message of a refused call's status, for the checks on why.
std::string Refusal(Authorizer& auth, const std::string& identity, const std::string& authz,
                    const std::string& method) {
  absl::StatusOr<Caller> c = auth.Check(identity, authz, {Role::kChief, Role::kWorker}, method);
  REQUIRE_FALSE(c.ok());
  CHECK(absl::IsUnauthenticated(c.status()));
  return std::string(c.status().message());
}

TEST_CASE("a signed call cannot be replayed, redirected, reused or kept", "[auth]") {
  const std::string secret(64, 's');
  Authorizer auth(secret, TwoWorkers(), "ps:0");
  const std::string shutdown = Signed(secret, "chief:0", "Shutdown", 1);
  REQUIRE(auth.Check("chief:0", shutdown, {Role::kChief}, "Shutdown").ok());
  // The same call again: what an eavesdropper on a plaintext wire could do.
  CHECK(Refusal(auth, "chief:0", shutdown, "Shutdown").find("a replayed call") !=
        std::string::npos);
  // The same signature for another method, or another identity.
  CHECK(Refusal(auth, "chief:0", Signed(secret, "chief:0", "Shutdown", 2), "Initialize")
            .find("bad signature") != std::string::npos);
  CHECK(Refusal(auth, "worker:0", Signed(secret, "chief:0", "Push", 3), "Push")
            .find("bad signature") != std::string::npos);
  // A call signed for another task (ps:1) brought to this one (ps:0).
  CHECK(Refusal(auth, "chief:0", Signed(secret, "chief:0", "Shutdown", 4, "ps:1"), "Shutdown")
            .find("signed for \"ps:1\", not for this task (ps:0)") != std::string::npos);
  // Signed too long ago, or too far ahead: the clocks' allowance is 5 minutes.
  const std::string old = Refusal(
      auth, "chief:0",
      Signed(secret, "chief:0", "Shutdown", 5, "ps:0", absl::Now() - absl::Minutes(6)),
      "Shutdown");
  CHECK(old.find("before this task's clock says now") != std::string::npos);
  CHECK(old.find("NTP") != std::string::npos);
  CHECK(Refusal(auth, "chief:0",
                Signed(secret, "chief:0", "Shutdown", 6, "ps:0", absl::Now() + absl::Minutes(6)),
                "Shutdown")
            .find("after") != std::string::npos);
  // Within the allowance a new call passes: ahead of the server's clock
  // (behind it, only as far as the server has been up: next case).
  CHECK(auth.Check("chief:0",
                   Signed(secret, "chief:0", "Shutdown", 7, "ps:0", absl::Now() + absl::Minutes(4)),
                   {Role::kChief}, "Shutdown")
            .ok());
  // A bearer token, as clients before signing sent, says why it is refused.
  CHECK(Refusal(auth, "chief:0", "Bearer " + DeriveToken(secret, "chief:0"), "Shutdown")
            .find("bearer token, which could be replayed") != std::string::npos);
  // Malformed signatures: refused, never a crash.
  for (const std::string& malformed :
       {std::string("PSTRAIN-HMAC-SHA256 "), std::string("PSTRAIN-HMAC-SHA256 a=ps:0"),
        std::string("PSTRAIN-HMAC-SHA256 a=ps:0 t=1 s=0000000000000007 n=0 sig=") +
            std::string(64, '0'),
        std::string("PSTRAIN-HMAC-SHA256 a=ps:0 t=x s=0000000000000007 n=1 sig=") +
            std::string(64, '0'),
        std::string("PSTRAIN-HMAC-SHA256 a=ps:0 t=+1 s=0000000000000007 n=1 sig=") +
            std::string(64, '0'),
        std::string("PSTRAIN-HMAC-SHA256 a=ps:0 t=1 s=0000000000000007 n= 1 sig=") +
            std::string(64, '0'),
        std::string("PSTRAIN-HMAC-SHA256 a=ps:0 t=1 s=000000000000000G n=1 sig=") +
            std::string(64, '0'),
        std::string("PSTRAIN-HMAC-SHA256 a=ps:0 t=1 s=0000000000000007 n=1 sig=") +
            std::string(63, '0'),
        Signed(secret, "chief:0", "Shutdown", 8) + " extra"}) {
    INFO(malformed);
    CHECK(Refusal(auth, "chief:0", malformed, "Shutdown").find("no signature") !=
          std::string::npos);
  }
}

TEST_CASE("a channel's signer numbers its calls in one session", "[auth]") {
  const std::string secret(64, 'c');
  Authorizer auth(secret, TwoWorkers(), "chief:0");
  CallSigner signer("worker:0", DeriveToken(secret, "worker:0"), "chief:0");
  const std::string first = signer.Sign("ReportProgress");
  const std::string second = signer.Sign("ReportProgress");
  CHECK(first.find(" n=1 ") != std::string::npos);
  CHECK(second.find(" n=2 ") != std::string::npos);
  // Out of order, as concurrent calls may arrive: both admitted, once.
  CHECK(auth.Check("worker:0", second, {Role::kWorker}, "ReportProgress").ok());
  CHECK(auth.Check("worker:0", first, {Role::kWorker}, "ReportProgress").ok());
  CHECK_FALSE(auth.Check("worker:0", first, {Role::kWorker}, "ReportProgress").ok());
  // Another channel of the same worker is another session.
  CallSigner other("worker:0", DeriveToken(secret, "worker:0"), "chief:0");
  CHECK(auth.Check("worker:0", other.Sign("ReportProgress"), {Role::kWorker}, "ReportProgress")
            .ok());
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
