#include "tools/sweep_space.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/storage/env.h"
#include "google/protobuf/text_format.h"

namespace pstrain {
namespace {

constexpr char kBase[] = R"(
model { mlp { input_dim: 784 hidden_units: 64 num_classes: 10 } }
data { train_images: "a" train_labels: "b" batch_size: 32 }
optimizer { learning_rate: 0.1 sgd {} }
max_steps: 100
output_dir: "base_out"
checkpoint { dir: "base_ckpt" every_steps: 50 }
)";

std::string Dir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = JoinPath(tmp != nullptr ? tmp : "/tmp", "sweep_space");
  REQUIRE(Env::Default()->CreateDirs(dir).ok());
  return dir;
}

// A sweep file over kBase (written beside it as base.pbtxt).
absl::StatusOr<SweepSpace> Space(const std::string& sweep_text) {
  const std::string dir = Dir();
  REQUIRE(WriteFileAtomically(Env::Default(), JoinPath(dir, "base.pbtxt"), kBase).ok());
  const std::string path = JoinPath(dir, "s.pbtxt");
  REQUIRE(WriteFileAtomically(Env::Default(), path,
                              absl::StrCat("base_config: \"base.pbtxt\"\n", sweep_text))
              .ok());
  return LoadSweepSpace(path);
}

TEST_CASE("a grid is every combination, the first parameter slowest; fields of every kind are "
          "set",
          "[sweep]") {
  auto space = Space(R"(
parameters { field: "optimizer.learning_rate" values { value: [0.01, 0.1] } }
parameters { field: "model.mlp.hidden_units" choices { choice: ["[32]", "128, 64"] } }
parameters { field: "rpc.wire_dtype" choices { choice: "bfloat16" } }
parameters { field: "seed" range { min: 1 max: 3 count: 3 } }
)");
  REQUIRE(space.ok());
  auto trials = ExpandSweep(*space);
  REQUIRE(trials.ok());
  REQUIRE(trials->size() == 12);
  const SweepTrial& first = trials->front();
  CHECK(first.params[0].second == "0.01");
  CHECK(first.params[1].second == "[32]");
  CHECK(first.params[3].second == "1");
  CHECK(first.config.optimizer().learning_rate() == 0.01f);
  CHECK(first.config.model().mlp().hidden_units_size() == 1);
  CHECK(first.config.rpc().wire_dtype() == "bfloat16");
  CHECK(first.config.seed() == 1);
  const SweepTrial& last = trials->back();
  CHECK(last.index == 11);
  CHECK(last.config.optimizer().learning_rate() == 0.1f);
  CHECK(last.config.model().mlp().hidden_units_size() == 2);
  CHECK(last.config.model().mlp().hidden_units(1) == 64);
  CHECK(last.config.seed() == 3);
  // The second trial differs from the first in the last parameter only.
  CHECK((*trials)[1].config.seed() == 2);
  CHECK((*trials)[1].params[1].second == "[32]");
  // The rest of the base config stays as written; the trial's outputs go to
  // its own directory.
  CHECK(first.config.max_steps() == 100);
  TrainingConfig run = TrialConfig(first, space->sweep, "sw/trial-0");
  CHECK(run.output_dir() == "sw/trial-0");
  CHECK(run.checkpoint().dir() == "sw/trial-0/checkpoints");
  CHECK(run.checkpoint().every_steps() == 50);
  CHECK(MetricOf(space->sweep).summary_key == "eval_accuracy");
}

TEST_CASE("a message field's choices replace the whole block: two optimizers compared",
          "[sweep]") {
  auto space = Space(R"(
parameters {
  field: "optimizer"
  choices {
    choice: "learning_rate: 0.01 adam {}"
    choice: "learning_rate: 0.2 momentum { momentum: 0.9 }"
  }
}
)");
  REQUIRE(space.ok());
  auto trials = ExpandSweep(*space);
  REQUIRE(trials.ok());
  REQUIRE(trials->size() == 2);
  CHECK((*trials)[0].config.optimizer().has_adam());
  CHECK((*trials)[0].config.optimizer().learning_rate() == 0.01f);
  CHECK_FALSE((*trials)[0].config.optimizer().has_sgd());  // the base's sgd {} replaced
  CHECK((*trials)[1].config.optimizer().has_momentum());
  CHECK((*trials)[1].config.optimizer().momentum().momentum() == 0.9f);
  // A choice that is not the message's fields is named.
  auto bad = Space(R"(parameters { field: "optimizer" choices { choice: "adam" } })");
  REQUIRE(bad.ok());
  absl::Status st = ExpandSweep(*bad).status();
  CHECK(
      std::string(st.message()).find("optimizer: \"adam\" is not a value of this message field") !=
      std::string::npos);
}

TEST_CASE("a log range spans its ends; random search draws the same trials from the same seed",
          "[sweep]") {
  auto grid = Space(R"(
parameters { field: "optimizer.learning_rate" range { min: 0.0001 max: 0.1 log: true count: 4 } }
metric: "loss"
)");
  REQUIRE(grid.ok());
  auto trials = ExpandSweep(*grid);
  REQUIRE(trials.ok());
  REQUIRE(trials->size() == 4);
  CHECK(std::abs((*trials)[0].config.optimizer().learning_rate() - 1e-4f) < 1e-9f);
  CHECK(std::abs((*trials)[1].config.optimizer().learning_rate() - 1e-3f) < 1e-8f);
  CHECK((*trials)[3].config.optimizer().learning_rate() == 0.1f);
  CHECK_FALSE(MetricOf(grid->sweep).higher_is_better);

  const std::string random = R"(
search: "random" trials: 20 seed: 7
parameters { field: "optimizer.learning_rate" range { min: 0.001 max: 1 log: true } }
parameters { field: "data.batch_size" choices { choice: ["16", "32", "64"] } }
)";
  auto a = Space(random);
  REQUIRE(a.ok());
  auto ta = ExpandSweep(*a);
  auto tb = ExpandSweep(*a);
  REQUIRE(ta.ok());
  REQUIRE(tb.ok());
  REQUIRE(ta->size() == 20);
  for (size_t k = 0; k < ta->size(); ++k) {
    CHECK((*ta)[k].params == (*tb)[k].params);
    const float lr = (*ta)[k].config.optimizer().learning_rate();
    CHECK(lr >= 0.001f);
    CHECK(lr <= 1.0f);
    const int batch = (*ta)[k].config.data().batch_size();
    CHECK((batch == 16 || batch == 32 || batch == 64));
  }
}

TEST_CASE("ASHA's rungs: min_steps x reduction^k below max_steps; the top 1/reduction go on",
          "[sweep]") {
  SweepEarlyStopping e;
  e.set_min_steps(20);
  e.set_reduction(3);
  CHECK(SweepRungs(e, 180, true).steps() == std::vector<int64_t>{20, 60});
  CHECK(SweepRungs(e, 181, true).steps() == std::vector<int64_t>{20, 60, 180});
  CHECK(SweepRungs(SweepEarlyStopping(), 1000, true).steps().empty());
  e.set_min_steps(int64_t{1} << 61);
  CHECK(SweepRungs(e, std::numeric_limits<int64_t>::max(), true).steps().size() == 2);
  e.set_min_steps(20);
  SweepRungs accuracy(e, 1000, true);
  CHECK(accuracy.Report(0, 0.9));        // alone at its rung: goes on
  CHECK_FALSE(accuracy.Report(0, 0.5));  // below the 2/3 quantile of {0.5, 0.9}: 0.767
  CHECK(std::abs(accuracy.Cutoff(0) - (0.5 + 2.0 / 3.0 * 0.4)) < 1e-12);
  CHECK(accuracy.Report(0, 0.95));       // of {0.5, 0.9, 0.95}: 0.9167
  CHECK(accuracy.Report(1, 0.1));        // another rung, its own values
  SweepRungs loss(e, 1000, false);
  CHECK(loss.Report(0, 1.0));
  CHECK_FALSE(loss.Report(0, 2.0));
  CHECK(loss.Report(0, 0.5));
}

TEST_CASE("a bad sweep is refused in one line naming the field", "[sweep][errors]") {
  struct Case {
    const char* sweep;
    const char* says;
  };
  for (const Case& c : {
           Case{"parameters { field: \"optimizer.learnin_rate\" values { value: 1 } }",
                "optimizer.learnin_rate: OptimizerConfig has no field \"learnin_rate\""},
           Case{"parameters { field: \"seed.x\" values { value: 1 } }",
                "seed.x: seed is not a message"},
           Case{"parameters { field: \"data.batch_size\" values { value: 0.5 } }",
                "data.batch_size: 0.5 is not a whole number"},
           Case{"parameters { field: \"rpc.wire_dtype\" values { value: 1 } }",
                "rpc.wire_dtype: values and range are for a number field"},
           Case{"parameters { field: \"model.mlp.activation\" choices { choice: \"TANH\" } }",
                "model.mlp.activation: \"TANH\" is not a value of this enum field"},
           Case{"parameters { field: \"rpc.wire_dtype\" choices { choice: \"float16\" } }",
                "rpc.wire_dtype"},
           Case{"parameters { field: \"optimizer.learning_rate\" values { value: -1 } }",
                "trial 0 (optimizer.learning_rate=-1)"},
           Case{"parameters { field: \"seed\" }", "seed: no values"},
           Case{"", "parameters: the space is empty"},
           Case{"search: \"bayes\" parameters { field: \"seed\" values { value: 1 } }",
                "search: expected grid or random"},
           Case{"metric: \"f1\" parameters { field: \"seed\" values { value: 1 } }",
                "metric: expected accuracy, auc or loss"},
           Case{"parameters { field: \"seed\" range { min: 1 max: 500 count: 500 } }",
                "more than max_trials (100)"},
           Case{"parameters { field: \"optimizer.learning_rate\" range { min: 0 max: 1 log: true "
                "count: 3 } }",
                "a log scale needs min > 0"},
           Case{"parameters { field: \"seed\" values { value: 1 } } bogus: 3", "s.pbtxt:"},
           Case{
               "early_stopping { min_steps: 0 } parameters { field: \"seed\" values { value: 1 } }",
               "early_stopping.min_steps: expected >= 1"},
           Case{"early_stopping { min_steps: 5 reduction: 1 } parameters { field: \"seed\" "
                "values { value: 1 } }",
                "early_stopping.reduction: expected 2..100"},
       }) {
    INFO(c.sweep);
    absl::StatusOr<SweepSpace> space = Space(c.sweep);
    absl::Status st = space.status();
    if (space.ok()) st = ExpandSweep(*space).status();
    INFO(st);
    REQUIRE_FALSE(st.ok());
    CHECK(std::string(st.message()).find(c.says) != std::string::npos);
    CHECK(std::string(st.message()).find('\n') == std::string::npos);
  }
  // A base config that is not there, or not valid, is named.
  const std::string dir = Dir();
  const std::string path = JoinPath(dir, "missing.pbtxt");
  REQUIRE(WriteFileAtomically(Env::Default(), path,
                              "base_config: \"nope.pbtxt\"\nparameters { field: \"seed\" "
                              "values { value: 1 } }\n")
              .ok());
  absl::StatusOr<SweepSpace> missing = LoadSweepSpace(path);
  REQUIRE_FALSE(missing.ok());
  CHECK(std::string(missing.status().message()).find("nope.pbtxt") != std::string::npos);
  CHECK_FALSE(LoadSweepSpace(JoinPath(dir, "no_such_sweep.pbtxt")).ok());
}

}  // namespace
}  // namespace pstrain
