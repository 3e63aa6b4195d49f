// A fresh directory for one test case: `prefix-XXXXXX` under Bazel's
// TEST_TMPDIR (/tmp outside Bazel), created empty with mkdtemp. The test
// fails at once (REQUIRE) when it cannot be made.
#ifndef PSTRAIN_COMMON_TESTING_TEMP_DIR_H_
#define PSTRAIN_COMMON_TESTING_TEMP_DIR_H_

#include <string>

namespace pstrain {
namespace testing {

std::string NewTempDir(const std::string& prefix);

}  // namespace testing
}  // namespace pstrain

#endif  // PSTRAIN_COMMON_TESTING_TEMP_DIR_H_
