#include "common/daemon.h"

#include "common/config.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace pstrain {

absl::StatusOr<DaemonSetup> SetUpDaemon(const DaemonFlags& flags, const std::string& expected_job) {
  DaemonSetup setup;
  ASSIGN_OR_RETURN(setup.task, ResolveTask(flags.cluster_spec, flags.job, flags.task,
                                           flags.tf_config, expected_job));
  if (!flags.config.empty()) {
    ASSIGN_OR_RETURN(setup.config, LoadTrainingConfig(flags.config));
  } else if (flags.config_required) {
    return absl::InvalidArgumentError("--config=FILE (the training config) is required");
  }
  InitLogging(setup.task.task.ToString(), flags.log_level);
  return setup;
}

}  // namespace pstrain
