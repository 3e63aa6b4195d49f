// libFuzzer target: the training-config parser and its validation never
// crash, and a config they accept is accepted again unchanged (defaults
// are filled once).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/cluster/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pstrain::TrainingConfig> config = pstrain::ParseTrainingConfig(text, "fuzz");
  if (config.ok()) {
    pstrain::TrainingConfig again = *config;
    if (!pstrain::ValidateAndFillDefaults(&again, "fuzz").ok()) std::abort();
    if (again.SerializeAsString() != config->SerializeAsString()) std::abort();
  }
  return 0;
}
