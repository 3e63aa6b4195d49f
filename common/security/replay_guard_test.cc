#include "common/security/replay_guard.h"

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

using Verdict = ReplayGuard::Verdict;

TEST_CASE("each call of a session is admitted once", "[replay]") {
  ReplayGuard guard(absl::Minutes(5));
  const absl::Time now = absl::Now();
  CHECK(guard.Admit("worker:0", 1, 1, now, now) == Verdict::kNew);
  CHECK(guard.Admit("worker:0", 1, 1, now, now) == Verdict::kReplayed);
  CHECK(guard.Admit("worker:0", 1, 3, now, now) == Verdict::kNew);
  // 2 arrived after 3 (calls in flight at once): still new, then seen.
  CHECK(guard.Admit("worker:0", 1, 2, now, now) == Verdict::kNew);
  CHECK(guard.Admit("worker:0", 1, 2, now, now) == Verdict::kReplayed);
  // The same numbers in another session, or of another identity, are new.
  CHECK(guard.Admit("worker:0", 2, 1, now, now) == Verdict::kNew);
  CHECK(guard.Admit("worker:1", 1, 1, now, now) == Verdict::kNew);
  CHECK(guard.sessions() == 3);
}

TEST_CASE("the window slides: far behind is refused, skipped numbers stay new", "[replay]") {
  ReplayGuard guard(absl::Minutes(5));
  const absl::Time now = absl::Now();
  const uint64_t w = ReplayGuard::kWindow;
  CHECK(guard.Admit("chief:0", 9, 10, now, now) == Verdict::kNew);
  CHECK(guard.Admit("chief:0", 9, 10 + w - 1, now, now) == Verdict::kNew);
  // 10 is now the oldest number the window holds; 9 just left it.
  CHECK(guard.Admit("chief:0", 9, 10, now, now) == Verdict::kReplayed);
  CHECK(guard.Admit("chief:0", 9, 9, now, now) == Verdict::kBelowWindow);
  CHECK(guard.Admit("chief:0", 9, 11, now, now) == Verdict::kNew);  // skipped, in the window
  // A jump past the whole window clears it: the old bits must not be taken
  // for the new numbers that share their positions.
  CHECK(guard.Admit("chief:0", 9, 10 + 3 * w, now, now) == Verdict::kNew);
  CHECK(guard.Admit("chief:0", 9, 10 + 2 * w + 1, now, now) == Verdict::kNew);
  CHECK(guard.Admit("chief:0", 9, 10 + 2 * w, now, now) == Verdict::kBelowWindow);
  // A smaller jump clears exactly the positions it passes.
  CHECK(guard.Admit("chief:0", 9, 10 + 3 * w + 5, now, now) == Verdict::kNew);
  for (uint64_t n = 10 + 3 * w + 1; n < 10 + 3 * w + 5; ++n) {
    CHECK(guard.Admit("chief:0", 9, n, now, now) == Verdict::kNew);
  }
  CHECK(guard.Admit("chief:0", 9, 10 + 3 * w, now, now) == Verdict::kReplayed);
}

TEST_CASE("sessions are forgotten once their calls are too old to admit", "[replay]") {
  ReplayGuard guard(absl::Minutes(5), /*max_sessions=*/2);
  const absl::Time t0 = absl::Now();
  CHECK(guard.Admit("worker:0", 1, 1, t0, t0) == Verdict::kNew);
  CHECK(guard.Admit("worker:1", 1, 1, t0 + absl::Minutes(3), t0 + absl::Minutes(3)) ==
        Verdict::kNew);
  // Full, and both sessions' calls still within the 5 minutes.
  CHECK(guard.Admit("worker:2", 1, 1, t0 + absl::Minutes(4), t0 + absl::Minutes(4)) ==
        Verdict::kTooManySessions);
  // Kept for twice the 5 minutes (a caller may have read the clock a while
  // before it reached the guard), then forgotten: worker:0's newest call is
  // 11 minutes old, worker:1's 8.
  CHECK(guard.Admit("worker:2", 1, 1, t0 + absl::Minutes(9), t0 + absl::Minutes(9)) ==
        Verdict::kTooManySessions);
  const absl::Time later = t0 + absl::Minutes(11);
  CHECK(guard.Admit("worker:2", 1, 1, later, later) == Verdict::kNew);
  CHECK(guard.sessions() == 2);
  CHECK(guard.Admit("worker:1", 1, 1, later, later) == Verdict::kReplayed);
}

TEST_CASE("one identity cannot take the others' room", "[replay]") {
  ReplayGuard guard(absl::Minutes(5), /*max_sessions=*/100, /*per_identity=*/3);
  const absl::Time now = absl::Now();
  for (uint64_t session = 1; session <= 3; ++session) {
    CHECK(guard.Admit("worker:0", session, 1, now, now) == Verdict::kNew);
  }
  // A worker making up sessions: refused past its share...
  CHECK(guard.Admit("worker:0", 4, 1, now, now) == Verdict::kTooManySessions);
  // ...while its live sessions go on, and the chief still gets its channels.
  CHECK(guard.Admit("worker:0", 2, 2, now, now) == Verdict::kNew);
  CHECK(guard.Admit("chief:0", 1, 1, now, now) == Verdict::kNew);
  CHECK(guard.sessions() == 4);
}

}  // namespace
}  // namespace pstrain
