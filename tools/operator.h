// The command-line tools (`pstrain launch`, `pstrain checkpoint restore`)
// call the daemons as the cluster's operator: signing each call with the
// operator's key where there is a cluster secret, and over TLS with the
// operator's certificate where the spec names a TLS directory
// (common/security/auth.h).
#ifndef PSTRAIN_TOOLS_OPERATOR_H_
#define PSTRAIN_TOOLS_OPERATOR_H_

#include <string>

#include "absl/status/status.h"
#include "common/cluster/cluster_spec.h"

namespace pstrain {

// Sets this process's channels up as the operator's, with the secret in
// `secret_file` (else the spec's, if it names one). The error names what
// could not be read.
absl::Status ActAsOperator(const ClusterSpec& cluster, const std::string& secret_file = "");

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_OPERATOR_H_
