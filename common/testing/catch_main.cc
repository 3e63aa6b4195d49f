// Catch2 main for every cc_test. Catch2 2.13 does not write Bazel's
// XML_OUTPUT_FILE by itself, and runs one reporter per session: when Bazel sets
// the variable, the session reports JUnit XML there (per-test-case results for
// Bazel and .ci/run), and on failure the XML is copied to stderr so the test
// log still shows what failed.
#define CATCH_CONFIG_RUNNER
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "catch2/catch.hpp"

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
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  Catch::Session session;
  int rc = session.applyCommandLine(static_cast<int>(cargs.size()), cargs.data());
  if (rc != 0) return rc;
  rc = session.run();
  if (junit) {
    std::ifstream in(xml);
    std::string line;
    if (rc != 0) {
      std::cerr << "Catch2 JUnit report (" << xml << "):\n";
      while (std::getline(in, line)) std::cerr << line << "\n";
    }
    std::cerr << "catch2: " << (rc == 0 ? "all test cases passed" : "failures") << "\n";
  }
  return rc;
}
