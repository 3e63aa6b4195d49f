// The ThreadSanitizer stage's self-test: a child process with a data race
// (tests/tsan/racy.cc) is stopped and reported, and its report lands where
// common/testing/catch_main.cc looks for the reports of a test's children,
// so a race in a daemon that a test starts fails that test. Under the other
// configurations it says it is skipped.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/base/config.h"
#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/storage/env.h"
#include "common/testing/skip.h"
#include "tests/cluster_testlib.h"

namespace pstrain {
namespace {

TEST_CASE("a child's data race is reported into the test's outputs", "[tsan]") {
#if !defined(ABSL_HAVE_THREAD_SANITIZER)
  testing::SkipCase("tsan", "not a ThreadSanitizer build (bazel test --config=tsan runs it)");
#else
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  REQUIRE(outputs != nullptr);
  const std::string dir = JoinPath(outputs, "tsan");
  testing::CommandResult r =
      testing::RunCommand({testing::Binary("tests/tsan_racy")}, absl::Seconds(60));
  INFO(r.output);
  CHECK(r.exit_code == 66);  // TSan's exit code, at the first report (halt_on_error)
  auto names = Env::Default()->ListDir(dir);
  REQUIRE(names.ok());
  std::vector<std::string> reports;
  for (const std::string& name : *names) {
    if (absl::StartsWith(name, "tsan-report.tsan_racy.")) reports.push_back(name);
  }
  REQUIRE(reports.size() == 1);
  const std::string path = JoinPath(dir, reports[0]);
  auto text = Env::Default()->ReadFile(path);
  REQUIRE(text.ok());
  CHECK(absl::StrContains(*text, "WARNING: ThreadSanitizer: data race"));
  CHECK(absl::StrContains(*text, "RacyIncrement"));
  // Expected: kept beside the others under a name the test's main does not
  // count as a failure.
  REQUIRE(std::rename(path.c_str(), JoinPath(dir, "expected-" + reports[0]).c_str()) == 0);
#endif
}

}  // namespace
}  // namespace pstrain
