// The closing lines of `pstrain launch`: a classifier's accuracy, a
// click-through model's AUC and log loss first, the model file and the
// command that exports it, the step's split; a run without an evaluation
// says so; nothing without a summary.
#include "tools/run_report.h"

#include <string>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

const char kDigits[] = R"({"global_step": 600, "eval_accuracy": 0.96781, "eval_loss": 0.1093,
  "eval_auc": null, "eval_log_loss": null, "train_seconds": 1.61, "examples_per_sec": 49812.4,
  "step_time_ms": {"pull": 1.5, "data": 0.0, "compute": 1.75, "push": 1.25}})";

const char kClickThrough[] = R"({"global_step": 1100, "eval_accuracy": 0.8669,
  "eval_loss": 0.3912, "eval_auc": 0.79703, "eval_log_loss": 0.39124, "train_seconds": 30.2,
  "examples_per_sec": 9300, "step_time_ms": {}})";

TEST_CASE("run report: a classifier's accuracy, the model and its export, the step's split",
          "[launch][report]") {
  const std::string out = FinishedLines(nlohmann::json::parse(kDigits), "demo_output");
  INFO(out);
  CHECK(out.find("pstrain launch: finished: step 600, held-out accuracy 0.9678, loss 0.1093, "
                 "1.6 s of training, 49812 examples/s\n") != std::string::npos);
  CHECK(out.find("pstrain launch: model in demo_output/model_final.pst (pstrain checkpoint "
                 "export demo_output/model_final.pst --format=safetensors --out=DIR)\n") !=
        std::string::npos);
  CHECK(out.find("a worker's step, on average: pull 1.50 ms (33%), data 0.00 ms (0%), compute "
                 "1.75 ms (39%), push 1.25 ms (28%)\n") != std::string::npos);
  CHECK(out.find("AUC") == std::string::npos);
}

TEST_CASE("run report: a click-through run leads with its AUC and log loss", "[launch][report]") {
  const std::string out = FinishedLines(nlohmann::json::parse(kClickThrough), "ctr_output");
  INFO(out);
  CHECK(out.find("finished: step 1100, held-out AUC 0.7970, log loss 0.3912 (accuracy "
                 "0.8669), 30.2 s of training, 9300 examples/s\n") != std::string::npos);
  CHECK(out.find("a worker's step") == std::string::npos);  // no split reported
}

TEST_CASE("run report: a run with nothing to evaluate on says so, with its train loss",
          "[launch][report]") {
  const std::string out = FinishedLines(
      nlohmann::json::parse(R"({"global_step": 300, "eval_accuracy": null, "eval_loss": null,
        "train_loss": 0.25, "train_seconds": 4.4, "examples_per_sec": 2182})"),
      "cnn_output");
  INFO(out);
  CHECK(out.find("finished: step 300, no held-out evaluation, train loss 0.2500, 4.4 s of "
                 "training, 2182 examples/s\n") != std::string::npos);
  CHECK(out.find("accuracy") == std::string::npos);
}

TEST_CASE("run report: nothing without a summary", "[launch][report]") {
  CHECK(FinishedLines(nlohmann::json::parse("{}"), "out").empty());
  CHECK(FinishedLines(nlohmann::json::parse(R"({"global_step": "x"})"), "out").empty());
  CHECK(FinishedLines(nlohmann::json::parse("[1]"), "out").empty());
  CHECK(FinishedLines(nlohmann::json::parse("x", nullptr, false), "out").empty());
}

}  // namespace
}  // namespace pstrain
