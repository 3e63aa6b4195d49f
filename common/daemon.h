// What every daemon's main() does before its real work: resolve which task it
// is (from --cluster_spec/--job/--task or the TF_CONFIG value main() read from
// the environment), load and validate the training config, and start logging
// with the task's name. Errors come back as one line for stderr.
#ifndef PSTRAIN_COMMON_DAEMON_H_
#define PSTRAIN_COMMON_DAEMON_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/cluster_spec.h"
#include "proto/config.pb.h"

namespace pstrain {

struct DaemonFlags {
  std::string cluster_spec;
  std::string job;
  int task = 0;
  std::string tf_config;  // the TF_CONFIG environment value, or empty
  std::string config;     // training config path, or empty
  bool config_required = true;
  std::string log_level = "info";
};

struct DaemonSetup {
  TaskConfig task;
  std::optional<TrainingConfig> config;
};

// Resolves the task (which must belong to `expected_job`) and loads the config;
// on success logging is initialised with the task's name ("ps:1").
absl::StatusOr<DaemonSetup> SetUpDaemon(const DaemonFlags& flags, const std::string& expected_job);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_DAEMON_H_
