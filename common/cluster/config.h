// Loading and validating the training config (text-format TrainingConfig).
// Syntax errors name the file, line and column; semantic errors name the file
// and the field. Defaults for unset knobs are filled in once, here, so every
// task sees the same effective config.
#ifndef PSTRAIN_COMMON_CLUSTER_CONFIG_H_
#define PSTRAIN_COMMON_CLUSTER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cluster/placement.h"
#include "proto/config.pb.h"

namespace pstrain {

// Parses text-format `text`; `source` names it in errors.
absl::StatusOr<TrainingConfig> ParseTrainingConfig(const std::string& text,
                                                   const std::string& source);
absl::StatusOr<TrainingConfig> LoadTrainingConfig(const std::string& path);

// Checks ranges and required fields, and fills defaults for unset knobs.
absl::Status ValidateAndFillDefaults(TrainingConfig* config, const std::string& source);

// A stable 64-bit fingerprint of the effective config (FNV-1a over the
// deterministic serialization): tasks compare it to refuse a mismatched config.
// The optimizer part of ValidateAndFillDefaults: checks every
// hyperparameter and fills the ones left out with their documented defaults.
// `max_steps` bounds the cosine schedule's default span.
absl::Status ValidateAndFillOptimizerDefaults(OptimizerConfig* optimizer, int64_t max_steps,
                                              const std::string& source);

uint64_t ConfigFingerprint(const TrainingConfig& config);

// What a run's tasks compare and its servers and checkpoints are tagged
// with: ConfigFingerprint(config), and for an external model the names and
// shapes of its variables too (read from its file): the config names the
// file by path alone, so two scripts that wrote different modules to the
// same path would otherwise pass as one run. For a built-in model,
// ConfigFingerprint(config) itself (its variables follow from the config).
uint64_t RunFingerprint(const TrainingConfig& config, const std::vector<VariableSpec>& variables);

bool IsSyncMode(const TrainingConfig& config);

// max_steps of a run that trains until it is stopped (a config with
// data.train_dir and no max_steps): far past any step a run reaches.
inline constexpr int64_t kUntilStopped = int64_t{1} << 62;
inline bool RunsUntilStopped(int64_t max_steps) { return max_steps >= kUntilStopped; }
// "120/600", or "120" for a run until stopped: how logs and progress show a step.
std::string StepText(int64_t step, int64_t max_steps);

// How long a run stopped by a signal spends saving its last steps
// (checkpoint.stop_save_seconds: 0 means 20 s); zero where it saves none
// (no checkpoint.dir, or -1).
absl::Duration StopSaveTimeout(const TrainingConfig& config);

// "sgd", "momentum", "adagrad", "adam", "adamw", "ftrl" ("sgd" when unset).
std::string OptimizerKindName(const OptimizerConfig& config);

// The model as a validated stack of layers: an `mlp` expands to its dense,
// activation and dropout layers and a softmax cross-entropy loss; a
// `sequential` is checked (one loss, last; a dense layer before it; sizes and
// rates in range). Errors name `source` and the field.
absl::StatusOr<SequentialConfig> ExpandModelConfig(const ModelConfig& model,
                                                   const std::string& source = "model");

// Where a worker computes: "auto" (or empty), "cpu" or "cuda:N".
struct DeviceSpec {
  enum class Kind { kAuto, kCpu, kCuda };
  Kind kind = Kind::kAuto;
  int index = 0;  // kCuda only
};
absl::StatusOr<DeviceSpec> ParseDeviceSpec(const std::string& text);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CLUSTER_CONFIG_H_
