// SkipCase's marks in Catch2's JUnit XML, and PSTRAIN_REQUIRE's list.
#include "common/testing/skip.h"

#include <cstdlib>
#include <string>

#include "catch2/catch.hpp"

namespace pstrain::testing {
namespace {

// What Catch2 2.13's JUnit reporter writes for a case with sections, a case
// with a message, and a case with no element content.
constexpr char kXml[] = R"(<testsuite>
    <testcase classname="t.global" name="a &lt;b&gt; &amp; &quot;c&quot;" time="0.1" status="run">
      <system-err>x</system-err>
    </testcase>
    <testcase classname="t.global" name="sections/one" time="0.1" status="run"/>
    <testcase classname="t.global" name="sections/two" time="0.1" status="run"/>
    <testcase classname="t.global" name="sections-not" time="0.1" status="run"/>
    <testcase classname="t.global" name="other" time="0.1" status="run">
      <failure message="x"/>
    </testcase>
</testsuite>
)";

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_CASE("skipped cases and their sections are marked in the JUnit XML, others not", "[skip]") {
  const std::string xml = MarkSkippedInJunit(
      kXml, {{"a <b> & \"c\"", "gpu", "no GPU <here>"}, {"sections", "tsan", "not TSan"}});
  CHECK(Count(xml, "<skipped ") == 3);
  CHECK(xml.find(R"(status="run"><skipped message="gpu: no GPU &lt;here&gt;"/>)") !=
        std::string::npos);
  CHECK(xml.find(R"(name="sections/one" time="0.1" status="run"><skipped message="tsan: not )"
                 R"(TSan"/></testcase>)") != std::string::npos);
  CHECK(xml.find(R"(name="sections-not" time="0.1" status="run"/>)") != std::string::npos);
  CHECK(xml.find(R"(name="other" time="0.1" status="run">)" "\n") != std::string::npos);
  CHECK(Count(xml, "<testcase ") == 5);
  CHECK(Count(xml, "</testcase>") == 4);  // the two skipped self-closing ones opened and closed
  CHECK(MarkSkippedInJunit(kXml, {}) == kXml);
}

TEST_CASE("PSTRAIN_REQUIRE names the needs whose skips fail", "[skip]") {
  const char* saved = std::getenv("PSTRAIN_REQUIRE");
  const std::string before = saved != nullptr ? saved : "";
  ::unsetenv("PSTRAIN_REQUIRE");
  CHECK_FALSE(Required("gpu"));
  ::setenv("PSTRAIN_REQUIRE", "python,gpu", 1);
  CHECK(Required("gpu"));
  CHECK(Required("python"));
  CHECK_FALSE(Required("tsan"));
  CHECK_FALSE(Required("gp"));
  ::setenv("PSTRAIN_REQUIRE", "all", 1);
  CHECK(Required("netns"));
  if (saved != nullptr) {
    ::setenv("PSTRAIN_REQUIRE", before.c_str(), 1);
  } else {
    ::unsetenv("PSTRAIN_REQUIRE");
  }
}

}  // namespace
}  // namespace pstrain::testing
