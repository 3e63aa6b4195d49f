#include "tests/checkpoint_testlib.h"

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

namespace pstrain {
namespace testing {

ConfigOptions CheckpointOptions(const std::string& ckpt_dir, int max_steps) {
  ConfigOptions o;
  o.max_steps = max_steps;
  o.learning_rate = 0.003f;
  o.optimizer = "adam {}";
  o.eval_every_steps = 100;
  o.extra = absl::StrCat("checkpoint { dir: \"", ckpt_dir, "\" every_steps: 50 keep: 100 }\n");
  return o;
}

Job WriteJob(const std::string& dir, ConfigOptions o, int ps) {
  Job job;
  job.spec = WriteClusterSpec(dir, ps, 2);
  job.out = JoinPath(dir, "out");
  o.output_dir = job.out;
  job.config = WriteFile(JoinPath(dir, "train.pbtxt"), ConfigText(o));
  return job;
}

CommandResult RunJob(const Job& job, bool resume) {
  std::vector<std::string> argv = {Binary("tools/pstrain"), "launch", "--cluster_spec", job.spec,
                                   "--config", job.config, "--bin_dir", BinDir(),
                                   "--progress=false"};
  if (resume) argv.push_back("--resume");
  return RunCommand(argv, absl::Seconds(180));
}

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

void CheckSameModel(const TensorMap& got, const TensorMap& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    CHECK(BitwiseEqual(got.at(name).values(), t.values()));
  }
}

int64_t NumberAfter(const std::string& text, const std::string& prefix, bool last) {
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

std::unique_ptr<Subprocess> SpawnLaunch(const Job& job, const std::string& dir,
                                        const std::vector<std::string>& flags) {
  SpawnOptions so;
  so.argv = {Binary("tools/pstrain"), "launch", "--cluster_spec", job.spec, "--config",
             job.config, "--bin_dir", BinDir(), "--progress=false"};
  so.argv.insert(so.argv.end(), flags.begin(), flags.end());
  so.output_file = JoinPath(dir, "launch.out");
  auto launch = Subprocess::Spawn(so);
  REQUIRE(launch.ok());
  return std::move(*launch);
}

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
                  g.updates[j] == w.updates[i] && g.touched[j] == w.touched[i];
      for (size_t k = 0; k < w.slots.size(); ++k) {
        same = same && std::memcmp(&g.slots[k][j * dim], &w.slots[k][i * dim], dim * 4) == 0;
      }
      if (!same) ++differ;
    }
    CHECK(differ == 0);
    CHECK(w.ids.size() > 100);
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

void LaunchAndKillAll(const Job& job, const std::string& dir, const std::function<bool()>& ready,
                      const std::vector<std::string>& flags) {
  std::unique_ptr<Subprocess> launch = SpawnLaunch(job, dir, flags);
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (!ready() && absl::Now() < deadline && launch->running()) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  for (int pid : ProcessesMatching(job.spec)) ::kill(pid, SIGKILL);
  REQUIRE(launch->Wait(absl::Seconds(30)).has_value());
  CHECK(NoProcessesMatching(job.spec, absl::Seconds(10)));
}

}  // namespace testing
}  // namespace pstrain
