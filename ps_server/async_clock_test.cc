// The async clock on its own: max_steps exact with updates in flight,
// tickets in admission order, abandoned admissions given back, the workers'
// clocks and the staleness bound, cursors of admitted pushes only, and each
// update's rate.
#include "ps_server/async_clock.h"

#include <vector>

#include "catch2/catch.hpp"
#include "google/protobuf/text_format.h"

namespace pstrain {
namespace {

StepCursor Cursor(int64_t position) { return {true, 0, position}; }

TEST_CASE("async clock: tickets count updates in flight, and max_steps is exact",
          "[ps][async_clock]") {
  AsyncClock clock;
  clock.Reset(2);
  // Server at version 10, max_steps 13: three more updates, whoever sends.
  CHECK(clock.Admit(0, 10, 13, Cursor(1)) == 11);
  CHECK(clock.Admit(1, 10, 13, Cursor(1)) == 12);
  CHECK(clock.in_flight() == 2);
  CHECK(clock.Admit(0, 10, 13, Cursor(2)) == 13);
  CHECK(clock.Admit(1, 10, 13, Cursor(2)) == 0);  // the run is full
  CHECK(clock.in_flight() == 3);
  // One is refused (a NaN): its slot is free again.
  clock.Abandon();
  CHECK(clock.in_flight() == 2);
  CHECK(clock.Admit(1, 10, 13, Cursor(3)) == 13);
  // Applied: the server's version moves with each (the caller's).
  CHECK(clock.Applied(0) == 1);
  CHECK(clock.Applied(1) == 1);
  CHECK(clock.Applied(0) == 2);
  CHECK(clock.in_flight() == 0);
  CHECK(clock.Admit(0, 13, 13, Cursor(4)) == 0);
  CHECK(clock.in_flight() == 0);
  // No max_steps: never full.
  CHECK(clock.Admit(0, 13, 0, Cursor(4)) == 14);
  CHECK(clock.Admit(1, 13, 0, Cursor(4)) == 15);

  clock.Reset(3);
  CHECK(clock.in_flight() == 0);
  CHECK(clock.num_workers() == 3);
  CHECK(clock.pushes(0) == 0);
  CHECK(clock.Admit(2, 0, 1, Cursor(1)) == 1);
}

TEST_CASE("async clock: the slowest worker and the staleness bound", "[ps][async_clock]") {
  AsyncClock clock;
  clock.Reset(3);
  CHECK(clock.Slowest() == 0);
  CHECK(clock.SlowestWorkers() == std::vector<int>{0, 1, 2});
  for (int i = 0; i < 3; ++i) {
    clock.Admit(0, i, 0, Cursor(i));
    clock.Applied(0);
  }
  clock.Admit(1, 3, 0, Cursor(0));
  clock.Applied(1);
  // Worker 0 has 3 applied, worker 1 has 1, worker 2 none.
  CHECK(clock.pushes(0) == 3);
  CHECK(clock.pushes(1) == 1);
  CHECK(clock.pushes(2) == 0);
  CHECK(clock.pushes(3) == 0);  // out of range
  CHECK(clock.pushes(-1) == 0);
  CHECK(clock.Slowest() == 0);
  CHECK(clock.SlowestWorkers() == std::vector<int>{2});
  CHECK_FALSE(clock.WithinBound(0, 2));  // 3 ahead of the slowest
  CHECK(clock.WithinBound(0, 3));
  CHECK(clock.WithinBound(0, 0));  // no bound
  CHECK(clock.WithinBound(1, 1));
  CHECK(clock.WithinBound(2, 1));
  clock.Admit(2, 4, 0, Cursor(0));
  clock.Applied(2);
  CHECK(clock.Slowest() == 1);
  CHECK(clock.SlowestWorkers() == std::vector<int>{1, 2});
  CHECK(clock.WithinBound(0, 2));
}

TEST_CASE("async clock: a worker's cursor is its last admitted push's", "[ps][async_clock]") {
  AsyncClock clock;
  clock.Reset(2);
  CHECK_FALSE(clock.cursors()[0].set);
  clock.Admit(0, 0, 2, {true, 1, 64});
  clock.Admit(1, 0, 2, {true, 1, 128});
  CHECK(clock.Admit(0, 0, 2, {true, 2, 0}) == 0);  // refused: the cursor stays
  CHECK(clock.cursors()[0].set);
  CHECK(clock.cursors()[0].epoch == 1);
  CHECK(clock.cursors()[0].position == 64);
  CHECK(clock.cursors()[1].position == 128);
  clock.Abandon();  // an abandoned push keeps its batch skipped (the cursor stays)
  CHECK(clock.cursors()[1].position == 128);
}

TEST_CASE("async clock: an update's rate is its ticket's, scaled by staleness where asked",
          "[ps][async_clock]") {
  OptimizerConfig config;
  REQUIRE(google::protobuf::TextFormat::ParseFromString(
      "learning_rate: 1 schedule { kind: STEP decay_steps: 10 decay_rate: 0.5 }", &config));
  auto rate = LearningRate::Create(config, 1, 100);
  REQUIRE(rate.ok());
  ServerModel model;
  model.learning_rate = *rate;
  // Ticket 11 is update t = 10: the first decay.
  CHECK(AsyncClock::Update(model, 10, 9).learning_rate == Approx(1.0));
  CHECK(AsyncClock::Update(model, 11, 4).learning_rate == Approx(0.5));
  model.staleness_scaled_lr = true;
  // Computed at version 4, applied as update 10 (t = 10): 6 updates stale.
  CHECK(AsyncClock::Update(model, 11, 4).learning_rate == Approx(0.5 / 6));
  // Staleness 1 (computed at the version just before) is not scaled.
  CHECK(AsyncClock::Update(model, 11, 9).learning_rate == Approx(0.5));
  CHECK(AsyncClock::Update(model, 11, 10).learning_rate == Approx(0.5));
}

}  // namespace
}  // namespace pstrain
