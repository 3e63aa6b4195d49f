// Multi-process tests of training: the real chief, ps_server and worker
// binaries, started by the real `pstrain launch` on free loopback ports,
// always reaped. What the jobs learn, equivalence with one process of the
// global batch, the click-through model, bitwise determinism. A job's life
// as a user starts it (errors, signals, lost daemons, TF_CONFIG, plan,
// bench): tests/launch_test.cc.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/client/chief_client.h"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/config.h"
#include "common/storage/env.h"
#include "common/rpc/rpc.h"
#include "tools/subprocess.h"
#include "common/storage/tensor_file.h"
#include "common/testing/skip.h"
#include "common/rpc/wire_frame.h"
#include "nlohmann/json.hpp"
#include "proto/ps_service.grpc.pb.h"
#include "ps_server/embedding_table.h"
#include "ps_server/optimizer.h"
#include "common/base/embedding_ids.h"
#include "tests/cluster_testlib.h"
#include "worker/data/criteo_reader.h"
#include "worker/data/idx_reader.h"
#include "worker/data/partition.h"
#include "worker/model/backend.h"
#include "worker/model/embedding_bag.h"
#include "worker/model/model.h"

namespace pstrain {
namespace {

using testing::Binary;
using testing::BinDir;
using testing::CommandResult;
using testing::ConfigOptions;

struct Run {
  std::string dir;
  std::string spec;
  std::string config;
  CommandResult result;
  nlohmann::json summary;
};

Run Launch(const std::string& name, ConfigOptions o, int ps = 2, int workers = 2,
           absl::Duration timeout = absl::Seconds(120)) {
  Run run;
  run.dir = testing::FreshTempDir(name);
  run.spec = testing::WriteClusterSpec(run.dir, ps, workers);
  o.output_dir = JoinPath(run.dir, "out");
  run.config = testing::WriteFile(JoinPath(run.dir, "train.pbtxt"), testing::ConfigText(o));
  run.result = testing::RunCommand({Binary("tools/pstrain"), "launch", "--cluster_spec", run.spec,
                                    "--config", run.config, "--bin_dir", BinDir()},
                                   timeout);
  auto text = Env::Default()->ReadFile(JoinPath(o.output_dir, "summary.json"));
  if (text.ok()) run.summary = nlohmann::json::parse(*text, nullptr, false);
  return run;
}

// Worker 0's log of the run ("" when there is none).
std::string WorkerLog(const Run& run) {
  return Env::Default()->ReadFile(JoinPath(run.dir, "out/logs/worker-0.log")).value_or("");
}

TensorMap ReadModel(const Run& run) {
  auto m = ReadTensorFile(Env::Default(), JoinPath(JoinPath(run.dir, "out"), "model_final.pst"));
  REQUIRE(m.ok());
  return *m;
}

TEST_CASE("sync training on 1 chief, 2 ps, 2 workers learns the digits", "[cluster][sync]") {
  ConfigOptions o;
  o.max_steps = 300;
  Run run = Launch("sync_learns", o);
  INFO(run.result.output);
  REQUIRE(run.result.exit_code == 0);
  REQUIRE(run.summary.is_object());
  CHECK(run.summary["global_step"] == 300);
  CHECK(run.summary["eval_accuracy"].get<double>() >= 0.85);
  CHECK(run.summary["mode"] == "sync");
  // Every worker's gradient for every step, on both servers; nothing dropped.
  CHECK(run.summary["pushes_applied"] == 2 * 2 * 300);
  CHECK(run.summary["gradients_dropped_stale"] == 0);
  CHECK(run.result.output.find("held-out accuracy") != std::string::npos);
  CHECK(testing::NoProcessesMatching(run.dir, absl::Seconds(10)));
}

TEST_CASE("sync with backup workers: 1 of 2 gradients per step, stragglers dropped and counted",
          "[cluster][sync]") {
  ConfigOptions o;
  o.max_steps = 600;
  o.replicas_to_aggregate = 1;
  Run run = Launch("backup_workers", o);
  INFO(run.result.output);
  REQUIRE(run.result.exit_code == 0);
  REQUIRE(run.summary.is_object());
  CHECK(run.summary["global_step"] == 600);  // the servers stayed in step to the end
  // Arrival order decides which gradients count: not bitwise reproducible.
  // At 300 steps the final accuracy measured 0.88-0.91, and once 0.785 in
  // CI (0.895 at step 256: one worker's batch per step is a noisy step); at
  // 600 steps, 0.942-0.954 over 8 runs.
  CHECK(run.summary["eval_accuracy"].get<double>() >= 0.8);
  // Each step took the first gradient on each of the 2 servers.
  CHECK(run.summary["pushes_applied"] == 2 * 600);
  CHECK(run.summary["gradients_dropped_stale"].get<int64_t>() > 0);
  CHECK(run.summary["pushes_refused"] == 0);
}

TEST_CASE("a layered model (GELU, dropout) trains from CSV files; bad CSV stops the job clearly",
          "[cluster][csv]") {
  ConfigOptions o;
  o.max_steps = 300;
  o.csv = true;
  o.model =
      "sequential { input_dim: 784 layer { dense { units: 64 } } layer { gelu {} } "
      "layer { dropout { rate: 0.1 } } layer { dense { units: 10 } } "
      "layer { softmax_cross_entropy {} } }";
  Run run = Launch("csv_learns", o);
  INFO(run.result.output);
  REQUIRE(run.result.exit_code == 0);
  REQUIRE(run.summary.is_object());
  CHECK(run.summary["global_step"] == 300);
  CHECK(run.summary["eval_accuracy"].get<double>() >= 0.8);
  CHECK(run.summary["eval_examples"] == 500);

  // The same job on a training file with 3 malformed lines and a limit of 2.
  const std::string dir = testing::FreshTempDir("csv_bad");
  auto good = Env::Default()->ReadFile(JoinPath(testing::DigitsCsvDir(), "train.csv"));
  REQUIRE(good.ok());
  const std::string bad_csv =
      testing::WriteFile(JoinPath(dir, "train.csv"), *good + "1,2,3\nx,y\n4,oops\n");
  o.max_malformed_lines = 2;
  o.output_dir = JoinPath(dir, "out");
  std::string text = testing::ConfigText(o);
  const std::string from = JoinPath(testing::DigitsCsvDir(), "train.csv");
  text.replace(text.find(from), from.size(), bad_csv);
  const std::string config = testing::WriteFile(JoinPath(dir, "train.pbtxt"), text);
  const std::string spec = testing::WriteClusterSpec(dir, 1, 1);
  CommandResult r = testing::RunCommand({Binary("tools/pstrain"), "launch", "--cluster_spec", spec,
                                         "--config", config, "--bin_dir", BinDir()},
                                        absl::Seconds(60));
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find(bad_csv + ": more than 2 malformed lines (line 3004: expected 785 fields, "
                                "found 2)") != std::string::npos);
  CHECK(testing::NoProcessesMatching(dir, absl::Seconds(10)));
}

TEST_CASE("async training with a staleness bound learns the digits", "[cluster][async]") {
  ConfigOptions o;
  o.sync = false;
  o.staleness_bound = 2;
  // Async steps are single pushes; a few seconds of TensorBoard points. Under
  // the sanitizers, 1,500 (seconds there too).
  const int steps = testing::SanitizedSteps(3000, 1500);
  o.max_steps = steps;
  Run run = Launch("async_learns", o);
  INFO(run.result.output);
  REQUIRE(run.result.exit_code == 0);
  REQUIRE(run.summary.is_object());
  CHECK(run.summary["global_step"] == steps);
  CHECK(run.summary["eval_accuracy"].get<double>() >= 0.85);
  CHECK(run.summary["mode"] == "async");
  // TensorBoard's own reader sees the mean staleness of the pushes between
  // points: with 2 workers and a bound of 2, within [0, 3].
  const testing::PythonReaders py =
      testing::PythonWithModules("tensorboard.backend.event_processing.event_accumulator");
  if (!py.error.empty()) {
    testing::SkipCase("python", "the TensorBoard check: " + py.error);
    return;
  }
  CommandResult tb = testing::RunCommand(
      {py.python, "-c",
       "import sys\n"
       "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
       "a = EventAccumulator(sys.argv[1]); a.Reload()\n"
       "s = [p.value for p in a.Scalars('train/staleness')]\n"
       "lr = [p.value for p in a.Scalars('train/learning_rate')]\n"
       "print('staleness', s, 'learning rate', lr)\n"
       "assert s and all(0 <= v <= 3 for v in s) and lr and all(abs(v - 0.1) < 1e-6 for v in lr)\n",
       JoinPath(JoinPath(run.dir, "out"), "events")},
      absl::Seconds(120));
  INFO(tb.output);
  CHECK(tb.exit_code == 0);
}

// The cluster's trained variables against an in-process reference's: equal
// to float rounding (1e-5 of the largest reference value, per variable).
void CheckAgainstReference(const TensorMap& cluster, const Model& m,
                           const std::vector<Tensor>& params) {
  REQUIRE(cluster.size() == params.size());
  for (size_t v = 0; v < params.size(); ++v) {
    const std::string& var = m.variables()[v].name;
    REQUIRE(cluster.count(var) == 1);
    const Tensor& got = cluster.at(var);
    REQUIRE(got.shape() == params[v].shape());
    double max_diff = 0, max_abs = 0;
    for (int64_t i = 0; i < got.num_elements(); ++i) {
      max_diff = std::max(max_diff, std::fabs(double{got.values()[i]} - params[v].values()[i]));
      max_abs = std::max(max_abs, std::fabs(double{params[v].values()[i]}));
    }
    WARN(var << ": max |cluster - reference| = " << max_diff << ", max |reference| = " << max_abs
             << ", relative " << max_diff / max_abs);
    CHECK(max_diff <= 1e-5 * max_abs);
    CHECK(max_abs > 0);
  }
}

// A run's model trained in this process as one worker of the global batch:
// the config the run used, its initial values, its optimizer and schedule,
// applied step by step to the model's own gradients.
struct Reference {
  TrainingConfig config;
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::optional<LearningRate> learning_rate;
  std::vector<Tensor> params, grads;
  std::vector<OptimizerSlots> slots;

  Reference(const Run& run, int global_batch) {
    auto c = LoadTrainingConfig(run.config);
    REQUIRE(c.ok());
    config = *c;
    auto m = Model::Create(config.model(), cpu.get());
    REQUIRE(m.ok());
    model = std::move(*m);
    auto opt = CreateOptimizer(config.optimizer());
    REQUIRE(opt.ok());
    optimizer = std::move(*opt);
    auto lr = LearningRate::Create(config.optimizer(), global_batch, config.max_steps());
    REQUIRE(lr.ok());
    learning_rate = *lr;
    params = model->Initialize(config.seed());
    slots.resize(params.size());
    for (size_t v = 0; v < params.size(); ++v) {
      optimizer->InitSlots(params[v].num_elements(), &slots[v]);
    }
  }
  // Update `step` of every variable from the gradients the model computed.
  void ApplyGradients(int step) {
    model->CopyGradients(&grads);
    UpdateInfo update;
    update.learning_rate = learning_rate->At(step);
    update.count = step + 1;
    for (size_t v = 0; v < params.size(); ++v) {
      optimizer->Apply(absl::MakeSpan(params[v].values()), grads[v].span(), &slots[v], update);
    }
  }
};

// Trains `o` on the cluster (2 ps, 2 workers of batch b) and the same model,
// data order and optimizer in this process with batch 2b; the parameters must
// agree to float rounding.
void CheckEquivalence(const std::string& name, const ConfigOptions& o) {
  Run run = Launch(name, o);
  INFO(run.result.output);
  REQUIRE(run.result.exit_code == 0);
  TensorMap cluster = ReadModel(run);

  Reference ref(run, 2 * o.batch_size);
  Model& m = *ref.model;
  auto data = LoadIdxDataset(Env::Default(), ref.config.data().train_images(),
                             ref.config.data().train_labels(), 784, 10, true);
  REQUIRE(data.ok());
  DataPartition p0(&*data, 0, 2, o.batch_size, true, ref.config.seed());
  DataPartition p1(&*data, 1, 2, o.batch_size, true, ref.config.seed());
  std::vector<float> x0, x1;
  std::vector<int32_t> y0, y1;
  for (int step = 0; step < o.max_steps; ++step) {
    p0.NextBatch(&x0, &y0);
    p1.NextBatch(&x1, &y1);
    x0.insert(x0.end(), x1.begin(), x1.end());
    y0.insert(y0.end(), y1.begin(), y1.end());
    float loss;
    REQUIRE(m.SetParameters(ref.params).ok());
    REQUIRE(m.ComputeGradients(x0.data(), y0.data(), 2 * o.batch_size, step, &loss).ok());
    ref.ApplyGradients(step);
  }
  CheckAgainstReference(cluster, m, ref.params);
}

TEST_CASE("sync with 2 workers of batch b equals one process with batch 2b", "[cluster][equivalence]") {
  ConfigOptions o;
  o.max_steps = 40;
  o.batch_size = 16;
  o.learning_rate = 0.2f;
  CheckEquivalence("equivalence", o);
}

TEST_CASE("2 x b == 1 x 2b also holds with two hidden layers and GELU", "[cluster][equivalence]") {
  ConfigOptions o;
  o.max_steps = 40;
  o.batch_size = 16;
  o.learning_rate = 0.2f;
  o.hidden_units = {48, 32};
  o.gelu = true;
  CheckEquivalence("equivalence_gelu", o);
}

TEST_CASE("2 x b == 1 x 2b holds with Adam, warm-up and a cosine schedule",
          "[cluster][equivalence][optimizer]") {
  ConfigOptions o;
  o.max_steps = 40;
  o.batch_size = 16;
  o.learning_rate = 0.002f;
  o.optimizer = "adam {} schedule { kind: COSINE warmup_steps: 5 }";
  CheckEquivalence("equivalence_adam", o);
}

TEST_CASE("2 x b == 1 x 2b holds with Nesterov momentum and step decay",
          "[cluster][equivalence][optimizer]") {
  ConfigOptions o;
  o.max_steps = 40;
  o.batch_size = 16;
  o.learning_rate = 0.05f;
  o.optimizer = "momentum { nesterov: true } schedule { kind: STEP decay_steps: 15 decay_rate: 0.5 }";
  CheckEquivalence("equivalence_nesterov", o);
}

TEST_CASE("clip_global_norm bounds each step's move by lr x the clip norm", "[cluster][optimizer]") {
  // Each worker scales its whole gradient (every variable, both servers) to
  // a norm of at most c before pushing, so the averaged update moves the
  // parameters by at most lr * c per step, in L2 over the whole model.
  ConfigOptions o;
  o.max_steps = 20;
  o.batch_size = 16;
  o.learning_rate = 0.2f;
  o.eval_every_steps = 0;
  o.optimizer = "sgd {} clip_global_norm: 0.01";
  Run run = Launch("clip_norm", o);
  INFO(run.result.output);
  REQUIRE(run.result.exit_code == 0);
  TensorMap trained = ReadModel(run);
  auto config = LoadTrainingConfig(run.config);
  REQUIRE(config.ok());
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  auto model = Model::Create(config->model(), cpu.get());
  REQUIRE(model.ok());
  Model& m = **model;
  const std::vector<Tensor> initial = m.Initialize(config->seed());
  // The same run in this process: each worker's gradient clipped on its own,
  // then averaged and applied, as the servers do.
  auto data = LoadIdxDataset(Env::Default(), config->data().train_images(),
                             config->data().train_labels(), 784, 10, true);
  REQUIRE(data.ok());
  DataPartition p0(&*data, 0, 2, o.batch_size, true, config->seed());
  DataPartition p1(&*data, 1, 2, o.batch_size, true, config->seed());
  std::vector<Tensor> params = initial, g0, g1;
  std::vector<float> x0, x1;
  std::vector<int32_t> y0, y1;
  int clipped_steps = 0;
  for (int step = 0; step < o.max_steps; ++step) {
    p0.NextBatch(&x0, &y0);
    p1.NextBatch(&x1, &y1);
    float loss;
    REQUIRE(m.SetParameters(params).ok());
    REQUIRE(m.ComputeGradients(x0.data(), y0.data(), o.batch_size, 0, &loss).ok());
    clipped_steps += m.ClipGradientsByGlobalNorm(0.01f) > 0.01;
    m.CopyGradients(&g0);
    REQUIRE(m.ComputeGradients(x1.data(), y1.data(), o.batch_size, 0, &loss).ok());
    m.ClipGradientsByGlobalNorm(0.01f);
    m.CopyGradients(&g1);
    for (size_t v = 0; v < params.size(); ++v) {
      float* p = params[v].data();
      for (int64_t i = 0; i < params[v].num_elements(); ++i) {
        p[i] -= 0.2f * ((g0[v].values()[i] + g1[v].values()[i]) / 2.0f);
      }
    }
  }
  CHECK(clipped_steps == o.max_steps);  // the clip was active on every step
  double moved = 0;
  for (size_t v = 0; v < initial.size(); ++v) {
    const Tensor& t = trained.at(m.variables()[v].name);
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      const double d = double{t.values()[i]} - initial[v].values()[i];
      moved += d * d;
    }
  }
  moved = std::sqrt(moved);
  const double bound = 20 * 0.2 * 0.01;
  WARN("moved " << moved << " of at most " << bound);
  CHECK(moved <= bound * (1 + 1e-4));
  CHECK(moved > 0);
  for (size_t v = 0; v < params.size(); ++v) {
    const Tensor& t = trained.at(m.variables()[v].name);
    double max_diff = 0;
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      max_diff = std::max(max_diff, std::fabs(double{t.values()[i]} - params[v].values()[i]));
    }
    CHECK(max_diff <= 1e-6);
  }
}

using testing::ClickThroughOptions;

// Synthetic click-through data: its directory and the ground truth's AUC.
std::pair<std::string, double> CriteoData(const std::string& name,
                                          const std::vector<std::string>& flags) {
  auto data = testing::CriteoData(name, flags);
  INFO(data.status().message());
  REQUIRE(data.ok());
  return *data;
}

TEST_CASE("the click-through model on 2 servers reaches the ground truth's AUC within 0.02",
          "[cluster][embedding][click_through]") {
  // 26 fields of 100 values each, 13 numeric features; sync, 2 workers of
  // batch 256 (about two epochs), embedding rows of width 16 in a hashed
  // table spread over both servers, Adam on the servers.
  auto [dir, truth] = CriteoData("ctr_data", {"--train=200000", "--test=20000",
                                              "--values_per_field=100", "--seed=3"});
  ConfigOptions o = ClickThroughOptions(dir);
  o.batch_size = 256;
  o.learning_rate = 0.003f;
  // Under the sanitizers one epoch, 400 steps: the AUC there was 0.7804
  // (TSan, 2026-11-27), against 0.7818 after 800; 400 steps took 33 s of the
  // case's 80 s under TSan.
  o.max_steps = testing::SanitizedSteps(800, 400);
  o.eval_every_steps = 400;
  Run run = Launch("click_through", o, 2, 2, absl::Seconds(300));
  INFO(run.result.output);
  REQUIRE(run.result.exit_code == 0);
  REQUIRE(run.summary.is_object());
  REQUIRE(run.summary["eval_auc"].is_number());
  const double auc = run.summary["eval_auc"].get<double>();
  WARN("held-out AUC " << auc << ", ground truth " << truth << ", log loss "
                       << run.summary["eval_log_loss"].get<double>());
  CHECK(auc >= truth - 0.02);
  CHECK(run.summary["eval_log_loss"].get<double>() < std::log(2.0));  // better than a coin
}

TEST_CASE("the click-through model with multi-hot fields reaches the ground truth's AUC within "
          "0.02",
          "[cluster][embedding][click_through][schema]") {
  // The last 4 of the 26 categorical fields hold 1 to 4 values each
  // (datagen --multi_hot), the bag of each their sum; otherwise as above.
  auto [dir, truth] =
      CriteoData("ctr_multi_hot", {"--train=100000", "--test=10000", "--values_per_field=100",
                                   "--seed=4", "--multi_hot=4", "--max_values=4"});
  const std::string schema = Env::Default()->ReadFile(JoinPath(dir, "schema.pbtxt")).value();
  CHECK(schema.find("max_values: 4") != std::string::npos);
  ConfigOptions o = ClickThroughOptions(dir);
  o.data += absl::StrCat(" schema { ", schema, " }");
  o.batch_size = 256;
  o.learning_rate = 0.003f;
  o.max_steps = testing::SanitizedSteps(400, 200);
  o.eval_every_steps = 400;
  Run run = Launch("click_through_multi_hot", o, 2, 2, absl::Seconds(300));
  INFO(run.result.output);
  REQUIRE(run.result.exit_code == 0);
  REQUIRE(run.summary["eval_auc"].is_number());
  const double auc = run.summary["eval_auc"].get<double>();
  WARN("held-out AUC " << auc << ", ground truth " << truth);
  CHECK(auc >= truth - (testing::kSanitized ? 0.04 : 0.02));
}

TEST_CASE("the click-through model over two tables of their own dims and optimizers reaches "
          "the ground truth's AUC within 0.02",
          "[cluster][embedding][click_through][schema]") {
  // As above, but the 4 multi-hot fields share one vocabulary of items
  // (datagen --multi_hot_table) and look up a table of their own: "items",
  // rows of 8 with Adagrad, beside the 22 other fields' "features", rows of
  // 16 with the run's Adam. Two epochs of 200,000 examples: 0.7922 against
  // the truth's 0.8029 (2026-11-30; 0.7870 at 400 steps of 100,000, Adam).
  auto [dir, truth] = CriteoData(
      "ctr_two_tables", {"--train=200000", "--test=20000", "--values_per_field=100", "--seed=4",
                         "--multi_hot=4", "--max_values=4", "--multi_hot_table=items"});
  const std::string schema = Env::Default()->ReadFile(JoinPath(dir, "schema.pbtxt")).value();
  CHECK(schema.find("table: \"items\"") != std::string::npos);
  ConfigOptions o = ClickThroughOptions(dir);
  o.data += absl::StrCat(" schema { ", schema, " }");
  o.extra += " embedding_tables { name: \"items\" dim: 8 "
             "optimizer { learning_rate: 0.3 adagrad {} } }";
  o.batch_size = 256;
  o.learning_rate = 0.003f;
  o.max_steps = testing::SanitizedSteps(800, 400);
  o.eval_every_steps = 800;
  const std::string ckpt = JoinPath(testing::FreshTempDir("ctr_two_tables_ckpt"), "ckpt");
  o.extra += absl::StrCat(" checkpoint { dir: \"", ckpt, "\" }");  // at the last step
  Run run = Launch("click_through_two_tables", o, 2, 2, absl::Seconds(300));
  INFO(run.result.output);
  REQUIRE(run.result.exit_code == 0);
  REQUIRE(run.summary["eval_auc"].is_number());
  const double auc = run.summary["eval_auc"].get<double>();
  WARN("held-out AUC " << auc << ", ground truth " << truth);
  CHECK(auc >= truth - (testing::kSanitized ? 0.04 : 0.02));
  // Both tables' rows were trained and saved: the last checkpoint holds
  // each, at its own width.
  CommandResult inspect = testing::RunCommand(
      {Binary("tools/pstrain"), "checkpoint", "inspect",
       JoinPath(ckpt, absl::StrCat("ckpt-", o.max_steps))},
      absl::Seconds(60));
  INFO(inspect.output);
  REQUIRE(inspect.exit_code == 0);
  CHECK(inspect.output.find("[397,64]") != std::string::npos);  // 13 + 22 x 16 + 4 x 8
  CHECK(inspect.output.find("rows of width 16, optimizer adam") != std::string::npos);
  // The 4 fields' 100 items and the empty value, one row each.
  CHECK(inspect.output.find("embedding table items: 101 rows of width 8, optimizer adagrad") !=
        std::string::npos);
}

// The first click-through case's data and run for one epoch, with `model`
// in place of its MLP alone: the summary shows `layer` (the interaction,
// with its width), and the held-out AUC is within `bound` of the truth's
// (twice that under a sanitizer's half the steps).
void CheckInteractionModel(const std::string& name, const std::string& model,
                           const std::string& layer, double bound) {
  auto [dir, truth] = CriteoData("ctr_data", {"--train=200000", "--test=20000",
                                              "--values_per_field=100", "--seed=3"});
  ConfigOptions o = ClickThroughOptions(dir);
  o.model = model;
  o.batch_size = 256;
  o.learning_rate = 0.003f;
  o.max_steps = testing::SanitizedSteps(400, 200);
  o.eval_every_steps = 400;
  Run run = Launch(name, o, 2, 2, absl::Seconds(300));
  INFO(run.result.output);
  REQUIRE(run.result.exit_code == 0);
  CHECK(run.result.output.find(layer) != std::string::npos);
  REQUIRE(run.summary["eval_auc"].is_number());
  const double auc = run.summary["eval_auc"].get<double>();
  WARN("held-out AUC " << auc << ", ground truth " << truth);
  CHECK(auc >= truth - (testing::kSanitized ? 2 * bound : bound));
}

TEST_CASE("the click-through model with a DCN-v2 cross layer reaches the ground truth's AUC "
          "within 0.02",
          "[cluster][embedding][click_through][cross]") {
  // A cross layer over the 429 inputs before the MLP: the embeddings'
  // gradients come through it. 0.7786 against the truth's 0.7950
  // (2026-11-30; without the layer 0.7804 at 400 steps; a second epoch
  // overfits it, 0.7688 at 800, as the truth has no crosses to find).
  CheckInteractionModel("click_through_cross",
                        "click_through { table: \"features\" hidden_units: 64 cross_layers: 1 }",
                        "cross0(429)", 0.02);
}

TEST_CASE("the click-through model with DLRM's dot interaction trains to within 0.03 of the "
          "ground truth's AUC",
          "[cluster][embedding][click_through][dot]") {
  // The 13 numbers through a bottom MLP (64, 16), its vector and the 26
  // bags' pairwise dots (367 inputs) into the top MLP. 0.7731 against the
  // truth's 0.7950 (2026-11-30): that hidden model is a sum of weights,
  // which dots fit less directly than the MLP over the bags does (0.7804
  // at 400 steps); the bound is 0.03.
  CheckInteractionModel("click_through_dot",
                        "click_through { table: \"features\" hidden_units: 64 "
                        "dot { bottom_units: 64 bottom_units: 16 } }",
                        "dot0(367)", 0.03);
}

TEST_CASE("the click-through model with a hashed table of over 1,000,000 ids on 2 servers "
          "reaches the ground truth's AUC within 0.02",
          "[cluster][embedding][click_through]") {
  // The scale: 2,000,000 examples whose 26 fields draw from 1,000,000
  // values each by Zipf's law (exponent 1.4), which puts 1,106,300 distinct
  // ids in the training set; one epoch, sync, 2 workers of batch 256, Adam.
  // At the default law (density k^(-3/4)) half the draws land on values seen
  // fewer than 20 times, whose weights no run of this length can learn (the
  // README's "The click-through model"); here 4.5% do. On 2026-11-27: AUC
  // 0.7831 against the truth's 0.7989, 1,113,598 rows, 66 s for the case.
  //
  // Under the sanitizers, which look for races and memory errors, not for
  // accuracy, 300,000 examples and one epoch of them: AUC 0.7674 against
  // 0.7942 and 319,811 rows (TSan 83 s, ASan 34 s), so the bound is 0.04.
  const int examples = testing::kSanitized ? 300000 : 2000000;
  auto [dir, truth] = CriteoData(
      "ctr_million", {absl::StrCat("--train=", examples), "--test=20000",
                      "--values_per_field=1000000", "--zipf=1.4", "--seed=3"});
  ConfigOptions o = ClickThroughOptions(dir);
  o.batch_size = 256;
  o.learning_rate = 0.003f;
  o.max_steps = examples / (2 * o.batch_size);
  o.eval_every_steps = 0;
  Run run = Launch("click_through_million", o, 2, 2, absl::Seconds(600));
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);  // ~440 MB of text
  INFO(run.result.output);
  REQUIRE(run.result.exit_code == 0);
  REQUIRE(run.summary.is_object());
  REQUIRE(run.summary["eval_auc"].is_number());
  const double auc = run.summary["eval_auc"].get<double>();
  const int64_t rows = run.summary["embedding_tables"]["features"]["rows"].get<int64_t>();
  WARN("held-out AUC " << auc << ", ground truth " << truth << ", " << rows << " rows");
  // Every id of the epoch became a row (a hashed table with no admission),
  // and so did the held-out set's new ones when the chief evaluated.
  CHECK(rows >= (testing::kSanitized ? 300000 : 1000000));
  // Values, and Adam's two slots: 3 x 16 floats a row.
  CHECK(run.summary["embedding_tables"]["features"]["bytes"].get<int64_t>() == rows * 3 * 16 * 4);
  CHECK(auc >= truth - (testing::kSanitized ? 0.04 : 0.02));
}

TEST_CASE("2 x b == 1 x 2b holds for the click-through model with Adam, rows included",
          "[cluster][equivalence][embedding][click_through]") {
  auto [dir, truth] = CriteoData("ctr_small", {"--train=4000", "--test=500",
                                               "--values_per_field=50", "--seed=5"});
  ConfigOptions o = ClickThroughOptions(dir);
  o.batch_size = 16;
  o.learning_rate = 0.002f;
  o.max_steps = 30;
  Run run = Launch("ctr_equivalence", o);
  INFO(run.result.output);
  REQUIRE(run.result.exit_code == 0);
  TensorMap cluster = ReadModel(run);

  // The same training in this process with batch 2b: the rows from an
  // EmbeddingTable of the servers' own code, the dense variables from Adam.
  const int b = o.batch_size;
  Reference ref(run, 2 * b);
  Model& m = *ref.model;
  m.set_input_gradient(true);
  auto data = LoadCriteoDataset(Env::Default(), ref.config.data().train_tsv(), 0);
  REQUIRE(data.ok());
  const int fields = data->id_fields, dim = 16;
  DataPartition p0(&*data, 0, 2, b, true, ref.config.seed());
  DataPartition p1(&*data, 1, 2, b, true, ref.config.seed());
  auto table_optimizer = CreateOptimizer(ref.config.optimizer());
  REQUIRE(table_optimizer.ok());
  EmbeddingTable::Options to;
  to.name = "features";
  to.dim = dim;
  to.init_scale = ref.config.embedding_tables(0).init_scale();
  to.seed = TableSeed(ref.config.seed(), "features");
  EmbeddingTable table(to, table_optimizer->get());
  const EmbeddingBags bags(data->dim, fields, dim, Combiner::kSum);
  std::vector<float> x(2 * b * data->dim), xf, rows, row_grads;
  std::vector<int32_t> y(2 * b);
  std::vector<uint64_t> ids(2 * b * fields);
  for (int step = 0; step < o.max_steps; ++step) {
    p0.NextBatch(x.data(), y.data(), ids.data());
    p1.NextBatch(x.data() + b * data->dim, y.data() + b, ids.data() + b * fields);
    const SparseBatch sparse = SparseBatch::OnePerField(ids.data(), 2 * b, fields);
    const UniqueRows unique = UniqueRows::Of(sparse.ids);
    rows.resize(unique.ids.size() * dim);
    REQUIRE(table.Lookup(unique.ids, step, rows.data()).ok());
    xf.resize(2 * b * bags.output_dim());
    bags.Forward(sparse, unique, rows.data(), x.data(), xf.data());
    float loss;
    REQUIRE(m.SetParameters(ref.params).ok());
    REQUIRE(m.ComputeGradients(xf.data(), y.data(), 2 * b, 0, &loss).ok());
    row_grads.resize(rows.size());
    bags.Backward(sparse, unique, m.host_input_gradient(), row_grads.data());
    REQUIRE(table
                .ApplyGradients(unique.ids, row_grads.data(), 1.0f,
                                ref.learning_rate->At(step), 0, step + 1)
                .ok());
    ref.ApplyGradients(step);
  }
  CheckAgainstReference(cluster, m, ref.params);
}

TEST_CASE("the click-through model on a layout of the user's own trains bit for bit as on "
          "Criteo's",
          "[cluster][click_through][schema]") {
  auto [dir, truth] = CriteoData("ctr_layout", {"--train=4000", "--test=500",
                                                "--values_per_field=50", "--seed=5"});
  // The same examples as CSV files of another layout: a header, a row id
  // first, the numbers, the categories, the click last.
  std::string header = "row";
  for (int j = 1; j <= 13; ++j) absl::StrAppend(&header, ",I", j);
  for (int j = 1; j <= 26; ++j) absl::StrAppend(&header, ",C", j);
  header += ",click\n";
  for (const char* split : {"train", "test"}) {
    const std::string tsv =
        Env::Default()->ReadFile(JoinPath(dir, absl::StrCat(split, ".tsv"))).value();
    std::string csv = header;
    int64_t row = 0;
    for (absl::string_view line : absl::StrSplit(tsv, '\n', absl::SkipEmpty())) {
      std::vector<absl::string_view> f = absl::StrSplit(line, '\t');
      REQUIRE(f.size() == 40);
      absl::StrAppend(&csv, row++, ",",
                      absl::StrJoin(std::vector<absl::string_view>(f.begin() + 1, f.end()), ","),
                      ",", f[0], "\n");
    }
    testing::WriteFile(JoinPath(dir, absl::StrCat(split, ".csv")), csv);
  }
  ConfigOptions criteo = ClickThroughOptions(dir);
  criteo.batch_size = 16;
  criteo.max_steps = 40;
  ConfigOptions mine = criteo;
  // The 26 categorical columns as 25 and 1 (a count is its columns one by one).
  const std::string columns =
      "columns { name: \"row\" } "
      "columns { name: \"I\" kind: NUMERIC log1p: true integer: true count: 13 } "
      "columns { name: \"C\" kind: CATEGORICAL count: 25 } "
      "columns { name: \"C26\" kind: CATEGORICAL } ";
  mine.data = absl::StrCat("format: CRITEO train_tsv: \"", dir, "/train.csv\" test_tsv: \"", dir,
                           "/test.csv\" schema { separator: \",\" header: true ", columns,
                           "columns { name: \"click\" kind: LABEL } }");
  Run a = Launch("ctr_layout_criteo", criteo);
  Run b = Launch("ctr_layout_schema", mine);
  INFO(a.result.output << b.result.output);
  REQUIRE(a.result.exit_code == 0);
  REQUIRE(b.result.exit_code == 0);
  // The same ids (the same text in the same categorical order), the same
  // numbers: the dense variables, and the rows behind the evaluation, equal.
  TensorMap ma = ReadModel(a), mb = ReadModel(b);
  REQUIRE(ma.size() == mb.size());
  for (const auto& [var, t] : ma) {
    const Tensor& u = mb.at(var);
    REQUIRE(t.num_elements() == u.num_elements());
    CHECK(std::memcmp(t.data(), u.data(), t.num_elements() * sizeof(float)) == 0);
  }
  CHECK(a.summary["eval_auc"].get<double>() == b.summary["eval_auc"].get<double>());
  CHECK(a.summary["eval_loss"].get<double>() == b.summary["eval_loss"].get<double>());
  CHECK(b.summary["eval_examples"] == 500);
  // Every categorical column read as multi-hot (each cell one value): the
  // same bags, so the same model.
  ConfigOptions multi = criteo;
  multi.data = absl::StrCat(
      "format: CRITEO train_tsv: \"", dir, "/train.tsv\" test_tsv: \"", dir,
      "/test.tsv\" schema { columns { kind: LABEL } "
      "columns { kind: NUMERIC log1p: true integer: true count: 13 } "
      "columns { kind: CATEGORICAL hex: true count: 26 max_values: 3 } }");
  Run c = Launch("ctr_layout_multi_hot", multi);
  INFO(c.result.output);
  REQUIRE(c.result.exit_code == 0);
  TensorMap mc = ReadModel(c);
  REQUIRE(mc.size() == ma.size());
  for (const auto& [var, t] : ma) {
    CHECK(std::memcmp(t.data(), mc.at(var).data(), t.num_elements() * sizeof(float)) == 0);
  }
  CHECK(a.summary["eval_auc"].get<double>() == c.summary["eval_auc"].get<double>());
}

// Runs of options `oa` and `ob` (2 servers) end with bitwise identical
// parameters. Returns the first run's worker:0 log, then the second's.
std::pair<std::string, std::string> CheckBitwiseSame(const std::string& name,
                                                     const ConfigOptions& oa,
                                                     const ConfigOptions& ob, size_t variables,
                                                     int workers = 2) {
  Run a = Launch(name + "_a", oa, 2, workers);
  Run b = Launch(name + "_b", ob, 2, workers);
  INFO(a.result.output << b.result.output);
  REQUIRE(a.result.exit_code == 0);
  REQUIRE(b.result.exit_code == 0);
  TensorMap ma = ReadModel(a), mb = ReadModel(b);
  REQUIRE(ma.size() == variables);
  REQUIRE(ma.size() == mb.size());
  for (const auto& [var, t] : ma) {
    const Tensor& u = mb.at(var);
    REQUIRE(t.num_elements() == u.num_elements());
    CHECK(std::memcmp(t.data(), u.data(), t.num_elements() * sizeof(float)) == 0);
  }
  return {WorkerLog(a), WorkerLog(b)};
}

void CheckBitwiseReruns(const std::string& name, const ConfigOptions& o, size_t variables) {
  CheckBitwiseSame(name, o, o, variables);
}

TEST_CASE("two identical sync runs give bitwise identical parameters", "[cluster][determinism]") {
  ConfigOptions o;
  o.max_steps = 60;
  CheckBitwiseReruns("bitwise", o, 4);
}

TEST_CASE("a sync run without overlap (rpc.sequential) gives bitwise the same parameters",
          "[cluster][determinism]") {
  // Pushing layers during the backward pass and sending the next pull with
  // the push change when bytes travel, never what is summed or in which order.
  ConfigOptions o;
  o.max_steps = 60;
  o.hidden_units = {48, 32};
  ConfigOptions sequential = o;
  sequential.rpc_extra = "sequential: true";
  const std::string log = CheckBitwiseSame("bitwise_sequential", o, sequential, 6).second;
  CHECK(log.find("rpc.sequential: no push during the backward pass") != std::string::npos);
}

TEST_CASE("a sync run over 4 connections per server gives bitwise the same parameters",
          "[cluster][determinism]") {
  // Which connection carries a call changes when its bytes arrive, never
  // what a server sums or in which order. Calls of at most 64 KiB make
  // several per server per pull and push, so every connection carries some.
  ConfigOptions o;
  o.max_steps = 60;
  o.hidden_units = {48, 32};
  ConfigOptions pooled = o;
  pooled.rpc_extra = "connections_per_server: 4 call_bytes: 65536";
  CheckBitwiseSame("bitwise_connections", o, pooled, 6);
}

TEST_CASE("async, one worker: the next pull sent with the push gives bitwise the parameters of "
          "pulls made after it",
          "[cluster][determinism]") {
  // Each server answers the pull sent with a push once it has applied that
  // push: with one worker nothing else changes the model in between, so the
  // run is the sequential one, a round trip sooner per step.
  ConfigOptions o;
  o.sync = false;
  o.max_steps = 60;
  o.hidden_units = {48, 32};
  ConfigOptions sequential = o;
  sequential.rpc_extra = "sequential: true";
  const auto [overlapped, in_turn] =
      CheckBitwiseSame("async_prefetch", o, sequential, 6, /*workers=*/1);
  INFO(overlapped);
  // 60 steps and the pull that finds the run finished. Every pull but the
  // first two (before the first push, and the one after it, whose push had
  // no count of earlier pushes to ask after) came with a push.
  CHECK(overlapped.find("pulls sent with the previous step's push: 59 of 61") !=
        std::string::npos);
  CHECK(in_turn.find("pulls sent with the previous step's push: 0 of 61") != std::string::npos);
}

TEST_CASE("async, one worker, rpc.async_prefetch: each pull leaves a step ahead, and each push "
          "is computed without the worker's previous one",
          "[cluster][async]") {
  // The pull for step t + 1 leaves as step t's parameters come in, before
  // step t's push, and the server answers it at once: without push t (a
  // server slow to serve it may have some of push t's parts in by then;
  // push t leaves only after the step's compute). So every push but the
  // first is one update stale, as the servers count it. Calls of
  // 64 KiB make each push several parts per server, and the first two pushes
  // both come from version 0: the servers tell them apart by their push_seq.
  ConfigOptions o;
  o.sync = false;
  o.max_steps = 60;
  o.hidden_units = {48, 32};
  o.rpc_extra = "async_prefetch: true call_bytes: 65536";
  Run run = Launch("async_ahead", o, 2, 1);
  INFO(run.result.output);
  REQUIRE(run.result.exit_code == 0);
  const std::string log = WorkerLog(run);
  INFO(log);
  CHECK(log.find("rpc.async_prefetch: each pull is sent a step ahead") != std::string::npos);
  // Every pull but the first was sent a step ahead. The 61st, sent before
  // the 60th push, need not know the run ends there: then its step's push
  // is the one the servers answer FINISHED.
  CHECK(log.find("pulls sent a step ahead: 60 of 61") != std::string::npos);
  CHECK(run.summary["global_step"].get<int64_t>() == 60);
  // Each server admitted 60 pushes: the first computed from what it was
  // pulled after (staleness 0), each other one from the values before the
  // worker's previous push (1; 0 only if a server had served the pull after
  // that push's every part, which the wait for the compute makes rare).
  REQUIRE(run.summary["async_staleness_mean"].is_number());
  const double stale = run.summary["async_staleness_mean"].get<double>();
  CHECK(stale <= 59.0 / 60.0 + 1e-9);
  CHECK(stale >= 0.5);

  // Without it, a pull is answered after the worker's own push: none stale.
  o.rpc_extra = "call_bytes: 65536";
  Run plain = Launch("async_ahead_plain", o, 2, 1);
  INFO(plain.result.output);
  REQUIRE(plain.result.exit_code == 0);
  REQUIRE(plain.summary["async_staleness_mean"].is_number());
  CHECK(plain.summary["async_staleness_mean"].get<double>() == 0.0);
}

TEST_CASE("bitwise reruns with two hidden layers and GELU", "[cluster][determinism]") {
  ConfigOptions o;
  o.max_steps = 60;
  o.hidden_units = {48, 32};
  o.gelu = true;
  CheckBitwiseReruns("bitwise_gelu", o, 6);
}

}  // namespace
}  // namespace pstrain

