#include "worker/progressive_eval.h"

#include <cmath>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

double Metric(const WorkerEvaluation& e, const std::string& name) {
  for (const auto& [n, v] : e.metrics) {
    if (n == name) return v;
  }
  FAIL("no metric " << name);
  return 0;
}

TEST_CASE("progressive validation: one evaluation per eval_every_steps of what came since") {
  ProgressiveEval eval(/*every=*/10, /*start=*/0);
  const float p1[] = {0.9f, 0.2f, 0.7f, 0.4f};
  const int32_t y1[] = {1, 0, 0, 1};
  eval.Add(p1, y1, 4, 8);
  CHECK_FALSE(eval.Take(9).has_value());  // not yet at step 10
  const float p2[] = {0.6f, 0.1f};
  const int32_t y2[] = {1, 0};
  eval.Add(p2, y2, 2, 10);
  std::optional<WorkerEvaluation> e = eval.Take(10);
  REQUIRE(e.has_value());
  CHECK(e->step == 10);
  CHECK(e->examples == 6);
  // Right at 0.5: 0.9, 0.2, 0.6, 0.1 (0.7 and 0.4 wrong).
  CHECK(Metric(*e, "accuracy") == Approx(4.0 / 6));
  const double want_log_loss =
      -(std::log(0.9) + std::log(0.8) + std::log(0.3) + std::log(0.4) + std::log(0.6) +
        std::log(0.9)) / 6;
  CHECK(Metric(*e, "log_loss") == Approx(want_log_loss).epsilon(1e-6));
  CHECK(Metric(*e, "loss") == Metric(*e, "log_loss"));
  // Positives 0.9, 0.4, 0.6 against negatives 0.2, 0.7, 0.1: 7 of 9 pairs.
  CHECK(Metric(*e, "auc") == Approx(7.0 / 9));
  // The window started over; the next evaluation is at step 20.
  eval.Add(p2, y2, 2, 19);
  CHECK_FALSE(eval.Take(19).has_value());
  eval.Add(p2, y2, 2, 23);
  e = eval.Take(23);
  REQUIRE(e.has_value());
  CHECK(e->step == 23);
  CHECK(e->examples == 4);
  CHECK_FALSE(eval.Take(30).has_value());  // nothing scored since
  CHECK_FALSE(eval.TakeRest().has_value());
  // The end of the run: what is left, at the last step added.
  eval.Add(p1, y1, 4, 31);
  eval.Add(p2, y2, 2, 32);
  CHECK_FALSE(eval.Take(32).has_value());  // the next is at 40
  e = eval.TakeRest();
  REQUIRE(e.has_value());
  CHECK(e->step == 32);
  CHECK(e->examples == 6);
  CHECK_FALSE(eval.TakeRest().has_value());
}

TEST_CASE("progressive validation: one label only has no AUC; a rollback drops the window") {
  ProgressiveEval eval(5, /*start=*/12);
  const float p[] = {0.3f, 0.8f};
  const int32_t y[] = {1, 1};
  eval.Add(p, y, 2, 14);
  CHECK_FALSE(eval.Take(14).has_value());
  std::optional<WorkerEvaluation> e = eval.Take(15);
  REQUIRE(e.has_value());
  for (const auto& [name, value] : e->metrics) CHECK(name != "auc");
  eval.Add(p, y, 2, 16);
  eval.Restart(7);  // the scores of step 16 no longer count
  eval.Add(p, y, 2, 8);
  CHECK_FALSE(eval.Take(8).has_value());
  eval.Add(p, y, 2, 10);
  e = eval.Take(10);
  REQUIRE(e.has_value());
  CHECK(e->examples == 4);
}

}  // namespace
}  // namespace pstrain
