// The open sync step on its own: per-partition quorums, the gradient that
// will complete one, closing with the workers in index order, the step's
// end and its contributors, who it waits on, a server holding no
// partition, the clock and deadline, and the workers' cursors.
#include "ps_server/sync_step.h"

#include <vector>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST_CASE("sync step: a partition closes on its quorum, with its workers in index order",
          "[ps][sync_step]") {
  SyncStep step;
  step.Reset(/*partitions=*/2, /*workers=*/3, /*replicas=*/2);
  CHECK(step.open() == 2);
  CHECK_FALSE(step.Has(0, 2));
  CHECK_FALSE(step.Begin(0, 2));  // the first of two: staged
  CHECK(step.Has(0, 2));          // on its way counts: a repeat is refused
  step.End(0, 2);
  CHECK_FALSE(step.Arrive(0, 2));
  CHECK(step.Count(0) == 1);
  CHECK(step.Begin(0, 0));  // the second completes it: read from the bytes
  step.End(0, 0);
  CHECK(step.Arrive(0, 0));
  CHECK(step.Close(0) == std::vector<int>{0, 2});
  CHECK(step.Closed(0));
  CHECK_FALSE(step.Closed(1));
  CHECK_FALSE(step.Applied(1));
  CHECK(step.open() == 1);
}

TEST_CASE("sync step: the step ends when every partition is applied, with its contributors",
          "[ps][sync_step]") {
  SyncStep step;
  step.Reset(2, 3, 3);
  for (int w : {0, 1, 2}) step.Arrive(0, w);
  step.Close(0);
  // Partition 1 goes on short (a deadline closed it with two).
  step.Arrive(1, 1);
  step.Arrive(1, 2);
  step.Close(1);
  CHECK(step.Applied(2));
  CHECK(step.NextStep() == 2);
  CHECK(step.open() == 2);
  CHECK_FALSE(step.Closed(0));
  CHECK(step.Count(1) == 0);
  CHECK_FALSE(step.Has(1, 1));
}

TEST_CASE("sync step: it says which workers it waits on", "[ps][sync_step]") {
  SyncStep step;
  step.Reset(2, 3, 3);
  step.Arrive(0, 0);
  step.Arrive(1, 0);
  step.Begin(0, 1);  // worker 1 is sending partition 0, not yet partition 1
  CHECK(step.Missing() == std::vector<int>{1, 2});
  CHECK(step.WaitingOn() == std::vector<bool>{false, true, true});
  CHECK(step.FewestOpen() == 1);
  step.Begin(1, 1);
  CHECK(step.WaitingOn() == std::vector<bool>{false, false, true});
}

TEST_CASE("sync step: on a server holding no partition the quorum of pushes ends the step",
          "[ps][sync_step]") {
  SyncStep step;
  step.Reset(0, 3, 2);
  CHECK(step.WaitingOn() == std::vector<bool>{true, true, true});
  CHECK(step.PushEmpty(2) == 1);
  CHECK(step.PushedEmpty(2));
  CHECK(step.WaitingOn() == std::vector<bool>{true, true, false});
  CHECK(step.PushEmpty(0) == 2);
  CHECK(step.EmptyCount() == 2);
  step.ClearEmpty();
  CHECK_FALSE(step.PushedEmpty(2));
  CHECK(step.Missing().empty());
}

TEST_CASE("sync step: its clock starts at its first gradient, and its deadline with it",
          "[ps][sync_step]") {
  SyncStep step;
  step.Reset(1, 2, 2);
  CHECK(step.deadline() == absl::InfiniteFuture());
  CHECK_FALSE(step.Completed(kT0).has_value());  // no gradient came
  CHECK(step.Started(kT0, absl::Milliseconds(500)));
  CHECK_FALSE(step.Started(kT0 + absl::Seconds(1), absl::Milliseconds(500)));  // set already
  CHECK(step.deadline() == kT0 + absl::Milliseconds(500));
  CHECK(step.Completed(kT0 + absl::Seconds(2)) == absl::Seconds(2));
  CHECK(step.deadline() == absl::InfiniteFuture());
  CHECK_FALSE(step.Started(kT0, absl::ZeroDuration()));  // no deadline configured
  CHECK(step.Completed(kT0 + absl::Seconds(3)) == absl::Seconds(3));
  step.Fail(absl::DeadlineExceededError("step 4 failed"));
  CHECK(step.failure().message() == "step 4 failed");
  step.Reset(1, 2, 2);
  CHECK(step.failure().ok());
}

TEST_CASE("sync step: a completed step's cursors are kept per worker", "[ps][sync_step]") {
  SyncStep step;
  step.Reset(1, 2, 2);
  step.SetCursor(0, {true, 1, 10});
  step.SetCursor(1, {true, 1, 11});
  step.CommitCursors();
  step.SetCursor(1, {true, 1, 12});  // worker 0 did not push to the next step
  CHECK(step.cursors()[1].position == 12);
  step.CommitCursors();
  CHECK(step.completed_cursors()[0].position == 10);
  CHECK(step.completed_cursors()[1].position == 12);
  CHECK_FALSE(step.cursors()[0].set);
}

}  // namespace
}  // namespace pstrain
