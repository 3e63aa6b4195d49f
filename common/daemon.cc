#include "common/daemon.h"

#include <malloc.h>

#include "absl/flags/flag.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/status_macros.h"

namespace pstrain {

absl::StatusOr<DaemonSetup> SetUpDaemon(const std::string& expected_job, bool config_required,
                                        const char* tf_config) {
  DaemonSetup setup;
  // Every step frees and reallocates the transport's multi-megabyte receive
  // buffers; glibc would hand the heap's top back to the kernel each time and
  // fault it in (zeroed) again on the next step. Keep up to one maximal
  // message of it instead: page faults per step drop from ~50 to ~4 on a
  // 1 MiB sync step (tests/data_path_test.cc).
  mallopt(M_TRIM_THRESHOLD, kMaxMessageBytes);
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
