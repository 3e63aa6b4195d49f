// `pstrain sweep`'s flags, checked into SweepOptions.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "tools/args.h"
#include "tools/sweep.h"

namespace pstrain {

Args::FlagSpec SweepFlags() {
  return {
      {"sweep", {"", "the search space (text-format SweepConfig, proto/sweep.proto): the base "
                     "config, the fields to change and their values (docs/sweep.md)"}},
      {"cluster_spec", {"", "each trial's cluster shape: its servers and workers, on loopback "
                            "(each trial gets free ports of its own)"}},
      {"out", {"sweep_output", "where each trial's directory, results.csv and best.pbtxt go"}},
      {"parallel", {"0", "trials at once (0: the cores / workers per trial, at least 1; with "
                         "--slurm, as many as Slurm places)"}},
      {"resume", {"false", "run only the trials an earlier sweep in --out did not finish"}},
      {"bin_dir", {"", "directory with chief, ps_server and worker (default: next to pstrain)"}},
      {"trial_timeout_s", {"86400", "a trial still running after this long is stopped and "
                                    "counted as failed"}},
      {"slurm", {"false", "run each trial as a task of one Slurm job array (sbatch --array; "
                          "--out on a file system the nodes share) instead of on this machine"}},
      {"ps", {"1", "--slurm, --kubernetes: parameter servers per trial"}},
      {"workers", {"1", "--slurm, --kubernetes: workers per trial"}},
      {"base_port", {"8470", "--slurm: trial k's tasks listen from base_port + k x its tasks"}},
      {"sbatch_args", {"", "--slurm: more sbatch options, space-separated (--partition=gpu "
                           "--time=2:00:00 --gpus-per-task=1)"}},
      {"kubernetes", {"false", "write each trial's Kubernetes manifest (a Kubeflow TFJob) into "
                               "--out instead of running it; --collect ranks them afterwards"}},
      {"image", {"", "--kubernetes: the container image (configs/k8s/Containerfile)"}},
      {"name", {"sweep", "--kubernetes: the trials' name prefix (<name>-t<k>) and volume "
                         "(<name>-data; trials write under /data/<name>/trial-<k>)"}},
      {"gpus_per_worker", {"0", "--kubernetes: GPUs each worker pod asks for"}},
      {"storage", {"20Gi", "--kubernetes: the shared volume's size"}},
      {"collect", {"false", "run nothing: rank the trials from what their runs left in --out "
                            "(copied back from Kubernetes or another machine)"}},
  };
}

int RunSweepCommand(const std::vector<std::string>& argv, const std::string& pstrain,
                    StopSignal* stop, std::ostream& out) {
  auto Refuse = [](const std::string& message) {
    std::cerr << "pstrain sweep: " << message << "\n";
    return 2;
  };
  auto args = Args::Parse(argv, SweepFlags());
  if (!args.ok()) return Refuse(std::string(args.status().message()));
  SweepOptions o;
  o.sweep_file = args->Get("sweep");
  o.cluster_spec = args->Get("cluster_spec");
  o.out_dir = args->Get("out");
  o.slurm = args->GetBool("slurm");
  o.kubernetes = args->GetBool("kubernetes");
  o.collect = args->GetBool("collect");
  if (o.sweep_file.empty()) return Refuse("--sweep is required");
  if (o.slurm + o.kubernetes + o.collect > 1) {
    return Refuse("--slurm, --kubernetes and --collect: one at most");
  }
  // Each trial's shape: a local spec's, or the flags' where something else
  // places the tasks.
  if (o.slurm || o.kubernetes) {
    if (!o.cluster_spec.empty()) {
      return Refuse(absl::StrCat(o.slurm ? "--slurm" : "--kubernetes",
                                 " places each trial's tasks: give --ps and --workers instead of "
                                 "--cluster_spec"));
    }
    auto ps = args->GetInt("ps");
    auto workers = args->GetInt("workers");
    if (!ps.ok() || *ps < 1 || *ps > 1000) return Refuse("--ps: expected 1..1000");
    if (!workers.ok() || *workers < 1 || *workers > 10000) {
      return Refuse("--workers: expected 1..10000");
    }
    o.num_ps = static_cast<int>(*ps);
    o.num_workers = static_cast<int>(*workers);
  } else if (o.cluster_spec.empty() && !o.collect) {
    return Refuse("--cluster_spec is required (each trial's shape), or --slurm or --kubernetes");
  } else if (args->Get("ps") != "1" || args->Get("workers") != "1") {
    return Refuse("--ps and --workers: with --slurm or --kubernetes (a local sweep takes each "
                  "trial's shape from --cluster_spec)");
  }
  if (!o.slurm && (!args->Get("sbatch_args").empty() || args->Get("base_port") != "8470")) {
    return Refuse("--sbatch_args and --base_port: only with --slurm");
  }
  if (o.slurm) {
    auto base_port = args->GetInt("base_port");
    if (!base_port.ok() || *base_port < 1 || *base_port > 65535) {
      return Refuse("--base_port: expected 1..65535");
    }
    o.base_port = static_cast<int>(*base_port);
    o.sbatch_args = absl::StrSplit(args->Get("sbatch_args"), ' ', absl::SkipEmpty());
  }
  if (o.kubernetes) {
    auto gpus = args->GetInt("gpus_per_worker");
    if (!gpus.ok()) return Refuse("--gpus_per_worker: expected 0..16");
    SweepKubernetesOptions& k = o.kubernetes_options;
    k.out_dir = o.out_dir;
    k.name = args->Get("name");
    k.image = args->Get("image");
    k.num_ps = o.num_ps;
    k.num_workers = o.num_workers;
    k.gpus_per_worker = static_cast<int>(*gpus);
    k.storage = args->Get("storage");
    if (k.image.empty()) return Refuse("--kubernetes needs --image");
  } else if (!args->Get("image").empty() || args->Get("name") != "sweep" ||
             args->Get("gpus_per_worker") != "0" || args->Get("storage") != "20Gi") {
    return Refuse("--image, --name, --gpus_per_worker and --storage: only with --kubernetes");
  }
  o.resume = args->GetBool("resume");
  if (o.resume && (o.kubernetes || o.collect)) {
    return Refuse("--resume: only for trials this sweep runs (here or with --slurm)");
  }
  o.bin_dir = args->Get("bin_dir");
  auto parallel = args->GetInt("parallel");
  if (!parallel.ok() || *parallel < 0 || *parallel > 1024) {
    return Refuse("--parallel: expected 0..1024");
  }
  o.parallel = static_cast<int>(*parallel);
  auto timeout = args->GetInt("trial_timeout_s");
  if (!timeout.ok() || *timeout < 1) return Refuse("--trial_timeout_s: expected >= 1");
  o.trial_timeout = absl::Seconds(*timeout);
  o.pstrain = pstrain;
  return RunSweep(o, stop, out);
}

}  // namespace pstrain
