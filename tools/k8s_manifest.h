// `pstrain k8s-manifest`: Kubernetes manifests for a pstrain job, the same
// shape as configs/k8s (which documents them): the training config as a
// ConfigMap, a shared volume claim, and either a headless Service with one
// StatefulSet per role (the image's entry point builds TF_CONFIG from each
// pod's ordinal) or a Kubeflow TFJob. The cluster secret (and with `tls` the
// certificates) are not in them: they are created with kubectl from `pstrain
// tokens` (and `pstrain certs`); the output's header says how.
#ifndef PSTRAIN_TOOLS_K8S_MANIFEST_H_
#define PSTRAIN_TOOLS_K8S_MANIFEST_H_

#include <string>

#include "absl/status/statusor.h"

namespace pstrain {

struct K8sManifestOptions {
  std::string kind = "statefulsets";  // or "tfjob"
  std::string name = "pstrain";       // prefix of every object and pod
  std::string image;
  int num_ps = 2;
  int num_workers = 2;
  int gpus_per_worker = 0;
  std::string storage = "20Gi";  // the shared volume's size
  std::string config_text;       // the training config, as its file holds it
  // Mutual TLS from a Secret per role, <name>-tls-<job>, holding ca.crt and
  // that role's certificates and keys (`pstrain certs`): every daemon gets
  // --tls_dir, the probes use HTTPS.
  bool tls = false;
  // Several jobs sharing one volume and one secret (a sweep's trials): the
  // claim and the Secret named here are used, and no claim is written.
  std::string data_claim;   // empty: <name>-data, written with the job
  std::string auth_secret;  // empty: <name>-auth
};

// A Kubernetes name: a-z, 0-9 and '-', not at either end, 1 to `max` long.
bool IsDnsLabel(const std::string& s, size_t max);

// The manifests as one YAML stream; INVALID_ARGUMENT naming the flag for a
// name that is no DNS label, an image with spaces or quotes, counts out of
// range.
absl::StatusOr<std::string> RenderK8sManifest(const K8sManifestOptions& options);

// The shared volume's claim, <name>-data, of `storage` (ReadWriteMany).
std::string K8sDataClaim(const std::string& name, const std::string& storage);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_K8S_MANIFEST_H_
