// Catch2 main for every cc_test. Catch2 2.13 does not write Bazel's
// XML_OUTPUT_FILE by itself, and runs one reporter per session: when Bazel sets
// the variable, the session reports JUnit XML there (per-test-case results for
// Bazel and .ci/run), and on failure the XML is copied to stderr so the test
// log still shows what failed.
//
// Under ThreadSanitizer (--config=tsan) the processes a test starts (the
// daemons, the CLI) write their reports to files of the test's own, and each
// report fails the test as a case of its own: a daemon that races, and that
// the test only stops, would otherwise go unseen.
//
// Cases that called SkipCase (common/testing/skip.h) are marked <skipped> in
// the XML and listed, with their reasons, at the end of the test's log.
#define CATCH_CONFIG_RUNNER
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/base/config.h"  // ABSL_HAVE_THREAD_SANITIZER: GCC's or clang's TSan

#if defined(ABSL_HAVE_THREAD_SANITIZER)
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>
#endif

#include "catch2/catch.hpp"
#include "common/testing/skip.h"

#if defined(ABSL_HAVE_THREAD_SANITIZER)
namespace {

const char kReportName[] = "tsan-report";

// Where this test's child processes put their reports: Bazel's undeclared
// outputs (kept with the test's logs), else its temporary directory.
std::string TsanReportDir() {
  for (const char* name : {"TEST_UNDECLARED_OUTPUTS_DIR", "TEST_TMPDIR"}) {
    const char* dir = std::getenv(name);
    if (dir != nullptr && *dir != '\0') return std::string(dir) + "/tsan";
  }
  return "/tmp/pstrain-tsan-" + std::to_string(::getpid());
}

// Children inherit TSAN_OPTIONS with log_path added: TSan writes each
// process's reports to <dir>/tsan-report.<exe>.<pid>. (This process read its
// options at start; its own reports go to stderr and fail it outright.)
void RouteChildReports(const std::string& dir) {
  ::mkdir(dir.c_str(), 0755);
  const char* current = std::getenv("TSAN_OPTIONS");
  std::string options = current != nullptr ? current : "";
  if (!options.empty()) options += ":";
  options += "log_path=" + dir + "/" + kReportName + ":log_exe_name=1";
  ::setenv("TSAN_OPTIONS", options.c_str(), 1);
}

// The reports the children wrote: name and text.
std::vector<std::pair<std::string, std::string>> ChildReports(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> reports;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return reports;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(kReportName, 0) != 0) continue;
    std::ifstream in(dir + "/" + name);
    std::stringstream text;
    text << in.rdbuf();
    if (text.str().find("ThreadSanitizer") == std::string::npos) continue;
    reports.emplace_back(name, text.str());
  }
  ::closedir(d);
  return reports;
}

// Each report as a failed test case in the JUnit XML, before its end.
void AddReportCases(const std::string& xml,
                    const std::vector<std::pair<std::string, std::string>>& reports) {
  std::stringstream all;
  all << std::ifstream(xml).rdbuf();
  std::string text = all.str();
  const size_t end = text.rfind("</testsuite>");
  if (end == std::string::npos) return;
  std::string cases;
  for (const auto& [name, report] : reports) {
    std::string body = report.substr(0, 20000);
    for (size_t at; (at = body.find("]]>")) != std::string::npos;) body.replace(at, 3, "]] >");
    cases += "    <testcase classname=\"ThreadSanitizer\" name=\"" + name +
             "\" time=\"0\">\n      <failure message=\"ThreadSanitizer report of a child "
             "process\" type=\"tsan\"><![CDATA[" +
             body + "]]></failure>\n    </testcase>\n";
  }
  text.insert(end, cases);
  std::ofstream(xml, std::ios::trunc) << text;
}

}  // namespace
#endif

int main(int argc, char* argv[]) {
  std::vector<std::string> args(argv, argv + argc);
  const char* xml = std::getenv("XML_OUTPUT_FILE");
  const bool junit = xml != nullptr && *xml != '\0';
  if (junit) {
    args.push_back("--reporter");
    args.push_back("junit");
    args.push_back("--out");
    args.push_back(xml);
  }
#if defined(ABSL_HAVE_THREAD_SANITIZER)
  const std::string tsan_dir = TsanReportDir();
  RouteChildReports(tsan_dir);
#endif
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  Catch::Session session;
  int rc = session.applyCommandLine(static_cast<int>(cargs.size()), cargs.data());
  if (rc != 0) return rc;
  rc = session.run();
#if defined(ABSL_HAVE_THREAD_SANITIZER)
  // The test reaped its children: their reports are written.
  const auto reports = ChildReports(tsan_dir);
  for (const auto& [name, report] : reports) {
    std::cerr << "=== ThreadSanitizer report of a child process (" << tsan_dir << "/" << name
              << "):\n"
              << report << "\n";
  }
  if (!reports.empty()) {
    if (junit) AddReportCases(xml, reports);
    if (rc == 0) rc = 1;
  }
#endif
  const auto& skipped = pstrain::testing::SkippedCases();
  for (const auto& s : skipped) {
    std::cerr << "skipped: " << s.test_case << " (" << s.need << "): " << s.why << "\n";
  }
  if (junit && !skipped.empty()) {
    std::stringstream all;
    all << std::ifstream(xml).rdbuf();
    std::ofstream(xml, std::ios::trunc) << pstrain::testing::MarkSkippedInJunit(all.str(), skipped);
  }
  if (junit) {
    std::ifstream in(xml);
    std::string line;
    if (rc != 0) {
      std::cerr << "Catch2 JUnit report (" << xml << "):\n";
      while (std::getline(in, line)) std::cerr << line << "\n";
    }
    std::cerr << "catch2: "
              << (rc != 0            ? "failures"
                  : skipped.empty() ? "all test cases passed"
                                    : "the test cases that ran passed; " +
                                          std::to_string(skipped.size()) + " skipped")
              << "\n";
  }
  return rc;
}
