// The cluster's certificate authority, for `pstrain certs`: issues a CA,
// and a certificate and key for every task, the operator and the scraper;
// revokes a task's certificate with a new revocation list. Only the CLI
// (and tests that need certificates) link it: the daemons read what it
// wrote (common/security/tls.h) and never hold the CA's key. Stateless.
#ifndef PSTRAIN_TOOLS_CERTIFICATE_AUTHORITY_H_
#define PSTRAIN_TOOLS_CERTIFICATE_AUTHORITY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/cluster/cluster_spec.h"

namespace pstrain {

// Revokes the certificate `pstrain certs` wrote in `dir` for `identity`: a
// new revocation list signed by the CA (ca.key must be there), holding
// every serial the newest list in dir/crl held and this certificate's,
// written as the next dir/crl/<issuer hash>.rN, the name OpenSSL's
// directory lookup reads (openssl crl -in ... -noout -text shows it).
// `crl_path` receives its path, `revoked` (may be null) how many serials it
// holds. Renewed certificates of the task (pstrain certs again) have new
// serials and are not revoked.
absl::Status RevokeCertificate(const std::string& dir, const std::string& identity,
                               std::string* crl_path, int* revoked = nullptr);

// Writes a CA (unless `dir` already has ca.crt and ca.key, which are reused)
// and a certificate and key for every task of `cluster` (may be null: then
// only the operator's and the scraper's), for the operator and for the
// scraper (kMonitorIdentity), valid for `validity` (at most until a reused
// CA expires). Tasks that serve RPCs (ps, chief) name their host and
// themselves (TaskAltName); every task's certificate names kMetricsAltName;
// the operator's and the scraper's are for clients only. `written`
// receives the paths written, `expires` (may be null) when the new
// certificates expire.
//
// Without a cluster, `unplaced` may ask for the tasks of a cluster whose
// hosts are known only when it starts (Slurm, a Kubeflow TFJob): chief:0,
// ps:0..num_ps-1 and worker:0..num_workers-1, named by task only (no host):
// a client that dials a task checks its task name, one given only an address
// cannot check them.
struct UnplacedTasks {
  int num_ps = 0;
  int num_workers = 0;
};
absl::Status WriteClusterCertificates(const ClusterSpec* cluster, const std::string& dir,
                                      absl::Duration validity, std::vector<std::string>* written,
                                      absl::Time* expires = nullptr,
                                      const UnplacedTasks& unplaced = UnplacedTasks());

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_CERTIFICATE_AUTHORITY_H_
