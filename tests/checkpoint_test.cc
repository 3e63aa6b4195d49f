// Checkpoints end to end: the real chief, ps_server and worker binaries under
// `pstrain launch` on free loopback ports, always reaped. A resumed sync run
// ends bitwise where a run never stopped does, after kill -9 on every
// process, onto another number of servers, and past a damaged checkpoint;
// exports, --init_from, failed saves, async cuts, embedding rows, timed saves.
// Recovery of a running job (restarts, restores): tests/recovery_test.cc.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"
#include "tools/subprocess.h"
#include "common/storage/tensor_file.h"
#include "common/testing/skip.h"
#include "nlohmann/json.hpp"
#include "tests/checkpoint_testlib.h"
#include "tests/cluster_testlib.h"

namespace pstrain {
namespace {

using testing::Binary;
using testing::BinDir;
using testing::CommandResult;
using testing::ConfigOptions;
using testing::BitwiseEqual;
using testing::CheckSameCheckpoint;
using testing::CheckSameModel;
using testing::CheckSameTables;
using testing::CheckpointOptions;
using testing::ChiefLog;
using testing::CopyCheckpoint;
using testing::FinalModel;
using testing::Job;
using testing::LaunchAndKillAll;
using testing::NumberAfter;
using testing::RunJob;
using testing::RunJobOk;
using testing::SpawnLaunch;
using testing::WriteJob;

TEST_CASE("a sync run killed with kill -9 on every process resumes to bitwise the same model",
          "[checkpoint][resume]") {
  const int steps = testing::SanitizedSteps(1500, 600);  // killed after ckpt-200
  // The run never stopped.
  const std::string ref_dir = testing::FreshTempDir("ckpt_ref");
  const Job ref = WriteJob(ref_dir, CheckpointOptions(JoinPath(ref_dir, "ckpt"), steps), 2);
  RunJobOk(ref, false);

  // The same job, every process killed with SIGKILL once it has checkpoints.
  const std::string dir = testing::FreshTempDir("ckpt_killed");
  const std::string ckpt = JoinPath(dir, "ckpt");
  const Job job = WriteJob(dir, CheckpointOptions(ckpt, steps), 2);
  LaunchAndKillAll(job, dir, [&ckpt] {
    return Env::Default()->FileExists(JoinPath(JoinPath(ckpt, "ckpt-200"), kManifestFile));
  });
  auto latest = LatestGoodCheckpoint(Env::Default(), ckpt, nullptr);
  REQUIRE(latest.ok());
  auto manifest = ReadManifest(Env::Default(), *latest);
  REQUIRE(manifest.ok());
  INFO("killed with the latest checkpoint at step " << manifest->step());
  CHECK(manifest->step() >= 200);
  CHECK(manifest->step() < steps);  // killed mid-run, not after it
  CHECK(manifest->cursors_size() == 2);
  CHECK(testing::RunCommand({Binary("tools/pstrain"), "checkpoint", "verify", *latest},
                            absl::Seconds(30))
            .exit_code == 0);

  RunJobOk(job, true);
  CHECK(ChiefLog(job).find("resume: from " + *latest) != std::string::npos);
  CheckSameModel(FinalModel(job), FinalModel(ref));
  CheckSameCheckpoint(JoinPath(ckpt, CheckpointDirName(steps)),
                      JoinPath(JoinPath(ref_dir, "ckpt"), CheckpointDirName(steps)));
  // The last checkpoint is the final model: model_final.pst holds its
  // values, bit for bit.
  auto last = LoadCheckpoint(Env::Default(), JoinPath(ckpt, CheckpointDirName(steps)));
  REQUIRE(last.ok());
  const TensorMap final_model = FinalModel(job);
  REQUIRE(last->variables.size() == final_model.size());
  for (const auto& [name, t] : final_model) {
    INFO(name);
    REQUIRE(last->variables.count(name) == 1);
    CHECK(BitwiseEqual(last->variables.at(name).values, t.values()));
  }
}

TEST_CASE("a checkpoint of 2 servers resumes onto 3, and one of 3 onto 1, values and slots "
          "bitwise",
          "[checkpoint][reshard]") {
  // The reference: 2 servers from 0 to 250, every checkpoint kept.
  const std::string ref_dir = testing::FreshTempDir("reshard_ref");
  const std::string ref_ckpt = JoinPath(ref_dir, "ckpt");
  const Job ref = WriteJob(ref_dir, CheckpointOptions(ref_ckpt, 250), 2);
  RunJobOk(ref, false);

  // 2 -> 3: its step-100 checkpoint alone, resumed on 3 servers to step 200.
  const std::string dir3 = testing::FreshTempDir("reshard_3");
  const std::string ckpt3 = JoinPath(dir3, "ckpt");
  CopyCheckpoint(ref_ckpt, 100, ckpt3);
  const Job job3 = WriteJob(dir3, CheckpointOptions(ckpt3, 200), 3);
  RunJobOk(job3, true);
  CHECK(ChiefLog(job3).find("(step 100, 2 shard(s) written, 3 now") != std::string::npos);
  auto m3 = ReadManifest(Env::Default(), JoinPath(ckpt3, "ckpt-200"));
  REQUIRE(m3.ok());
  CHECK(m3->num_shards() == 3);
  CheckSameCheckpoint(JoinPath(ckpt3, "ckpt-200"), JoinPath(ref_ckpt, "ckpt-200"));

  // 3 -> 1: the 3 servers' step-200 checkpoint, resumed on 1 server to 250.
  const std::string dir1 = testing::FreshTempDir("reshard_1");
  const std::string ckpt1 = JoinPath(dir1, "ckpt");
  CopyCheckpoint(ckpt3, 200, ckpt1);
  const Job job1 = WriteJob(dir1, CheckpointOptions(ckpt1, 250), 1);
  RunJobOk(job1, true);
  CHECK(ChiefLog(job1).find("(step 200, 3 shard(s) written, 1 now") != std::string::npos);
  CheckSameCheckpoint(JoinPath(ckpt1, "ckpt-250"), JoinPath(ref_ckpt, "ckpt-250"));
}

TEST_CASE("a damaged newest checkpoint is skipped, named in the log, and the previous one resumes",
          "[checkpoint][faults]") {
  const std::string dir = testing::FreshTempDir("ckpt_damaged");
  const std::string ckpt = JoinPath(dir, "ckpt");
  const Job job = WriteJob(dir, CheckpointOptions(ckpt, 150), 2);
  RunJobOk(job, false);
  const TensorMap want = FinalModel(job);
  auto before = LoadCheckpoint(Env::Default(), JoinPath(ckpt, "ckpt-150"));
  REQUIRE(before.ok());

  // One flipped byte in the middle of ckpt-150's second shard, and a step-200
  // directory without a manifest (a save that never completed).
  const std::string shard = JoinPath(JoinPath(ckpt, "ckpt-150"), ShardFileName(1, 2));
  auto bytes = Env::Default()->ReadFile(shard);
  REQUIRE(bytes.ok());
  REQUIRE(bytes->size() > 1000);
  (*bytes)[bytes->size() / 2] ^= 0x01;
  REQUIRE(Env::Default()->WriteFile(shard, *bytes, false).ok());
  REQUIRE(Env::Default()->CreateDirs(JoinPath(ckpt, "ckpt-200")).ok());
  CommandResult verify = testing::RunCommand(
      {Binary("tools/pstrain"), "checkpoint", "verify", JoinPath(ckpt, "ckpt-150")},
      absl::Seconds(30));
  CHECK(verify.exit_code == 1);
  CHECK(verify.output.find("shard-1-of-2") != std::string::npos);

  // Resumed: from ckpt-100, on to 150 again: the same model as before.
  REQUIRE(Env::Default()->DeleteFile(JoinPath(job.out, "model_final.pst")).ok());
  RunJobOk(job, true);
  const std::string log = ChiefLog(job);
  INFO(log);
  CHECK(log.find("resume: skipping ckpt-200: ") != std::string::npos);
  CHECK(log.find("resume: skipping ckpt-150: ") != std::string::npos);
  CHECK(log.find("CRC32C mismatch") != std::string::npos);
  CHECK(log.find("resume: from " + JoinPath(ckpt, "ckpt-100")) != std::string::npos);
  CheckSameModel(FinalModel(job), want);
  // The resumed run wrote a good ckpt-150 over the damaged one.
  CHECK(VerifyCheckpoint(Env::Default(), JoinPath(ckpt, "ckpt-150")).empty());
}

// The Python with NumPy and safetensors that tools/test.sh sets up; ""
// when there is none and the test may skip (it fails where it is required).
std::string PythonWithReaders() {
  const testing::PythonReaders py = testing::PythonWithModules("numpy, safetensors.numpy");
  if (py.error.empty()) return py.python;
  testing::SkipCase("python", py.error);
  return "";
}

TEST_CASE("a run's checkpoint exports to safetensors and npy that NumPy and safetensors read "
          "bitwise",
          "[checkpoint][export]") {
  const std::string python = PythonWithReaders();
  if (python.empty()) return;
  const std::string dir = testing::FreshTempDir("ckpt_export");
  const std::string ckpt = JoinPath(dir, "ckpt");
  const Job job = WriteJob(dir, CheckpointOptions(ckpt, 100), 2);
  RunJobOk(job, false);
  // The final checkpoint against the model the chief pulled from the servers.
  const std::string last = JoinPath(ckpt, "ckpt-100");
  const std::string st_dir = JoinPath(dir, "st"), npy_dir = JoinPath(dir, "npy");
  for (const auto& [format, out] : {std::pair<std::string, std::string>{"safetensors", st_dir},
                                    {"npy", npy_dir}}) {
    CommandResult e = testing::RunCommand({Binary("tools/pstrain"), "checkpoint", "export", last,
                                           "--format=" + format, "--out=" + out},
                                          absl::Seconds(60));
    INFO(e.output);
    REQUIRE(e.exit_code == 0);
    CHECK(e.output.find("exported step 100: 4 variable(s)") != std::string::npos);
  }
  std::string expect;
  int i = 0;
  for (const auto& [name, t] : FinalModel(job)) {
    const std::string raw = JoinPath(dir, absl::StrCat("want-", i++, ".f32"));
    REQUIRE(Env::Default()
                ->WriteFile(raw,
                            absl::string_view(reinterpret_cast<const char*>(t.values().data()),
                                              t.values().size() * sizeof(float)),
                            false)
                .ok());
    absl::StrAppend(&expect, name, "\t", absl::StrJoin(t.shape(), ","), "\t", raw, "\n");
  }
  const std::string expect_file = testing::WriteFile(JoinPath(dir, "expect.tsv"), expect);
  CommandResult py = testing::RunCommand(
      {python, JoinPath(BinDir(), "tests/read_export.py"),
       JoinPath(st_dir, "model.safetensors"), npy_dir, expect_file},
      absl::Seconds(60));
  INFO(py.output);
  CHECK(py.exit_code == 0);
  CHECK(py.output.find("safetensors dense0/kernel shape (784, 64) bitwise equal") !=
        std::string::npos);
  CHECK(py.output.find("npy dense1/bias shape (10,) bitwise equal") != std::string::npos);
}

TEST_CASE("--init_from starts a new run from a checkpoint's values with fresh optimizer state",
          "[checkpoint][init_from]") {
  const std::string dir = testing::FreshTempDir("ckpt_init_from");
  const std::string ckpt = JoinPath(dir, "ckpt");
  const Job first = WriteJob(dir, CheckpointOptions(ckpt, 100), 2);
  RunJobOk(first, false);
  const std::string from = JoinPath(ckpt, "ckpt-100");

  // A new run on 1 server whose Adam steps are far below float32's
  // resolution (lr 1e-30): its variables stay the checkpoint's, while its
  // step and Adam's update counts start again from 0.
  const std::string dir2 = testing::FreshTempDir("ckpt_init_from_2");
  ConfigOptions o = CheckpointOptions(JoinPath(dir2, "ckpt"), 20);
  o.learning_rate = 1e-30f;
  const Job second = WriteJob(dir2, o, 1);
  CommandResult r2 = testing::RunCommand(
      {Binary("tools/pstrain"), "launch", "--cluster_spec", second.spec, "--config", second.config,
       "--bin_dir", BinDir(), "--progress=false", "--init_from=" + from},
      absl::Seconds(120));
  INFO(r2.output);
  REQUIRE(r2.exit_code == 0);
  CHECK(ChiefLog(second).find("init_from: from " + from + " (step 100, 2 shard(s) written, 1 now") !=
        std::string::npos);
  auto want = LoadCheckpoint(Env::Default(), from);
  auto got = LoadCheckpoint(Env::Default(), JoinPath(JoinPath(dir2, "ckpt"), "ckpt-20"));
  REQUIRE(want.ok());
  REQUIRE(got.ok());
  CHECK(got->manifest.step() == 20);
  for (const auto& [name, w] : want->variables) {
    INFO(name);
    const RestoredVariable& g = got->variables.at(name);
    REQUIRE(g.values.size() == w.values.size());
    CHECK(w.updates == 100);
    CHECK(g.updates == 20);  // Adam's counts began again
    double worst = 0;
    for (size_t i = 0; i < w.values.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(g.values[i]) - w.values[i]));
    }
    CHECK(worst < 1e-20);
  }

  // Resuming under another optimizer is refused, naming both; init_from is
  // the way to take the values alone.
  ConfigOptions sgd = CheckpointOptions(ckpt, 150);
  sgd.optimizer = "sgd {}";
  const std::string dir3 = testing::FreshTempDir("ckpt_init_from_3");
  const Job other = WriteJob(dir3, sgd, 2);
  CommandResult refused = RunJob(other, true);
  INFO(refused.output);
  INFO(ChiefLog(other));
  CHECK(refused.exit_code != 0);
  CHECK(ChiefLog(other).find("was saved with optimizer adam, the config's is sgd") !=
        std::string::npos);

  // A checkpoint that is not there is one line, and nothing starts. (Into
  // the second run's output_dir again: --overwrite starts afresh there.)
  CommandResult bad = testing::RunCommand(
      {Binary("tools/pstrain"), "launch", "--cluster_spec", second.spec, "--config", second.config,
       "--bin_dir", BinDir(), "--progress=false", "--overwrite",
       "--init_from=" + JoinPath(ckpt, "ckpt-999")},
      absl::Seconds(120));
  INFO(bad.output);
  INFO(ChiefLog(second));
  CHECK(bad.exit_code != 0);
  CHECK(ChiefLog(second).find("ckpt-999") != std::string::npos);
}

TEST_CASE("a save that fails is logged, training goes on, and the next save is written",
          "[checkpoint][faults]") {
  const std::string dir = testing::FreshTempDir("ckpt_save_fails");
  const std::string ckpt = JoinPath(dir, "ckpt");
  const Job job = WriteJob(dir, CheckpointOptions(ckpt, 200), 2);
  // A file where ckpt-100's directory should go: every server's shard write
  // for step 100 fails, as on a broken or full disk.
  REQUIRE(Env::Default()->CreateDirs(ckpt).ok());
  testing::WriteFile(JoinPath(ckpt, "ckpt-100"), "in the way\n");
  RunJobOk(job, false);
  const std::string log = ChiefLog(job);
  INFO(log);
  CHECK(log.find("checkpoint step 100 failed, training goes on") != std::string::npos);
  CHECK(log.find("exists and is not a directory") != std::string::npos);
  for (const char* good : {"ckpt-50", "ckpt-150", "ckpt-200"}) {
    INFO(good);
    CHECK(VerifyCheckpoint(Env::Default(), JoinPath(ckpt, good)).empty());
  }
  auto pointer = ReadPointer(Env::Default(), ckpt);
  REQUIRE(pointer.ok());
  CHECK(*pointer == 200);
}

TEST_CASE("an async run checkpoints with pushes held briefly and resumes after kill -9",
          "[checkpoint][async]") {
  const int steps = 1500;
  const std::string dir = testing::FreshTempDir("ckpt_async");
  const std::string ckpt = JoinPath(dir, "ckpt");
  ConfigOptions o = CheckpointOptions(ckpt, steps);
  o.sync = false;
  const Job job = WriteJob(dir, o, 2);
  LaunchAndKillAll(job, dir, [&ckpt] { return ReadPointer(Env::Default(), ckpt).ok(); });
  const std::string first_log = ChiefLog(job);
  INFO(first_log);
  CHECK(first_log.find("cut taken, pushes held at most") != std::string::npos);
  auto latest = LatestGoodCheckpoint(Env::Default(), ckpt, nullptr);
  REQUIRE(latest.ok());
  auto killed_at = ReadManifest(Env::Default(), *latest);
  REQUIRE(killed_at.ok());
  CHECK(killed_at->step() >= 50);
  CHECK(killed_at->step() < steps);
  // A worker that had not pushed yet has no cursor: it starts from the top.
  CHECK(killed_at->cursors_size() >= 1);

  RunJobOk(job, true);
  const std::string log = ChiefLog(job);
  INFO(log);
  CHECK(log.find("resume: from " + *latest) != std::string::npos);
  // The run ends at max_steps with a last checkpoint there, and learned.
  auto last = ReadManifest(Env::Default(), JoinPath(ckpt, CheckpointDirName(steps)));
  REQUIRE(last.ok());
  CHECK(last->cursors_size() == 2);
  CHECK(VerifyCheckpoint(Env::Default(), JoinPath(ckpt, CheckpointDirName(steps))).empty());
  auto summary = Env::Default()->ReadFile(JoinPath(job.out, "summary.json"));
  REQUIRE(summary.ok());
  const nlohmann::json j = nlohmann::json::parse(*summary);
  CHECK(j["global_step"].get<int64_t>() == steps);
  CHECK(j["eval_accuracy"].get<double>() >= 0.85);
}

TEST_CASE("embedding rows and their Adam slots resume bitwise after kill -9, and onto 3 servers",
          "[checkpoint][rows][resume]") {
  auto data = testing::CriteoData("ckpt_ctr_data", {"--train=20000", "--test=2000",
                                                    "--values_per_field=50", "--seed=5"});
  INFO(data.status().message());
  REQUIRE(data.ok());
  const int steps = 400;
  auto options = [&](const std::string& ckpt_dir) {
    ConfigOptions o = testing::ClickThroughOptions(data->first);
    o.batch_size = 64;
    o.learning_rate = 0.003f;
    o.max_steps = steps;
    o.eval_every_steps = 200;
    o.extra += absl::StrCat("\ncheckpoint { dir: \"", ckpt_dir, "\" every_steps: 50 keep: 100 }\n");
    return o;
  };
  // The run never stopped.
  const std::string ref_dir = testing::FreshTempDir("ckpt_ctr_ref");
  const std::string ref_ckpt = JoinPath(ref_dir, "ckpt");
  const Job ref = WriteJob(ref_dir, options(ref_ckpt), 2);
  RunJobOk(ref, false);
  auto m = ReadManifest(Env::Default(), JoinPath(ref_ckpt, CheckpointDirName(steps)));
  REQUIRE(m.ok());
  REQUIRE(m->tables_size() == 1);
  CHECK(m->tables(0).slot_names_size() == 2);
  CHECK(m->rows_size() == 2);  // one entry per server

  // Killed with SIGKILL once it has a checkpoint, then resumed.
  const std::string dir = testing::FreshTempDir("ckpt_ctr_killed");
  const std::string ckpt = JoinPath(dir, "ckpt");
  const Job job = WriteJob(dir, options(ckpt), 2);
  LaunchAndKillAll(job, dir, [&ckpt] { return ReadPointer(Env::Default(), ckpt).ok(); });
  auto latest = LatestGoodCheckpoint(Env::Default(), ckpt, nullptr);
  REQUIRE(latest.ok());
  auto killed_at = ReadManifest(Env::Default(), *latest);
  REQUIRE(killed_at.ok());
  INFO("killed with the latest checkpoint at step " << killed_at->step());
  CHECK(killed_at->step() < steps);  // killed mid-run, not after it
  CHECK(killed_at->rows(0).rows() + killed_at->rows(1).rows() > 100);
  RunJobOk(job, true);
  const std::string log = ChiefLog(job);
  INFO(log);
  CHECK(log.find("resume: from " + *latest) != std::string::npos);
  CHECK(log.find("embedding table features: ") != std::string::npos);
  CHECK(log.find("rows restored with their optimizer state") != std::string::npos);
  CheckSameTables(JoinPath(ckpt, CheckpointDirName(steps)),
                  JoinPath(ref_ckpt, CheckpointDirName(steps)));
  CheckSameCheckpoint(JoinPath(ckpt, CheckpointDirName(steps)),
                      JoinPath(ref_ckpt, CheckpointDirName(steps)));

  // Exported, the table is its rows and their ids, as NumPy reads them.
  const std::string python = PythonWithReaders();
  if (!python.empty()) {
    const std::string out = JoinPath(dir, "export");
    CommandResult e = testing::RunCommand(
        {Binary("tools/pstrain"), "checkpoint", "export",
         JoinPath(ckpt, CheckpointDirName(steps)), "--format=safetensors", "--out=" + out},
        absl::Seconds(60));
    INFO(e.output);
    REQUIRE(e.exit_code == 0);
    auto c = LoadCheckpoint(Env::Default(), JoinPath(ckpt, CheckpointDirName(steps)));
    REQUIRE(c.ok());
    const RestoredTable& t = c->tables.at("features");
    // (Rows in any order: the first of LoadCheckpoint's found by its id.)
    CommandResult py = testing::RunCommand(
        {python, "-c",
         "import sys; import numpy as np; from safetensors.numpy import load_file\n"
         "t = load_file(sys.argv[1]); v, i = t['features'], t['features/ids']\n"
         "k = i.tolist().index(int(sys.argv[2]))\n"
         "print(v.dtype, v.shape, i.dtype, len(set(i.tolist())), '%.9g' % v[k, 0])",
         JoinPath(out, "model.safetensors"), absl::StrCat(t.ids[0])},
        absl::Seconds(60));
    INFO(py.output);
    CHECK(py.exit_code == 0);
    CHECK(py.output.find(absl::StrCat("float32 (", t.ids.size(), ", 16) uint64 ", t.ids.size(),
                                      " ", absl::StrFormat("%.9g", t.values[0]))) !=
          std::string::npos);
  }

  // The reference's step-200 checkpoint resumed on 3 servers: the rows go
  // to their new owners, and the run ends where the 2-server one did.
  const std::string dir3 = testing::FreshTempDir("ckpt_ctr_3");
  const std::string ckpt3 = JoinPath(dir3, "ckpt");
  CopyCheckpoint(ref_ckpt, 200, ckpt3);
  const Job job3 = WriteJob(dir3, options(ckpt3), 3);
  RunJobOk(job3, true);
  auto m3 = ReadManifest(Env::Default(), JoinPath(ckpt3, CheckpointDirName(steps)));
  REQUIRE(m3.ok());
  CHECK(m3->rows_size() == 3);
  CheckSameTables(JoinPath(ckpt3, CheckpointDirName(steps)),
                  JoinPath(ref_ckpt, CheckpointDirName(steps)));
  CheckSameCheckpoint(JoinPath(ckpt3, CheckpointDirName(steps)),
                      JoinPath(ref_ckpt, CheckpointDirName(steps)));
}

TEST_CASE("checkpoint.every_seconds saves on a timer, in sync and in async mode",
          "[checkpoint][timer]") {
  for (const bool sync : {true, false}) {
    INFO((sync ? "sync" : "async"));
    const std::string dir = testing::FreshTempDir(sync ? "ckpt_timer_sync" : "ckpt_timer_async");
    const std::string ckpt = JoinPath(dir, "ckpt");
    // Under the sanitizers 1,000 steps still take well over the timer's 1 s.
    const int steps = testing::SanitizedSteps(3000, 1000);
    ConfigOptions o = CheckpointOptions(ckpt, steps);
    o.sync = sync;
    o.extra = absl::StrCat("checkpoint { dir: \"", ckpt, "\" every_seconds: 1 keep: 100 }\n");
    const Job job = WriteJob(dir, o, 2);
    RunJobOk(job, false);
    const std::string log = ChiefLog(job);
    INFO(log);
    if (sync) CHECK(log.find("since the last one; the servers cut at step ") != std::string::npos);
    auto all = ListCheckpoints(Env::Default(), ckpt);
    REQUIRE(all.ok());
    // The last step's, and at least one the timer asked for on the way.
    REQUIRE(all->size() >= 2);
    CHECK(all->back().step == steps);
    for (const CheckpointInfo& c : *all) {
      INFO(c.path);
      CHECK(c.complete);
      CHECK(VerifyCheckpoint(Env::Default(), c.path).empty());
    }
  }
}

TEST_CASE("a run stopped by SIGTERM saves the steps since its last checkpoint first, and "
          "--resume goes on from there",
          "[checkpoint][signals]") {
  for (const std::string mode : {"sync", "async", "off"}) {
    INFO(mode);
    const std::string dir = testing::FreshTempDir("stop_save_" + mode);
    const std::string ckpt = JoinPath(dir, "ckpt");
    ConfigOptions o = CheckpointOptions(ckpt, 1000000);
    o.sync = mode != "async";
    // No save on the way: a checkpoint now is the stop's.
    o.extra = absl::StrCat("checkpoint { dir: \"", ckpt, "\" every_steps: 1000000",
                           mode == "off" ? " stop_save_seconds: -1" : "", " }\n");
    const Job job = WriteJob(dir, o, 2);
    std::unique_ptr<Subprocess> launch = SpawnLaunch(job, dir);
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    // The first evaluation, at the first step >= 100 the chief sees.
    while (ChiefLog(job).find("eval accuracy") == std::string::npos && absl::Now() < deadline &&
           launch->running()) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    REQUIRE(launch->running());
    const absl::Time signalled = absl::Now();
    launch->Signal(SIGTERM);
    std::optional<int> code = launch->Wait(absl::Seconds(60));
    REQUIRE(code.has_value());
    WARN(mode << ": the launch ended " << absl::FormatDuration(absl::Now() - signalled)
              << " after SIGTERM");
    CHECK(*code == 128 + SIGTERM);
    CHECK(testing::NoProcessesMatching(job.spec, absl::Seconds(10)));
    const std::string log = ChiefLog(job);
    const std::string out = Env::Default()->ReadFile(JoinPath(dir, "launch.out")).value_or("");
    INFO(out << "\n" << log);
    auto all = ListCheckpoints(Env::Default(), ckpt);
    if (mode == "off") {
      CHECK((!all.ok() || all->empty()));
      CHECK(out.find("saves the steps since") == std::string::npos);
      continue;
    }
    CHECK(out.find("received Terminated; the chief saves the steps since its last checkpoint "
                   "first (at most 20s)") != std::string::npos);
    CHECK(log.find("stopping without the save") == std::string::npos);
    REQUIRE(all.ok());
    REQUIRE(all->size() == 1);
    const CheckpointInfo& saved = all->front();
    CHECK(saved.complete);
    CHECK(saved.step >= 100);
    CHECK(VerifyCheckpoint(Env::Default(), saved.path).empty());
    if (mode == "sync") {
      CHECK(NumberAfter(log, "saving the steps since the last checkpoint first, at step ") ==
            saved.step);
    }
    // Resumed, it goes on from the saved step to 20 more.
    ConfigOptions more = o;
    more.max_steps = static_cast<int>(saved.step) + 20;
    const Job resumed = WriteJob(dir, more, 2);
    RunJobOk(resumed, /*resume=*/true);
    const std::string resumed_log = ChiefLog(resumed);
    INFO(resumed_log);
    CHECK(resumed_log.find(absl::StrCat("ckpt-", saved.step)) != std::string::npos);
    CHECK(resumed_log.find("resume: from") != std::string::npos);
  }
}

TEST_CASE("pstrain bench --suites=checkpoint writes, restores and compares with dd",
          "[checkpoint][bench]") {
  const std::string dir = testing::FreshTempDir("ckpt_bench");
  CommandResult r = testing::RunCommand(
      {Binary("tools/pstrain"), "bench", "--suites=checkpoint", "--checkpoint_mib=16",
       "--reps=2", "--out=" + dir},
      absl::Seconds(120));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("== checkpoint: 16 MiB model, 2 shards") != std::string::npos);
  CHECK(r.output.find("x of dd") != std::string::npos);
  auto csv = Env::Default()->ReadFile(JoinPath(dir, "bench.csv"));
  REQUIRE(csv.ok());
  for (const char* what : {"checkpoint,write,", "checkpoint,dd_fsync,", "checkpoint,restore,"}) {
    CHECK(csv->find(what) != std::string::npos);
  }
  // Nothing is left behind in the output directory but the CSV (and a plot).
  auto names = Env::Default()->ListDir(dir);
  REQUIRE(names.ok());
  for (const std::string& n : *names) CHECK((n == "bench.csv" || n == "bench.png"));
}

}  // namespace
}  // namespace pstrain
