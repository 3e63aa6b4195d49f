// The chief's driver once the run has started (chief_runner.h's RunChief
// holds it): the loop that confirms the global step from the servers,
// evaluates, commits checkpoints, rolls every server back after a lost one
// or an operator's restore and writes training events, and then the end of
// the run (the final evaluation, the last checkpoint, the model and the
// summary; the servers shut down).
//
// What it owns: the schedule of evaluations, the checkpoint schedule, the
// events file and when each server went silent. It works through a PsClient
// (the gRPC one in the daemon; tests/driver_test.cc's in-process one) and
// the chief's state (Chief, which the service's threads share). Runs on the
// driver's thread only.
#ifndef PSTRAIN_CHIEF_DRIVER_H_
#define PSTRAIN_CHIEF_DRIVER_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chief/checkpoint_schedule.h"
#include "chief/eval_schedule.h"
#include "chief/chief_state.h"
#include "chief/run_context.h"
#include "chief/start_point.h"
#include "chief/training_events.h"
#include "common/base/shutdown.h"
#include "common/base/tensor.h"
#include "common/client/ps_client.h"
#include "worker/data/loader.h"
#include "worker/model/model.h"

namespace pstrain {

// What one round's poll of every server's status found.
struct ServerPoll {
  // The slowest version of the servers on this run's incarnation; the
  // lowest int64 when one did not answer or restarted (nothing confirmed).
  int64_t version = std::numeric_limits<int64_t>::max();
  bool all_answered = true;
  int down = 0;
  std::vector<std::string> restarted;  // "ps:1"
  std::optional<float> learning_rate;  // ps:0's
  int64_t staleness_count = 0;         // over every server
  double staleness_sum = 0;
};

// The training loop and the end of the run, over the state they share.
class Driver {
 public:
  Driver(const RunContext& run, Model* model, const Dataset* test, PsClient* ps, Chief* chief,
         StopSignal* stop, const ChiefStart& start, const RunStart& begun)
      : run_(run),
        model_(model),
        test_(test),
        ps_(ps),
        chief_(chief),
        stop_(stop),
        init_from_(start.init_from),
        adopted_(begun.adopted),
        max_steps_(run.config.max_steps()),
        // Without held-out data the chief has nothing to evaluate: no
        // periodic pull (an external model's workers report their own).
        evals_(test != nullptr ? run.config.eval_every_steps() : 0, max_steps_, begun.step),
        schedule_(run, ps, chief, begun.step, begun.adopted != 0),
        events_(run.config.output_dir(), begun.step),
        down_since_(ps->num_servers(), absl::InfiniteFuture()) {}

  // Until max_steps or every worker done: confirms the global step from the
  // servers, evaluates, commits checkpoints, rolls back, writes events.
  absl::Status Train();
  // The final evaluation, the last checkpoint, the model and the summary;
  // the servers shut down.
  absl::Status Finish();

 private:
  ServerPoll PollServers();
  // Whether every server answers, on this run's incarnation.
  bool ServersOnRun();
  absl::Status Restore(const std::string& checkpoint, bool finishing);
  absl::Status RecoverFromRestart(const std::vector<std::string>& restarted);
  absl::StatusOr<int64_t> RollBackTo(std::optional<ResumePoint> point, const std::string& why,
                                     absl::Time began);
  absl::Status CheckServersBack();
  absl::Status CheckProgress(int down, int64_t step);
  // false: put off (a server lost meanwhile; the rollback takes it up).
  absl::StatusOr<bool> EvaluateAt(int64_t step);
  // The evaluations workers reported since the last call: logged and
  // written to TensorBoard.
  void RecordWorkerEvals();
  // Once the stop signal is raised: true when the loop ends now (the save on
  // stop committed, not possible, or out of time); until then the workers
  // train on to the save's cut.
  bool StopNow(int64_t step);

  // The stop's save (checkpoint.stop_save_seconds): its step and deadline.
  struct StopSave {
    bool began = false;
    std::optional<int64_t> step;
    absl::Time deadline;
    int servers_down = 0;  // at the last poll
  };

  const RunContext& run_;
  Model* const model_;
  const Dataset* const test_;  // null: no test split
  PsClient* const ps_;
  Chief* const chief_;
  StopSignal* const stop_;
  const std::string init_from_;
  const uint64_t adopted_;
  const int64_t max_steps_;
  EvalSchedule evals_;
  CheckpointSchedule schedule_;
  TrainingEvents events_;
  // Servers the loop finds not answering, since when.
  std::vector<absl::Time> down_since_;
  // The variables as the last evaluation pulled them: the final model.
  std::vector<Tensor> params_;
  absl::Time started_;
  StopSave stop_save_;
};

}  // namespace pstrain

#endif  // PSTRAIN_CHIEF_DRIVER_H_
