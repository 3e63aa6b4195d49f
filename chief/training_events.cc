#include "chief/training_events.h"

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/storage/env.h"

namespace pstrain {

TrainingEvents::TrainingEvents(const std::string& output_dir, int64_t start_step)
    : step_at_scalars_(start_step), time_at_scalars_(absl::Now()) {
  auto created = EventWriter::Create(Env::Default(), JoinPath(output_dir, "events"));
  if (created.ok()) {
    events_ = std::move(*created);
    LOG_INFO("TensorBoard events: {} (tensorboard --logdir {})", events_->path(), output_dir);
  } else {
    LOG_WARN("no TensorBoard events: {}", created.status());
  }
}

void TrainingEvents::SetStalenessTotals(int64_t count, double sum) {
  if (count < staleness_count_at_scalars_) {
    // A server started afresh: its totals began again at 0.
    staleness_count_at_scalars_ = count;
    staleness_sum_at_scalars_ = sum;
  }
  staleness_count_ = count;
  staleness_sum_ = sum;
}

void TrainingEvents::Write(int64_t step,
                           const std::vector<std::pair<std::string, double>>& scalars) {
  if (events_ == nullptr) return;
  if (absl::Status st = events_->WriteScalars(step, scalars); !st.ok()) {
    LOG_WARN("TensorBoard events stop: {}", st);
    events_.reset();
  }
}

void TrainingEvents::WriteTrainScalars(int64_t step, Chief* chief) {
  const absl::Time now = absl::Now();
  if (step <= step_at_scalars_ || now - time_at_scalars_ < absl::Seconds(1)) return;
  ChiefStatusResponse progress;
  chief->GetStatus(&progress);
  std::vector<std::pair<std::string, double>> scalars = {
      {"train/loss", progress.train_loss()},
      {"train/examples_per_second", progress.examples_per_sec()},
      {"train/step_time_seconds", absl::ToDoubleSeconds(now - time_at_scalars_) /
                                      static_cast<double>(step - step_at_scalars_)},
      {"train/learning_rate", learning_rate_}};
  if (staleness_count_ > staleness_count_at_scalars_) {
    scalars.push_back({"train/staleness",
                       (staleness_sum_ - staleness_sum_at_scalars_) /
                           static_cast<double>(staleness_count_ - staleness_count_at_scalars_)});
    staleness_count_at_scalars_ = staleness_count_;
    staleness_sum_at_scalars_ = staleness_sum_;
  }
  Write(step, scalars);
  step_at_scalars_ = step;
  time_at_scalars_ = now;
}

void TrainingEvents::WriteEvalScalars(const Evaluation& e) {
  std::vector<std::pair<std::string, double>> scalars = {{"eval/accuracy", e.result.accuracy()},
                                                         {"eval/loss", e.result.loss}};
  if (e.auc) {
    scalars.push_back({"eval/auc", *e.auc});
    scalars.push_back({"eval/log_loss", e.log_loss});
  }
  Write(e.step, scalars);
}

void TrainingEvents::Sync() {
  if (events_ != nullptr) (void)events_->Sync();
}

}  // namespace pstrain
