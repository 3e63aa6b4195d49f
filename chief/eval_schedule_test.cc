// The evaluation schedule's rule, on the run issue 48 saw (every 100 steps
// of 1,100, the chief reaching steps 110, 211, 843, 921, 1010): each due
// evaluation runs once, at the first step the chief sees at or past it, and
// the ones passed meanwhile are counted as skipped.
#include "chief/eval_schedule.h"

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

TEST_CASE("evaluations run at the first step seen past their due step; the rest are skipped",
          "[chief][eval]") {
  EvalSchedule s(100, 1100, 0);
  CHECK(s.next() == 100);
  CHECK_FALSE(s.Due(99));
  REQUIRE(s.Due(110));
  CHECK(s.Ran(110) == 1);  // due at 100
  CHECK(s.next() == 200);
  CHECK(s.Ran(211) == 1);  // due at 200
  CHECK(s.Ran(843) == 6);  // due at 300 .. 800: 5 skipped
  CHECK(s.next() == 900);
  CHECK(s.Ran(921) == 1);
  CHECK(s.Ran(1010) == 1);  // due at 1000
  CHECK(s.next() == 1100);
  CHECK_FALSE(s.Due(1100));  // the end's own evaluation
}

TEST_CASE("the evaluation schedule: at the end only, resumed, and rolled back", "[chief][eval]") {
  EvalSchedule end_only(0, 50, 0);
  CHECK(end_only.next() == 50);
  CHECK_FALSE(end_only.Due(49));

  EvalSchedule resumed(10, 100, 35);  // a run resumed at step 35
  CHECK(resumed.next() == 40);
  EvalSchedule at_due(10, 100, 40);  // resumed exactly at a due step: it was evaluated
  CHECK(at_due.next() == 50);

  EvalSchedule s(10, 100, 0);
  CHECK(s.Ran(57) == 5);  // due at 10 .. 50
  s.Restart(20);          // rolled back to 20
  CHECK(s.next() == 30);
  CHECK(s.Ran(30) == 1);
  EvalSchedule tail(10, 25, 0);
  CHECK(tail.Ran(24) == 2);  // due at 10, 20
  CHECK(tail.next() == 25);
}

}  // namespace
}  // namespace pstrain
