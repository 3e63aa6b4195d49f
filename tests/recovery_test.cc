// Recovery of a running job, end to end with the real binaries under
// `pstrain launch --restart=on-failure` on free loopback ports, always
// reaped: a chief, a server or a worker killed with kill -9 (or hung) is
// restarted and the job goes on from its checkpoint, ending bitwise where an
// uninterrupted run does; `pstrain checkpoint restore` rolls a running job
// back, also over mutual TLS. Checkpoints themselves: tests/checkpoint_test.cc.
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

// Under a running `launch`: waits until the pointer of `ckpt` names step
// `min_step` or later, the launch has ended, or 120 s have passed.
void WaitForCheckpoint(const std::string& ckpt, int64_t min_step, Subprocess* launch) {
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (ReadPointer(Env::Default(), ckpt).value_or(0) < min_step && absl::Now() < deadline &&
         launch->running()) {
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// `pstrain checkpoint restore CKPT --cluster_spec=` the job's spec, with the
// secret its launch made where it made one.
CommandResult RestoreWithCli(const std::string& checkpoint, const Job& job,
                             absl::Duration timeout) {
  std::vector<std::string> argv = {Binary("tools/pstrain"), "checkpoint", "restore", checkpoint,
                                   "--cluster_spec=" + job.spec};
  const std::string secret = JoinPath(job.out, "run.secret");
  if (Env::Default()->FileExists(secret)) argv.push_back("--auth_secret_file=" + secret);
  return testing::RunCommand(argv, timeout);
}

// Under a running `launch`: once the pointer of `ckpt` names step `min_step`
// or later (or 120 s pass), kills the one task matching `victim` ("--job=ps
// --task=1") with SIGKILL; then times (up to 60 s) until the chief's log
// holds `line`. *at_kill gets the pointer's step at the kill.
absl::Duration KillAndTime(const Job& job, const std::string& ckpt, Subprocess* launch,
                           int64_t min_step, const std::string& victim, const std::string& line,
                           int64_t* at_kill) {
  WaitForCheckpoint(ckpt, min_step, launch);
  const std::vector<int> pids =
      testing::ProcessesMatching(absl::StrCat("--cluster_spec=", job.spec, " ", victim));
  REQUIRE(pids.size() == 1);
  REQUIRE(::kill(pids[0], SIGKILL) == 0);
  const absl::Time killed = absl::Now();
  auto pointer = ReadPointer(Env::Default(), ckpt);
  REQUIRE(pointer.ok());
  *at_kill = *pointer;
  while (absl::Now() < killed + absl::Seconds(60) && launch->running()) {
    if (ChiefLog(job).find(line) != std::string::npos) return absl::Now() - killed;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::InfiniteDuration();
}

// Waits (up to 180 s) for the launch to end; returns its exit code (none:
// it was stopped) and its output, DIR/launch.out.
std::pair<std::optional<int>, std::string> FinishLaunch(Subprocess* launch,
                                                        const std::string& dir) {
  std::optional<int> code = launch->Wait(absl::Seconds(180));
  if (!code.has_value()) launch->Stop(absl::Seconds(5));
  return {code, Env::Default()->ReadFile(JoinPath(dir, "launch.out")).value_or("")};
}

// The chief's log line of a rollback: "rolled back to step N in S s (why)".
const char kRolledBack[] = "rolled back to step ";

// Checks that both workers of `job` followed one rollback to `step`, each
// in its own process: the launcher (its output `out`) restarted neither.
void CheckWorkersFollowed(const Job& job, const std::string& out, int64_t step) {
  for (int w = 0; w < 2; ++w) {
    const std::string wl = Env::Default()
                               ->ReadFile(JoinPath(job.out, absl::StrCat("logs/worker-", w, ".log")))
                               .value_or("");
    // Its warnings and errors first: why it did not follow, if it did not.
    std::string said;
    for (absl::string_view line : absl::StrSplit(wl, '\n')) {
      if (absl::StrContains(line, " W ") || absl::StrContains(line, " E ")) {
        absl::StrAppend(&said, line, "\n");
      }
    }
    INFO("worker " << w << " warned: " << said);
    CHECK(out.find(absl::StrCat("worker:", w, " exited")) == std::string::npos);
    INFO("worker " << w << ": " << wl);
    CHECK(wl.find(absl::StrCat("the job was rolled back to step ", step)) != std::string::npos);
    CHECK(wl.find("1 rollback(s) followed") != std::string::npos);
  }
}

// Task `task` ("ps:1") killed with kill -9 under `launch
// --restart=on-failure` once the checkpoint of `min_step` exists (a sync
// 1,500-step run, 800 under the sanitizers, with Adam, 2 ps + 2 workers):
// the launcher restarts it
// alone (its output has `restarted`, the chief's log `chief_says` and
// `chief_starts` starts), every server goes back to the newest checkpoint
// complete at the kill (or one committed in the instant after; the step
// after `resumed_line` in the chief's log), the workers follow, nothing else
// restarts, and the run ends bitwise as one never interrupted. Returns the
// step gone back to; *at_kill and *elapsed (the kill to `resumed_line`) are
// for the figures. `options` makes the job's config (checkpoints in its
// first argument, its second the steps; null: CheckpointOptions).
using OptionsMaker = std::function<ConfigOptions(const std::string&, int)>;
int64_t KillAloneAndCheck(const std::string& name, const std::string& task, int64_t min_step,
                          const std::string& restarted, const std::string& chief_says,
                          int chief_starts, const std::string& resumed_line, int64_t* at_kill,
                          absl::Duration* elapsed, OptionsMaker options = nullptr) {
  if (options == nullptr) options = testing::CheckpointOptions;
  const std::string victim = absl::StrCat("--job=", task.substr(0, task.find(':')),
                                          " --task=", task.substr(task.find(':') + 1));
  const int steps = testing::SanitizedSteps(1500, 800);  // min_step is 200 or 300
  const std::string dir = testing::FreshTempDir(name);
  const std::string ckpt = JoinPath(dir, "ckpt");
  const Job job = WriteJob(dir, options(ckpt, steps), 2);
  std::unique_ptr<Subprocess> launch = SpawnLaunch(job, dir, {"--restart=on-failure"});
  *elapsed = KillAndTime(job, ckpt, launch.get(), min_step, victim, resumed_line, at_kill);
  const auto [code, out] = FinishLaunch(launch.get(), dir);
  INFO(out);
  const std::string log = ChiefLog(job);  // every start: logs are appended on a restart
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(out.find(task + " exited with code 137") != std::string::npos);
  CHECK(out.find(restarted) != std::string::npos);
  CHECK(out.find("restarting the job") == std::string::npos);  // nothing else restarted
  CHECK(log.find(chief_says) != std::string::npos);
  int starts = 0;
  for (size_t at = log.find("chief listening on"); at != std::string::npos;
       at = log.find("chief listening on", at + 1)) {
    ++starts;
  }
  CHECK(starts == chief_starts);
  const int64_t back_to = NumberAfter(log, resumed_line);
  REQUIRE(back_to >= 0);
  CHECK(back_to >= *at_kill);
  CHECK(back_to < steps);
  CheckWorkersFollowed(job, out, back_to);
  auto summary = Env::Default()->ReadFile(JoinPath(job.out, "summary.json"));
  REQUIRE(summary.ok());
  const nlohmann::json j = nlohmann::json::parse(*summary);
  CHECK(j["global_step"].get<int64_t>() == steps);
  // Back from the checkpoint's values, slots, step and cursors: the run
  // ends where one never interrupted does.
  const std::string ref_dir = testing::FreshTempDir(name + "_ref");
  const Job ref = WriteJob(ref_dir, options(JoinPath(ref_dir, "ckpt"), steps), 2);
  RunJobOk(ref, false);
  CheckSameModel(FinalModel(job), FinalModel(ref));
  CHECK(testing::NoProcessesMatching(job.spec, absl::Seconds(10)));
  return back_to;
}

TEST_CASE("--restart=on-failure: a chief killed with kill -9 is restarted alone and takes the "
          "job over from its latest checkpoint; the others wait for it, and a sync run ends "
          "bitwise as if never killed",
          "[checkpoint][recovery]") {
  int64_t at_kill = -1;
  absl::Duration elapsed;
  const int64_t back_to = KillAloneAndCheck(
      "chief_takeover", "chief:0", 200,
      "restarting it alone, the others wait for it to take the job over from the latest "
      "checkpoint (restart 1 of 3)",
      "parameter server(s) still serve the run", 2, "from the checkpoint of step ", &at_kill,
      &elapsed);
  WARN("killed the chief after ckpt-" << at_kill << ": the restarted one took the job over from "
                                      << "step " << back_to << ", "
                                      << absl::FormatDuration(elapsed)
                                      << " from the kill to the variables restored");
}

TEST_CASE("--restart=on-failure: a server killed with kill -9 is restarted alone, every server "
          "rolls back to the latest checkpoint, the workers follow, and a sync run ends bitwise "
          "as if never killed",
          "[checkpoint][recovery]") {
  int64_t at_kill = -1;
  absl::Duration elapsed;
  const int64_t back_to = KillAloneAndCheck(
      "ps_rollback", "ps:1", 300,
      "restarting it alone, the others go on from the latest checkpoint (restart 1 of 3)",
      "ps:1 restarted and lost its partitions", 1, kRolledBack, &at_kill, &elapsed);
  WARN("killed ps:1 after ckpt-" << at_kill << ": every server rolled back to step " << back_to
                                 << ", " << absl::FormatDuration(elapsed)
                                 << " from the kill to the variables restored");
}

TEST_CASE("--restart=on-failure: a server killed while it moves rows of a table held 10% in "
          "memory to and from its disk recovers from the checkpoint, and a sync run ends "
          "bitwise as if never killed",
          "[checkpoint][recovery][tier]") {
  // 5,200 ids on 2 servers, rows of 16 floats with Adam's slots (192
  // bytes): 260 of each server's 2,600 in memory, so every step moves rows.
  auto data = testing::CriteoData("tier_recovery_data", {"--train=20000", "--test=2000",
                                                         "--values_per_field=200", "--seed=7"});
  INFO(data.status().message());
  REQUIRE(data.ok());
  const std::string data_dir = data->first;
  OptionsMaker tiered = [data_dir](const std::string& ckpt, int steps) {
    ConfigOptions o = testing::ClickThroughOptions(data_dir);
    o.max_steps = steps;
    o.batch_size = 64;
    o.learning_rate = 0.003f;
    o.eval_every_steps = 500;
    o.extra = absl::StrCat(
        "embedding_tables { name: \"features\" dim: 16 memory_budget_bytes: 49920 }\n"
        "checkpoint { dir: \"", ckpt, "\" every_steps: 50 keep: 100 full_every: 3 }\n");
    return o;
  };
  int64_t at_kill = -1;
  absl::Duration elapsed;
  const int64_t back_to = KillAloneAndCheck(
      "tier_rollback", "ps:1", 300,
      "restarting it alone, the others go on from the latest checkpoint (restart 1 of 3)",
      "ps:1 restarted and lost its partitions", 1, kRolledBack, &at_kill, &elapsed, tiered);
  WARN("killed ps:1 (a table mostly on disk) after ckpt-" << at_kill << ": rolled back to step "
                                                          << back_to << " in "
                                                          << absl::FormatDuration(elapsed));
}

TEST_CASE("a chief restarted once its servers finished the run ends it from there, without "
          "waiting for workers that are gone",
          "[checkpoint][recovery]") {
  // A finished run, and its checkpoint of the last step.
  const int steps = 200;
  const std::string dir = testing::FreshTempDir("adopt_finished");
  const Job job = WriteJob(dir, CheckpointOptions(JoinPath(dir, "ckpt"), steps), 2);
  RunJobOk(job, false);
  const TensorMap want = FinalModel(job);
  REQUIRE(Env::Default()->DeleteFile(JoinPath(job.out, "model_final.pst")).ok());
  // Its servers again, and a chief that resumes them at the last step and
  // then waits for its workers (step_timeout, 30 s), which never come:
  // killed there, it leaves servers that serve a finished run.
  std::vector<std::unique_ptr<Subprocess>> servers;
  for (int s = 0; s < 2; ++s) {
    SpawnOptions so;
    so.argv = {Binary("ps_server/ps_server"), "--cluster_spec=" + job.spec, "--job=ps",
               absl::StrCat("--task=", s), "--config=" + job.config};
    so.output_file = JoinPath(dir, absl::StrCat("ps", s, ".log"));
    auto p = Subprocess::Spawn(so);
    REQUIRE(p.ok());
    servers.push_back(std::move(*p));
  }
  auto start_chief = [&](const std::string& log) {
    SpawnOptions so;
    so.argv = {Binary("chief/chief"), "--cluster_spec=" + job.spec, "--config=" + job.config,
               "--resume"};
    so.output_file = JoinPath(dir, log);
    auto p = Subprocess::Spawn(so);
    REQUIRE(p.ok());
    return std::move(*p);
  };
  std::unique_ptr<Subprocess> first = start_chief("chief-a.log");
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (Env::Default()->ReadFile(JoinPath(dir, "chief-a.log")).value_or("").find(
             "from the checkpoint of step 200") == std::string::npos &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  first->Signal(SIGKILL);
  REQUIRE(first->Wait(absl::Seconds(10)).has_value());
  // The restarted chief finds every server at the last step: it evaluates,
  // writes the model and ends the servers, with no worker and no wait.
  const absl::Time t0 = absl::Now();
  std::unique_ptr<Subprocess> second = start_chief("chief-b.log");
  const std::optional<int> code = second->Wait(absl::Seconds(60));
  const absl::Duration took = absl::Now() - t0;
  const std::string log = Env::Default()->ReadFile(JoinPath(dir, "chief-b.log")).value_or("");
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(took < absl::Seconds(20));
  CHECK(log.find("the parameter servers already finished the run") != std::string::npos);
  CHECK(log.find("training finished at step 200") != std::string::npos);
  CheckSameModel(FinalModel(job), want);
  for (auto& p : servers) {
    const std::optional<int> ended = p->Wait(absl::Seconds(20));
    CHECK(ended.has_value());
    if (!ended.has_value()) p->Stop(absl::Seconds(5));
  }
  WARN("a chief restarted over finished servers ended the run in " << absl::FormatDuration(took));
}

TEST_CASE("--restart=on-failure: a hung server fails the chief, which restarts the whole job "
          "from its latest checkpoint, and it finishes",
          "[checkpoint][recovery]") {
  const int steps = 1500;
  const std::string dir = testing::FreshTempDir("hung_server");
  const std::string ckpt = JoinPath(dir, "ckpt");
  ConfigOptions o = CheckpointOptions(ckpt, steps);
  o.rpc_timeout_ms = 1000;
  o.startup_timeout_ms = 4000;
  const Job job = WriteJob(dir, o, 2);
  std::unique_ptr<Subprocess> launch = SpawnLaunch(job, dir, {"--restart=on-failure"});
  WaitForCheckpoint(ckpt, 200, launch.get());
  // Stopped, not dead: it holds its port and answers nothing. Restarting
  // the chief alone could not help; the job's restart replaces the server.
  const std::vector<int> pids =
      testing::ProcessesMatching(absl::StrCat("--cluster_spec=", job.spec, " --job=ps --task=1"));
  REQUIRE(pids.size() == 1);
  REQUIRE(::kill(pids[0], SIGSTOP) == 0);
  const auto [code, out] = FinishLaunch(launch.get(), dir);
  INFO(out);
  const std::string log = ChiefLog(job);
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(log.find("ps:1 has not answered for 4s (rpc.startup_timeout_ms): it is gone") !=
        std::string::npos);
  CHECK(out.find("chief:0 exited with code 1") != std::string::npos);
  CHECK(out.find("restarting the job from its latest checkpoint in 1s (restart 1 of 3)") !=
        std::string::npos);
  CHECK(out.find("restarting it alone") == std::string::npos);
  CHECK(NumberAfter(log, "from the checkpoint of step ") >= 200);
  auto summary = Env::Default()->ReadFile(JoinPath(job.out, "summary.json"));
  REQUIRE(summary.ok());
  const nlohmann::json j = nlohmann::json::parse(*summary);
  CHECK(j["global_step"].get<int64_t>() == steps);
  CHECK(j["eval_accuracy"].get<double>() >= 0.85);
  CHECK(testing::NoProcessesMatching(job.spec, absl::Seconds(10)));
}

TEST_CASE("pstrain checkpoint restore rolls a running job back to a checkpoint; it ends bitwise "
          "as if never rolled back, and a damaged checkpoint changes nothing",
          "[checkpoint][recovery]") {
  const int steps = 1500;
  const std::string dir = testing::FreshTempDir("cli_restore");
  const std::string ckpt = JoinPath(dir, "ckpt");
  const Job job = WriteJob(dir, CheckpointOptions(ckpt, steps), 2);
  // Without a running chief: a clear failure.
  CommandResult none = RestoreWithCli(JoinPath(ckpt, "ckpt-200"), job, absl::Seconds(60));
  CHECK(none.exit_code != 0);
  std::unique_ptr<Subprocess> launch = SpawnLaunch(job, dir);
  WaitForCheckpoint(ckpt, 400, launch.get());
  // A damaged copy of ckpt-100 is refused before the chief is asked.
  const std::string bad_dir = testing::FreshTempDir("cli_restore_bad");
  CopyCheckpoint(ckpt, 100, bad_dir);
  const std::string bad = JoinPath(bad_dir, "ckpt-100");
  {
    auto manifest = ReadManifest(Env::Default(), bad);
    REQUIRE(manifest.ok());
    const std::string shard = JoinPath(bad, manifest->shards(0).file());
    auto bytes = Env::Default()->ReadFile(shard);
    REQUIRE(bytes.ok());
    std::string damaged = *bytes;
    damaged[damaged.size() / 2] ^= 0x40;
    REQUIRE(Env::Default()->WriteFile(shard, damaged, false).ok());
  }
  CommandResult refused = RestoreWithCli(bad, job, absl::Seconds(60));
  INFO(refused.output);
  CHECK(refused.exit_code == 1);
  CHECK(refused.output.find("is not a good checkpoint; nothing changed") != std::string::npos);
  // ckpt-200 of this run, restored from a copy elsewhere (the chief reads
  // the path it is given).
  const std::string copy_dir = testing::FreshTempDir("cli_restore_copy");
  CopyCheckpoint(ckpt, 200, copy_dir);
  // The run signs its calls with a secret of its own: a restore without it
  // is refused, naming where the secret is, and changes nothing.
  CommandResult unsigned_restore = testing::RunCommand(
      {Binary("tools/pstrain"), "checkpoint", "restore", JoinPath(copy_dir, "ckpt-200"),
       "--cluster_spec=" + job.spec},
      absl::Seconds(60));
  INFO(unsigned_restore.output);
  CHECK(unsigned_restore.exit_code == 1);
  CHECK(unsigned_restore.output.find("unauthenticated") != std::string::npos);
  CHECK(unsigned_restore.output.find("the run.secret pstrain launch writes in the "
                                     "output_dir") != std::string::npos);
  CommandResult restored =
      RestoreWithCli(JoinPath(copy_dir, "ckpt-200"), job, absl::Seconds(120));
  INFO(restored.output);
  REQUIRE(restored.exit_code == 0);
  CHECK(restored.output.find("rolled the job back to step 200 from") != std::string::npos);
  const auto [code, out] = FinishLaunch(launch.get(), dir);
  INFO(out);
  const std::string log = ChiefLog(job);
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(log.find("an operator's restore of ") != std::string::npos);
  CHECK(NumberAfter(log, kRolledBack) == 200);
  // The checkpoints past 200 at the restore were set aside, and written
  // again by the new timeline.
  CHECK(Env::Default()->IsDirectory(JoinPath(ckpt, "ckpt-400.rolled-back")));
  auto latest = ReadPointer(Env::Default(), ckpt);
  REQUIRE(latest.ok());
  CHECK(*latest == steps);
  const nlohmann::json j =
      nlohmann::json::parse(Env::Default()->ReadFile(JoinPath(job.out, "summary.json")).value_or("{}"));
  CHECK(j["global_step"].get<int64_t>() == steps);
  // A deliberate restore is no fault: pushes of the replaced incarnation,
  // refused until their workers follow it, are said once per worker at
  // INFO, not warned about call by call.
  for (int s = 0; s < 2; ++s) {
    const std::string ps_log =
        Env::Default()->ReadFile(JoinPath(job.out, absl::StrCat("logs/ps-", s, ".log")))
            .value_or("");
    INFO(ps_log);
    CHECK(ps_log.find("refused: FAILED_PRECONDITION") == std::string::npos);
    int said = 0;
    for (size_t at = 0; (at = ps_log.find("which a rollback or restore replaced", at)) !=
                        std::string::npos;
         ++at) {
      ++said;
    }
    CHECK(said <= 2);
  }
  // Sync training from step 200's values, slots and cursors replays the
  // same steps: the model ends where a run never rolled back does.
  const std::string ref_dir = testing::FreshTempDir("cli_restore_ref");
  const Job ref = WriteJob(ref_dir, CheckpointOptions(JoinPath(ref_dir, "ckpt"), steps), 2);
  RunJobOk(ref, false);
  CheckSameModel(FinalModel(job), FinalModel(ref));
  CHECK(testing::NoProcessesMatching(job.spec, absl::Seconds(10)));
}

TEST_CASE("over mutual TLS, pstrain checkpoint restore rolls a running job back as the "
          "operator; once the operator's certificate is revoked the CLI refuses to call",
          "[checkpoint][recovery][tls]") {
  const int steps = 1000;
  const std::string dir = testing::FreshTempDir("tls_restore");
  const std::string ckpt = JoinPath(dir, "ckpt");
  const Job job = WriteJob(dir, CheckpointOptions(ckpt, steps), 2);
  testing::UseMutualTls(dir, job.spec);
  std::unique_ptr<Subprocess> launch = SpawnLaunch(job, dir);
  WaitForCheckpoint(ckpt, 200, launch.get());
  // The job still runs, past a committed checkpoint to roll back to: the
  // first one committed (ckpt-50 unless its commit failed under load).
  int64_t back = 0;
  {
    INFO(Env::Default()->ReadFile(JoinPath(dir, "launch.out")).value_or("") << ChiefLog(job));
    REQUIRE(launch->running());
    REQUIRE(ReadPointer(Env::Default(), ckpt).value_or(0) >= 200);
    auto all = ListCheckpoints(Env::Default(), ckpt);
    REQUIRE(all.ok());
    const auto first = std::find_if(all->begin(), all->end(),
                                    [](const CheckpointInfo& c) { return c.complete; });
    REQUIRE(first != all->end());
    back = first->step;
    REQUIRE(back > 0);
    REQUIRE(back < 200);
  }
  // The CLI calls the chief with the operator's certificate from the spec's
  // TLS directory; the chief lets the operator, and only it, roll back.
  const std::string back_dir = JoinPath(ckpt, absl::StrCat("ckpt-", back));
  CommandResult restored = RestoreWithCli(back_dir, job, absl::Seconds(120));
  INFO(restored.output);
  REQUIRE(restored.exit_code == 0);
  CHECK(restored.output.find(absl::StrCat("rolled the job back to step ", back, " from")) !=
        std::string::npos);
  const auto [code, out] = FinishLaunch(launch.get(), dir);
  INFO(out);
  const std::string log = ChiefLog(job);
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(log.find("mutual TLS on") != std::string::npos);
  // One rollback, the operator's.
  CHECK(NumberAfter(log, kRolledBack) == back);
  CHECK(log.find(kRolledBack, log.find(kRolledBack) + 1) == std::string::npos);
  CHECK(log.find("an operator's restore of ") != std::string::npos);
  CheckWorkersFollowed(job, out, back);
  const nlohmann::json j = nlohmann::json::parse(
      Env::Default()->ReadFile(JoinPath(job.out, "summary.json")).value_or("{}"));
  CHECK(j["global_step"].get<int64_t>() == steps);
  CHECK(testing::NoProcessesMatching(job.spec, absl::Seconds(10)));
  // Revoked (after the run: the launcher too calls the chief as the
  // operator), the CLI no longer has a certificate to call with, and says so.
  CommandResult revoke = testing::RunCommand(
      {Binary("tools/pstrain"), "certs", "--out", JoinPath(dir, "tls"), "--revoke=operator"},
      absl::Seconds(30));
  INFO(revoke.output);
  REQUIRE(revoke.exit_code == 0);
  CommandResult refused = RestoreWithCli(back_dir, job, absl::Seconds(60));
  INFO(refused.output);
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("pstrain checkpoint restore: TLS: ") != std::string::npos);
  CHECK(refused.output.find("revoked") != std::string::npos);
}

TEST_CASE("--restart=on-failure: a worker killed mid-run is restarted alone and goes on where "
          "its data stood, in async and in sync mode; sync ends bitwise as if never killed",
          "[checkpoint][recovery]") {
  for (const bool sync : {false, true}) {
    INFO((sync ? "sync" : "async"));
    // Under the sanitizers 2,000 async: after the kill at step 600, the async
    // run still has time for two restarts (each a slow start there) before it
    // ends. A sync run waits for its restarted worker, so 1,000 leave room
    // for the kill (it rejoined at step 612 under TSan), and the reference
    // run below is as short.
    const int steps = testing::SanitizedSteps(3000, sync ? 1000 : 2000);
    const std::string dir = testing::FreshTempDir(sync ? "rejoin_sync" : "rejoin_async");
    ConfigOptions o = CheckpointOptions(JoinPath(dir, "ckpt"), steps);
    o.sync = sync;
    const Job job = WriteJob(dir, o, 2);
    std::unique_ptr<Subprocess> launch = SpawnLaunch(job, dir, {"--restart=on-failure"});
    // Kill worker 1 once the run is well under way (a checkpoint of step 600
    // or later: async checkpoints cut at whatever step they are asked at).
    WaitForCheckpoint(JoinPath(dir, "ckpt"), 600, launch.get());
    const std::vector<int> pids = testing::ProcessesMatching(
        absl::StrCat("--cluster_spec=", job.spec, " --job=worker --task=1"));
    REQUIRE(pids.size() == 1);
    REQUIRE(::kill(pids[0], SIGKILL) == 0);
    const absl::Time killed = absl::Now();
    const std::string w1_log = JoinPath(job.out, "logs/worker-1.log");
    if (sync) {
      // Timed until the restarted worker has rejoined (its cursor restored).
      while (Env::Default()->ReadFile(w1_log).value_or("").find("rejoined the running job") ==
                 std::string::npos &&
             absl::Now() < killed + absl::Seconds(60) && launch->running()) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      WARN("sync: worker 1 killed; " << absl::FormatDuration(absl::Now() - killed)
                                     << " from the kill to its restarted process rejoining");
    }
    if (!sync) {
      // Once it has rejoined, kill it again: the second restart waits 1 s.
      const absl::Time again = absl::Now() + absl::Seconds(30);
      while (Env::Default()->ReadFile(w1_log).value_or("").find("rejoined the running job") ==
                 std::string::npos &&
             absl::Now() < again && launch->running()) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      const std::vector<int> second = testing::ProcessesMatching(
          absl::StrCat("--cluster_spec=", job.spec, " --job=worker --task=1"));
      REQUIRE(second.size() == 1);
      REQUIRE(::kill(second[0], SIGKILL) == 0);
    }
    const auto [code, out] = FinishLaunch(launch.get(), dir);
    INFO(out);
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    CHECK(out.find("worker:1 exited with code 137") != std::string::npos);
    CHECK(out.find("restarting it alone, the others go on (restart 1 of 3)") !=
          std::string::npos);
    if (!sync) {
      CHECK(out.find("restarting it alone in 1s, the others go on (restart 2 of 3)") !=
            std::string::npos);
      CHECK(ChiefLog(job).find("worker 1 registered again (restart 2)") != std::string::npos);
    }
    CHECK(out.find("restarting the job") == std::string::npos);  // the others went on
    CHECK(ChiefLog(job).find("worker 1 registered again (restart 1)") != std::string::npos);
    CHECK(ChiefLog(job).find("from the checkpoint of step") == std::string::npos);

    auto log = [&](int w) {
      return Env::Default()
          ->ReadFile(JoinPath(job.out, absl::StrCat("logs/worker-", w, ".log")))
          .value_or("");
    };
    const std::string w1 = log(1);
    INFO(w1);
    const std::string rejoined = "rejoined the running job after a restart (session 1): ";
    REQUIRE(w1.find(rejoined) != std::string::npos);
    const int64_t epoch = NumberAfter(w1, "data goes on at epoch ");
    const int64_t position =
        NumberAfter(w1, "data goes on at epoch " + std::to_string(epoch) + ", position ");
    // The data went on from the servers' cursor, not from the start.
    CHECK(epoch * 1000000 + position > 0);
    const int64_t w1_after = NumberAfter(w1, "done after ");
    const int64_t w0 = NumberAfter(log(0), "done after ");
    REQUIRE(w1_after > 0);
    REQUIRE(w0 > 0);
    auto summary = Env::Default()->ReadFile(JoinPath(job.out, "summary.json"));
    REQUIRE(summary.ok());
    const nlohmann::json j = nlohmann::json::parse(*summary);
    CHECK(j["global_step"].get<int64_t>() == steps);
    CHECK(j["eval_accuracy"].get<double>() >= 0.85);
    if (!sync) {
      // Every step is one push, applied once: worker 0's steps, worker 1's
      // before the kill (the servers' count) and after it add up to the run,
      // within one push per kill (a push a kill cut off between the two
      // servers counts on one only; the worker was killed twice).
      // (Its second restart's count: the servers count all of its pushes.)
      const int64_t before = NumberAfter(
          w1, "rejoined the running job after a restart (session 2): ", /*last=*/true);
      REQUIRE(before > 0);
      CHECK(std::abs(w0 + before + w1_after - steps) <= 2);
      // The chief counts the first process's steps too.
      CHECK(std::abs(j["worker_steps"].get<int64_t>() - steps) <= 2);
      WARN("async: worker 1 killed twice, after " << before << " pushes in all; rejoined first "
           << "at epoch " << epoch << ", position " << position << "; then " << w1_after
           << " steps, worker 0 " << w0);
    } else {
      const int64_t at = NumberAfter(w1, rejoined + "at step ");
      REQUIRE(at > 0);
      CHECK(w0 == steps);  // every step had both workers' gradients
      CHECK(w1_after == steps - at);
      // The chief's count of worker steps lags only by the reports the
      // killed process did not make (one every 10 steps).
      CHECK(j["worker_steps"].get<int64_t>() <= 2 * steps);
      CHECK(j["worker_steps"].get<int64_t>() >= 2 * steps - 10);
      WARN("sync: worker 1 rejoined at step " << at << ", epoch " << epoch << ", position "
                                              << position);
      // The restarted worker recomputed the open step from the same batch and
      // parameters: the run ends as one never interrupted. (Unless the kill
      // fell between two servers completing the step: the worker says so.)
      if (w1.find("the servers are at steps") != std::string::npos) {
        WARN("the kill fell between the servers' completions of a step: not compared bitwise");
      } else {
        const std::string ref_dir = testing::FreshTempDir("rejoin_sync_ref");
        ConfigOptions ro = CheckpointOptions(JoinPath(ref_dir, "ckpt"), steps);
        const Job ref = WriteJob(ref_dir, ro, 2);
        RunJobOk(ref, false);
        CheckSameModel(FinalModel(job), FinalModel(ref));
      }
    }
    CHECK(testing::NoProcessesMatching(job.spec, absl::Seconds(10)));
  }
}

}  // namespace
}  // namespace pstrain
