// `pstrain checkpoint list|verify|inspect`: reading checkpoints from the
// command line (common/storage/checkpoint.h is the one reader).
//   list DIR             step, time, size, complete or not, which is latest
//   verify CKPT          exit 0 for a good checkpoint, else one line per problem
//   inspect CKPT [--json]  step, fingerprint, cursors, slots, and every
//                        variable's shape, partitions, min/max/mean/L2 norm
#ifndef PSTRAIN_TOOLS_CHECKPOINT_CLI_H_
#define PSTRAIN_TOOLS_CHECKPOINT_CLI_H_

#include <ostream>
#include <string>
#include <vector>

namespace pstrain {

// `argv` after "checkpoint". Returns the exit code: 0 done, 1 a bad or
// missing checkpoint, 2 a usage error.
int CheckpointCommand(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_CHECKPOINT_CLI_H_
