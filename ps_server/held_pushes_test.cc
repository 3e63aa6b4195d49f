// Async pushes in parts on their own: which part belongs to which push, a
// late part of an earlier push told apart, drops that give an admission
// back once, and overdue pushes found at the worker's push deadline.
#include "ps_server/held_pushes.h"

#include <vector>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

PushRequest Part(int32_t session, int64_t step, uint64_t seq, int num_parts = 2) {
  PushRequest p;
  p.set_worker(0);
  p.set_session(session);
  p.set_step(step);
  p.set_push_seq(seq);
  p.set_num_parts(num_parts);
  return p;
}

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST_CASE("held pushes: a part belongs to the push of its session, step, seq and parts",
          "[ps][held]") {
  HeldPushes held;
  held.Reset(2);
  CHECK_FALSE(held.IsPartOf(0, Part(0, 5, 1)));
  CHECK_FALSE(held.IsEarlier(0, Part(0, 5, 1)));  // nothing held: nothing is late
  HeldPushes::Push& h = held.Start(0, Part(0, 5, 1), kT0, false, UpdateInfo());
  CHECK(h.open());
  CHECK(h.got.size() == 2);
  CHECK(held.IsPartOf(0, Part(0, 5, 1)));
  CHECK_FALSE(held.IsPartOf(0, Part(0, 5, 1, /*num_parts=*/3)));
  CHECK_FALSE(held.IsPartOf(1, Part(0, 5, 1)));  // another worker's slot
  // Earlier: a lower session, or the same session's earlier step or push.
  CHECK(held.IsEarlier(0, Part(0, 4, 9)));
  CHECK(held.IsEarlier(0, Part(0, 5, 0)));
  CHECK_FALSE(held.IsEarlier(0, Part(0, 5, 2)));
  CHECK_FALSE(held.IsEarlier(0, Part(0, 6, 0)));
  CHECK_FALSE(held.IsEarlier(0, Part(1, 0, 0)));  // a restarted worker's push is later
  CHECK(held.IsEarlier(0, Part(-1, 9, 9)));
  // Ids are never reused.
  const uint64_t first = h.id;
  CHECK(held.Start(0, Part(0, 6, 0), kT0, false, UpdateInfo()).id != first);
}

TEST_CASE("held pushes: a drop gives an admission back once, and not for a finished push",
          "[ps][held]") {
  HeldPushes held;
  held.Reset(1);
  CHECK_FALSE(held.Drop(0, "nothing held"));
  held.Start(0, Part(0, 1, 0), kT0, /*finished=*/false, UpdateInfo());
  CHECK(held.Drop(0, "a part of a later push came"));
  CHECK(held.of(0).closed == "it was dropped: a part of a later push came");
  CHECK_FALSE(held.of(0).open());
  CHECK_FALSE(held.Drop(0, "again"));      // closed: nothing changes
  CHECK(held.IsPartOf(0, Part(0, 1, 0)));  // kept, so its late parts are refused

  held.Start(0, Part(0, 2, 0), kT0, /*finished=*/true, UpdateInfo());
  CHECK_FALSE(held.Drop(0, "past max_steps: it held no admission"));
  held.Start(0, Part(0, 3, 0), kT0, false, UpdateInfo());
  held.Complete(0);
  CHECK(held.of(0).closed == "it is complete");
  CHECK_FALSE(held.Drop(0, "complete already"));
}

TEST_CASE("held pushes: a push whose parts stop coming is overdue after its deadline",
          "[ps][held]") {
  HeldPushes held;
  held.Reset(3);
  const absl::Duration ttl = absl::Seconds(10);
  CHECK(held.NextExpiry(ttl) == absl::InfiniteFuture());
  held.Start(0, Part(0, 1, 0), kT0, false, UpdateInfo());
  held.Start(2, Part(0, 1, 0), kT0 + absl::Seconds(3), false, UpdateInfo());
  CHECK(held.NextExpiry(ttl) == kT0 + ttl);
  CHECK(held.Overdue(kT0 + ttl, ttl, false).empty());  // at the deadline: a part may still come
  CHECK(held.Overdue(kT0 + ttl + absl::Milliseconds(1), ttl, false) == std::vector<int>{0});
  CHECK(held.Overdue(kT0 + absl::Seconds(20), ttl, false) == std::vector<int>{0, 2});
  held.Drop(0, "overdue");
  CHECK(held.NextExpiry(ttl) == kT0 + absl::Seconds(13));
  // From a part (throttled): at most one look per min(ttl, 1 s) since the
  // last (at 20 s).
  CHECK(held.Overdue(kT0 + absl::Seconds(20) + absl::Milliseconds(500), ttl, true).empty());
  CHECK(held.Overdue(kT0 + absl::Seconds(21), ttl, true) == std::vector<int>{2});
  CHECK(held.Overdue(kT0 + absl::Seconds(21) + absl::Milliseconds(999), ttl, true).empty());
}

}  // namespace
}  // namespace pstrain
