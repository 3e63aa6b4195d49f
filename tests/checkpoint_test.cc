// Checkpoints end to end: the real chief, ps_server and worker binaries under
// `pstrain launch` on free loopback ports, always reaped. A resumed sync run
// ends bitwise where a run never stopped does, after kill -9 on every
// process, onto another number of servers, and past a damaged checkpoint.
#include <signal.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/checkpoint.h"
#include "common/env.h"
#include "common/subprocess.h"
#include "common/tensor_file.h"
#include "tests/cluster_testlib.h"

namespace pstrain {
namespace {

using testing::Binary;
using testing::BinDir;
using testing::CommandResult;
using testing::ConfigOptions;

// Adam (two slots per element), checkpoints every 50 steps, all kept.
ConfigOptions CheckpointOptions(const std::string& ckpt_dir, int max_steps) {
  ConfigOptions o;
  o.max_steps = max_steps;
  o.learning_rate = 0.003f;
  o.optimizer = "adam {}";
  o.eval_every_steps = 100;
  o.extra = absl::StrCat("checkpoint { dir: \"", ckpt_dir, "\" every_steps: 50 keep: 100 }\n");
  return o;
}

struct Job {
  std::string spec;
  std::string config;
  std::string out;
};

Job WriteJob(const std::string& dir, ConfigOptions o, int ps) {
  Job job;
  job.spec = testing::WriteClusterSpec(dir, ps, 2);
  job.out = JoinPath(dir, "out");
  o.output_dir = job.out;
  job.config = testing::WriteFile(JoinPath(dir, "train.pbtxt"), testing::ConfigText(o));
  return job;
}

CommandResult RunJob(const Job& job, bool resume) {
  std::vector<std::string> argv = {Binary("tools/pstrain"), "launch", "--cluster_spec", job.spec,
                                   "--config", job.config, "--bin_dir", BinDir(),
                                   "--progress=false"};
  if (resume) argv.push_back("--resume");
  return testing::RunCommand(argv, absl::Seconds(180));
}

std::string ChiefLog(const Job& job) {
  return Env::Default()->ReadFile(JoinPath(JoinPath(job.out, "logs"), "chief-0.log")).value_or("");
}

TensorMap FinalModel(const Job& job) {
  auto m = ReadTensorFile(Env::Default(), JoinPath(job.out, "model_final.pst"));
  REQUIRE(m.ok());
  return *m;
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Values, slots and update counts of two checkpoints, variable by variable.
void CheckSameCheckpoint(const std::string& got_dir, const std::string& want_dir) {
  auto got = LoadCheckpoint(Env::Default(), got_dir);
  auto want = LoadCheckpoint(Env::Default(), want_dir);
  REQUIRE(got.ok());
  REQUIRE(want.ok());
  CHECK(got->manifest.step() == want->manifest.step());
  REQUIRE(got->variables.size() == want->variables.size());
  REQUIRE(got->manifest.slot_names_size() == 2);  // Adam's m and v
  for (const auto& [name, w] : want->variables) {
    INFO(name);
    REQUIRE(got->variables.count(name) == 1);
    const RestoredVariable& g = got->variables.at(name);
    CHECK(g.shape == w.shape);
    CHECK(BitwiseEqual(g.values, w.values));
    REQUIRE(g.slots.size() == w.slots.size());
    for (size_t s = 0; s < w.slots.size(); ++s) CHECK(BitwiseEqual(g.slots[s], w.slots[s]));
    CHECK(g.updates == w.updates);
  }
}

void CopyCheckpoint(const std::string& from_dir, int64_t step, const std::string& to_dir) {
  const std::string from = JoinPath(from_dir, CheckpointDirName(step));
  const std::string to = JoinPath(to_dir, CheckpointDirName(step));
  REQUIRE(Env::Default()->CreateDirs(to).ok());
  auto files = Env::Default()->ListDir(from);
  REQUIRE(files.ok());
  for (const std::string& f : *files) {
    auto bytes = Env::Default()->ReadFile(JoinPath(from, f));
    REQUIRE(bytes.ok());
    REQUIRE(Env::Default()->WriteFile(JoinPath(to, f), *bytes, false).ok());
  }
}

TEST_CASE("a sync run killed with kill -9 on every process resumes to bitwise the same model",
          "[checkpoint][resume]") {
  const int steps = 1500;
  // The run never stopped.
  const std::string ref_dir = testing::FreshTempDir("ckpt_ref");
  const Job ref = WriteJob(ref_dir, CheckpointOptions(JoinPath(ref_dir, "ckpt"), steps), 2);
  CommandResult r = RunJob(ref, false);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);

  // The same job, every process killed with SIGKILL once it has checkpoints.
  const std::string dir = testing::FreshTempDir("ckpt_killed");
  const std::string ckpt = JoinPath(dir, "ckpt");
  const Job job = WriteJob(dir, CheckpointOptions(ckpt, steps), 2);
  SpawnOptions so;
  so.argv = {Binary("tools/pstrain"), "launch", "--cluster_spec", job.spec, "--config",
             job.config, "--bin_dir", BinDir(), "--progress=false"};
  so.output_file = JoinPath(dir, "launch.out");
  auto launch = Subprocess::Spawn(so);
  REQUIRE(launch.ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (!Env::Default()->FileExists(JoinPath(JoinPath(ckpt, "ckpt-200"), kManifestFile)) &&
         absl::Now() < deadline && (*launch)->running()) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  for (int pid : testing::ProcessesMatching(job.spec)) ::kill(pid, SIGKILL);
  REQUIRE((*launch)->Wait(absl::Seconds(30)).has_value());
  CHECK(testing::ProcessesMatching(job.spec).empty());
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

  CommandResult resumed = RunJob(job, true);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(ChiefLog(job).find("resume: from " + *latest) != std::string::npos);
  const TensorMap want = FinalModel(ref), got = FinalModel(job);
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    CHECK(BitwiseEqual(got.at(name).values(), t.values()));
  }
  CheckSameCheckpoint(JoinPath(ckpt, CheckpointDirName(steps)),
                      JoinPath(JoinPath(ref_dir, "ckpt"), CheckpointDirName(steps)));
}

TEST_CASE("a checkpoint of 2 servers resumes onto 3, and one of 3 onto 1, values and slots "
          "bitwise",
          "[checkpoint][reshard]") {
  // The reference: 2 servers from 0 to 250, every checkpoint kept.
  const std::string ref_dir = testing::FreshTempDir("reshard_ref");
  const std::string ref_ckpt = JoinPath(ref_dir, "ckpt");
  const Job ref = WriteJob(ref_dir, CheckpointOptions(ref_ckpt, 250), 2);
  CommandResult r = RunJob(ref, false);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);

  // 2 -> 3: its step-100 checkpoint alone, resumed on 3 servers to step 200.
  const std::string dir3 = testing::FreshTempDir("reshard_3");
  const std::string ckpt3 = JoinPath(dir3, "ckpt");
  CopyCheckpoint(ref_ckpt, 100, ckpt3);
  const Job job3 = WriteJob(dir3, CheckpointOptions(ckpt3, 200), 3);
  CommandResult r3 = RunJob(job3, true);
  INFO(r3.output);
  REQUIRE(r3.exit_code == 0);
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
  CommandResult r1 = RunJob(job1, true);
  INFO(r1.output);
  REQUIRE(r1.exit_code == 0);
  CHECK(ChiefLog(job1).find("(step 200, 3 shard(s) written, 1 now") != std::string::npos);
  CheckSameCheckpoint(JoinPath(ckpt1, "ckpt-250"), JoinPath(ref_ckpt, "ckpt-250"));
}

TEST_CASE("a damaged newest checkpoint is skipped, named in the log, and the previous one resumes",
          "[checkpoint][faults]") {
  const std::string dir = testing::FreshTempDir("ckpt_damaged");
  const std::string ckpt = JoinPath(dir, "ckpt");
  const Job job = WriteJob(dir, CheckpointOptions(ckpt, 150), 2);
  CommandResult r = RunJob(job, false);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
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
  CommandResult resumed = RunJob(job, true);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const std::string log = ChiefLog(job);
  INFO(log);
  CHECK(log.find("resume: skipping ckpt-200: ") != std::string::npos);
  CHECK(log.find("resume: skipping ckpt-150: ") != std::string::npos);
  CHECK(log.find("CRC32C mismatch") != std::string::npos);
  CHECK(log.find("resume: from " + JoinPath(ckpt, "ckpt-100")) != std::string::npos);
  const TensorMap got = FinalModel(job);
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    CHECK(BitwiseEqual(got.at(name).values(), t.values()));
  }
  // The resumed run wrote a good ckpt-150 over the damaged one.
  CHECK(VerifyCheckpoint(Env::Default(), JoinPath(ckpt, "ckpt-150")).empty());
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
