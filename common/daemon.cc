#include "common/daemon.h"

#include "absl/flags/flag.h"
#include "common/allocator.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/status_macros.h"

namespace pstrain {

absl::StatusOr<DaemonSetup> SetUpDaemon(const std::string& expected_job, bool config_required,
                                        const char* tf_config) {
  DaemonSetup setup;
  TuneAllocator();
  ASSIGN_OR_RETURN(setup.task,
                   ResolveTask(absl::GetFlag(FLAGS_cluster_spec), absl::GetFlag(FLAGS_job),
                               absl::GetFlag(FLAGS_task), tf_config ? tf_config : "",
                               expected_job));
  const std::string config_path = absl::GetFlag(FLAGS_config);
  if (!config_path.empty()) {
    ASSIGN_OR_RETURN(setup.config, LoadTrainingConfig(config_path));
  } else if (config_required) {
    return absl::InvalidArgumentError("--config=FILE (the training config) is required");
  }
  InitLogging(setup.task.task.ToString(), absl::GetFlag(FLAGS_log_level));
  return setup;
}

}  // namespace pstrain
