// The chief's driver (chief/driver.h) after its start phase (StartRun),
// over in-process parameter servers, with workers running the real loop on
// threads: a run to its end, a resume from a checkpoint, and an operator's
// restore mid-run. No processes, no sockets; the checkpoints are real files
// under the test's temporary directory.
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "chief/driver.h"
#include "chief/run_context.h"
#include "chief/start_point.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"
#include "common/storage/tensor_file.h"
#include "tests/in_process_testlib.h"

namespace pstrain {
namespace {

using testing::BitwiseEqual;
using testing::CheckClose;
using testing::InProcessCluster;
using testing::Reference;

// A directory of this case's own, empty (a rerun outside Bazel's sandbox
// finds no checkpoint of an earlier one).
std::string TempDir(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp", "/driver_test_", name);
  (void)DeleteRecursively(Env::Default(), path);
  return path;
}

// Sync, 2 workers, evaluated on the test split and checkpointed every
// `every` steps (the newest 2 kept) into `name`'s own directories.
TrainingConfig DriverConfig(const std::string& name, int max_steps, int every = 5) {
  TrainingConfig config = testing::InProcessConfig(true, 2, max_steps);
  config.mutable_data()->set_test_csv(testing::TestCsv());
  config.set_eval_every_steps(every);
  config.set_output_dir(TempDir(name + "_out"));
  config.mutable_checkpoint()->set_dir(TempDir(name + "_ckpt"));
  config.mutable_checkpoint()->set_every_steps(every);
  config.mutable_checkpoint()->set_keep(every == 5 ? 2 : 100);
  return config;
}

// As RunChief does once its checks pass: StartRun, then the driver's loop
// and its end, with the workers training meanwhile. `during` (optional)
// runs on a thread of its own beside them.
absl::Status RunDriver(InProcessCluster* c, const ChiefStart& start,
                       const std::function<void()>& during = nullptr) {
  const RunContext run(c->config, c->cluster, c->placement,
                       RunFingerprint(c->config, c->model->variables()));
  auto test = LoadDataset(Env::Default(), c->config.data(), DataSplit::kTest,
                          c->model->input_dim(), c->model->num_labels());
  REQUIRE(test.ok());
  auto begun = StartRun(run, start, c->model.get(), c->driver.get(), c->chief.get());
  if (!begun.ok()) return begun.status();
  c->StartWorkers();
  std::optional<std::thread> beside;
  if (during) beside.emplace(during);
  StopSignal stop;
  Driver driver(run, c->model.get(), &*test, c->driver.get(), c->chief.get(), &stop, start,
                *begun);
  absl::Status st = driver.Train();
  if (st.ok()) st = driver.Finish();
  if (beside) beside->join();
  c->JoinWorkers();
  return st;
}

// The model the run wrote to output_dir, in placement order.
std::vector<Tensor> FinalModel(const InProcessCluster& c) {
  auto read =
      ReadTensorFile(Env::Default(), JoinPath(c.config.output_dir(), "model_final.pst"));
  REQUIRE(read.ok());
  std::vector<Tensor> params;
  for (const auto& vp : c.placement.variables()) {
    REQUIRE(read->count(vp.spec.name) == 1);
    params.push_back(read->at(vp.spec.name));
  }
  return params;
}

std::vector<int64_t> CheckpointSteps(const TrainingConfig& config) {
  auto list = ListCheckpoints(Env::Default(), config.checkpoint().dir());
  REQUIRE(list.ok());
  std::vector<int64_t> steps;
  for (const CheckpointInfo& info : *list) {
    if (info.complete) steps.push_back(info.step);
  }
  return steps;
}

TEST_CASE("the driver runs a sync job to its end: checkpoints, the model, the summary, the "
          "servers shut down",
          "[driver]") {
  InProcessCluster c(DriverConfig("end", 20), 2);
  REQUIRE(RunDriver(&c, ChiefStart()).ok());
  Reference ref(c.config, 2);
  ref.Steps(0, 20);
  CheckClose(FinalModel(c), ref.params);
  CHECK(CheckpointSteps(c.config) == std::vector<int64_t>{15, 20});  // keep: 2
  auto summary = Env::Default()->ReadFile(JoinPath(c.config.output_dir(), "summary.json"));
  REQUIRE(summary.ok());
  CHECK(absl::StrContains(*summary, "\"global_step\": 20"));
  ChiefStatusResponse status;
  c.chief->GetStatus(&status);
  CHECK(status.state() == "finished");
  // Shut down: the servers refuse to serve.
  std::vector<Tensor> params;
  PsClient::PullResult r;
  CHECK(absl::IsUnavailable(c.driver->PullAll({}, absl::Seconds(1), &params, &r)));
}

TEST_CASE("a run resumed from its checkpoint ends bitwise where an uninterrupted one does",
          "[driver][resume]") {
  InProcessCluster whole(DriverConfig("whole", 20), 2);
  REQUIRE(RunDriver(&whole, ChiefStart()).ok());

  // The first 10 steps, then a new cluster (fresh servers and chief) that
  // resumes from the checkpoint at 10: values, cursors, step.
  InProcessCluster first(DriverConfig("halves", 10), 2);
  REQUIRE(RunDriver(&first, ChiefStart()).ok());
  TrainingConfig longer = first.config;  // the same directories, kept
  longer.set_max_steps(20);
  InProcessCluster second(longer, 2);
  ChiefStart resume;
  resume.resume = true;
  REQUIRE(RunDriver(&second, resume).ok());
  for (const WorkerStats& s : second.stats) CHECK(s.steps == 10);
  CHECK(BitwiseEqual(FinalModel(second), FinalModel(whole)));
}

TEST_CASE("an operator's restore mid-run rolls every server back and the workers follow",
          "[driver][rollback]") {
  InProcessCluster whole(DriverConfig("plain", 40, 10), 2);
  REQUIRE(RunDriver(&whole, ChiefStart()).ok());

  // The workers wait at step 15 until the restore is done (the driver
  // takes it between its rounds; without the hold the run could end first).
  InProcessCluster c(DriverConfig("restored", 40, 10), 2);
  c.HoldPullsFrom(15);
  absl::Status restored = absl::UnknownError("not asked");
  int64_t to = -1;
  REQUIRE(RunDriver(&c, ChiefStart(), [&c, &restored, &to] {
            // Once the checkpoint at 10 is committed.
            const absl::Time deadline = absl::Now() + absl::Seconds(30);
            while (absl::Now() < deadline && c.chief->checkpoint_stats().last_step < 10) {
              absl::SleepFor(absl::Milliseconds(1));
            }
            restored = c.chief->RequestRestore(
                JoinPath(c.config.checkpoint().dir(), CheckpointDirName(10)), absl::Seconds(30),
                &to);
            c.ReleasePulls();
          }).ok());
  INFO(restored.ToString());
  CHECK(restored.ok());
  CHECK(to == 10);
  CHECK(c.chief->rollbacks() == 1);
  for (const WorkerStats& s : c.stats) CHECK(s.steps > 40);  // steps 10.. again
  // From the checkpoint's values, optimizer state and cursors: the same run.
  CHECK(BitwiseEqual(FinalModel(c), FinalModel(whole)));
}

}  // namespace
}  // namespace pstrain
