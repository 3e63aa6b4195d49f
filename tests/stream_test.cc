// Training that follows a directory of part files (data.train_dir) end to
// end: the real chief, ps_server and worker binaries under `pstrain launch`
// on free loopback ports, always reaped. Parts that arrive while the run
// waits for them are all read, once, and the run ends bitwise where one that
// had every part from the start does; a resume from a checkpoint whose
// cursor is mid-part ends there too.
#include <signal.h>

#include <cmath>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "nlohmann/json.hpp"
#include "common/observability/event_writer.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"
#include "tests/checkpoint_testlib.h"
#include "tests/cluster_testlib.h"
#include "tools/subprocess.h"

namespace pstrain {
namespace {

using testing::ChiefLog;
using testing::ConfigOptions;
using testing::CopyCheckpoint;
using testing::FinalModel;
using testing::Job;
using testing::RunJobOk;
using testing::WriteJob;

constexpr int kSteps = 150;  // 2 workers x 64: 19,200 lines, into the third part

// The lines of train.tsv in three parts: 6,000, 6,000 and the rest.
std::vector<std::string> Parts(const std::string& data_dir) {
  auto text = Env::Default()->ReadFile(JoinPath(data_dir, "train.tsv"));
  REQUIRE(text.ok());
  std::vector<std::string> lines = absl::StrSplit(*text, '\n', absl::SkipEmpty());
  REQUIRE(lines.size() == 20000);
  std::vector<std::string> parts(3);
  for (size_t i = 0; i < lines.size(); ++i) {
    parts[i < 6000 ? 0 : i < 12000 ? 1 : 2] += lines[i] + "\n";
  }
  return parts;
}

ConfigOptions Options(const std::string& data_dir, const std::string& parts_dir,
                      const std::string& ckpt_dir) {
  ConfigOptions o = testing::ClickThroughOptions(data_dir);
  o.data = absl::StrCat("format: CRITEO train_dir: \"", parts_dir, "\" test_tsv: \"", data_dir,
                        "/test.tsv\"");
  o.shuffle = false;  // parts are read in order
  o.batch_size = 64;
  o.learning_rate = 0.003f;
  o.max_steps = kSteps;
  o.extra += absl::StrCat("\ncheckpoint { dir: \"", ckpt_dir, "\" every_steps: 50 keep: 10 }\n");
  return o;
}

void WritePart(const std::string& dir, int n, const std::string& text) {
  // As a log shipper does: written under a temporary name, then renamed.
  const std::string tmp = JoinPath(dir, absl::StrCat("part-", n, ".tsv.tmp"));
  REQUIRE(Env::Default()->WriteFile(tmp, text, true).ok());
  REQUIRE(Env::Default()->RenameFile(tmp, JoinPath(dir, absl::StrCat("part-", n, ".tsv"))).ok());
}

TEST_CASE("parts arriving while training are read once, as if there from the start; a resume "
          "mid-part is exact", "[stream][checkpoint]") {
  auto data = testing::CriteoData("stream_data", {"--train=20000", "--test=2000",
                                                  "--values_per_field=50", "--seed=5"});
  INFO(data.status().message());
  REQUIRE(data.ok());
  const std::vector<std::string> parts = Parts(data->first);

  // Every part there from the start.
  const std::string ref_dir = testing::FreshTempDir("stream_ref");
  const std::string ref_parts = JoinPath(ref_dir, "parts");
  REQUIRE(Env::Default()->CreateDirs(ref_parts).ok());
  for (int n = 0; n < 3; ++n) WritePart(ref_parts, n, parts[n]);
  const Job ref = WriteJob(ref_dir, Options(data->first, ref_parts, JoinPath(ref_dir, "ckpt")), 2);
  RunJobOk(ref, false);

  // Two parts at the start; the third once training has begun, and the
  // workers wait for it.
  const std::string dir = testing::FreshTempDir("stream_late");
  const std::string late_parts = JoinPath(dir, "parts");
  REQUIRE(Env::Default()->CreateDirs(late_parts).ok());
  WritePart(late_parts, 0, parts[0]);
  WritePart(late_parts, 1, parts[1]);
  const Job late = WriteJob(dir, Options(data->first, late_parts, JoinPath(dir, "ckpt")), 2);
  std::unique_ptr<Subprocess> launch = testing::SpawnLaunch(late, dir);
  const std::string worker_log = JoinPath(late.out, "logs/worker-0.log");
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline &&
         Env::Default()->ReadFile(worker_log).value_or("").find("waiting for data: ") ==
             std::string::npos) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  WritePart(late_parts, 2, parts[2]);
  const std::optional<int> code = launch->Wait(absl::Seconds(120));
  const std::string log = Env::Default()->ReadFile(worker_log).value_or("");
  INFO(log);
  REQUIRE(code.has_value());
  REQUIRE(*code == 0);
  CHECK(log.find("training data: the parts of " + late_parts) != std::string::npos);
  CHECK(log.find("waiting for data: " + late_parts + " has nothing past part 1") !=
        std::string::npos);
  testing::CheckSameModel(FinalModel(late), FinalModel(ref));
  // Each worker's cursor: into part 2, past the same lines (every line of
  // the first two parts, and 7,200 of the third, taken once).
  auto m = ReadManifest(Env::Default(), JoinPath(dir, "ckpt/ckpt-150"));
  REQUIRE(m.ok());
  REQUIRE(m->cursors_size() == 2);
  for (const WorkerCursor& c : m->cursors()) {
    CHECK(c.epoch() == 2);
    CHECK(c.position() >= 7199);
    CHECK(c.position() <= 7200);
  }

  // The reference's step-100 checkpoint (its cursors at part 2, line 800)
  // resumed: the same end.
  const std::string dir2 = testing::FreshTempDir("stream_resume");
  CopyCheckpoint(JoinPath(ref_dir, "ckpt"), 100, JoinPath(dir2, "ckpt"));
  auto at100 = ReadManifest(Env::Default(), JoinPath(dir2, "ckpt/ckpt-100"));
  REQUIRE(at100.ok());
  for (const WorkerCursor& c : at100->cursors()) CHECK(c.epoch() == 2);
  const Job resumed = WriteJob(dir2, Options(data->first, ref_parts, JoinPath(dir2, "ckpt")), 2);
  RunJobOk(resumed, true);
  const std::string resumed_log =
      Env::Default()->ReadFile(JoinPath(resumed.out, "logs/worker-1.log")).value_or("");
  INFO(resumed_log);
  CHECK(resumed_log.find("data cursor restored: part 2, line ") != std::string::npos);
  testing::CheckSameModel(FinalModel(resumed), FinalModel(ref));
}

TEST_CASE("progressive validation: worker 0 scores each of its examples once, before training "
          "on it; the chief's log, TensorBoard and summary.json carry the figures",
          "[stream][eval]") {
  auto data = testing::CriteoData("stream_data", {"--train=20000", "--test=2000",
                                                  "--values_per_field=50", "--seed=5"});
  INFO(data.status().message());
  REQUIRE(data.ok());
  const auto& [data_dir, truth] = *data;
  const std::vector<std::string> parts = Parts(data_dir);
  const std::string dir = testing::FreshTempDir("stream_progressive");
  const std::string parts_dir = JoinPath(dir, "parts");
  REQUIRE(Env::Default()->CreateDirs(parts_dir).ok());
  for (int n = 0; n < 3; ++n) WritePart(parts_dir, n, parts[n]);
  ConfigOptions o = Options(data_dir, parts_dir, JoinPath(dir, "ckpt"));
  o.data = absl::StrCat("format: CRITEO train_dir: \"", parts_dir, "\" progressive_eval: true");
  REQUIRE(o.eval_every_steps == 50);
  const Job job = WriteJob(dir, o, 2);
  RunJobOk(job, false);
  const std::string log = ChiefLog(job);
  INFO(log);
  // Every 50 steps, and the rest at the end: worker 0's 150 batches of 64,
  // each scored once (sync: the version a batch was computed from).
  const std::regex line(R"(step (\d+)/150: worker 0's evaluation \((\d+) examples\): )"
                        R"(accuracy [0-9.]+, loss [0-9.]+, log_loss [0-9.]+, auc ([0-9.]+))");
  std::vector<int64_t> steps;
  std::vector<double> aucs;
  int64_t examples = 0;
  for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it) {
    steps.push_back(std::stoll((*it)[1]));
    examples += std::stoll((*it)[2]);
    aucs.push_back(std::stod((*it)[3]));
  }
  CHECK(steps == std::vector<int64_t>{50, 100, 149});
  CHECK(examples == kSteps * 64);
  CHECK(log.find("worker 1's evaluation") == std::string::npos);
  REQUIRE(aucs.size() == 3);
  WARN("progressive AUC " << aucs[0] << ", " << aucs[1] << ", " << aucs[2] << "; the truth's "
                          << truth);
  CHECK(aucs[2] > aucs[0]);  // it learns
  CHECK(aucs[2] > truth - 0.1);
  CHECK(aucs[2] < truth + 0.02);  // a held-out figure: not above what the data allows
  // TensorBoard: the same figures at the same steps.
  auto events = ReadScalarEvents(Env::Default(), JoinPath(job.out, "events"));
  REQUIRE(events.ok());
  std::vector<int64_t> auc_steps;
  for (const ScalarEvent& e : *events) {
    if (e.tag == "eval/auc") auc_steps.push_back(e.step);
  }
  CHECK(auc_steps == std::vector<int64_t>{50, 100, 149});
  // summary.json: the last of them.
  auto summary = nlohmann::json::parse(
      Env::Default()->ReadFile(JoinPath(job.out, "summary.json")).value_or("{}"), nullptr, false);
  INFO(summary.dump());
  REQUIRE(summary["eval_auc"].is_number());
  CHECK(std::abs(summary["eval_auc"].get<double>() - aucs[2]) < 1e-4);
  CHECK(summary["eval_step"] == 149);
}

TEST_CASE("without max_steps a stream trains until stopped; stopped, it saves its place, and a "
          "resume goes on from there",
          "[stream][checkpoint][signals]") {
  auto data = testing::CriteoData("stream_data", {"--train=20000", "--test=2000",
                                                  "--values_per_field=50", "--seed=5"});
  REQUIRE(data.ok());
  const std::vector<std::string> parts = Parts(data->first);
  const std::string dir = testing::FreshTempDir("stream_until_stopped");
  const std::string parts_dir = JoinPath(dir, "parts");
  REQUIRE(Env::Default()->CreateDirs(parts_dir).ok());
  // 20 x 6,000 lines: 937 steps of 2 x 64, then the workers wait for more.
  for (int n = 0; n < 20; ++n) WritePart(parts_dir, n, parts[0]);
  const std::string ckpt = JoinPath(dir, "ckpt");
  ConfigOptions o = Options(data->first, parts_dir, ckpt);
  o.max_steps = 0;  // until stopped
  o.extra = testing::ClickThroughOptions(data->first).extra +
            absl::StrCat("\ncheckpoint { dir: \"", ckpt,
                         "\" every_steps: 100000 stop_save_seconds: 5 }\n");
  const Job job = WriteJob(dir, o, 2);
  std::unique_ptr<Subprocess> launch = testing::SpawnLaunch(job, dir);
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (ChiefLog(job).find("eval AUC") == std::string::npos && absl::Now() < deadline &&
         launch->running()) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  REQUIRE(launch->running());
  // The steps as they are, with no "/max_steps".
  const std::regex eval_line(R"(I step \d+: train loss)");
  CHECK(std::regex_search(ChiefLog(job), eval_line));
  launch->Signal(SIGTERM);
  std::optional<int> code = launch->Wait(absl::Seconds(60));
  REQUIRE(code.has_value());
  CHECK(*code == 128 + SIGTERM);
  const std::string first_log = ChiefLog(job);
  INFO(first_log);
  auto saved = ListCheckpoints(Env::Default(), ckpt);
  REQUIRE(saved.ok());
  REQUIRE(saved->size() == 1);
  const int64_t step = saved->front().step;
  CHECK(step >= 50);
  CHECK(step < 937);
  auto m = ReadManifest(Env::Default(), saved->front().path);
  REQUIRE(m.ok());
  REQUIRE(m->cursors_size() == 2);

  // Resumed: from the saved cursors to the end of the parts, where it waits
  // for more; stopped there (nothing to save, no step to reach), it ends
  // within stop_save_seconds.
  std::unique_ptr<Subprocess> resumed = testing::SpawnLaunch(job, dir, {"--resume"});
  const std::string worker_log = JoinPath(job.out, "logs/worker-0.log");
  while (Env::Default()->ReadFile(worker_log).value_or("").find(
             "has nothing past part 19") == std::string::npos &&
         absl::Now() < deadline + absl::Seconds(60) && resumed->running()) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string log = Env::Default()->ReadFile(worker_log).value_or("");
  INFO(log);
  CHECK(log.find("data cursor restored: part ") != std::string::npos);
  REQUIRE(resumed->running());
  resumed->Signal(SIGTERM);
  code = resumed->Wait(absl::Seconds(60));
  REQUIRE(code.has_value());
  CHECK(*code == 128 + SIGTERM);
  const std::string resumed_log = ChiefLog(job);
  INFO(resumed_log);
  CHECK(resumed_log.find(absl::StrCat("ckpt-", step)) != std::string::npos);
  // It trained to the end of the parts: an evaluation past step 900.
  CHECK(std::regex_search(resumed_log, std::regex(R"(I step 9[0-9][0-9]: train loss)")));
}

TEST_CASE("a train_dir config is checked: one source, CRITEO only, no shuffle", "[stream]") {
  const std::string dir = testing::FreshTempDir("stream_config");
  const std::string parts = JoinPath(dir, "parts");
  REQUIRE(Env::Default()->CreateDirs(parts).ok());
  auto check = [&](const std::string& data, const std::string& want) {
    ConfigOptions o = testing::ClickThroughOptions(dir);
    o.data = data;
    o.shuffle = false;
    if (data.find("CSV") != std::string::npos) o.model.clear();  // the MLP, on CSV
    const std::string path = testing::WriteFile(JoinPath(dir, "c.pbtxt"), testing::ConfigText(o));
    testing::CommandResult r = testing::RunCommand(
        {testing::Binary("tools/pstrain"), "plan", "--config", path, "--cluster_spec",
         testing::WriteClusterSpec(dir, 1, 1)},
        absl::Seconds(30));
    INFO(r.output);
    CHECK(r.exit_code != 0);
    CHECK(r.output.find(want) != std::string::npos);
  };
  check(absl::StrCat("format: CRITEO train_dir: \"", parts, "\" train_tsv: \"x.tsv\""),
        "data.train_tsv/train_dir: expected one");
  check(absl::StrCat("format: CRITEO train_dir: \"", parts, "\" shuffle: true"),
        "data.shuffle: does not apply to data.train_dir");
  check(absl::StrCat("format: CRITEO train_tsv: \"\""), "data.train_tsv/train_dir: expected one");
  check(absl::StrCat("format: CSV train_csv: \"x.csv\" train_dir: \"", parts, "\""),
        "data.train_dir: is read with format: CRITEO only");
}

}  // namespace
}  // namespace pstrain
