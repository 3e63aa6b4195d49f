// The worker's training loop (worker/trainer.h) on in-process parameter
// servers and an in-process chief: the sync step, the async step, a resume
// and a rollback, without processes or sockets. Each run's parameters are
// checked against the same model trained in this process as one worker of
// the global batch (the equivalence the multi-process tests check end to
// end, tests/cluster_test.cc).
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "tests/in_process_testlib.h"

namespace pstrain {
namespace {

using testing::BitwiseEqual;
using testing::CheckClose;
using testing::InProcessCluster;
using testing::kBatch;
using testing::Reference;

TrainingConfig Config(bool sync, int workers, int max_steps) {
  return testing::InProcessConfig(sync, workers, max_steps);
}

// A cluster whose servers the test initialises as the chief's start does.
struct Started : InProcessCluster {
  Started(const TrainingConfig& config, int workers, int64_t start_step = 0,
          std::vector<Tensor> params = {}, const std::vector<WorkerCursor>& cursors = {})
      : InProcessCluster(config, workers, start_step) {
    Initialize(start_step, std::move(params), cursors);
  }
};

TEST_CASE("sync: two in-process workers of batch b train as one process of batch 2b",
          "[trainer][sync]") {
  const TrainingConfig config = Config(true, 2, 20);
  Started run(config, 2);
  run.Train();
  Reference ref(config, 2);
  ref.Steps(0, 20);
  CheckClose(run.Params(), ref.params);
  for (const WorkerStats& s : run.stats) {
    CHECK(s.steps == 20);
    CHECK(s.examples == 20 * kBatch);
    CHECK(s.registered);
  }
  for (int s = 0; s < 2; ++s) {
    PsStatusResponse status;
    REQUIRE(run.driver->GetStatus(s, &status).ok());
    CHECK(status.version() == 20);
  }
}

TEST_CASE("sync: pushing during the backward pass changes nothing (bitwise, against "
          "rpc.sequential)",
          "[trainer][sync]") {
  Started overlapped(Config(true, 2, 12), 2);
  overlapped.Train();
  TrainingConfig in_turn = Config(true, 2, 12);
  in_turn.mutable_rpc()->set_sequential(true);
  Started sequential(in_turn, 2);
  sequential.Train();
  CHECK(BitwiseEqual(overlapped.Params(), sequential.Params()));
}

TEST_CASE("async: one in-process worker trains as sequential SGD of its batch",
          "[trainer][async]") {
  // Each pull is answered once the worker's own push is applied (it leaves
  // with the push), so with one worker every step sees the one before.
  const TrainingConfig config = Config(false, 1, 15);
  Started run(config, 1);
  run.Train();
  Reference ref(config, 1);
  ref.Steps(0, 15);
  CheckClose(run.Params(), ref.params);
  CHECK(run.stats[0].steps == 15);
  CHECK(run.stats[0].gradients_dropped_stale == 0);
}

TEST_CASE("resume: workers registered at step k with their data cursors go on from there",
          "[trainer][resume]") {
  // The servers start at step 8 from the reference's parameters there, and
  // the chief gives each worker its cursor after 8 batches: the run ends
  // where one of 20 steps from the start does.
  const TrainingConfig config = Config(true, 2, 20);
  Reference ref(config, 2);
  ref.Steps(0, 8);
  Started run(config, 2, /*start_step=*/8, ref.params, ref.Cursors());
  run.Train();
  ref.Steps(8, 20);
  CheckClose(run.Params(), ref.params);
  for (const WorkerStats& s : run.stats) CHECK(s.steps == 12);
}

TEST_CASE("rollback: workers follow the job back to step 0 and end where a run without it does",
          "[trainer][rollback]") {
  // As the driver rolls back (chief/rollback.cc, no checkpoint yet): the
  // chief holds registrations, the servers get a new incarnation from the
  // seed, and the workers, refused on the old one, register again and
  // start over with their data from the start.
  const TrainingConfig config = Config(true, 2, 20);
  Started run(config, 2);
  run.HoldPullsFrom(8);  // the workers wait at step 8 until the rollback is done
  absl::Status rolled = absl::UnknownError("not rolled back");
  std::thread driver([&run, &rolled] {
    // No Catch assertion on this thread: its outcome is checked after join.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (PsStatusResponse st; absl::Now() < deadline; absl::SleepFor(absl::Milliseconds(1))) {
      if (run.driver->GetStatus(0, &st).ok() && st.version() >= 6) break;
    }
    run.chief->BeginRollback();
    run.chief->SetServersDown(0);
    const uint64_t fresh = run.incarnation + 1;
    run.driver->set_incarnation(fresh);
    rolled = run.driver->InitializeAll(run.config, run.fingerprint, 2, 0,
                                       run.model->Initialize(run.config.seed()),
                                       absl::Seconds(1));
    run.chief->FinishRollback(fresh, 0, {});
    run.ReleasePulls();
  });
  run.Train();
  driver.join();
  INFO(rolled.ToString());
  REQUIRE(rolled.ok());
  CHECK(run.chief->rollbacks() == 1);
  for (const WorkerStats& s : run.stats) CHECK(s.steps > 20);  // steps before it, again
  Reference ref(config, 2);
  ref.Steps(0, 20);
  CheckClose(run.Params(), ref.params);
}

TEST_CASE("a stop ends every worker's loop with CANCELLED", "[trainer]") {
  Started run(Config(true, 2, 100000), 2);
  run.StartWorkers();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline && (run.stats[0].steps < 3 || run.stats[1].steps < 3)) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  run.stop.Stop("test over");
  // A worker parked in a pull for its partner's step is woken by the
  // servers' shutdown, as the daemons' are.
  absl::SleepFor(absl::Milliseconds(50));
  for (auto& s : run.servers) s->Shutdown();
  run.JoinWorkers(/*expect_ok=*/false);
  for (const absl::Status& st : run.statuses) {
    INFO(st.ToString());
    CHECK((absl::IsCancelled(st) || absl::IsUnavailable(st)));
  }
  for (const WorkerStats& s : run.stats) CHECK(s.steps > 0);
}

}  // namespace
}  // namespace pstrain
