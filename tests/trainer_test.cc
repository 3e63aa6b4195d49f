// The worker's training loop (worker/trainer.h) on in-process parameter
// servers and an in-process chief: the sync step, the async step, a resume
// and a rollback, without processes or sockets. Each run's parameters are
// checked against the same model trained in this process as one worker of
// the global batch (the equivalence the multi-process tests check end to
// end, tests/cluster_test.cc).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "chief/chief_state.h"
#include "chief/in_process_chief_client.h"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/config.h"
#include "common/cluster/placement.h"
#include "common/storage/env.h"
#include "ps_server/in_process_client.h"
#include "ps_server/optimizer.h"
#include "ps_server/parameter_server.h"
#include "worker/data/loader.h"
#include "worker/data/partition.h"
#include "worker/model/backend.h"
#include "worker/model/model.h"
#include "worker/trainer.h"

namespace pstrain {
namespace {

constexpr int kBatch = 8;

// 120 examples of 4 features and 3 classes (the largest of three sums),
// written once per test binary.
std::string TrainCsv() {
  static const std::string path = [] {
    const char* dir = std::getenv("TEST_TMPDIR");
    std::string p = absl::StrCat(dir != nullptr ? dir : "/tmp", "/trainer_test_train.csv");
    FILE* f = std::fopen(p.c_str(), "w");
    REQUIRE(f != nullptr);
    uint64_t x = 12345;
    for (int i = 0; i < 120; ++i) {
      float v[4];
      for (float& e : v) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        e = static_cast<float>((x >> 40) % 2000) / 1000.0f - 1.0f;
      }
      const float a = v[0] + v[1], b = v[2] - v[1], c = v[3] - v[0];
      const int label = a >= b && a >= c ? 0 : (b >= c ? 1 : 2);
      std::fprintf(f, "%.3f,%.3f,%.3f,%.3f,%d\n", v[0], v[1], v[2], v[3], label);
    }
    std::fclose(f);
    return p;
  }();
  return path;
}

TrainingConfig Config(bool sync, int workers, int max_steps) {
  auto c = ParseTrainingConfig(
      absl::StrCat(R"(
model { mlp { input_dim: 4 hidden_units: 8 num_classes: 3 } }
data { format: CSV train_csv: ")",
                   TrainCsv(), R"(" csv_label_column: 4 batch_size: 8 shuffle: true }
optimizer { learning_rate: 0.2 }
rpc { step_timeout_ms: 20000 startup_timeout_ms: 20000 }
seed: 11
device: "cpu"
)",
                   "max_steps: ", max_steps, "\n"),
      "trainer_test");
  REQUIRE(c.ok());
  if (sync) {
    c->mutable_sync()->set_replicas_to_aggregate(workers);
  } else {
    c->mutable_async();
  }
  return *c;
}

// Two parameter servers and the chief's state as objects, initialised as
// the chief's driver does (at `start_step` from `params`, or at 0 from the
// seed), and workers that train on them in threads of this process.
struct InProcessCluster {
  InProcessCluster(const TrainingConfig& c, int workers, int64_t start_step = 0,
                   std::vector<Tensor> params = {}, std::vector<WorkerCursor> cursors = {})
      : config(c), num_workers(workers) {
    std::string spec = R"({"chief": ["localhost:1"], "ps": ["localhost:2", "localhost:3"], )"
                       R"("worker": [)";
    for (int w = 0; w < workers; ++w) {
      absl::StrAppend(&spec, w ? ", " : "", "\"localhost:", 10 + w, "\"");
    }
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
    if (params.empty()) params = model->Initialize(config.seed());
    REQUIRE(driver
                ->InitializeAll(config, fingerprint, workers, start_step, params,
                                absl::Seconds(1))
                .ok());
    chief->MarkInitialized(start_step, cursors);
  }

  std::unique_ptr<InProcessPsClient> Client(int worker) {
    auto c = std::make_unique<InProcessPsClient>(
        std::vector<ParameterServer*>{servers[0].get(), servers[1].get()}, &placement, worker);
    c->set_incarnation(incarnation);
    return c;
  }

  // Trains every worker to the end, each on a thread of its own.
  void Train() {
    statuses.assign(num_workers, absl::UnknownError("not run"));
    stats = std::vector<WorkerStats>(num_workers);
    std::vector<std::thread> threads;
    for (int w = 0; w < num_workers; ++w) {
      threads.emplace_back([this, w] {
        WorkerConnections connections;
        connections.chief = std::make_unique<InProcessChiefClient>(chief.get());
        connections.connect = [this, w](const Placement& p, const RegisterWorkerResponse& r) {
          auto client = std::make_unique<InProcessPsClient>(
              std::vector<ParameterServer*>{servers[0].get(), servers[1].get()}, &p, w);
          client->set_incarnation(r.incarnation());
          client->set_session(r.session());
          return std::unique_ptr<PsClient>(std::move(client));
        };
        WorkerOptions options;
        options.worker = w;
        options.report_every = 5;
        options.stats = &stats[w];
        statuses[w] = RunWorker(config, cluster, options, &stop, std::move(connections));
      });
    }
    for (std::thread& t : threads) t.join();
    for (int w = 0; w < num_workers; ++w) {
      INFO("worker " << w);
      CHECK(statuses[w].ok());
      if (!statuses[w].ok()) WARN(statuses[w].ToString());
    }
  }

  std::vector<Tensor> Params() {
    std::vector<Tensor> params;
    PsClient::PullResult r;
    REQUIRE(driver->PullAll({}, absl::Seconds(5), &params, &r).ok());
    return params;
  }

  TrainingConfig config;
  const int num_workers;
  ClusterSpec cluster;
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  std::unique_ptr<Model> model;
  Placement placement;
  std::unique_ptr<ParameterServer> servers[2];
  uint64_t incarnation = 0xA11CE;
  uint64_t fingerprint = 0;
  std::unique_ptr<Chief> chief;
  std::unique_ptr<InProcessPsClient> driver;
  StopSignal stop;
  std::vector<absl::Status> statuses;
  std::vector<WorkerStats> stats;
};

// The model trained in this process as one worker whose batch is every
// worker's batch of the step together: SGD at the config's rate.
struct Reference {
  Reference(const TrainingConfig& c, int workers) : config(c), num_workers(workers) {
    auto m = Model::Create(config.model(), cpu.get());
    REQUIRE(m.ok());
    model = std::move(*m);
    auto opt = CreateOptimizer(config.optimizer());
    REQUIRE(opt.ok());
    optimizer = std::move(*opt);
    params = model->Initialize(config.seed());
    slots.resize(params.size());
    for (size_t v = 0; v < params.size(); ++v) {
      optimizer->InitSlots(params[v].num_elements(), &slots[v]);
    }
    auto d = LoadDataset(Env::Default(), config.data(), DataSplit::kTrain, model->input_dim(),
                         model->num_labels());
    REQUIRE(d.ok());
    data = std::move(*d);
    for (int w = 0; w < workers; ++w) {
      partitions.push_back(std::make_unique<DataPartition>(&data, w, workers, kBatch, true,
                                                           config.seed()));
    }
  }
  void Steps(int64_t from, int64_t to) {
    std::vector<float> x, xw;
    std::vector<int32_t> y, yw;
    std::vector<Tensor> grads;
    for (int64_t step = from; step < to; ++step) {
      x.clear();
      y.clear();
      for (auto& p : partitions) {
        p->NextBatch(&xw, &yw);
        x.insert(x.end(), xw.begin(), xw.end());
        y.insert(y.end(), yw.begin(), yw.end());
      }
      float loss;
      REQUIRE(model->SetParameters(params).ok());
      REQUIRE(model->ComputeGradients(x.data(), y.data(), kBatch * num_workers, 0, &loss).ok());
      model->CopyGradients(&grads);
      UpdateInfo update;
      update.learning_rate = config.optimizer().learning_rate();
      update.count = step + 1;
      for (size_t v = 0; v < params.size(); ++v) {
        optimizer->Apply(absl::MakeSpan(params[v].values()), grads[v].span(), &slots[v], update);
      }
    }
  }
  std::vector<WorkerCursor> Cursors() const {
    std::vector<WorkerCursor> cursors;
    for (size_t w = 0; w < partitions.size(); ++w) {
      WorkerCursor& c = cursors.emplace_back();
      c.set_worker(static_cast<int>(w));
      c.set_epoch(partitions[w]->epoch());
      c.set_position(partitions[w]->position());
    }
    return cursors;
  }

  TrainingConfig config;
  const int num_workers;
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::vector<Tensor> params;
  std::vector<OptimizerSlots> slots;
  Dataset data;
  std::vector<std::unique_ptr<DataPartition>> partitions;
};

// Equal to float rounding: 1e-5 of the largest reference value, per variable.
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
    if (a[v].values() != b[v].values()) return false;
  }
  return true;
}

TEST_CASE("sync: two in-process workers of batch b train as one process of batch 2b",
          "[trainer][sync]") {
  const TrainingConfig config = Config(true, 2, 20);
  InProcessCluster run(config, 2);
  run.Train();
  Reference ref(config, 2);
  ref.Steps(0, 20);
  CheckClose(run.Params(), ref.params);
  for (const WorkerStats& s : run.stats) {
    CHECK(s.steps == 20);
    CHECK(s.examples == 20 * kBatch);
    CHECK(s.registered);
  }
  for (int s = 0; s < 2; ++s) {
    PsStatusResponse status;
    REQUIRE(run.driver->GetStatus(s, &status).ok());
    CHECK(status.version() == 20);
  }
}

TEST_CASE("sync: pushing during the backward pass changes nothing (bitwise, against "
          "rpc.sequential)",
          "[trainer][sync]") {
  InProcessCluster overlapped(Config(true, 2, 12), 2);
  overlapped.Train();
  TrainingConfig in_turn = Config(true, 2, 12);
  in_turn.mutable_rpc()->set_sequential(true);
  InProcessCluster sequential(in_turn, 2);
  sequential.Train();
  CHECK(BitwiseEqual(overlapped.Params(), sequential.Params()));
}

TEST_CASE("async: one in-process worker trains as sequential SGD of its batch",
          "[trainer][async]") {
  // Each pull is answered once the worker's own push is applied (it leaves
  // with the push), so with one worker every step sees the one before.
  const TrainingConfig config = Config(false, 1, 15);
  InProcessCluster run(config, 1);
  run.Train();
  Reference ref(config, 1);
  ref.Steps(0, 15);
  CheckClose(run.Params(), ref.params);
  CHECK(run.stats[0].steps == 15);
  CHECK(run.stats[0].gradients_dropped_stale == 0);
}

TEST_CASE("resume: workers registered at step k with their data cursors go on from there",
          "[trainer][resume]") {
  // The servers start at step 8 from the reference's parameters there, and
  // the chief gives each worker its cursor after 8 batches: the run ends
  // where one of 20 steps from the start does.
  const TrainingConfig config = Config(true, 2, 20);
  Reference ref(config, 2);
  ref.Steps(0, 8);
  InProcessCluster run(config, 2, /*start_step=*/8, ref.params, ref.Cursors());
  run.Train();
  ref.Steps(8, 20);
  CheckClose(run.Params(), ref.params);
  for (const WorkerStats& s : run.stats) CHECK(s.steps == 12);
}

TEST_CASE("rollback: workers follow the job back to step 0 and end where a run without it does",
          "[trainer][rollback]") {
  // As the driver rolls back (chief/rollback.cc, no checkpoint yet): the
  // chief holds registrations, the servers get a new incarnation from the
  // seed, and the workers, refused on the old one, register again and
  // start over with their data from the start.
  const TrainingConfig config = Config(true, 2, 20);
  InProcessCluster run(config, 2);
  std::thread driver([&run] {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (PsStatusResponse st; absl::Now() < deadline; absl::SleepFor(absl::Milliseconds(1))) {
      REQUIRE(run.driver->GetStatus(0, &st).ok());
      if (st.version() >= 6) break;
    }
    run.chief->BeginRollback();
    run.chief->SetServersDown(0);
    const uint64_t fresh = run.incarnation + 1;
    run.driver->set_incarnation(fresh);
    REQUIRE(run.driver
                ->InitializeAll(run.config, run.fingerprint, 2, 0,
                                run.model->Initialize(run.config.seed()), absl::Seconds(1))
                .ok());
    run.chief->FinishRollback(fresh, 0, {});
  });
  run.Train();
  driver.join();
  CHECK(run.chief->rollbacks() == 1);
  for (const WorkerStats& s : run.stats) CHECK(s.steps > 20);  // steps before it, again
  Reference ref(config, 2);
  ref.Steps(0, 20);
  CheckClose(run.Params(), ref.params);
}

TEST_CASE("a stop ends every worker's loop with CANCELLED", "[trainer]") {
  InProcessCluster run(Config(true, 2, 100000), 2);
  std::thread stopper([&run] {
    absl::SleepFor(absl::Milliseconds(200));
    run.stop.Stop("test over");
  });
  run.statuses.clear();
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&run, &statuses, w] {
      WorkerConnections connections;
      connections.chief = std::make_unique<InProcessChiefClient>(run.chief.get());
      connections.connect = [&run, w](const Placement& p, const RegisterWorkerResponse& r) {
        auto client = std::make_unique<InProcessPsClient>(
            std::vector<ParameterServer*>{run.servers[0].get(), run.servers[1].get()}, &p, w);
        client->set_incarnation(r.incarnation());
        return std::unique_ptr<PsClient>(std::move(client));
      };
      WorkerOptions options;
      options.worker = w;
      statuses[w] = RunWorker(run.config, run.cluster, options, &run.stop, std::move(connections));
    });
  }
  stopper.join();
  // A worker parked in a pull for its partner's step is woken by the
  // servers' shutdown, as the daemons' are.
  absl::SleepFor(absl::Milliseconds(50));
  for (auto& s : run.servers) s->Shutdown();
  for (std::thread& t : threads) t.join();
  for (const absl::Status& st : statuses) {
    INFO(st.ToString());
    CHECK((absl::IsCancelled(st) || absl::IsUnavailable(st)));
  }
}

}  // namespace
}  // namespace pstrain
