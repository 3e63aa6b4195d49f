#include "common/client/eval_report.h"

#include <cmath>
#include <limits>
#include <string>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

ProgressReport WithMetrics(std::initializer_list<std::pair<std::string, double>> metrics) {
  ProgressReport r;
  r.set_eval_step(40);
  r.set_eval_examples(360);
  for (const auto& [name, value] : metrics) {
    EvalMetric* m = r.add_eval();
    m->set_name(name);
    m->set_value(value);
  }
  return r;
}

std::string Refusal(const ProgressReport& r) {
  absl::Status st = CheckEvalReport(r);
  CHECK(absl::IsInvalidArgument(st));
  return std::string(st.message());
}

TEST_CASE("a worker's evaluation: good ones pass, bad ones are refused by name", "[eval]") {
  CHECK(CheckEvalReport(ProgressReport()).ok());
  CHECK(CheckEvalReport(WithMetrics({{"accuracy", 0.97}, {"loss", 0.1}, {"top_5", 1}})).ok());
  CHECK(Refusal(WithMetrics({{"", 1}})).find("evaluation metric name \"\"") !=
        std::string::npos);
  CHECK(Refusal(WithMetrics({{"5top", 1}})).find("\"5top\"") != std::string::npos);
  CHECK(Refusal(WithMetrics({{"eval/acc", 1}})).find("\"eval/acc\"") != std::string::npos);
  CHECK(Refusal(WithMetrics({{"a\n\"b", 1}})).find("\"a\\n\\\"b\"") != std::string::npos);
  CHECK(Refusal(WithMetrics({{std::string(65, 'a'), 1}})).find("1 to 64") != std::string::npos);
  CHECK(CheckEvalReport(WithMetrics({{std::string(64, 'a'), 1}})).ok());
  CHECK(Refusal(WithMetrics({{"loss", std::nan("")}})).find("loss: nan is not finite") !=
        std::string::npos);
  CHECK(Refusal(WithMetrics({{"loss", std::numeric_limits<double>::infinity()}}))
            .find("not finite") != std::string::npos);
  CHECK(Refusal(WithMetrics({{"loss", 1}, {"acc", 1}, {"loss", 2}})).find("loss given twice") !=
        std::string::npos);
  ProgressReport many;
  for (int i = 0; i < kMaxEvalMetrics + 1; ++i) {
    EvalMetric* m = many.add_eval();
    m->set_name("m" + std::to_string(i));
  }
  CHECK(Refusal(many).find("17 metrics; at most 16") != std::string::npos);
  ProgressReport negative = WithMetrics({{"loss", 1}});
  negative.set_eval_step(-1);
  CHECK(Refusal(negative).find("at step -1") != std::string::npos);
  negative.set_eval_step(0);
  negative.set_eval_examples(-5);
  CHECK(Refusal(negative).find("-5 examples") != std::string::npos);
}

}  // namespace
}  // namespace pstrain
