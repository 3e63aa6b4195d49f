#include "common/testing/temp_dir.h"

#include <stdlib.h>

#include <cstdlib>

#include "catch2/catch.hpp"

namespace pstrain {
namespace testing {

std::string NewTempDir(const std::string& prefix) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string templ = std::string(base != nullptr ? base : "/tmp") + "/" + prefix + "-XXXXXX";
  REQUIRE(::mkdtemp(templ.data()) != nullptr);
  return templ;
}

}  // namespace testing
}  // namespace pstrain
