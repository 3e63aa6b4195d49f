// The command-line tools (`pstrain launch`, `pstrain checkpoint restore`)
// call the daemons as the cluster's operator: with the operator's bearer
// token where the spec names a cluster secret, and over TLS with the
// operator's certificate where it names a TLS directory (common/security/auth.h).
#ifndef PSTRAIN_TOOLS_OPERATOR_H_
#define PSTRAIN_TOOLS_OPERATOR_H_

#include "absl/status/status.h"
#include "common/cluster/cluster_spec.h"

namespace pstrain {

// Sets this process's channels up as the operator's. The error names what
// could not be read.
absl::Status ActAsOperator(const ClusterSpec& cluster);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_OPERATOR_H_
