// Checkpoints end to end: the real chief, ps_server and worker binaries under
// `pstrain launch` on free loopback ports, always reaped. A resumed sync run
// ends bitwise where a run never stopped does, after kill -9 on every
// process, onto another number of servers, and past a damaged checkpoint.
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

// Runs the job to its end; it must succeed.
void RunJobOk(const Job& job, bool resume) {
  CommandResult r = RunJob(job, resume);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
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

// Every variable of `want` is in `got` with the same bits, and no other.
void CheckSameModel(const TensorMap& got, const TensorMap& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    CHECK(BitwiseEqual(got.at(name).values(), t.values()));
  }
}

// The number after the first (or `last`) `prefix` in `text` (-1 when absent).
int64_t NumberAfter(const std::string& text, const std::string& prefix, bool last = false) {
  const size_t at = last ? text.rfind(prefix) : text.find(prefix);
  if (at == std::string::npos) return -1;
  const size_t begin = at + prefix.size();
  int64_t n = -1;
  if (!absl::SimpleAtoi(text.substr(begin, text.find_first_not_of("0123456789", begin) - begin),
                        &n)) {
    return -1;
  }
  return n;
}

// `pstrain launch` of `job` with `flags` added, its output in DIR/launch.out.
std::unique_ptr<Subprocess> SpawnLaunch(const Job& job, const std::string& dir,
                                        const std::vector<std::string>& flags = {}) {
  SpawnOptions so;
  so.argv = {Binary("tools/pstrain"), "launch", "--cluster_spec", job.spec, "--config",
             job.config, "--bin_dir", BinDir(), "--progress=false"};
  so.argv.insert(so.argv.end(), flags.begin(), flags.end());
  so.output_file = JoinPath(dir, "launch.out");
  auto launch = Subprocess::Spawn(so);
  REQUIRE(launch.ok());
  return std::move(*launch);
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

// Starts the job under `pstrain launch` and, once `ready()` holds (or 120 s
// pass, or the launch ends), kills every process of it with SIGKILL.
void LaunchAndKillAll(const Job& job, const std::string& dir, const std::function<bool()>& ready) {
  std::unique_ptr<Subprocess> launch = SpawnLaunch(job, dir);
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (!ready() && absl::Now() < deadline && launch->running()) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  for (int pid : testing::ProcessesMatching(job.spec)) ::kill(pid, SIGKILL);
  REQUIRE(launch->Wait(absl::Seconds(30)).has_value());
  CHECK(testing::NoProcessesMatching(job.spec, absl::Seconds(10)));
}

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

  // A checkpoint that is not there is one line, and nothing starts.
  CommandResult bad = testing::RunCommand(
      {Binary("tools/pstrain"), "launch", "--cluster_spec", second.spec, "--config", second.config,
       "--bin_dir", BinDir(), "--progress=false", "--init_from=" + JoinPath(ckpt, "ckpt-999")},
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

// Every row of every table, by id: values, slots, update count bitwise.
void CheckSameTables(const std::string& got_dir, const std::string& want_dir) {
  auto got = LoadCheckpoint(Env::Default(), got_dir);
  auto want = LoadCheckpoint(Env::Default(), want_dir);
  REQUIRE(got.ok());
  REQUIRE(want.ok());
  REQUIRE(got->tables.size() == want->tables.size());
  for (const auto& [name, w] : want->tables) {
    INFO("table " << name);
    REQUIRE(got->tables.count(name) == 1);
    const RestoredTable& g = got->tables.at(name);
    REQUIRE(g.ids.size() == w.ids.size());
    REQUIRE(g.slots.size() == w.slots.size());
    std::map<uint64_t, size_t> at;
    for (size_t i = 0; i < g.ids.size(); ++i) at[g.ids[i]] = i;
    const size_t dim = static_cast<size_t>(w.dim);
    int64_t differ = 0;
    for (size_t i = 0; i < w.ids.size(); ++i) {
      auto it = at.find(w.ids[i]);
      if (it == at.end()) {
        ++differ;
        continue;
      }
      const size_t j = it->second;
      bool same = std::memcmp(&g.values[j * dim], &w.values[i * dim], dim * 4) == 0 &&
                  g.updates[j] == w.updates[i];
      for (size_t k = 0; k < w.slots.size(); ++k) {
        same = same && std::memcmp(&g.slots[k][j * dim], &w.slots[k][i * dim], dim * 4) == 0;
      }
      if (!same) ++differ;
    }
    CHECK(differ == 0);
    CHECK(w.ids.size() > 100);
  }
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
    CommandResult py = testing::RunCommand(
        {python, "-c",
         "import sys; import numpy as np; from safetensors.numpy import load_file\n"
         "t = load_file(sys.argv[1]); v, i = t['features'], t['features/ids']\n"
         "print(v.dtype, v.shape, i.dtype, len(set(i.tolist())), '%.9g' % v[0, 0])",
         JoinPath(out, "model.safetensors")},
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

// Under a running `launch`: waits until the pointer of `ckpt` names step
// `min_step` or later, the launch has ended, or 120 s have passed.
void WaitForCheckpoint(const std::string& ckpt, int64_t min_step, Subprocess* launch) {
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (ReadPointer(Env::Default(), ckpt).value_or(0) < min_step && absl::Now() < deadline &&
         launch->running()) {
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// `pstrain checkpoint restore CKPT --cluster_spec=` the job's spec.
CommandResult RestoreWithCli(const std::string& checkpoint, const Job& job,
                             absl::Duration timeout) {
  return testing::RunCommand({Binary("tools/pstrain"), "checkpoint", "restore", checkpoint,
                              "--cluster_spec=" + job.spec},
                             timeout);
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
// for the figures.
int64_t KillAloneAndCheck(const std::string& name, const std::string& task, int64_t min_step,
                          const std::string& restarted, const std::string& chief_says,
                          int chief_starts, const std::string& resumed_line, int64_t* at_kill,
                          absl::Duration* elapsed) {
  const std::string victim = absl::StrCat("--job=", task.substr(0, task.find(':')),
                                          " --task=", task.substr(task.find(':') + 1));
  const int steps = testing::SanitizedSteps(1500, 800);  // min_step is 200 or 300
  const std::string dir = testing::FreshTempDir(name);
  const std::string ckpt = JoinPath(dir, "ckpt");
  const Job job = WriteJob(dir, CheckpointOptions(ckpt, steps), 2);
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
  const Job ref = WriteJob(ref_dir, CheckpointOptions(JoinPath(ref_dir, "ckpt"), steps), 2);
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
