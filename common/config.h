// Loading and validating the training config (text-format TrainingConfig).
// Syntax errors name the file, line and column; semantic errors name the file
// and the field. Defaults for unset knobs are filled in once, here, so every
// task sees the same effective config.
#ifndef PSTRAIN_COMMON_CONFIG_H_
#define PSTRAIN_COMMON_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
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
uint64_t ConfigFingerprint(const TrainingConfig& config);

bool IsSyncMode(const TrainingConfig& config);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CONFIG_H_
