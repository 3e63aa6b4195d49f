// Incremental checkpoints of embedding rows end to end (checkpoint.full_every):
// the real chief, ps_server and worker binaries under `pstrain launch` on
// free loopback ports, always reaped. A run whose saves between full ones
// write only the rows changed (and the ids expired) loads, at every step, as
// bitwise the same model as a run saving everything; resumes from a delta
// to the same end; and its damaged or missing links are named by verify and
// skipped by a resume. A table held mostly on disk (memory_budget_bytes)
// saves and resumes as one held whole.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "catch2/catch.hpp"
#include "chief/serving_snapshot.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"
#include "common/testing/skip.h"
#include "nlohmann/json.hpp"
#include "tests/checkpoint_testlib.h"
#include "tests/cluster_testlib.h"
#include "tools/subprocess.h"

namespace pstrain {
namespace {

using testing::Binary;
using testing::CheckSameCheckpoint;
using testing::CheckSameTables;
using testing::ChiefLog;
using testing::CommandResult;
using testing::ConfigOptions;
using testing::CopyCheckpoint;
using testing::Job;
using testing::RunJobOk;
using testing::WriteJob;

constexpr int kSteps = 300;

ConfigOptions Options(const std::string& data_dir, const std::string& ckpt_dir, int full_every,
                      const std::string& serving_dir = "", int64_t memory_budget_bytes = 0) {
  ConfigOptions o = testing::ClickThroughOptions(data_dir);
  o.batch_size = 64;
  o.learning_rate = 0.003f;
  o.max_steps = kSteps;
  // Rows untouched for 40 steps expire: deltas carry dropped ids too.
  o.extra = absl::StrCat(
      "embedding_tables { name: \"features\" dim: 16 expire_after_steps: 40 memory_budget_bytes: ",
      memory_budget_bytes, " }\n checkpoint { dir: \"", ckpt_dir,
      "\" every_steps: 50 keep: 100 full_every: ", full_every,
      serving_dir.empty() ? "" : absl::StrCat(" serving_dir: \"", serving_dir, "\""), " }\n");
  return o;
}

// The click-through data both runs of a case train on: 5,200 ids.
absl::StatusOr<std::pair<std::string, double>> Data(const std::string& name) {
  return testing::CriteoData(name, {"--train=20000", "--test=2000", "--values_per_field=200",
                                    "--seed=7"});
}

std::string Ckpt(const std::string& dir, int64_t step) {
  return JoinPath(dir, CheckpointDirName(step));
}

TEST_CASE("rows saved as deltas load, resume and verify as full saves of the same steps",
          "[checkpoint][rows][incremental]") {
  auto data = Data("incr_ctr_data");
  INFO(data.status().message());
  REQUIRE(data.ok());
  const std::string ref_dir = testing::FreshTempDir("incr_ref");
  const std::string ref_ckpt = JoinPath(ref_dir, "ckpt");
  RunJobOk(WriteJob(ref_dir, Options(data->first, ref_ckpt, 0), 2), false);
  const std::string dir = testing::FreshTempDir("incr_run");
  const std::string ckpt = JoinPath(dir, "ckpt");
  const std::string serving = JoinPath(dir, "serving");
  const Job job = WriteJob(dir, Options(data->first, ckpt, 3, serving), 2);
  RunJobOk(job, false);
  {
    const std::string log = ChiefLog(job);
    INFO(log);
    CHECK(log.find("its embedding rows are deltas on 2 earlier checkpoint(s) from ckpt-50") !=
          std::string::npos);
  }

  // Three saves a chain (a full one, two deltas); the run's last stands alone.
  const std::vector<std::vector<int64_t>> chains = {{}, {50}, {50, 100}, {}, {200}, {}};
  int64_t deleted = 0;
  for (int64_t step = 50; step <= kSteps; step += 50) {
    INFO("step " << step);
    auto m = ReadManifest(Env::Default(), Ckpt(ckpt, step));
    REQUIRE(m.ok());
    CHECK(std::vector<int64_t>(m->chain().begin(), m->chain().end()) == chains[step / 50 - 1]);
    for (const CheckpointRows& r : m->rows()) {
      // The chain's first link is its full save, the others deltas.
      const bool full = m->chain().empty() ? r.checkpoint().empty()
                                           : r.checkpoint() == CheckpointDirName(m->chain(0));
      CHECK(r.delta() == !full);
      if (r.checkpoint().empty()) deleted += r.deleted();
    }
    CHECK(VerifyCheckpoint(Env::Default(), Ckpt(ckpt, step)).empty());
    CheckSameTables(Ckpt(ckpt, step), Ckpt(ref_ckpt, step));
    CheckSameCheckpoint(Ckpt(ckpt, step), Ckpt(ref_ckpt, step));
  }
  CHECK(deleted > 0);  // expired rows left through deltas, and loaded as gone

  // The CLI shows the chain, and the rows as they stand at the step.
  CommandResult inspect = testing::RunCommand(
      {Binary("tools/pstrain"), "checkpoint", "inspect", Ckpt(ckpt, 150)}, absl::Seconds(60));
  INFO(inspect.output);
  CHECK(inspect.exit_code == 0);
  CHECK(inspect.output.find("embedding rows: deltas on ckpt-50, ckpt-100 (beside it)") !=
        std::string::npos);
  auto want = LoadCheckpoint(Env::Default(), Ckpt(ref_ckpt, 150));
  REQUIRE(want.ok());
  CHECK(inspect.output.find(absl::StrCat("embedding table features: ",
                                         want->tables.at("features").ids.size(), " rows")) !=
        std::string::npos);
  CommandResult list = testing::RunCommand(
      {Binary("tools/pstrain"), "checkpoint", "list", ckpt}, absl::Seconds(60));
  CHECK(list.output.find("rows: deltas on ckpt-200") != std::string::npos);

  SECTION("serving snapshots: tables as deltas, read back outside pstrain as the export") {
    // The run's last checkpoint is full, so its snapshot is too, and the
    // ones before it are gone.
    auto names = Env::Default()->ListDir(serving);
    REQUIRE(names.ok());
    std::sort(names->begin(), names->end());
    CHECK(*names == std::vector<std::string>{"latest", "step-300"});
    // Written one by one from the run's checkpoints up to ckpt-250: 50 in
    // full, 100 and 150 deltas, 200 in full (the three before go), 250 a
    // delta on 200.
    const std::string serving2 = JoinPath(dir, "serving2");
    for (int64_t step = 50; step <= 250; step += 50) {
      REQUIRE(WriteServingSnapshot(Env::Default(), serving2, Ckpt(ckpt, step), step).ok());
    }
    auto names2 = Env::Default()->ListDir(serving2);
    REQUIRE(names2.ok());
    std::sort(names2->begin(), names2->end());
    CHECK(*names2 == std::vector<std::string>{"latest", "step-200", "step-250"});
    const testing::PythonReaders py = testing::PythonWithModules("numpy, safetensors.numpy");
    if (!py.error.empty()) {
      testing::SkipCase("python", py.error);
      return;
    }
    const std::string out = JoinPath(dir, "export250");
    CommandResult e = testing::RunCommand({Binary("tools/pstrain"), "checkpoint", "export",
                                           Ckpt(ckpt, 250), "--format=safetensors",
                                           "--out=" + out},
                                          absl::Seconds(60));
    INFO(e.output);
    REQUIRE(e.exit_code == 0);
    CommandResult r = testing::RunCommand(
        {py.python, Binary("tools/serving_reader.py"), serving2, "--compare",
         JoinPath(out, "model.safetensors")},
        absl::Seconds(60));
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("(the full snapshot of step-200 and 1 delta(s))") != std::string::npos);
    CHECK(r.output.find("the same as the export") != std::string::npos);
  }

  SECTION("a resume from a delta ends bitwise where the run never stopped") {
    const std::string dir2 = testing::FreshTempDir("incr_resume");
    const std::string ckpt2 = JoinPath(dir2, "ckpt");
    CopyCheckpoint(ckpt, 200, ckpt2);
    CopyCheckpoint(ckpt, 250, ckpt2);
    const Job resumed = WriteJob(dir2, Options(data->first, ckpt2, 3), 2);
    RunJobOk(resumed, true);
    const std::string log2 = ChiefLog(resumed);
    INFO(log2);
    CHECK(log2.find("resume: from " + Ckpt(ckpt2, 250)) != std::string::npos);
    CheckSameTables(Ckpt(ckpt2, kSteps), Ckpt(ref_ckpt, kSteps));
    CheckSameCheckpoint(Ckpt(ckpt2, kSteps), Ckpt(ref_ckpt, kSteps));
  }

  SECTION("a missing or corrupted link is named, and the save before it restores") {
    const std::string dir2 = testing::FreshTempDir("incr_damaged");
    const std::string ckpt2 = JoinPath(dir2, "ckpt");
    CopyCheckpoint(ckpt, 200, ckpt2);
    CopyCheckpoint(ckpt, 250, ckpt2);
    // A byte of ckpt-250's own delta rows flipped.
    auto m = ReadManifest(Env::Default(), Ckpt(ckpt2, 250));
    REQUIRE(m.ok());
    const CheckpointRows* own = nullptr;
    for (const CheckpointRows& r : m->rows()) {
      if (r.checkpoint().empty() && r.delta() && r.rows() > 0) own = &r;
    }
    REQUIRE(own != nullptr);
    const std::string shard = JoinPath(Ckpt(ckpt2, 250), ShardFileName(own->shard(), 2));
    auto bytes = Env::Default()->ReadFile(shard);
    REQUIRE(bytes.ok());
    (*bytes)[own->values().offset() + 5] ^= 0x40;
    REQUIRE(Env::Default()->WriteFile(shard, *bytes, false).ok());
    const std::string problems =
        absl::StrJoin(VerifyCheckpoint(Env::Default(), Ckpt(ckpt2, 250)), "; ");
    CHECK(problems.find("CRC32C mismatch") != std::string::npos);
    std::vector<std::string> skipped;
    std::string path;
    auto loaded = LoadLatestGoodCheckpoint(Env::Default(), ckpt2, &skipped, &path);
    REQUIRE(loaded.ok());
    CHECK(path == Ckpt(ckpt2, 200));
    REQUIRE(skipped.size() == 1);
    CHECK(skipped[0].find("ckpt-250: ") == 0);

    // The full save it rests on gone: verify (and `pstrain checkpoint
    // verify`) name the link and say it must stay beside it.
    REQUIRE(Env::Default()->WriteFile(shard, *Env::Default()->ReadFile(
        JoinPath(Ckpt(ckpt, 250), ShardFileName(own->shard(), 2))), false).ok());
    REQUIRE(VerifyCheckpoint(Env::Default(), Ckpt(ckpt2, 250)).empty());
    REQUIRE(DeleteRecursively(Env::Default(), Ckpt(ckpt2, 200)).ok());
    CommandResult v = testing::RunCommand(
        {Binary("tools/pstrain"), "checkpoint", "verify", Ckpt(ckpt2, 250)}, absl::Seconds(60));
    INFO(v.output);
    CHECK(v.exit_code != 0);
    CHECK(v.output.find("ckpt-200/shard-") != std::string::npos);
    CHECK(v.output.find("it must stay beside it") != std::string::npos);
  }
}

TEST_CASE("a table held 10% in memory saves, resumes and ends bitwise as one held whole",
          "[checkpoint][rows][incremental][tier]") {
  auto data = Data("tier_ctr_data");
  INFO(data.status().message());
  REQUIRE(data.ok());
  const std::string ref_dir = testing::FreshTempDir("tier_ref");
  const std::string ref_ckpt = JoinPath(ref_dir, "ckpt");
  const Job ref = WriteJob(ref_dir, Options(data->first, ref_ckpt, 3), 2);
  RunJobOk(ref, false);
  // 5,200 ids over 2 servers: a tenth of each one's rows of 16 floats and
  // Adam's two slots (192 bytes a row).
  constexpr int64_t kBudget = 260 * 192;
  const std::string dir = testing::FreshTempDir("tier_run");
  const std::string ckpt = JoinPath(dir, "ckpt");
  const Job job = WriteJob(dir, Options(data->first, ckpt, 3, "", kBudget), 2);
  RunJobOk(job, false);
  for (int64_t step = 50; step <= kSteps; step += 50) {
    INFO("step " << step);
    CHECK(VerifyCheckpoint(Env::Default(), Ckpt(ckpt, step)).empty());
    CheckSameTables(Ckpt(ckpt, step), Ckpt(ref_ckpt, step));
    CheckSameCheckpoint(Ckpt(ckpt, step), Ckpt(ref_ckpt, step));
  }
  testing::CheckSameModel(testing::FinalModel(job), testing::FinalModel(ref));
  auto ps_log = Env::Default()->ReadFile(JoinPath(job.out, "logs/ps-0.log"));
  REQUIRE(ps_log.ok());
  CHECK(ps_log->find("table features: at most 260 rows (49920 bytes with their optimizer "
                     "slots) in memory on this server, the rest in a disk tier") !=
        std::string::npos);
  auto summary = Env::Default()->ReadFile(JoinPath(job.out, "summary.json"));
  REQUIRE(summary.ok());
  INFO(*summary);
  const nlohmann::json features = nlohmann::json::parse(*summary)["embedding_tables"]["features"];
  CHECK(features["rows_on_disk"].get<int64_t>() > features["rows"].get<int64_t>() / 2);
  CHECK(features["disk_reads"].get<int64_t>() > 1000);
  CHECK(features["disk_write_errors"].get<int64_t>() == 0);

  // Resumed from a delta with the budget: the tier starts empty, the rows
  // come from the chain, and the run ends where the whole one did.
  const std::string dir2 = testing::FreshTempDir("tier_resume");
  const std::string ckpt2 = JoinPath(dir2, "ckpt");
  CopyCheckpoint(ckpt, 200, ckpt2);
  CopyCheckpoint(ckpt, 250, ckpt2);
  const Job resumed = WriteJob(dir2, Options(data->first, ckpt2, 3, "", kBudget), 2);
  RunJobOk(resumed, true);
  CHECK(ChiefLog(resumed).find("resume: from " + Ckpt(ckpt2, 250)) != std::string::npos);
  CheckSameTables(Ckpt(ckpt2, kSteps), Ckpt(ref_ckpt, kSteps));
  CheckSameCheckpoint(Ckpt(ckpt2, kSteps), Ckpt(ref_ckpt, kSteps));
}

TEST_CASE("an async run's cuts chain their rows too, and resume from a delta",
          "[checkpoint][rows][incremental][async]") {
  auto data = Data("incr_async_data");
  INFO(data.status().message());
  REQUIRE(data.ok());
  const std::string dir = testing::FreshTempDir("incr_async");
  const std::string ckpt = JoinPath(dir, "ckpt");
  ConfigOptions o = Options(data->first, ckpt, 2);
  o.sync = false;
  const Job job = WriteJob(dir, o, 2);
  RunJobOk(job, false);
  auto all = ListCheckpoints(Env::Default(), ckpt);
  REQUIRE(all.ok());
  int deltas = 0;
  for (const CheckpointInfo& c : *all) {
    INFO(c.path);
    CHECK(c.complete);
    CHECK(VerifyCheckpoint(Env::Default(), c.path).empty());
    deltas += c.chain.empty() ? 0 : 1;
  }
  CHECK(deltas >= 2);
  CHECK(all->back().chain.empty());  // the last one stands alone
  // Resumed from its newest delta (the checkpoints after it set aside):
  // the rows restored are the delta's.
  int64_t from = -1;
  for (const CheckpointInfo& c : *all) {
    if (!c.chain.empty()) from = c.step;
  }
  REQUIRE(from > 0);
  std::vector<std::string> moved;
  REQUIRE(SetAsideCheckpointsAfter(Env::Default(), ckpt, from, &moved).ok());
  auto want = LoadCheckpoint(Env::Default(), Ckpt(ckpt, from));
  REQUIRE(want.ok());
  RunJobOk(job, true);
  const std::string log = ChiefLog(job);
  INFO(log);
  CHECK(log.find("resume: from " + Ckpt(ckpt, from)) != std::string::npos);
  CHECK(log.find(absl::StrCat("embedding table features: ",
                              want->tables.at("features").ids.size(), " rows")) !=
        std::string::npos);
}

TEST_CASE("pstrain bench --suites=tables saves a table in full and as a delta, and runs it "
          "from its disk tier",
          "[checkpoint][bench][incremental]") {
  const std::string dir = testing::FreshTempDir("tables_bench");
  CommandResult r = testing::RunCommand({Binary("tools/pstrain"), "bench", "--suites=tables",
                                         "--table_rows=20000", "--reps=1", "--out=" + dir},
                                        absl::Seconds(120));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("== tables: one server's save of a table of 16 floats a row") !=
        std::string::npos);
  // Both tables' 20,000 rows in full, and the 1% changed, 200 rows, in a
  // delta; the tiered one's rows on disk read as the shard is written.
  CHECK(r.output.find("in memory: full                             20000") != std::string::npos);
  CHECK(r.output.find("in memory: delta (1% changed)                 200") != std::string::npos);
  CHECK(r.output.find("10% in memory: full                         20000") != std::string::npos);
  CHECK(r.output.find("10% in memory: delta (1% changed)             200") != std::string::npos);
  CHECK(r.output.find("x faster") != std::string::npos);
  // The disk tier beside the table in memory and the hash map.
  CHECK(r.output.find("== tables: Zipf (s = 1.1) batches of 4096 ids") != std::string::npos);
  CHECK(r.output.find("x of the hash map") != std::string::npos);
  CHECK(r.output.find("table, 10% of its 20000 rows in memory") != std::string::npos);
  CHECK(r.output.find("x of in memory; memory tier hit rate ") != std::string::npos);
  CHECK(r.output.find("18000 rows") != std::string::npos);  // on disk
  // The policies simulated over the same lookups.
  CHECK(r.output.find("== tables: which rows stay in memory, simulated over the same lookups: "
                      "20000 rows, 2000 in memory") != std::string::npos);
  for (const char* policy : {"CLOCK (the table's)", "LRU", "LFU (all rows counted, aged)"}) {
    CHECK(r.output.find(std::string("\n") + policy + " ") != std::string::npos);
  }
  auto csv = Env::Default()->ReadFile(JoinPath(dir, "bench.csv"));
  REQUIRE(csv.ok());
  CHECK(csv->find("tables,full_save_seconds,") != std::string::npos);
  CHECK(csv->find("tables,delta_save_seconds,") != std::string::npos);
  CHECK(csv->find("tables,tiered_full_save_seconds,") != std::string::npos);
  CHECK(csv->find("tables,tiered_delta_save_seconds,") != std::string::npos);
  CHECK(csv->find("tables,tiered_pull_push_mrows,") != std::string::npos);
  CHECK(csv->find("tables,tier_hit_percent,") != std::string::npos);
  CHECK(csv->find("tables,policy_hit_percent_trending_lfu,") != std::string::npos);
  auto names = Env::Default()->ListDir(dir);
  REQUIRE(names.ok());
  for (const std::string& n : *names) CHECK((n == "bench.csv" || n == "bench.png"));
  CommandResult bad = testing::RunCommand(
      {Binary("tools/pstrain"), "bench", "--suites=tables", "--table_rows=5"}, absl::Seconds(30));
  CHECK(bad.exit_code != 0);
  CHECK(bad.output.find("--table_rows: expected 100..2000000000") != std::string::npos);
  CommandResult bad_fraction =
      testing::RunCommand({Binary("tools/pstrain"), "bench", "--suites=tables",
                           "--table_memory_fraction=0"},
                          absl::Seconds(30));
  CHECK(bad_fraction.exit_code != 0);
  CHECK(bad_fraction.output.find("--table_memory_fraction: expected a number in (0, 1]") !=
        std::string::npos);
}

}  // namespace
}  // namespace pstrain
