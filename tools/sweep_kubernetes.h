// `pstrain sweep --kubernetes`: each trial of a sweep as a Kubeflow TFJob of
// its own (tools/k8s_manifest.h), for Kubernetes to run: one manifest per
// trial, all sharing one volume and one cluster secret, each trial writing
// under the volume's /data/<name>/trial-<k>. `pstrain sweep --collect` then
// ranks what they wrote, once copied back.
#ifndef PSTRAIN_TOOLS_SWEEP_KUBERNETES_H_
#define PSTRAIN_TOOLS_SWEEP_KUBERNETES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/sweep_space.h"

namespace pstrain {

struct SweepKubernetesOptions {
  std::string out_dir;
  std::string name = "sweep";  // objects <name>-t<k>-..., the volume <name>-data
  std::string image;
  int num_ps = 1;
  int num_workers = 1;
  int gpus_per_worker = 0;
  std::string storage = "20Gi";  // the shared volume's size
};

// Where trial `index` writes inside its pods.
std::string KubernetesTrialDir(const std::string& name, int index);

// Writes out_dir/kubernetes-volume.yaml (the shared claim) and, for each
// trial, out_dir/trial-<k>/config.pbtxt (its config as the pods read it) and
// out_dir/trial-<k>/kubernetes.yaml. Returns the commands that run them.
absl::StatusOr<std::string> WriteKubernetesTrials(const SweepKubernetesOptions& options,
                                                  const SweepSpace& space,
                                                  const std::vector<SweepTrial>& trials);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_SWEEP_KUBERNETES_H_
