#include "tools/sweep_kubernetes.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/storage/env.h"
#include "google/protobuf/text_format.h"
#include "tools/k8s_manifest.h"

namespace pstrain {

std::string KubernetesTrialDir(const std::string& name, int index) {
  return absl::StrCat("/data/", name, "/trial-", index);
}

absl::StatusOr<std::string> WriteKubernetesTrials(const SweepKubernetesOptions& o,
                                                  const SweepSpace& space,
                                                  const std::vector<SweepTrial>& trials) {
  // RenderK8sManifest allows names of 40; the trials' add -t<k>.
  const size_t longest = 40 - absl::StrCat("-t", trials.empty() ? 0 : trials.back().index).size();
  if (!IsDnsLabel(o.name, longest)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--name: expected a DNS label of at most ", longest,
        " characters (a-z, 0-9, '-'; the trials' names add -t<k>)"));
  }
  Env* env = Env::Default();
  RETURN_IF_ERROR(env->CreateDirs(o.out_dir));
  K8sManifestOptions m;
  m.kind = "tfjob";  // a trial runs to its end, as Katib's trials do
  m.image = o.image;
  m.num_ps = o.num_ps;
  m.num_workers = o.num_workers;
  m.gpus_per_worker = o.gpus_per_worker;
  m.storage = o.storage;
  m.data_claim = o.name + "-data";
  m.auth_secret = o.name + "-auth";
  const std::string volume = JoinPath(o.out_dir, "kubernetes-volume.yaml");
  for (const SweepTrial& trial : trials) {
    std::string text;
    google::protobuf::TextFormat::PrintToString(
        TrialConfig(trial, space.sweep, KubernetesTrialDir(o.name, trial.index)), &text);
    m.name = absl::StrCat(o.name, "-t", trial.index);
    m.config_text = absl::StrCat("# pstrain sweep, trial ", trial.index, ": ",
                                 TrialParamsText(trial.params), "\n", text);
    absl::StatusOr<std::string> manifest = RenderK8sManifest(m);
    if (!manifest.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--kubernetes, trial ", trial.index, " (",
                                                     m.name, "): ", manifest.status().message()));
    }
    const std::string dir = JoinPath(o.out_dir, absl::StrCat("trial-", trial.index));
    RETURN_IF_ERROR(env->CreateDirs(dir));
    RETURN_IF_ERROR(WriteFileAtomically(env, JoinPath(dir, "config.pbtxt"), m.config_text));
    RETURN_IF_ERROR(WriteFileAtomically(env, JoinPath(dir, "kubernetes.yaml"), *manifest));
  }
  RETURN_IF_ERROR(
      WriteFileAtomically(env, volume,
                          absl::StrCat("# pstrain sweep: the volume every trial of ", o.name,
                                       " reads its data from and writes under /data/", o.name,
                                       "/trial-<k>\n", K8sDataClaim(o.name, o.storage))));
  return absl::StrCat("wrote ", trials.size(), " trial manifest(s), ", o.out_dir,
                      "/trial-<k>/kubernetes.yaml: ", "each a Kubeflow TFJob ", o.name,
                      "-t<k> of 1 chief, ", o.num_ps, " ps and ", o.num_workers,
                      " worker(s). Run them with\n"
                      "  pstrain tokens --out=auth\n"
                      "  kubectl create secret generic ",
                      o.name,
                      "-auth --from-file=cluster.secret=auth/cluster.secret\n"
                      "  kubectl apply -f ",
                      volume,
                      "   # then put the data where the config reads it\n"
                      "  for f in ",
                      o.out_dir,
                      "/trial-*/kubernetes.yaml; do kubectl apply -f \"$f\"; done\n"
                      "and, once they are done, copy /data/",
                      o.name, " from the volume into ", o.out_dir,
                      " and rank them:\n"
                      "  pstrain sweep --sweep=... --collect --out=",
                      o.out_dir, "\n");
}

}  // namespace pstrain
