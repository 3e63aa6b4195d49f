#include "tests/in_process_testlib.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "chief/in_process_chief_client.h"
#include "common/cluster/config.h"
#include "common/storage/env.h"

namespace pstrain {
namespace testing {
namespace {

// Writes the examples [first, end) of the data set to `name` once.
std::string WriteCsv(const std::string& name, int first, int end) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
  FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f != nullptr);
  uint64_t x = 12345;
  for (int i = 0; i < end; ++i) {
    float v[4];
    for (float& e : v) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      e = static_cast<float>((x >> 40) % 2000) / 1000.0f - 1.0f;
    }
    const float a = v[0] + v[1], b = v[2] - v[1], c = v[3] - v[0];
    const int label = a >= b && a >= c ? 0 : (b >= c ? 1 : 2);
    if (i >= first) std::fprintf(f, "%.3f,%.3f,%.3f,%.3f,%d\n", v[0], v[1], v[2], v[3], label);
  }
  std::fclose(f);
  return path;
}

}  // namespace

std::string TrainCsv() {
  static const std::string path = WriteCsv("in_process_train.csv", 0, 120);
  return path;
}

std::string TestCsv() {
  static const std::string path = WriteCsv("in_process_test.csv", 90, 120);
  return path;
}

TrainingConfig InProcessConfig(bool sync, int workers, int max_steps) {
  auto c = ParseTrainingConfig(
      absl::StrCat(R"(
model { mlp { input_dim: 4 hidden_units: 8 num_classes: 3 } }
data { format: CSV train_csv: ")",
                   TrainCsv(), R"(" csv_label_column: 4 batch_size: 8 shuffle: true }
optimizer { learning_rate: 0.2 }
rpc { step_timeout_ms: 20000 startup_timeout_ms: 20000 }
seed: 11
device: "cpu"
max_steps: )",
                   max_steps, "\n"),
      "in_process_testlib");
  REQUIRE(c.ok());
  if (sync) {
    c->mutable_sync()->set_replicas_to_aggregate(workers);
  } else {
    c->mutable_async();
  }
  return *c;
}

InProcessCluster::InProcessCluster(const TrainingConfig& c, int workers, int64_t start_step)
    : config(c), num_workers(workers) {
  std::string spec = R"({"chief": ["localhost:1"], "ps": ["localhost:2", "localhost:3"], )"
                     R"("worker": [)";
  for (int w = 0; w < workers; ++w) absl::StrAppend(&spec, w ? ", " : "", "\"localhost:", 10 + w, "\"");
  auto parsed = ClusterSpec::Parse(spec + "]}", "test");
  INFO(parsed.status().ToString());
  REQUIRE(parsed.ok());
  cluster = *parsed;
  auto m = Model::Create(config.model(), cpu.get());
  REQUIRE(m.ok());
  model = std::move(*m);
  auto p = Placement::Compute(model->variables(), 2, config.placement().partition_min_bytes(),
                              config.placement().partition_max_bytes());
  REQUIRE(p.ok());
  placement = *p;
  for (auto& s : servers) s = std::make_unique<ParameterServer>();
  fingerprint = ConfigFingerprint(config);
  chief = std::make_unique<Chief>(workers, config.max_steps(), incarnation, fingerprint,
                                  start_step);
  driver = Client(-1);
  stats = std::vector<WorkerStats>(workers);
}

InProcessCluster::~InProcessCluster() {
  if (threads_.empty()) return;
  stop.Stop("the test case ended");
  ReleasePulls();
  for (auto& s : servers) s->Shutdown();  // wakes workers parked in pulls
  for (std::thread& t : threads_) t.join();
}

void InProcessCluster::Initialize(int64_t start_step, std::vector<Tensor> params,
                                  const std::vector<WorkerCursor>& cursors) {
  if (params.empty()) params = model->Initialize(config.seed());
  REQUIRE(driver->InitializeAll(config, fingerprint, num_workers, start_step, params,
                                absl::Seconds(1))
              .ok());
  chief->MarkInitialized(start_step, cursors);
}

std::unique_ptr<InProcessPsClient> InProcessCluster::Client(int worker) {
  auto c = std::make_unique<InProcessPsClient>(
      std::vector<ParameterServer*>{servers[0].get(), servers[1].get()}, &placement, worker);
  c->set_incarnation(incarnation);
  return c;
}

WorkerConnections InProcessCluster::Connections(int w) {
  WorkerConnections connections;
  connections.chief = std::make_unique<InProcessChiefClient>(chief.get());
  connections.connect = [this, w](const Placement& p, const RegisterWorkerResponse& r) {
    auto client = std::make_unique<InProcessPsClient>(
        std::vector<ParameterServer*>{servers[0].get(), servers[1].get()}, &p, w);
    client->set_incarnation(r.incarnation());
    client->set_session(r.session());
    client->set_before_pull([this](const std::vector<int64_t>& min_versions) {
      absl::MutexLock lock(&gate_mu_);
      auto open = [this, &min_versions]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gate_mu_) {
        return held_from_ < 0 || min_versions.empty() || min_versions[0] < held_from_;
      };
      // Bounded: a test that never releases fails on its own deadline.
      gate_mu_.AwaitWithTimeout(absl::Condition(&open), absl::Seconds(60));
    });
    return std::unique_ptr<PsClient>(std::move(client));
  };
  return connections;
}

void InProcessCluster::HoldPullsFrom(int64_t step) {
  absl::MutexLock lock(&gate_mu_);
  held_from_ = step;
}

void InProcessCluster::ReleasePulls() {
  absl::MutexLock lock(&gate_mu_);
  held_from_ = -1;
}

void InProcessCluster::StartWorkers() {
  statuses.assign(num_workers, absl::UnknownError("not run"));
  stats = std::vector<WorkerStats>(num_workers);
  for (int w = 0; w < num_workers; ++w) {
    threads_.emplace_back([this, w] {
      WorkerOptions options;
      options.worker = w;
      options.report_every = 5;
      options.stats = &stats[w];
      statuses[w] = RunWorker(config, cluster, options, &stop, Connections(w));
    });
  }
}

void InProcessCluster::JoinWorkers(bool expect_ok) {
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  for (int w = 0; expect_ok && w < num_workers; ++w) {
    INFO("worker " << w << ": " << statuses[w].ToString());
    CHECK(statuses[w].ok());
  }
}

std::vector<Tensor> InProcessCluster::Params() {
  std::vector<Tensor> params;
  PsClient::PullResult r;
  absl::Status st = driver->PullAll({}, absl::Seconds(5), &params, &r);
  INFO(st.ToString());
  REQUIRE(st.ok());
  return params;
}

Reference::Reference(const TrainingConfig& config, int workers)
    : config_(config), num_workers_(workers) {
  auto m = Model::Create(config_.model(), cpu_.get());
  REQUIRE(m.ok());
  model_ = std::move(*m);
  auto opt = CreateOptimizer(config_.optimizer());
  REQUIRE(opt.ok());
  optimizer_ = std::move(*opt);
  params = model_->Initialize(config_.seed());
  slots_.resize(params.size());
  for (size_t v = 0; v < params.size(); ++v) {
    optimizer_->InitSlots(params[v].num_elements(), &slots_[v]);
  }
  auto d = LoadDataset(Env::Default(), config_.data(), DataSplit::kTrain, model_->input_dim(),
                       model_->num_labels());
  REQUIRE(d.ok());
  data_ = std::move(*d);
  for (int w = 0; w < workers; ++w) {
    partitions_.push_back(std::make_unique<DataPartition>(&data_, w, workers, kBatch,
                                                          config_.data().shuffle(),
                                                          config_.seed()));
  }
}

void Reference::Steps(int64_t from, int64_t to) {
  std::vector<float> x, xw;
  std::vector<int32_t> y, yw;
  std::vector<Tensor> grads;
  for (int64_t step = from; step < to; ++step) {
    x.clear();
    y.clear();
    for (auto& p : partitions_) {
      p->NextBatch(&xw, &yw);
      x.insert(x.end(), xw.begin(), xw.end());
      y.insert(y.end(), yw.begin(), yw.end());
    }
    float loss;
    REQUIRE(model_->SetParameters(params).ok());
    REQUIRE(model_->ComputeGradients(x.data(), y.data(), kBatch * num_workers_, 0, &loss).ok());
    model_->CopyGradients(&grads);
    UpdateInfo update;
    update.learning_rate = config_.optimizer().learning_rate();
    update.count = step + 1;
    for (size_t v = 0; v < params.size(); ++v) {
      optimizer_->Apply(absl::MakeSpan(params[v].values()), grads[v].span(), &slots_[v], update);
    }
  }
}

std::vector<WorkerCursor> Reference::Cursors() const {
  std::vector<WorkerCursor> cursors;
  for (size_t w = 0; w < partitions_.size(); ++w) {
    WorkerCursor& c = cursors.emplace_back();
    c.set_worker(static_cast<int>(w));
    c.set_epoch(partitions_[w]->epoch());
    c.set_position(partitions_[w]->position());
  }
  return cursors;
}

void CheckClose(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t v = 0; v < got.size(); ++v) {
    REQUIRE(got[v].shape() == want[v].shape());
    double max_diff = 0, max_abs = 0;
    for (int64_t i = 0; i < got[v].num_elements(); ++i) {
      max_diff = std::max(max_diff, std::fabs(double{got[v].values()[i]} - want[v].values()[i]));
      max_abs = std::max(max_abs, std::fabs(double{want[v].values()[i]}));
    }
    INFO("variable " << v << ": max |got - want| " << max_diff << ", max |want| " << max_abs);
    CHECK(max_diff <= 1e-5 * max_abs);
    CHECK(max_abs > 0);
  }
}

bool BitwiseEqual(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t v = 0; v < a.size(); ++v) {
    if (a[v].shape() != b[v].shape() || a[v].values() != b[v].values()) return false;
  }
  return true;
}

}  // namespace testing
}  // namespace pstrain
