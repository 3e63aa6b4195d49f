// `pstrain sweep`'s search space: a sweep file (proto/sweep.proto) read and
// checked, and expanded into trials, each the base training config with
// some of its fields set. Every trial's config is checked as
// `pstrain launch` would check it before anything runs, and every error is
// one line naming the parameter's field.
#ifndef PSTRAIN_TOOLS_SWEEP_SPACE_H_
#define PSTRAIN_TOOLS_SWEEP_SPACE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/config.pb.h"
#include "proto/sweep.pb.h"

namespace pstrain {

// A sweep file and the training config it names, as written (no defaults
// filled in: a trial's config is the user's with its fields changed).
struct SweepSpace {
  SweepConfig sweep;
  TrainingConfig base;
  std::string base_path;
};

// Reads `path`: its syntax, search, metric and limits, the base config
// (relative to the sweep file's directory), and every parameter's field.
absl::StatusOr<SweepSpace> LoadSweepSpace(const std::string& path);

// Sets the field at dotted `path` of `config` ("optimizer.learning_rate")
// to `value`, written as in a config: a string field's text as it is, a
// message's fields, a repeated field's list ("[64, 64]" or "64, 64").
// Messages on the way are created (choosing a oneof's member). Errors name
// the path and what was wrong.
absl::Status SetConfigField(TrainingConfig* config, const std::string& path,
                            const std::string& value);

struct SweepTrial {
  int index = 0;  // 0-based; the trial's directory is trial-<index>
  // Each parameter's field and its value as set.
  std::vector<std::pair<std::string, std::string>> params;
  // The base config with the parameters set: without output directories
  // (TrialConfig sets them).
  TrainingConfig config;
};

// "optimizer.learning_rate=0.1, seed=2".
std::string TrialParamsText(const std::vector<std::pair<std::string, std::string>>& params);

// The space's trials: grid (every combination, the first parameter
// slowest) or random (`trials` draws with the sweep's seed); each checked
// as pstrain launch would. More than max_trials (default 100) is refused.
absl::StatusOr<std::vector<SweepTrial>> ExpandSweep(const SweepSpace& space);

// `trial`'s config as it runs: its output_dir (and checkpoint.dir and
// checkpoint.serving_dir where the base set them) inside `dir`; with early
// stopping, an evaluation every early_stopping.min_steps steps, and no save
// on stop (a trial is stopped at a rung for being worse).
TrainingConfig TrialConfig(const SweepTrial& trial, const SweepConfig& sweep,
                           const std::string& dir);

// "accuracy", "auc" or "loss": whether higher is better, and the key in a
// run's summary.json.
struct SweepMetric {
  std::string name;
  std::string summary_key;
  bool higher_is_better = true;
};
SweepMetric MetricOf(const SweepConfig& sweep);

// ASHA's rungs (SweepEarlyStopping): where trials are compared, and which
// go on. Not thread-safe.
class SweepRungs {
 public:
  // No rungs where `early` is unset (min_steps 0).
  SweepRungs(const SweepEarlyStopping& early, int64_t max_steps, bool higher_is_better);
  // The steps of the rungs, ascending, each below max_steps.
  const std::vector<int64_t>& steps() const { return steps_; }
  int reduction() const { return reduction_; }
  // A trial's `value` at rung `k`: recorded; whether it is in the top
  // 1/reduction of the values recorded there (itself included: the
  // (1 - 1/reduction) quantile, interpolated as NumPy's percentile).
  bool Report(int k, double value);
  // The quantile a value at rung `k` must reach (in the metric's own sense).
  double Cutoff(int k) const;

 private:
  std::vector<int64_t> steps_;
  int reduction_ = 3;
  bool higher_is_better_ = true;
  std::vector<std::vector<double>> values_;  // per rung, oriented: higher is better
};

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_SWEEP_SPACE_H_
