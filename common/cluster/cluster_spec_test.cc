#include "common/cluster/cluster_spec.h"

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

const char kGood[] =
    R"({"chief": ["localhost:2220"], "ps": ["localhost:2221", "localhost:2222"],
        "worker": ["localhost:2223", "localhost:2224"]})";

std::string ErrorOf(const std::string& text) {
  auto spec = ClusterSpec::Parse(text, "spec.json");
  REQUIRE_FALSE(spec.ok());
  return std::string(spec.status().message());
}

TEST_CASE("a TF_CONFIG-style cluster spec parses", "[cluster_spec]") {
  auto spec = ClusterSpec::Parse(kGood, "spec.json");
  REQUIRE(spec.ok());
  CHECK(spec->num_ps() == 2);
  CHECK(spec->num_workers() == 2);
  CHECK(spec->address("worker", 1) == "localhost:2224");
  CHECK(spec->AllTasks().size() == 5);
  CHECK(spec->AllTasks()[0].ToString() == "chief:0");
  CHECK(spec->ValidateTask("ps", 1).ok());
}

TEST_CASE("malformed specs give one-line errors naming file, key and expectation",
          "[cluster_spec]") {
  std::string e = ErrorOf("{\"ps\": [");
  CHECK(e.find("spec.json") != std::string::npos);
  CHECK(e.find("not valid JSON") != std::string::npos);
  CHECK(e.find('\n') == std::string::npos);

  e = ErrorOf(R"({"chief": ["a:1"], "ps": ["a:2", "localhost:3"], "worker": ["127.0.0.1:3"]})");
  CHECK(e.find("duplicate address") != std::string::npos);
  CHECK(e.find("\"worker\"[0]") != std::string::npos);

  e = ErrorOf(R"({"chief": ["a:1"], "worker": ["a:3"]})");
  CHECK(e.find("\"ps\"") != std::string::npos);
  CHECK(e.find("at least one parameter server") != std::string::npos);

  e = ErrorOf(R"({"chief": ["a:1"], "ps": ["a:70000"], "worker": ["a:3"]})");
  CHECK(e.find("\"ps\"[0]") != std::string::npos);
  CHECK(e.find("1..65535") != std::string::npos);

  e = ErrorOf(R"({"chief": ["a:1"], "ps": ["a"], "worker": ["a:3"]})");
  CHECK(e.find("host:port") != std::string::npos);

  e = ErrorOf(R"({"chief": ["a:1"], "ps": ["a:2"], "worker": ["a:3"], "gpu": ["a:4"]})");
  CHECK(e.find("unknown job") != std::string::npos);

  e = ErrorOf(R"({"chief": ["a:1"], "ps": [2], "worker": ["a:3"]})");
  CHECK(e.find("string") != std::string::npos);

  e = ErrorOf(R"(["a:1"])");
  CHECK(e.find("object") != std::string::npos);

  // A number beyond a double threw an exception nobody caught.
  e = ErrorOf(R"({"chief": ["a:1"], "ps": 1e999})");
  CHECK(e.find("not valid JSON") != std::string::npos);
  CHECK(e.find("number overflow") != std::string::npos);
  CHECK_FALSE(ParseTfConfig(R"({"cluster": {"chief": ["a:1"]}, "task": {"index": 1e999}})").ok());
}

TEST_CASE("pstrain extras are not jobs, and their keys are checked", "[cluster_spec]") {
  auto spec = ClusterSpec::Parse(
      R"({"chief": ["a:1"], "ps": ["a:2"], "worker": ["a:3"], "pstrain": {"insecure": false}})",
      "s");
  REQUIRE(spec.ok());
  CHECK(spec->AllTasks().size() == 3);
  auto typo = ClusterSpec::Parse(R"({"chief": ["a:1"], "pstrain": {"metric": {}}})", "s");
  CHECK(std::string(typo.status().message()).find("\"pstrain\".\"metric\": unknown key") !=
        std::string::npos);
}

TEST_CASE("the spec may say where each task serves /metrics", "[cluster_spec]") {
  auto spec = ClusterSpec::Parse(
      R"({"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2", "127.0.0.1:3"], "worker": ["h:4"],
          "pstrain": {"metrics": {"chief": ["127.0.0.1:9100"],
                                  "ps": ["127.0.0.1:9101", "127.0.0.1:9102"]}}})",
      "s");
  REQUIRE(spec.ok());
  CHECK(spec->has_metrics());
  CHECK(spec->metrics_address("chief", 0) == "127.0.0.1:9100");
  CHECK(spec->metrics_address("ps", 1) == "127.0.0.1:9102");
  CHECK(spec->metrics_address("worker", 0).empty());  // none named for workers
  CHECK(spec->metrics_address("ps", 2).empty());
  CHECK_FALSE(ClusterSpec::Parse(kGood, "s")->has_metrics());

  const std::string base = R"({"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"], "worker": ["h:4"],
                               "pstrain": {"metrics": )";
  auto error = [&base](const std::string& metrics) { return ErrorOf(base + metrics + "}}"); };
  CHECK(error(R"({"ps": ["127.0.0.1:9101", "127.0.0.1:9102"]})") ==
        "cluster spec spec.json: key \"pstrain\".\"metrics\".\"ps\": 2 address(es) for 1 "
        "task(s); expected one per task");
  CHECK(error(R"({"ps": ["127.0.0.1:2"]})").find("duplicate address \"127.0.0.1:2\", already "
                                                  "used by \"ps\"[0]") != std::string::npos);
  CHECK(error(R"({"ps": ["127.0.0.1:9"], "chief": ["localhost:9"]})")
            .find("every endpoint needs its own port") != std::string::npos);
  CHECK(error(R"({"evaluator": ["127.0.0.1:9"]})").find("unknown job") != std::string::npos);
  CHECK(error(R"({"ps": "127.0.0.1:9"})").find("expected an array") != std::string::npos);
  CHECK(error(R"({"ps": ["127.0.0.1"]})").find("\"ps\"[0]") != std::string::npos);
  CHECK(error(R"(["127.0.0.1:9"])").find("where each task serves /metrics") != std::string::npos);
}

TEST_CASE("task index out of range is refused", "[cluster_spec]") {
  auto spec = ClusterSpec::Parse(kGood, "spec.json");
  REQUIRE(spec.ok());
  absl::Status st = spec->ValidateTask("ps", 2);
  CHECK(absl::IsInvalidArgument(st));
  CHECK(std::string(st.message()).find("expected 0..1") != std::string::npos);
  CHECK_FALSE(spec->ValidateTask("ps", -1).ok());
  CHECK_FALSE(spec->ValidateTask("evaluator", 0).ok());
}

TEST_CASE("TF_CONFIG as Kubeflow sets it resolves the task", "[cluster_spec]") {
  std::string tf = std::string(R"({"cluster": )") + kGood + R"(, "task": {"type": "ps", "index": 1}})";
  auto task = ResolveTask("", "", 0, tf, "ps");
  REQUIRE(task.ok());
  CHECK(task->task.ToString() == "ps:1");
  CHECK(task->cluster.num_workers() == 2);

  auto wrong_role = ResolveTask("", "", 0, tf, "worker");
  CHECK_FALSE(wrong_role.ok());

  std::string bad = std::string(R"({"cluster": )") + kGood + R"(, "task": {"type": "ps", "index": 9}})";
  CHECK_FALSE(ParseTfConfig(bad).ok());
  CHECK_FALSE(ResolveTask("", "", 0, "", "ps").ok());
}

TEST_CASE("host:port parsing", "[cluster_spec]") {
  CHECK(ParseHostPort("[::1]:80").ok());
  CHECK(ParseHostPort("[::1]:80")->host == "::1");
  CHECK(ParseHostPort("h:65535").ok());
  CHECK_FALSE(ParseHostPort("h:0").ok());
  CHECK_FALSE(ParseHostPort(":80").ok());
  CHECK_FALSE(ParseHostPort("h:x").ok());
  CHECK_FALSE(ParseHostPort("::1:80").ok());
}

TEST_CASE("host names are validated", "[cluster_spec]") {
  for (const char* good : {"localhost", "127.0.0.1", "ps-0.pstrain.default.svc", "a", "10.0.0.7",
                           "::1", "fe80::1"}) {
    INFO(good);
    CHECK(ValidateHost(good).ok());
  }
  for (const char* bad : {"", "-h", "h-", "a..b", "host name", "h/x", "h;rm", "h\nx", ":::",
                          "[::1]", "a_b"}) {
    INFO(bad);
    CHECK_FALSE(ValidateHost(bad).ok());
  }
  CHECK_FALSE(ValidateHost(std::string(64, 'a')).ok());  // a label of 64
  CHECK_FALSE(ParseHostPort("bad host:80").ok());
  CHECK(ParseHostPort("bad host:80").status().message().find("not a host name") !=
        std::string::npos);
  CHECK(HostPortString("::1", 80) == "[::1]:80");
  CHECK(HostPortString("h", 80) == "h:80");
}

}  // namespace
}  // namespace pstrain
