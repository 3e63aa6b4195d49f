// A cluster in one process for the trainer's and the driver's unit tests
// (tests/trainer_test.cc, tests/driver_test.cc): two ParameterServer objects,
// the chief's state, and workers that run the real training loop
// (RunWorker) on threads, all through the in-process clients. No processes,
// no sockets. Also the reference those runs are checked against: the same
// model trained in this process as one worker of the global batch.
#ifndef PSTRAIN_TESTS_IN_PROCESS_TESTLIB_H_
#define PSTRAIN_TESTS_IN_PROCESS_TESTLIB_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "chief/chief_state.h"
#include "common/base/shutdown.h"
#include "common/base/tensor.h"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/placement.h"
#include "proto/config.pb.h"
#include "ps_server/in_process_client.h"
#include "ps_server/optimizer.h"
#include "ps_server/parameter_server.h"
#include "worker/data/loader.h"
#include "worker/data/partition.h"
#include "worker/model/backend.h"
#include "worker/model/model.h"
#include "worker/trainer.h"

namespace pstrain {
namespace testing {

// Examples per worker per step.
inline constexpr int kBatch = 8;

// 120 examples of 4 features and 3 classes in a CSV file under the test's
// temporary directory, written once per test binary; the last 30 also as
// the test split.
std::string TrainCsv();
std::string TestCsv();

// A 4-8-3 MLP on TrainCsv(), SGD at 0.2, `workers` in sync mode (all of
// them per step) or async, `max_steps`, seed 11, on the CPU.
TrainingConfig InProcessConfig(bool sync, int workers, int max_steps);

// Two servers and the chief's state, on `incarnation`.
class InProcessCluster {
 public:
  // Nothing initialised yet: see Initialize, or the driver's StartRun.
  // `start_step`: the chief's global step before it is initialised.
  InProcessCluster(const TrainingConfig& config, int workers, int64_t start_step = 0);
  // Stops and joins workers still running (a case that failed midway).
  ~InProcessCluster();

  // As the chief's start phase does: every server initialised at
  // `start_step` from `params` (the seed's when empty) and the chief told,
  // with each worker's data cursor.
  void Initialize(int64_t start_step = 0, std::vector<Tensor> params = {},
                  const std::vector<WorkerCursor>& cursors = {});

  // A client of the servers on this run's incarnation (worker -1: the chief).
  std::unique_ptr<InProcessPsClient> Client(int worker);
  // Worker `w`'s connections to the in-process chief and servers.
  WorkerConnections Connections(int w);

  // Sync workers wait before pulling for `step` or later until
  // ReleasePulls: a test's rollback or restore happens while they wait,
  // whatever the threads' timing.
  void HoldPullsFrom(int64_t step);
  void ReleasePulls();

  // Starts every worker's loop on a thread of its own; JoinWorkers waits for
  // them and checks each ended OK. Train does both.
  void StartWorkers();
  void JoinWorkers(bool expect_ok = true);
  void Train() {
    StartWorkers();
    JoinWorkers();
  }

  // The variables as the servers hold them now.
  std::vector<Tensor> Params();

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
  std::unique_ptr<InProcessPsClient> driver;  // worker -1
  StopSignal stop;                             // the workers'
  std::vector<absl::Status> statuses;          // per worker, once joined
  std::vector<WorkerStats> stats;              // per worker

 private:
  std::vector<std::thread> threads_;
  absl::Mutex gate_mu_;
  int64_t held_from_ ABSL_GUARDED_BY(gate_mu_) = -1;  // -1: none held
};

// The model trained in this process as one worker whose batch is every
// worker's batch of the step together, at the config's rate.
class Reference {
 public:
  Reference(const TrainingConfig& config, int workers);
  // Steps [from, to).
  void Steps(int64_t from, int64_t to);
  // Each worker's data cursor now.
  std::vector<WorkerCursor> Cursors() const;

  std::vector<Tensor> params;

 private:
  TrainingConfig config_;
  const int num_workers_;
  std::unique_ptr<Backend> cpu_ = NewCpuBackend(1);
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<OptimizerSlots> slots_;
  Dataset data_;
  std::vector<std::unique_ptr<DataPartition>> partitions_;
};

// Equal to float rounding: 1e-5 of the largest reference value, per
// variable (each must hold a non-zero value).
void CheckClose(const std::vector<Tensor>& got, const std::vector<Tensor>& want);
bool BitwiseEqual(const std::vector<Tensor>& a, const std::vector<Tensor>& b);

}  // namespace testing
}  // namespace pstrain

#endif  // PSTRAIN_TESTS_IN_PROCESS_TESTLIB_H_
