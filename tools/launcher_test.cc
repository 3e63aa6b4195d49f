// The launcher's check for an earlier run in its output_dir: refused by
// default, naming what it found and the flags; resumed as it is; started
// afresh with --overwrite, which removes the earlier summary, model and
// events (and nothing else). And the secret it makes for a run.
#include "tools/launcher.h"

#include <sys/stat.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/testing/temp_dir.h"
#include "common/storage/checkpoint.h"
#include "common/security/auth.h"
#include "common/storage/env.h"

namespace pstrain {
namespace {

void Write(const std::string& path) {
  REQUIRE(Env::Default()->CreateDirs(Dirname(path)).ok());
  REQUIRE(Env::Default()->WriteFile(path, "x", false).ok());
}

TEST_CASE("a launch into an output_dir with an earlier run is refused unless resumed or "
          "overwritten",
          "[launch]") {
  const std::string out = testing::NewTempDir("launcher");
  const std::string ckpts = JoinPath(out, "checkpoints");
  LaunchOptions o;
  // Empty, or only logs and checkpoints of a run that never got far: fine.
  CHECK(CheckEarlierRun(o, out, ckpts).ok());
  Write(JoinPath(out, "logs/chief-0.log"));
  CHECK(CheckEarlierRun(o, out, ckpts).ok());

  // Events of an earlier run, no checkpoint: --overwrite is the way on.
  Write(JoinPath(out, "events/events.out.tfevents.1.host"));
  absl::Status events = CheckEarlierRun(o, out, ckpts);
  CHECK(absl::IsFailedPrecondition(events));
  CHECK(events.message() == "output_dir " + out +
                                " holds an earlier run (its events/): pass --overwrite to start "
                                "afresh over it, or give this run another output_dir");
  // With checkpoints, --resume is named too.
  Write(JoinPath(ckpts, "ckpt-10/manifest"));
  Write(JoinPath(out, "summary.json"));
  Write(JoinPath(out, "model_final.pst"));
  CHECK(CheckEarlierRun(o, out, ckpts).message() ==
        "output_dir " + out +
            " holds an earlier run (its summary.json): pass --resume to go on from its latest "
            "checkpoint, --overwrite to start afresh over it, or give this run another "
            "output_dir");

  // --resume goes on with the earlier run: nothing removed.
  o.resume = true;
  CHECK(CheckEarlierRun(o, out, ckpts).ok());
  CHECK(Env::Default()->FileExists(JoinPath(out, "summary.json")));

  // --overwrite removes the summary, the model and the events (a directory
  // there too), sets the checkpoints aside, and keeps the logs (the run
  // rewrites them).
  Write(JoinPath(out, "events/plugins/x"));
  o.resume = false;
  o.overwrite = true;
  REQUIRE(CheckEarlierRun(o, out, ckpts).ok());
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(out, "summary.json")));
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(out, "model_final.pst")));
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(out, "events/events.out.tfevents.1.host")));
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(out, "events/plugins")));
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(ckpts, "ckpt-10")));
  CHECK(Env::Default()->FileExists(JoinPath(ckpts, "ckpt-10.rolled-back/manifest")));
  auto left = ListCheckpoints(Env::Default(), ckpts);
  REQUIRE(left.ok());
  CHECK(left->empty());
  CHECK(Env::Default()->FileExists(JoinPath(out, "logs/chief-0.log")));
  o.overwrite = false;
  CHECK(CheckEarlierRun(o, out, ckpts).ok());  // nothing of a run left
}

TEST_CASE("--overwrite refuses to set aside the checkpoint --init_from names", "[launch]") {
  const std::string out = testing::NewTempDir("launcher");
  const std::string ckpts = JoinPath(out, "checkpoints");
  Write(JoinPath(out, "summary.json"));
  Write(JoinPath(ckpts, "ckpt-600/manifest"));
  LaunchOptions o;
  o.overwrite = true;
  o.init_from = JoinPath(ckpts, "ckpt-600");
  absl::Status st = CheckEarlierRun(o, out, ckpts);
  CHECK(absl::IsFailedPrecondition(st));
  CHECK(st.message().find("is a checkpoint of the earlier run, which --overwrite would set "
                          "aside") != std::string::npos);
  // Nothing was removed or moved.
  CHECK(Env::Default()->FileExists(JoinPath(out, "summary.json")));
  CHECK(Env::Default()->FileExists(JoinPath(ckpts, "ckpt-600/manifest")));
  // From a checkpoint elsewhere, it goes on.
  const std::string other = testing::NewTempDir("launcher");
  Write(JoinPath(other, "ckpt-5/manifest"));
  o.init_from = JoinPath(other, "ckpt-5");
  CHECK(CheckEarlierRun(o, out, ckpts).ok());
  CHECK(Env::Default()->FileExists(JoinPath(ckpts, "ckpt-600.rolled-back/manifest")));
}

TEST_CASE("a loopback run without a secret or TLS in its spec gets a secret of its own",
          "[launch][security]") {
  const std::string out = testing::NewTempDir("run_secret");
  const ClusterSpec loopback = *ClusterSpec::Parse(
      R"({"chief": ["localhost:1"], "ps": ["127.0.0.1:2"], "worker": ["localhost:3"]})", "l");
  LaunchOptions o;
  absl::StatusOr<std::string> first = MakeRunSecret(o, loopback, out);
  REQUIRE(first.ok());
  CHECK(*first == JoinPath(RealPath(out), kRunSecretFile));
  struct stat st;
  REQUIRE(::stat(first->c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  absl::StatusOr<std::string> secret = ReadSecretFile(*first);
  REQUIRE(secret.ok());
  CHECK(secret->size() == 64);
  // Each launch makes a new one in place of the last.
  absl::StatusOr<std::string> second = MakeRunSecret(o, loopback, out);
  REQUIRE(second.ok());
  CHECK(*second == *first);
  CHECK(ReadSecretFile(*second).value_or("") != *secret);

  // None where the spec has its own authentication, on --insecure (the
  // run's or the spec's), or beyond loopback (a secret must be shared
  // between machines: the spec's, or ResolveAuth refuses).
  const std::string empty = testing::NewTempDir("run_secret_none");
  for (const char* spec :
       {R"({"chief": ["localhost:1"], "ps": ["localhost:2"], "worker": ["localhost:3"],
            "pstrain": {"auth": {"secret_file": "/etc/pstrain/cluster.secret"}}})",
        R"({"chief": ["localhost:1"], "ps": ["localhost:2"], "worker": ["localhost:3"],
            "pstrain": {"tls": {"dir": "/etc/pstrain/tls"}}})",
        R"({"chief": ["localhost:1"], "ps": ["localhost:2"], "worker": ["localhost:3"],
            "pstrain": {"insecure": true}})",
        R"({"chief": ["10.0.0.1:1"], "ps": ["10.0.0.2:2"], "worker": ["10.0.0.3:3"]})"}) {
    INFO(spec);
    absl::StatusOr<std::string> none = MakeRunSecret(o, *ClusterSpec::Parse(spec, "s"), empty);
    REQUIRE(none.ok());
    CHECK(none->empty());
  }
  LaunchOptions insecure;
  insecure.insecure = true;
  CHECK(MakeRunSecret(insecure, loopback, empty).value_or("x").empty());
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(empty, kRunSecretFile)));
  // An earlier run's secret is removed when this run makes none: a tool
  // given it would sign with the wrong key.
  CHECK(Env::Default()->FileExists(*first));
  CHECK(MakeRunSecret(insecure, loopback, out).value_or("x").empty());
  CHECK_FALSE(Env::Default()->FileExists(*first));
  // A secret given to the launch is the run's: none is made, and an
  // earlier run's is removed.
  REQUIRE(MakeRunSecret(o, loopback, out).ok());
  REQUIRE(Env::Default()->FileExists(*first));
  LaunchOptions given;
  given.secret_file = "/etc/pstrain/cluster.secret";
  CHECK(MakeRunSecret(given, loopback, out).value_or("") == "/etc/pstrain/cluster.secret");
  CHECK_FALSE(Env::Default()->FileExists(*first));
  // A secret the user named that is the very file (pstrain tokens --out
  // into the output_dir, named by another path): kept, by the launch's
  // flag or by the spec.
  REQUIRE(CreateSecretFile(*first).ok());
  const std::string own = ReadSecretFile(*first).value_or("");
  LaunchOptions by_flag;
  by_flag.secret_file = JoinPath(out, std::string("./") + kRunSecretFile);
  CHECK(MakeRunSecret(by_flag, loopback, out).value_or("") == *first);
  CHECK(ReadSecretFile(*first).value_or("") == own);
  const ClusterSpec by_spec = *ClusterSpec::Parse(
      absl::StrCat(R"({"chief": ["localhost:1"], "ps": ["localhost:2"], "worker": ["localhost:3"],
                       "pstrain": {"auth": {"secret_file": ")",
                   out, "//", kRunSecretFile, R"("}}})"),
      "s");
  CHECK(MakeRunSecret(o, by_spec, out).value_or("x").empty());
  CHECK(ReadSecretFile(*first).value_or("") == own);
}

}  // namespace
}  // namespace pstrain
