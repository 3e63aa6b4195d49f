// The launcher's check for an earlier run in its output_dir: refused by
// default, naming what it found and the flags; resumed as it is; started
// afresh with --overwrite, which removes the earlier summary, model and
// events (and nothing else).
#include "tools/launcher.h"

#include <stdlib.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/storage/env.h"

namespace pstrain {
namespace {

std::string TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string templ = absl::StrCat(base != nullptr ? base : "/tmp", "/launcher-XXXXXX");
  REQUIRE(::mkdtemp(templ.data()) != nullptr);
  return templ;
}

void Write(const std::string& path) {
  REQUIRE(Env::Default()->CreateDirs(Dirname(path)).ok());
  REQUIRE(Env::Default()->WriteFile(path, "x", false).ok());
}

TEST_CASE("a launch into an output_dir with an earlier run is refused unless resumed or "
          "overwritten",
          "[launch]") {
  const std::string out = TempDir();
  LaunchOptions o;
  // Empty, or only logs and checkpoints of a run that never got far: fine.
  CHECK(CheckEarlierRun(o, out).ok());
  Write(JoinPath(out, "logs/chief-0.log"));
  Write(JoinPath(out, "checkpoints/ckpt-10/manifest"));
  CHECK(CheckEarlierRun(o, out).ok());

  Write(JoinPath(out, "events/events.out.tfevents.1.host"));
  absl::Status events = CheckEarlierRun(o, out);
  CHECK(absl::IsFailedPrecondition(events));
  CHECK(events.message() == "output_dir " + out +
                                " holds an earlier run (its events/): pass --resume to go on from "
                                "its latest checkpoint, --overwrite to start afresh over it, or "
                                "give this run another output_dir");
  Write(JoinPath(out, "summary.json"));
  Write(JoinPath(out, "model_final.pst"));
  CHECK(CheckEarlierRun(o, out).message().find("(its summary.json)") != std::string::npos);

  // --resume goes on with the earlier run: nothing removed.
  o.resume = true;
  CHECK(CheckEarlierRun(o, out).ok());
  CHECK(Env::Default()->FileExists(JoinPath(out, "summary.json")));

  // --overwrite removes the summary, the model and the events, and keeps
  // the rest (logs are rewritten by the run; checkpoints are the config's).
  o.resume = false;
  o.overwrite = true;
  REQUIRE(CheckEarlierRun(o, out).ok());
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(out, "summary.json")));
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(out, "model_final.pst")));
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(out, "events/events.out.tfevents.1.host")));
  CHECK(Env::Default()->FileExists(JoinPath(out, "checkpoints/ckpt-10/manifest")));
  CHECK(Env::Default()->FileExists(JoinPath(out, "logs/chief-0.log")));
  o.overwrite = false;
  CHECK(CheckEarlierRun(o, out).ok());  // nothing of a run left
}

}  // namespace
}  // namespace pstrain
