// `pstrain sweep` as a user runs it: a grid over learning rates, each trial
// a real job on loopback, ranked as independent runs of the same configs
// rank; a failing trial recorded while the sweep goes on, and --resume
// running only what is missing; a trial whose chief is killed mid-run.
#include <signal.h>
#include <unistd.h>

#include <optional>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "catch2/catch.hpp"
#include "common/observability/event_writer.h"
#include "common/rpc/rpc.h"
#include "common/storage/env.h"
#include "nlohmann/json.hpp"
#include "tests/cluster_testlib.h"
#include "tools/subprocess.h"

namespace pstrain {
namespace {

using testing::Binary;
using testing::BinDir;
using testing::CommandResult;
using testing::ConfigOptions;

nlohmann::json ReadJson(const std::string& path) {
  auto text = Env::Default()->ReadFile(path);
  REQUIRE(text.ok());
  return nlohmann::json::parse(*text);
}

// The ranked table's rows in a sweep's output, its header first.
std::vector<std::string> TableRows(const std::string& output) {
  const size_t table = output.find("trial  optimizer.learning_rate  accuracy");
  REQUIRE(table != std::string::npos);
  std::vector<std::string> rows = absl::StrSplit(output.substr(table), '\n');
  REQUIRE(rows.size() > 4);
  return rows;
}

CommandResult Sweep(const std::string& sweep, const std::string& spec, const std::string& out,
                    std::vector<std::string> more = {}) {
  std::vector<std::string> argv = {Binary("tools/pstrain"), "sweep", "--sweep", sweep,
                                   "--cluster_spec", spec, "--out", out, "--bin_dir", BinDir(),
                                   "--parallel=2"};
  argv.insert(argv.end(), more.begin(), more.end());
  return testing::RunCommand(argv, absl::Seconds(600));
}

TEST_CASE("a grid over learning rates ranks the trials as independent runs of their configs do, "
          "bitwise, and names the best",
          "[sweep][cluster]") {
  const std::string dir = testing::FreshTempDir("sweep_grid");
  ConfigOptions o;
  o.max_steps = 60;
  o.eval_every_steps = 0;
  o.output_dir = JoinPath(dir, "base_out");
  testing::WriteFile(JoinPath(dir, "base.pbtxt"), testing::ConfigText(o));
  const std::string sweep = testing::WriteFile(JoinPath(dir, "sweep.pbtxt"), R"(
base_config: "base.pbtxt"
parameters { field: "optimizer.learning_rate" values { value: [0.001, 0.1, 0.02] } }
)");
  const std::string spec = testing::WriteClusterSpec(dir, 1, 2);
  const std::string out = JoinPath(dir, "sweep_out");
  CommandResult r = Sweep(sweep, spec, out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("3 trial(s) (grid over 1 parameter(s)), 2 at once, 1 ps and 2 worker(s) "
                      "each; ranked by accuracy") != std::string::npos);
  // The table, best first: 0.1 before 0.02 before 0.001 at 60 steps.
  const std::vector<std::string> rows = TableRows(r.output);
  CHECK(rows[1].rfind("1      0.1 ", 0) == 0);
  CHECK(rows[2].rfind("2      0.02 ", 0) == 0);
  CHECK(rows[3].rfind("0      0.001 ", 0) == 0);
  CHECK(r.output.find("best: trial 1 (optimizer.learning_rate=0.1), accuracy ") !=
        std::string::npos);

  // Each trial again as an independent launch of its config: the same
  // metrics, bit for bit (sync mode, the same seed).
  for (int k = 0; k < 3; ++k) {
    const std::string trial = JoinPath(out, absl::StrCat("trial-", k));
    const nlohmann::json result = ReadJson(JoinPath(trial, "trial.json"));
    CHECK(result["state"] == "finished");
    std::string config = Env::Default()->ReadFile(JoinPath(trial, "config.pbtxt")).value();
    const std::string again = JoinPath(dir, absl::StrCat("again-", k));
    const size_t at = config.find("output_dir: \"" + trial + "\"");
    REQUIRE(at != std::string::npos);
    config.replace(at, 14 + trial.size(), "output_dir: \"" + again + "\"");
    const std::string path = testing::WriteFile(JoinPath(dir, absl::StrCat("again-", k, ".pbtxt")),
                                                config);
    CommandResult run = testing::RunCommand(
        {Binary("tools/pstrain"), "launch", "--cluster_spec", spec, "--config", path, "--bin_dir",
         BinDir(), "--progress=false", "--metrics=false"},
        absl::Seconds(120));
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    const nlohmann::json alone = ReadJson(JoinPath(again, "summary.json"));
    CHECK(alone["eval_accuracy"].get<double>() == result["accuracy"].get<double>());
    CHECK(alone["eval_loss"].get<double>() == result["loss"].get<double>());
    CHECK(alone["global_step"].get<int64_t>() == 60);
  }

  // The CSV, read by Python's csv module; the best config, ready to launch.
  testing::PythonReaders py = testing::PythonWithModules("csv");
  REQUIRE(py.error.empty());
  CommandResult csv = testing::RunCommand(
      {py.python, "-c",
       "import csv, sys\n"
       "rows = list(csv.DictReader(open(sys.argv[1])))\n"
       "print(len(rows), rows[0]['trial'], rows[0]['optimizer.learning_rate'], rows[0]['state'],"
       " rows[0]['metric'] == rows[0]['accuracy'], rows[2]['trial'])\n",
       JoinPath(out, "results.csv")},
      absl::Seconds(30));
  INFO(csv.output);
  CHECK(csv.output == "3 1 0.1 finished True 0\n");
  // The picture: the metric against each parameter, by Debian's matplotlib
  // (tools/setup.sh installs it).
  CHECK(r.output.find("wrote " + JoinPath(out, "sweep.png")) != std::string::npos);
  const std::string png = Env::Default()->ReadFile(JoinPath(out, "sweep.png")).value_or("");
  CHECK(png.size() > 1000);
  CHECK(png.rfind("\x89PNG\r\n\x1a\n", 0) == 0);
  const std::string best = Env::Default()->ReadFile(JoinPath(out, "best.pbtxt")).value();
  CHECK(best.find("learning_rate: 0.1\n") != std::string::npos);
  CHECK(best.find("output_dir: \"" + o.output_dir + "\"") != std::string::npos);
  CommandResult plan = testing::RunCommand(
      {Binary("tools/pstrain"), "plan", "--cluster_spec", spec, "--config",
       JoinPath(out, "best.pbtxt")},
      absl::Seconds(30));
  CHECK(plan.exit_code == 0);

  // TensorBoard's HParams dashboard: the experiment at the sweep's root,
  // each trial a session beside its scalars, read by TensorBoard's own
  // event accumulator and parsed with its hparams plugin's protos.
  py = testing::PythonWithModules("tensorboard");
  REQUIRE(py.error.empty());
  CommandResult hparams = testing::RunCommand(
      {py.python, "-c",
       "import sys\n"
       "from tensorboard.backend.event_processing import event_accumulator as ea\n"
       "from tensorboard.plugins.hparams import plugin_data_pb2\n"
       "def plugin(path):\n"
       "  acc = ea.EventAccumulator(path)\n"
       "  acc.Reload()\n"
       "  return {t: plugin_data_pb2.HParamsPluginData.FromString(c)\n"
       "          for t, c in acc.PluginTagToContent('hparams').items()}\n"
       "exp = plugin(sys.argv[1])['_hparams_/experiment'].experiment\n"
       "print([h.name for h in exp.hparam_infos], [m.name.tag for m in exp.metric_infos],\n"
       "      [v.number_value for v in exp.hparam_infos[0].domain_discrete.values])\n"
       "run = sys.argv[1] + '/trial-1/events'\n"
       "s = plugin(run)\n"
       "start = s['_hparams_/session_start_info'].session_start_info\n"
       "acc = ea.EventAccumulator(run)\n"
       "acc.Reload()\n"
       "print(start.group_name, start.hparams['optimizer.learning_rate'].number_value,\n"
       "      s['_hparams_/session_end_info'].session_end_info.status,\n"
       "      'eval/accuracy' in acc.Tags()['scalars'])\n",
       out},
      absl::Seconds(60));
  INFO(hparams.output);
  CHECK(hparams.exit_code == 0);
  CHECK(hparams.output.find("['optimizer.learning_rate'] ['eval/accuracy', 'eval/loss'] "
                            "[0.001, 0.1, 0.02]\ntrial-1 0.1 1 True\n") != std::string::npos);

  // --collect ranks runs that ran elsewhere (Kubernetes' trials, copied
  // back): here the same runs' summaries and events, trial 2's summary
  // missing as an unfinished run's would be.
  const std::string collected = JoinPath(dir, "collected");
  for (int k = 0; k < 3; ++k) {
    const std::string from = JoinPath(out, absl::StrCat("trial-", k));
    const std::string to = JoinPath(collected, absl::StrCat("trial-", k));
    REQUIRE(Env::Default()->CreateDirs(JoinPath(to, "events")).ok());
    const std::vector<std::string> events =
        Env::Default()->ListDir(JoinPath(from, "events")).value_or(std::vector<std::string>());
    CHECK_FALSE(events.empty());
    for (const std::string& name : events) {
      if (name.find("pstrain-sweep-hparams") != std::string::npos) continue;
      testing::WriteFile(JoinPath(to, "events/" + name),
                         Env::Default()->ReadFile(JoinPath(from, "events/" + name)).value());
    }
    if (k == 2) continue;
    testing::WriteFile(JoinPath(to, "summary.json"),
                       Env::Default()->ReadFile(JoinPath(from, "summary.json")).value());
  }
  CommandResult collect = testing::RunCommand(
      {Binary("tools/pstrain"), "sweep", "--sweep", sweep, "--collect", "--out", collected},
      absl::Seconds(60));
  INFO(collect.output);
  CHECK(collect.exit_code == 1);  // one unfinished
  CHECK(collect.output.find("3 trial(s) (grid over 1 parameter(s)), collected from " +
                            collected) != std::string::npos);
  const std::vector<std::string> crows = TableRows(collect.output);
  CHECK(crows[1].rfind("1      0.1 ", 0) == 0);
  CHECK(crows[2].rfind("0      0.001 ", 0) == 0);
  CHECK(crows[3].rfind("2      0.02 ", 0) == 0);
  CHECK(crows[3].find("60     ") != std::string::npos);  // its events reach step 60
  CHECK(crows[3].find("unfinished") != std::string::npos);
  const nlohmann::json best1 = ReadJson(JoinPath(collected, "trial-1/trial.json"));
  CHECK(best1["accuracy"] == ReadJson(JoinPath(out, "trial-1/trial.json"))["accuracy"]);
  CHECK(ReadJson(JoinPath(collected, "trial-2/trial.json"))["error"].get<std::string>().find(
            "no summary.json in ") != std::string::npos);
  CHECK(Env::Default()->ReadFile(JoinPath(collected, "best.pbtxt")).value_or("").find(
            "learning_rate: 0.1\n") != std::string::npos);

  // The same --out again is refused without --resume; with it, nothing runs.
  CommandResult twice = Sweep(sweep, spec, out);
  CHECK(twice.exit_code == 2);
  CHECK(twice.output.find("holds an earlier sweep: --resume") != std::string::npos);
  CommandResult resumed = Sweep(sweep, spec, out, {"--resume"});
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
  CHECK(resumed.output.find("3 finished before") != std::string::npos);
  CHECK(resumed.output.find("started") == std::string::npos);
}

TEST_CASE("early stopping stops the clearly bad trials at the first rung and finds the full "
          "grid's best with fewer steps",
          "[sweep][cluster]") {
  const std::string dir = testing::FreshTempDir("sweep_asha");
  ConfigOptions o;
  o.max_steps = 600;
  o.eval_every_steps = 0;
  testing::WriteFile(JoinPath(dir, "base.pbtxt"), testing::ConfigText(o));
  const std::string space = R"(
base_config: "base.pbtxt"
parameters { field: "optimizer.learning_rate" values { value: [0.1, 0.05, 0.0001, 0.00001] } }
)";
  const std::string grid = testing::WriteFile(JoinPath(dir, "grid.pbtxt"), space);
  const std::string asha = testing::WriteFile(
      JoinPath(dir, "asha.pbtxt"),
      space + "early_stopping { min_steps: 50 reduction: 3 }\n");
  const std::string spec = testing::WriteClusterSpec(dir, 1, 1);
  CommandResult full = Sweep(grid, spec, JoinPath(dir, "grid_out"), {"--parallel=1"});
  INFO(full.output);
  REQUIRE(full.exit_code == 0);
  CommandResult early = Sweep(asha, spec, JoinPath(dir, "asha_out"), {"--parallel=1"});
  INFO(early.output);
  REQUIRE(early.exit_code == 0);
  CHECK(early.output.find("early stopping: rungs at step(s) 50, 150, 450; the top 1/3 at each go "
                          "on") != std::string::npos);
  // The two clearly bad rates stop at the first rung.
  int64_t steps = 0;
  for (int k = 0; k < 4; ++k) {
    const nlohmann::json t =
        ReadJson(JoinPath(dir, absl::StrCat("asha_out/trial-", k, "/trial.json")));
    INFO(k << ": " << t.dump());
    steps += t["steps"].get<int64_t>();
    if (k >= 2) {
      CHECK(t["state"] == "stopped early");
      CHECK(t["rungs"].size() == 1);
      CHECK(early.output.find(absl::StrCat("trial ", k, " (of 4) stopped at rung 0 (step 50)")) !=
            std::string::npos);
    }
  }
  CHECK(ReadJson(JoinPath(dir, "asha_out/trial-0/trial.json"))["state"] == "finished");
  // The same best as the full grid, with fewer steps trained.
  const std::string best_line = "best: trial 0 (optimizer.learning_rate=0.1)";
  CHECK(full.output.find(best_line) != std::string::npos);
  CHECK(early.output.find(best_line) != std::string::npos);
  WARN("early stopping trained " << steps << " steps against the full grid's 2400");
  CHECK(steps < 2400 * 3 / 4);
  CHECK(early.output.find(absl::StrCat(steps, " steps trained, ")) != std::string::npos);
  CHECK(early.output.find(" of the 2400 that every trial to its max_steps would take") !=
        std::string::npos);
}

TEST_CASE("a failing trial is recorded with its error, the sweep goes on, and --resume runs only "
          "what did not finish",
          "[sweep][cluster][errors]") {
  const std::string dir = testing::FreshTempDir("sweep_fail");
  ConfigOptions o;
  o.max_steps = 30;
  o.eval_every_steps = 0;
  testing::WriteFile(JoinPath(dir, "base.pbtxt"), testing::ConfigText(o));
  // The second value names held-out labels that are not there (yet).
  const std::string labels = JoinPath(dir, "labels");
  const std::string sweep = testing::WriteFile(JoinPath(dir, "sweep.pbtxt"), absl::StrCat(R"(
base_config: "base.pbtxt"
parameters { field: "data.test_labels" choices { choice: [")",
      testing::DigitsDir(), "/t10k-labels-idx1-ubyte\", \"", labels, R"("] } }
parameters { field: "seed" values { value: [1, 2] } }
)"));
  const std::string spec = testing::WriteClusterSpec(dir, 1, 1);
  const std::string out = JoinPath(dir, "sweep_out");
  CommandResult r = Sweep(sweep, spec, out);
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("trial 2 (of 4) failed after ") != std::string::npos);
  CHECK(r.output.find(labels) != std::string::npos);
  for (int k : {2, 3}) {
    const nlohmann::json t = ReadJson(JoinPath(out, absl::StrCat("trial-", k, "/trial.json")));
    CHECK(t["state"] == "failed");
    CHECK(t["error"].get<std::string>().find(labels) != std::string::npos);
  }
  CHECK(ReadJson(JoinPath(out, "trial-1/trial.json"))["state"] == "finished");
  // The missing file is there now: a resume runs the two failed trials only.
  REQUIRE(::symlink((testing::DigitsDir() + "/t10k-labels-idx1-ubyte").c_str(), labels.c_str()) ==
          0);
  CommandResult resumed = Sweep(sweep, spec, out, {"--resume"});
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
  CHECK(resumed.output.find("2 finished before") != std::string::npos);
  CHECK(resumed.output.find("trial 0 (of 4) started") == std::string::npos);
  CHECK(resumed.output.find("trial 2 (of 4) started") != std::string::npos);
  CHECK(resumed.output.find("trial 3 (of 4) started") != std::string::npos);
  // The same data and seed: trial 2 now trains what trial 0 did.
  CHECK(ReadJson(JoinPath(out, "trial-2/trial.json"))["accuracy"] ==
        ReadJson(JoinPath(out, "trial-0/trial.json"))["accuracy"]);

  // Bad input stops the sweep before anything runs, in one line.
  const std::string bad = testing::WriteFile(
      JoinPath(dir, "bad.pbtxt"),
      "base_config: \"base.pbtxt\"\nparameters { field: \"optimizer.rate\" values { value: 1 } "
      "}\n");
  CommandResult refused = Sweep(bad, spec, JoinPath(dir, "bad_out"));
  INFO(refused.output);
  CHECK(refused.exit_code == 2);
  CHECK(refused.output ==
        "pstrain sweep: sweep file " + bad +
            ": parameters: optimizer.rate: OptimizerConfig has no field \"rate\"\n");
  CHECK_FALSE(Env::Default()->IsDirectory(JoinPath(dir, "bad_out")));
  // Flags of another mode, and --collect of nothing, are refused.
  for (const auto& [more, named] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--ps=2"}, "--ps and --workers: with --slurm or --kubernetes"},
           {{"--image=x:1"}, "--image, --name, --gpus_per_worker and --storage: only with "
                             "--kubernetes"},
           {{"--base_port=9000"}, "--sbatch_args and --base_port: only with --slurm"}}) {
    CommandResult r = Sweep(sweep, spec, JoinPath(dir, "bad_out"), more);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(named) != std::string::npos);
  }
  CommandResult nothing = testing::RunCommand(
      {Binary("tools/pstrain"), "sweep", "--sweep", sweep, "--collect", "--out",
       JoinPath(dir, "no_such_dir")},
      absl::Seconds(30));
  CHECK(nothing.exit_code == 2);
  CHECK(nothing.output.find("is not a directory") != std::string::npos);
  CHECK_FALSE(Env::Default()->IsDirectory(JoinPath(dir, "no_such_dir")));
}

TEST_CASE("a trial whose chief is killed mid-run is marked failed, the sweep completes, and "
          "--resume runs only that trial",
          "[sweep][cluster][faults]") {
  const std::string dir = testing::FreshTempDir("sweep_kill");
  ConfigOptions o;
  o.eval_every_steps = 0;
  testing::WriteFile(JoinPath(dir, "base.pbtxt"), testing::ConfigText(o));
  // Trial 0 trains long enough to be killed in the middle; trial 1 briefly.
  const std::string sweep = testing::WriteFile(JoinPath(dir, "sweep.pbtxt"), R"(
base_config: "base.pbtxt"
parameters { field: "max_steps" values { value: [3000, 30] } }
)");
  const std::string spec = testing::WriteClusterSpec(dir, 1, 1);
  const std::string out = JoinPath(dir, "sweep_out");
  SpawnOptions so;
  so.argv = {Binary("tools/pstrain"), "sweep", "--sweep", sweep, "--cluster_spec", spec, "--out",
             out, "--bin_dir", BinDir(), "--parallel=1", "--trial_timeout_s=300"};
  so.output_file = JoinPath(dir, "sweep.log");
  auto proc = Subprocess::Spawn(so);
  REQUIRE(proc.ok());
  // Trial 0's chief, once it has trained some steps (its first event).
  const std::string chief =
      "chief --cluster_spec=" + JoinPath(out, "trial-0/cluster.json");
  absl::Status training = RetryWithBackoff("trial 0 training", absl::Seconds(120), [&]() {
    auto events = ReadScalarEvents(Env::Default(), JoinPath(out, "trial-0/events"));
    const bool trained = events.ok() && !events->empty() && events->back().step > 0;
    return trained && !testing::ProcessesMatching(chief).empty()
               ? absl::OkStatus()
               : absl::UnavailableError("not yet");
  });
  REQUIRE(training.ok());
  const std::vector<int> pids = testing::ProcessesMatching(chief);
  REQUIRE(pids.size() == 1);
  REQUIRE(::kill(pids[0], SIGKILL) == 0);
  std::optional<int> code = (*proc)->Wait(absl::Seconds(300));
  const std::string log = Env::Default()->ReadFile(so.output_file).value_or("");
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  const nlohmann::json killed = ReadJson(JoinPath(out, "trial-0/trial.json"));
  CHECK(killed["state"] == "failed");
  CHECK(killed["error"].get<std::string>().find("chief:0 exited with code 137") !=
        std::string::npos);
  const int64_t steps = killed["steps"].get<int64_t>();
  CHECK(steps > 0);
  CHECK(steps < 3000);
  CHECK(ReadJson(JoinPath(out, "trial-1/trial.json"))["state"] == "finished");
  CHECK(log.find("trial 1 (of 2) finished after ") != std::string::npos);
  CHECK(Env::Default()->FileExists(JoinPath(out, "results.csv")));
  // Nothing of the killed trial is left running.
  CHECK(testing::NoProcessesMatching(JoinPath(out, "trial-0"), absl::Seconds(10)));

  CommandResult resumed = Sweep(sweep, spec, out, {"--resume"});
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
  CHECK(resumed.output.find("1 finished before") != std::string::npos);
  CHECK(resumed.output.find("trial 0 (of 2) started") != std::string::npos);
  CHECK(resumed.output.find("trial 1 (of 2) started") == std::string::npos);
  const nlohmann::json again = ReadJson(JoinPath(out, "trial-0/trial.json"));
  CHECK(again["state"] == "finished");
  CHECK(again["steps"].get<int64_t>() == 3000);
}

}  // namespace
}  // namespace pstrain
