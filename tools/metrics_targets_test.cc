#include "tools/metrics_targets.h"

#include "catch2/catch.hpp"
#include "common/storage/env.h"
#include "common/testing/temp_dir.h"
#include "nlohmann/json.hpp"

namespace pstrain {
namespace {

TEST_CASE("the targets file follows each task's metrics address", "[launch][metrics]") {
  const std::string path = JoinPath(testing::NewTempDir("targets"), "metrics_targets.json");
  MetricsTargets targets(path);
  REQUIRE(targets.Set("ps:0", "http://127.0.0.1:38805/metrics").ok());
  REQUIRE(targets.Set("chief:0", "https://127.0.0.1:41231/metrics").ok());
  // ps:0 restarted on a new port: the file names the new one only.
  REQUIRE(targets.Set("ps:0", "http://127.0.0.1:40001/metrics").ok());
  const nlohmann::json j = nlohmann::json::parse(*Env::Default()->ReadFile(path));
  REQUIRE(j.size() == 2);
  CHECK(j[0]["targets"] == nlohmann::json::array({"127.0.0.1:41231"}));
  CHECK(j[0]["labels"]["pstrain_task"] == "chief:0");
  CHECK(j[0]["labels"]["__scheme__"] == "https");
  CHECK(j[0]["labels"]["__metrics_path__"] == "/metrics");
  CHECK(j[1]["targets"] == nlohmann::json::array({"127.0.0.1:40001"}));
  CHECK(j[1]["labels"]["pstrain_task"] == "ps:0");
  CHECK(j[1]["labels"]["__scheme__"] == "http");
  CHECK_FALSE(targets.Set("worker:0", "127.0.0.1:5").ok());
  CHECK_FALSE(targets.Set("worker:0", "ftp://127.0.0.1:5/metrics").ok());
  // A launch's start and end: no targets.
  REQUIRE(targets.Clear().ok());
  CHECK(*Env::Default()->ReadFile(path) == "[]\n");
  REQUIRE(targets.Set("worker:0", "http://127.0.0.1:5/metrics").ok());
  CHECK(nlohmann::json::parse(*Env::Default()->ReadFile(path)).size() == 1);
}

}  // namespace
}  // namespace pstrain
