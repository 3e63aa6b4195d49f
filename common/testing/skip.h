// Skipped test cases for Catch2 2.13, which has no SKIP of its own: a case
// that cannot run where it is (no GPU, not a ThreadSanitizer build, no
// Prometheus, no network namespaces...) calls SkipCase and returns. The case
// is then reported as skipped, never as passed: the test's main
// (common/testing/catch_main.cc) marks it <skipped> in the JUnit XML that
// tools/test.sh counts, and lists it with its reason at the end of the test.
//
// Where the environment variable PSTRAIN_REQUIRE names the case's need (a
// comma-separated list, or "all"), the case fails instead: a run on the GPU
// machine sets PSTRAIN_REQUIRE=gpu, so that a CUDA case that could not run
// there is a failure, not a quiet skip.
//
// Thread-compatible: call from the test case's own thread (as Catch2's own
// macros are).
#ifndef PSTRAIN_COMMON_TESTING_SKIP_H_
#define PSTRAIN_COMMON_TESTING_SKIP_H_

#include <string>
#include <string_view>
#include <vector>

namespace pstrain::testing {

// Whether PSTRAIN_REQUIRE makes a skip for want of `need` a failure. A need
// is one word naming what a skipped case lacked: "gpu", "tsan", "python",
// "prometheus", "podman", "netns", "slurm", "cpu-only-build",
// "real-allocator" (docs/testing.md lists them).
bool Required(std::string_view need);

// Reports the running case as skipped for want of `need`, saying `why` (in the
// test's log and its report); the caller then returns. Where `need` is
// required, fails the case instead (Catch2's FAIL, which throws).
void SkipCase(std::string_view need, const std::string& why);

struct SkippedCase {
  std::string test_case;  // Catch2's name of the case
  std::string need;
  std::string why;
};

// The cases this process skipped, in order.
const std::vector<SkippedCase>& SkippedCases();

// Marks each skipped case's <testcase> elements (the case's own, and those of
// its sections, "case/section") with <skipped message="need: why"/> in the
// JUnit XML text Catch2 wrote; returns the new text.
std::string MarkSkippedInJunit(const std::string& xml, const std::vector<SkippedCase>& skipped);

}  // namespace pstrain::testing

#endif  // PSTRAIN_COMMON_TESTING_SKIP_H_
