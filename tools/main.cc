// pstrain: the command-line tool.
//   pstrain launch  --cluster_spec=F --config=C   start a local cluster and train
//   srun pstrain launch --slurm --ps=N --config=C one task of a Slurm job step
//   pstrain datagen --out=DIR                     write the synthetic digits dataset
//   pstrain plan    --cluster_spec=F --config=C   print the variable placement
//   pstrain tokens  --cluster_spec=F --out=DIR    write the cluster secret and task tokens
//   pstrain certs   --cluster_spec=F --out=DIR    write a cluster CA and task certificates
//   pstrain k8s-manifest --config=C --image=I     Kubernetes manifests for a job
//   pstrain prometheus-config --cluster_spec=F    a Prometheus scrape config for a spec
//   pstrain bench   [--suites=wire,apply]         data-path figures beside the machine's limits
//   pstrain checkpoint list|verify|inspect ...    read checkpoints
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/security/auth.h"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/config.h"
#include "common/storage/env.h"
#include "common/rpc/grpc_lifetime.h"
#include "common/rpc/rpc.h"
#include "common/cluster/sizing.h"
#include "common/cluster/slurm.h"
#include "common/base/status_macros.h"
#include "common/base/shutdown.h"
#include "common/security/tls.h"
#include "tools/certificate_authority.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "tools/args.h"
#include "tools/bench.h"
#include "tools/checkpoint_cli.h"
#include "tools/datagen.h"
#include "tools/k8s_manifest.h"
#include "tools/launcher.h"
#include "tools/plan.h"
#include "tools/sweep.h"
#include "tools/prometheus_config.h"
#include "worker/model/cpu_ops.h"

namespace pstrain {
namespace {

const char kUsage[] =
    "usage: pstrain <command> [flags]\n"
    "commands:\n"
    "  launch   start every local task of a cluster spec and train\n"
    "  datagen  write a synthetic dataset: digits (MNIST IDX format, or CSV) or click-through\n"
    "           data in the Criteo layout with its ground-truth AUC\n"
    "  plan     print how variables are placed on the parameter servers\n"
    "  tokens   write a cluster secret and each task's token (authentication)\n"
    "  certs    write a cluster CA and each task's certificate (mutual TLS)\n"
    "  k8s-manifest  Kubernetes manifests for a job (StatefulSets or a Kubeflow TFJob)\n"
    "  prometheus-config  a Prometheus configuration scraping every task of a cluster spec\n"
    "  bench    measure the data path beside the limits of this machine\n"
    "  sweep    a hyperparameter search: many jobs of one config with fields changed\n"
    "  checkpoint  list, verify, inspect, export (safetensors, npy) or restore checkpoints\n"
    "run 'pstrain <command> --help' for its flags\n";

// Makes a relative `path` absolute from the working directory; false (the
// path unchanged) when the working directory cannot be named.
bool MakeAbsolute(std::string* path) {
  if (path->empty() || (*path)[0] == '/') return true;
  char cwd[4096];
  if (::getcwd(cwd, sizeof(cwd)) == nullptr) return false;
  *path = JoinPath(cwd, *path);
  return true;
}

int Fail(const std::string& command, const std::string& message) {
  std::cerr << "pstrain " << command << ": " << message << "\n";
  return 2;
}

bool WantsHelp(const std::vector<std::string>& argv) {
  for (const std::string& a : argv) {
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

// `srun ... pstrain launch --slurm`: this rank's task of a cluster derived
// from Slurm's environment. The process becomes the task's daemon (exec, with
// TF_CONFIG set), so Slurm supervises, signals and reaps it directly.
int SlurmTask(const Args& args) {
  if (!args.Get("cluster_spec").empty()) {
    return Fail("launch", "--slurm derives the cluster from Slurm: drop --cluster_spec");
  }
  if (args.Get("config").empty()) return Fail("launch", "--config is required");
  if (args.Get("restart") != "never") {
    return Fail("launch", "--slurm: restarts are Slurm's (sbatch --requeue with --resume), not "
                          "--restart");
  }
  SlurmRoles roles;
  auto ps = args.GetInt("ps");
  auto workers = args.Get("workers").empty() ? absl::StatusOr<int64_t>(-1)
                                             : args.GetInt("workers");
  auto base_port = args.GetInt("base_port");
  if (!ps.ok() || *ps < 1 || *ps > 4096) return Fail("launch", "--ps: expected 1..4096");
  if (!workers.ok() || (*workers != -1 && (*workers < 1 || *workers > 65536))) {
    return Fail("launch", "--workers: expected 1..65536");
  }
  if (!base_port.ok() || *base_port < 1 || *base_port > 65535) {
    return Fail("launch", "--base_port: expected 1..65535");
  }
  roles.num_ps = static_cast<int>(*ps);
  roles.num_workers = static_cast<int>(*workers);
  roles.base_port = static_cast<int>(*base_port);
  nlohmann::json extras = nlohmann::json::object();
  // Absolute: every task reads them, each from its own working directory.
  if (std::string secret = args.Get("auth_secret_file"); !secret.empty()) {
    MakeAbsolute(&secret);
    extras["auth"] = {{"secret_file", secret}};
  }
  if (std::string tls = args.Get("tls_dir"); !tls.empty()) {
    MakeAbsolute(&tls);
    extras["tls"] = {{"dir", tls}};
  }
  if (args.GetBool("insecure")) extras["insecure"] = true;
  auto task = ResolveSlurmTask(
      [](const char* name) -> std::optional<std::string> {
        const char* v = std::getenv(name);
        if (v == nullptr) return std::nullopt;
        return std::string(v);
      },
      roles, extras.empty() ? "" : extras.dump());
  if (!task.ok()) return Fail("launch --slurm", std::string(task.status().message()));
  const std::string& job = task->task.task.job;
  const std::string name = job == kPsJob ? "ps_server" : job;
  const std::string binary = FindBinary(args.Get("bin_dir"), name, name);
  if (binary.empty()) {
    return Fail("launch --slurm", "cannot find the " + name +
                                      " binary next to pstrain or in --bin_dir");
  }
  // All of the node's addresses: a node's own name often resolves to a
  // loopback address on the node itself (Debian maps it to 127.0.1.1), where
  // no other node could reach it. Calls are authenticated (a secret, or an
  // explicit --insecure: ResolveAuth refuses anything else).
  std::vector<std::string> argv = {binary, "--config=" + args.Get("config"), "--bind=0.0.0.0"};
  if (args.GetBool("resume") && job == kChiefJob) argv.push_back("--resume");
  if (!args.Get("init_from").empty() && job == kChiefJob) {
    argv.push_back("--init_from=" + args.Get("init_from"));
  }
  if (args.GetBool("metrics")) argv.push_back("--metrics_address=0.0.0.0:0");
  const std::string address =
      task->task.cluster.address(task->task.task.job, task->task.task.index);
  std::cerr << "pstrain launch --slurm: rank " << task->rank << " of " << task->num_tasks
            << " on " << task->node << " is " << task->task.task.ToString() << " at " << address
            << "\n";
  if (task->rank == 0) {
    std::cerr << "pstrain launch --slurm: cluster "
              << nlohmann::json::parse(task->tf_config)["cluster"].dump() << "\n";
  }
  std::cerr.flush();
  ::setenv("TF_CONFIG", task->tf_config.c_str(), 1);
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  ::execv(binary.c_str(), cargv.data());
  return Fail("launch --slurm", absl::StrCat("exec ", binary, ": ", std::strerror(errno)));
}

int LaunchCommand(const std::vector<std::string>& argv) {
  const Args::FlagSpec flags = {
      {"cluster_spec", {"", "cluster spec JSON (TF_CONFIG's cluster format)"}},
      {"config", {"", "training config (text-format TrainingConfig)"}},
      {"bin_dir", {"", "directory with chief, ps_server and worker (default: next to pstrain)"}},
      {"log_dir", {"", "per-task logs (default: <output_dir>/logs)"}},
      {"verbose", {"false", "echo every task's log lines"}},
      {"progress", {"true", "show the live progress line"}},
      {"resume", {"false", "start from the latest complete checkpoint in the config's "
                           "checkpoint.dir (from the seed when there is none)"}},
      {"init_from", {"", "a checkpoint (ckpt-<step> directory) whose values start a new run "
                         "at step 0 with fresh optimizer state"}},
      {"overwrite", {"false", "start afresh in an output_dir that holds an earlier run: its "
                              "summary, final model and events are removed first (without this "
                              "or --resume, such a launch is refused)"}},
      {"restart", {"never", "never, or on-failure (needs checkpoint.dir): a failed worker or "
                            "server, or a chief that died, is restarted alone while the others "
                            "go on or wait (a server's or chief's restart rolls every server "
                            "back to the latest checkpoint); any other failure stops every task "
                            "and starts the job again from its latest checkpoint"}},
      {"max_restarts", {"3", "on-failure: restarts allowed before the run fails (backoff 1, 2, "
                             "4, ... 30 s)"}},
      {"metrics", {"true", "each local task serves /metrics, /healthz and /readyz on a free "
                           "port (printed as each task reports it)"}},
      {"max_inflight_mib", {"", "passed to the servers and the chief: memory for RPC messages "
                                "in flight, MiB (at least 512; default: theirs, raised to what "
                                "the job's calls need, up to half the machine, as pstrain plan "
                                "prints)"}},
      {"max_rpc_threads", {"", "passed to the servers and the chief: threads for synchronous "
                               "RPC handlers, 4..65536 (default: theirs)"}},
      {"max_concurrent_calls", {"", "passed to the servers: data calls served at once, at "
                                    "least 1 (default: theirs)"}},
      {"tier_dir", {"", "passed to the servers: where embedding tables with a "
                        "memory_budget_bytes keep the rows past it, on a local disk (default: "
                        "theirs, $TMPDIR, else /tmp)"}},
      {"handshake_timeout_ms", {"", "passed to the servers and the chief: a connection must "
                                    "finish its handshake within this, 100..86400000 "
                                    "(default: theirs, 20000)"}},
      {"keepalive_ms", {"", "passed to the servers and the chief: a peer quiet this long is "
                            "pinged, and dropped if it leaves the ping unanswered as long, "
                            "100..86400000 and at least the config's rpc.step_timeout_ms + "
                            "rpc.rpc_timeout_ms (default: theirs, 120000)"}},
      {"slurm", {"false", "run as one task of a Slurm job step (srun ... pstrain launch "
                          "--slurm): derive the cluster from Slurm's environment and become "
                          "this rank's chief, ps or worker; no --cluster_spec"}},
      {"ps", {"1", "--slurm: parameter servers (ranks 1..N; rank 0 is the chief)"}},
      {"workers", {"", "--slurm: workers (default: every remaining rank)"}},
      {"base_port", {"8470", "--slurm: the k-th task on a node listens on base_port + k"}},
      {"auth_secret_file", {"", "the cluster secret every task signs its calls with (pstrain "
                                "tokens --out DIR writes one); default: the spec's, or on "
                                "loopback a new one per run in <output_dir>/run.secret; "
                                "with --slurm, on a file system every node reads"}},
      {"insecure", {"false", "run without authentication: locally, no secret is made for the "
                             "run (any process on the machine may call its tasks); with "
                             "--slurm, on a trusted network only"}},
      {"tls_dir", {"", "--slurm: mutual TLS from this directory of pstrain certs (written with "
                       "--ps and --workers for a Slurm job: hosts are known only at start)"}},
      {"worker_cmd", {"", "run this shell command as each worker instead of the worker binary "
                          "(a model of your own, model { external { ... } }: e.g. \"python3 "
                          "train.py\"); it gets the worker's flags in PSTRAIN_WORKER_ARGS and "
                          "the task in TF_CONFIG (docs/pytorch.md)"}},
  };
  if (WantsHelp(argv)) {
    std::cout << "pstrain launch flags:\n" << Args::Usage(flags);
    return 0;
  }
  auto args = Args::Parse(argv, flags);
  if (!args.ok()) return Fail("launch", std::string(args.status().message()));
  if (args->GetBool("slurm")) return SlurmTask(*args);
  LaunchOptions o;
  o.cluster_spec = args->Get("cluster_spec");
  o.config = args->Get("config");
  if (o.cluster_spec.empty() || o.config.empty()) {
    return Fail("launch", "--cluster_spec and --config are required");
  }
  o.bin_dir = args->Get("bin_dir");
  o.log_dir = args->Get("log_dir");
  o.verbose = args->GetBool("verbose");
  o.progress = args->GetBool("progress");
  o.resume = args->GetBool("resume");
  o.init_from = args->Get("init_from");
  o.overwrite = args->GetBool("overwrite");
  o.insecure = args->GetBool("insecure");
  o.secret_file = args->Get("auth_secret_file");
  o.worker_cmd = args->Get("worker_cmd");
  if (o.insecure && !o.secret_file.empty()) {
    return Fail("launch", "--insecure and --auth_secret_file: choose one");
  }
  const std::string restart = args->Get("restart");
  if (restart != "never" && restart != "on-failure") {
    return Fail("launch", "--restart: expected never or on-failure");
  }
  auto max_restarts = args->GetInt("max_restarts");
  if (!max_restarts.ok() || *max_restarts < 0 || *max_restarts > 1000) {
    return Fail("launch", "--max_restarts: expected 0..1000");
  }
  o.max_restarts = restart == "on-failure" ? static_cast<int>(*max_restarts) : 0;
  o.metrics = args->GetBool("metrics");
  // The daemons' RPC limits, checked here so that a bad one stops the
  // launch before any task starts.
  struct LimitFlag {
    const char* name;
    int64_t min, max;
    std::vector<std::string>* to;
  };
  for (const LimitFlag& f : {LimitFlag{"max_inflight_mib", 512, int64_t{1} << 30, &o.server_flags},
                             LimitFlag{"max_rpc_threads", 4, 65536, &o.server_flags},
                             LimitFlag{"max_concurrent_calls", 1, 1 << 30, &o.ps_flags},
                             LimitFlag{"handshake_timeout_ms", kMinPeerTimeoutMs,
                                       kMaxPeerTimeoutMs, &o.server_flags},
                             LimitFlag{"keepalive_ms", kMinPeerTimeoutMs, kMaxPeerTimeoutMs,
                                       &o.server_flags}}) {
    if (args->Get(f.name).empty()) continue;
    auto value = args->GetInt(f.name);
    if (!value.ok() || *value < f.min || *value > f.max) {
      return Fail("launch", absl::StrCat("--", f.name, ": expected ", f.min, "..", f.max));
    }
    f.to->push_back(absl::StrCat("--", f.name, "=", *value));
  }
  if (const std::string& dir = args->Get("tier_dir"); !dir.empty()) {
    o.ps_flags.push_back("--tier_dir=" + dir);
  }
  {
    // Sized before any task starts (each task checks its own share again).
    auto cluster = ClusterSpec::FromFile(o.cluster_spec);
    auto config = LoadTrainingConfig(o.config);
    if (cluster.ok() && config.ok()) {
      absl::StatusOr<ModelPlan> plan = PlanModel(*cluster, *config);
      absl::Status st = plan.ok() ? CheckPlanFits(*cluster, *plan, nullptr) : plan.status();
      if (!st.ok()) return Fail("launch", std::string(st.message()));
      if (args->Get("max_inflight_mib").empty()) {
        if (const int64_t mib = LaunchInflightMib(*cluster, *config, *plan); mib > 0) {
          o.server_flags.push_back(absl::StrCat("--max_inflight_mib=", mib));
        }
      }
      // A worker may be paused as long as its push may wait; a server that
      // dropped it sooner would fail a step the deadlines allow.
      const int64_t longest_wait = config->rpc().step_timeout_ms() + config->rpc().rpc_timeout_ms();
      auto keepalive = args->GetInt("keepalive_ms");
      if (!args->Get("keepalive_ms").empty() && keepalive.ok() && *keepalive < longest_wait) {
        return Fail("launch", absl::StrCat("--keepalive_ms=", *keepalive,
                                           " is below rpc.step_timeout_ms + rpc.rpc_timeout_ms (",
                                           longest_wait, "): a worker paused that long would be "
                                           "dropped mid-step"));
      }
    }  // else Launch names the error
  }
  StopSignal& stop = StopOnTerminationSignals();
  KeepGrpcUntilExit();  // after the signals are blocked: gRPC's threads block them too
  return Launch(o, &stop);
}

int DatagenCommand(const std::vector<std::string>& argv) {
  const Args::FlagSpec flags = {
      {"out", {"", "output directory"}},
      {"format", {"idx", "idx (MNIST's four files), csv (train.csv, test.csv) or criteo "
                         "(click-through train.tsv, test.tsv)"}},
      {"train", {"", "training examples (digits 20000, criteo 200000)"}},
      {"test", {"", "held-out examples (digits 4000, criteo 50000)"}},
      {"values_per_field",
       {std::to_string(CriteoOptions().values_per_field),
        "criteo: categorical values per field (more: rarer values, harder to learn)"}},
      {"missing", {"0.05", "criteo: probability that a feature field is empty"}},
      {"zipf", {"0", "criteo: 0 draws a field's value k with density k^(-3/4); above 1, "
                     "Zipf's law k^(-zipf), as in real click logs"}},
      {"multi_hot", {"0", "criteo: the last N of the 26 categorical fields hold 1 to "
                          "--max_values values each, separated by |; the data.schema they "
                          "need is written to schema.pbtxt"}},
      {"max_values", {"4", "criteo: the most values of a multi-hot field's cell (2..64)"}},
      {"multi_hot_table",
       {"", "criteo: the multi-hot fields share one vocabulary of items and look up this "
            "embedding table of their own (named in schema.pbtxt; the config declares it)"}},
      {"seed", {"1", "random seed"}},
      {"difficulty", {"1.0", "0 = clean strokes, 1 = default warp and noise"}},
  };
  if (WantsHelp(argv)) {
    std::cout << "pstrain datagen flags:\n" << Args::Usage(flags);
    return 0;
  }
  auto args = Args::Parse(argv, flags);
  if (!args.ok()) return Fail("datagen", std::string(args.status().message()));
  if (args->Get("out").empty()) return Fail("datagen", "--out=DIR is required");
  const std::string format = args->Get("format");
  if (format != "idx" && format != "csv" && format != "criteo") {
    return Fail("datagen", "--format: expected idx, csv or criteo");
  }
  const bool criteo = format == "criteo";
  auto count = [&](const std::string& flag, int64_t fallback) -> absl::StatusOr<int64_t> {
    if (args->Get(flag).empty()) return fallback;
    return args->GetInt(flag);
  };
  auto train = count("train", criteo ? 200000 : 20000);
  auto test = count("test", criteo ? 50000 : 4000);
  if (criteo) {
    CriteoOptions c;
    auto seed = args->GetInt("seed");
    auto values = args->GetInt("values_per_field");
    auto missing = args->GetDouble("missing");
    auto zipf = args->GetDouble("zipf");
    auto multi_hot = args->GetInt("multi_hot");
    auto max_values = args->GetInt("max_values");
    for (const absl::Status& st :
         {train.status(), test.status(), seed.status(), values.status(), missing.status(),
          zipf.status(), multi_hot.status(), max_values.status()}) {
      if (!st.ok()) return Fail("datagen", std::string(st.message()));
    }
    c.train_examples = *train;
    c.test_examples = *test;
    c.seed = static_cast<uint64_t>(*seed);
    c.values_per_field = *values;
    c.missing = *missing;
    c.zipf = *zipf;
    c.multi_hot = static_cast<int>(std::clamp<int64_t>(*multi_hot, -1, 1000));
    c.max_values = static_cast<int>(std::clamp<int64_t>(*max_values, -1, 1000));
    c.multi_hot_table = args->Get("multi_hot_table");
    auto truth = WriteCriteoDataset(Env::Default(), args->Get("out"), c);
    if (!truth.ok()) return Fail("datagen", std::string(truth.status().message()));
    std::cout << "wrote " << c.train_examples << " training and " << c.test_examples
              << " held-out click-through examples to " << args->Get("out")
              << " (criteo: train.tsv, test.tsv"
              << (c.multi_hot > 0 ? "; their data.schema in schema.pbtxt" : "") << ")\n"
              << absl::StrFormat(
                     "ground-truth model on the held-out part: AUC %.4f, log loss %.4f, "
                     "click rate %.3f\n",
                     truth->test_auc, truth->test_log_loss, truth->positive_rate);
    return 0;
  }
  DigitsOptions o;
  auto seed = args->GetInt("seed");
  auto difficulty = args->GetDouble("difficulty");
  for (const absl::Status& st : {train.status(), test.status(), seed.status(),
                                 difficulty.status()}) {
    if (!st.ok()) return Fail("datagen", std::string(st.message()));
  }
  o.train_examples = *train;
  o.test_examples = *test;
  o.seed = static_cast<uint64_t>(*seed);
  o.difficulty = *difficulty;
  absl::Status st = format == "csv" ? WriteDigitsCsv(Env::Default(), args->Get("out"), o)
                                    : WriteDigitsDataset(Env::Default(), args->Get("out"), o);
  if (!st.ok()) return Fail("datagen", std::string(st.message()));
  std::cout << "wrote " << o.train_examples << " training and " << o.test_examples
            << " held-out digits to " << args->Get("out") << " (" << format << ")\n";
  return 0;
}

// The --cluster_spec of `pstrain tokens` and `certs`: none when empty.
absl::StatusOr<std::optional<ClusterSpec>> OptionalClusterSpec(const std::string& path) {
  if (path.empty()) return std::optional<ClusterSpec>();
  ASSIGN_OR_RETURN(ClusterSpec spec, ClusterSpec::FromFile(path));
  return std::optional<ClusterSpec>(std::move(spec));
}

// A directory for keys or secrets: one this creates is private (mode 0700);
// one that exists is left as it is (the files in it are private either way).
absl::Status CreatePrivateDir(const std::string& dir) {
  if (Env::Default()->IsDirectory(dir)) return absl::OkStatus();
  RETURN_IF_ERROR(Env::Default()->CreateDirs(dir));
  if (::chmod(dir.c_str(), 0700) != 0) {
    return absl::InternalError(absl::StrCat("cannot chmod 700 ", dir));
  }
  return absl::OkStatus();
}

// pstrain certs: a cluster CA (kept if it exists) and a certificate and key
// per task, for the operator and for the scraper, for mutual TLS (common/security/tls.h).
int CertsCommand(const std::vector<std::string>& argv) {
  const Args::FlagSpec flags = {
      {"cluster_spec", {"", "cluster spec JSON (without one: only the CA and the operator's "
                            "and the scraper's certificates)"}},
      {"out", {"", "directory for ca.crt, ca.key and JOB-INDEX.crt/.key (created, mode 0700)"}},
      {"days", {"365", "how long the certificates are valid"}},
      {"ps", {"0", "without a cluster spec: certificates for chief:0, ps:0..N-1 and the "
                   "--workers, named by task only, for hosts known only at start (Slurm, a "
                   "Kubeflow TFJob)"}},
      {"workers", {"0", "with --ps: how many workers"}},
      {"revoke", {"", "revoke the certificate in --out of this task (ps:1, worker:3, operator, "
                      "monitor), or the one in this file (old/ps-1.crt): a new revocation list "
                      "in --out/crl, which every task reads at each handshake"}},
  };
  if (WantsHelp(argv)) {
    std::cout << "pstrain certs flags:\n" << Args::Usage(flags);
    return 0;
  }
  auto args = Args::Parse(argv, flags);
  if (!args.ok()) return Fail("certs", std::string(args.status().message()));
  if (const std::string id = args->Get("revoke"); !id.empty()) {
    if (args->Get("out").empty()) return Fail("certs", "--revoke needs --out=DIR, the CA's");
    std::string crl;
    int revoked = 0;
    if (absl::Status st = RevokeCertificate(args->Get("out"), id, &crl, &revoked); !st.ok()) {
      return Fail("certs", std::string(st.message()));
    }
    std::cout << "revoked " << id << "'s certificate: " << crl << " lists " << revoked
              << " revoked certificate(s)\ncopy " << Dirname(crl)
              << " beside ca.crt on every task: each checks it at its next handshake "
                 "(connections already open stay)\n";
    return 0;
  }
  auto cluster = OptionalClusterSpec(args->Get("cluster_spec"));
  if (!cluster.ok()) return Fail("certs", std::string(cluster.status().message()));
  auto days = args->GetInt("days");
  if (!days.ok() || *days < 1 || *days > 3650) {
    return Fail("certs", "--days: a whole number of days from 1 to 3650");
  }
  const std::string out = args->Get("out");
  if (out.empty()) return Fail("certs", "--out=DIR is required");
  if (absl::Status st = CreatePrivateDir(out); !st.ok()) {
    return Fail("certs", std::string(st.message()));
  }
  const bool had_ca = Env::Default()->FileExists(JoinPath(out, "ca.crt"));
  std::vector<std::string> written;
  absl::Time expires;
  const ClusterSpec* spec = cluster->has_value() ? &cluster->value() : nullptr;
  auto num_ps = args->GetInt("ps");
  auto num_workers = args->GetInt("workers");
  if (!num_ps.ok() || !num_workers.ok() || *num_ps < 0 || *num_ps > 4096 || *num_workers < 0 ||
      *num_workers > 65536 || (*num_ps > 0) != (*num_workers > 0)) {
    return Fail("certs", "--ps and --workers: both or neither, 1..4096 and 1..65536");
  }
  if (spec != nullptr && *num_ps > 0) {
    return Fail("certs", "--ps and --workers are for a cluster without a spec: drop them or "
                         "--cluster_spec");
  }
  const UnplacedTasks unplaced{static_cast<int>(*num_ps), static_cast<int>(*num_workers)};
  if (absl::Status st = WriteClusterCertificates(spec, out, absl::Hours(24) * *days, &written,
                                                 &expires, unplaced);
      !st.ok()) {
    return Fail("certs", std::string(st.message()));
  }
  const bool capped = expires < absl::Now() + absl::Hours(24) * *days - absl::Minutes(1);
  std::cout << (had_ca ? "signed with the existing CA " : "wrote a new CA ")
            << JoinPath(out, "ca.crt") << "\nwrote " << written.size() - (had_ca ? 0 : 2)
            << " certificate and key files in " << out << ", valid until "
            << absl::FormatTime("%Y-%m-%d %H:%M UTC", expires, absl::UTCTimeZone())
            << (capped ? " (when the CA expires: move ca.crt and ca.key away for a new CA)" : "")
            << "\nevery task needs ca.crt and its own JOB-INDEX.crt and .key; keep ca.key "
               "off the cluster.\nPrometheus scrapes /metrics with monitor.crt and .key "
               "(pstrain prometheus-config).\nname the directory in the cluster spec:\n  \"pstrain\": "
               "{\"tls\": {\"dir\": \""
            << out << "\"}}\n";
  return 0;
}

// pstrain tokens: the cluster secret (kept if it exists) and one token file
// per task and for the operator, all mode 0600, in --out.
int TokensCommand(const std::vector<std::string>& argv) {
  const Args::FlagSpec flags = {
      {"cluster_spec", {"", "cluster spec JSON (without one: only the secret and the operator's "
                            "token, e.g. for a Slurm job)"}},
      {"out", {"", "directory for cluster.secret and the token files (created, mode 0700)"}},
  };
  if (WantsHelp(argv)) {
    std::cout << "pstrain tokens flags:\n" << Args::Usage(flags);
    return 0;
  }
  auto args = Args::Parse(argv, flags);
  if (!args.ok()) return Fail("tokens", std::string(args.status().message()));
  auto cluster = OptionalClusterSpec(args->Get("cluster_spec"));
  if (!cluster.ok()) return Fail("tokens", std::string(cluster.status().message()));
  const std::string out = args->Get("out");
  if (out.empty()) return Fail("tokens", "--out=DIR is required");
  if (absl::Status st = CreatePrivateDir(out); !st.ok()) {
    return Fail("tokens", std::string(st.message()));
  }
  const std::string secret_path = JoinPath(out, "cluster.secret");
  if (!Env::Default()->FileExists(secret_path)) {
    if (absl::Status st = CreateSecretFile(secret_path); !st.ok()) {
      return Fail("tokens", std::string(st.message()));
    }
    std::cout << "wrote a new cluster secret " << secret_path << "\n";
  }
  auto secret = ReadSecretFile(secret_path);
  if (!secret.ok()) return Fail("tokens", std::string(secret.status().message()));
  std::vector<std::string> identities;
  if (cluster->has_value()) {
    for (const TaskId& t : (*cluster)->AllTasks()) identities.push_back(t.ToString());
  }
  identities.push_back(kOperatorIdentity);
  for (const std::string& id : identities) {
    std::string file = id;
    std::replace(file.begin(), file.end(), ':', '-');
    const std::string path = JoinPath(out, file + ".token");
    if (absl::Status st = WritePrivateFile(path, DeriveToken(*secret, id) + "\n"); !st.ok()) {
      return Fail("tokens", std::string(st.message()));
    }
  }
  std::cout << "wrote " << identities.size() << " tokens in " << out
            << "\nparameter servers and the chief need the secret; a worker needs only its "
               "token (--auth_token_file=" << JoinPath(out, "worker-N.token")
            << ").\nname the secret in the cluster spec:\n  \"pstrain\": {\"auth\": "
               "{\"secret_file\": \"" << secret_path << "\"}}\n";
  return 0;
}

int K8sManifestCommand(const std::vector<std::string>& argv) {
  const Args::FlagSpec flags = {
      {"config", {"", "training config (checked, then carried in a ConfigMap; its paths should "
                      "be under /data, the shared volume)"}},
      {"image", {"", "the container image (configs/k8s/Containerfile builds one)"}},
      {"kind", {"statefulsets", "statefulsets (a headless Service and a StatefulSet per role) or "
                                "tfjob (a Kubeflow TFJob)"}},
      {"name", {"pstrain", "prefix of every object and pod (a DNS label)"}},
      {"ps", {"2", "parameter servers"}},
      {"workers", {"2", "workers"}},
      {"gpus_per_worker", {"0", "nvidia.com/gpu limit of each worker"}},
      {"storage", {"20Gi", "size of the shared volume for data, output and checkpoints"}},
      {"tls", {"false", "mutual TLS from a Secret per role, NAME-tls-chief, -ps and -worker, of "
                        "pstrain certs --ps=N --workers=M (the header says how); probes over "
                        "HTTPS"}},
  };
  if (WantsHelp(argv)) {
    std::cout << "pstrain k8s-manifest flags (the YAML goes to standard output):\n"
              << Args::Usage(flags);
    return 0;
  }
  auto args = Args::Parse(argv, flags);
  if (!args.ok()) return Fail("k8s-manifest", std::string(args.status().message()));
  if (args->Get("config").empty() || args->Get("image").empty()) {
    return Fail("k8s-manifest", "--config and --image are required");
  }
  // Read once: checked as a config, then carried as it is.
  auto text = Env::Default()->ReadFile(args->Get("config"));
  if (!text.ok()) return Fail("k8s-manifest", std::string(text.status().message()));
  auto config = ParseTrainingConfig(*text, args->Get("config"));
  if (!config.ok()) return Fail("k8s-manifest", std::string(config.status().message()));
  K8sManifestOptions o;
  o.kind = args->Get("kind");
  o.name = args->Get("name");
  o.image = args->Get("image");
  o.storage = args->Get("storage");
  o.config_text = *text;
  o.tls = args->GetBool("tls");
  for (const auto& [flag, field] : {std::pair{"ps", &o.num_ps}, std::pair{"workers", &o.num_workers},
                                    std::pair{"gpus_per_worker", &o.gpus_per_worker}}) {
    auto v = args->GetInt(flag);
    if (!v.ok() || *v < 0 || *v > 100000) {
      return Fail("k8s-manifest", absl::StrCat("--", flag, ": expected a count"));
    }
    *field = static_cast<int>(*v);
  }
  auto yaml = RenderK8sManifest(o);
  if (!yaml.ok()) return Fail("k8s-manifest", std::string(yaml.status().message()));
  std::cout << *yaml;
  return 0;
}

int PrometheusConfigCommand(const std::vector<std::string>& argv) {
  const Args::FlagSpec flags = {
      {"cluster_spec", {"", "cluster spec whose \"pstrain\": {\"metrics\": ...} extras say "
                            "where each task serves /metrics"}},
      {"scrape_interval", {"5s", "how often Prometheus scrapes each task"}},
      {"job_name", {"pstrain", "the scrape job's name (the `job` label of `up`)"}},
      {"tls_dir", {"", "with mutual TLS: where Prometheus reads ca.crt, monitor.crt and "
                       "monitor.key (default: the spec's TLS directory)"}},
  };
  if (WantsHelp(argv)) {
    std::cout << "pstrain prometheus-config flags (the YAML goes to standard output):\n"
              << Args::Usage(flags);
    return 0;
  }
  auto args = Args::Parse(argv, flags);
  if (!args.ok()) return Fail("prometheus-config", std::string(args.status().message()));
  if (args->Get("cluster_spec").empty()) {
    return Fail("prometheus-config", "--cluster_spec is required");
  }
  auto spec = ClusterSpec::FromFile(args->Get("cluster_spec"));
  if (!spec.ok()) return Fail("prometheus-config", std::string(spec.status().message()));
  PrometheusConfigOptions o;
  o.scrape_interval = args->Get("scrape_interval");
  o.job_name = args->Get("job_name");
  // Prometheus reads relative paths from its configuration file's directory.
  o.tls_dir = args->Get("tls_dir").empty() ? spec->tls_dir() : args->Get("tls_dir");
  if (!MakeAbsolute(&o.tls_dir)) {
    return Fail("prometheus-config", "cannot name the working directory");
  }
  auto yaml = RenderPrometheusConfig(*spec, o);
  if (!yaml.ok()) return Fail("prometheus-config", std::string(yaml.status().message()));
  std::cout << *yaml;
  return 0;
}

int PlanCommand(const std::vector<std::string>& argv) {
  const Args::FlagSpec flags = {
      {"cluster_spec", {"", "cluster spec JSON"}},
      {"config", {"", "training config"}},
  };
  if (WantsHelp(argv)) {
    std::cout << "pstrain plan flags:\n" << Args::Usage(flags);
    return 0;
  }
  auto args = Args::Parse(argv, flags);
  if (!args.ok()) return Fail("plan", std::string(args.status().message()));
  if (args->Get("cluster_spec").empty() || args->Get("config").empty()) {
    return Fail("plan", "--cluster_spec and --config are required");
  }
  auto cluster = ClusterSpec::FromFile(args->Get("cluster_spec"));
  if (!cluster.ok()) return Fail("plan", std::string(cluster.status().message()));
  auto config = LoadTrainingConfig(args->Get("config"));
  if (!config.ok()) return Fail("plan", std::string(config.status().message()));
  auto plan = PlanModel(*cluster, *config);
  if (!plan.ok()) return Fail("plan", std::string(plan.status().message()));
  if (absl::Status st = PrintPlan(*cluster, *config, *plan, std::cout); !st.ok()) {
    return Fail("plan", std::string(st.message()));
  }
  return 0;
}

int BenchCommand(const std::vector<std::string>& argv) {
  const Args::FlagSpec flags = {
      {"suites", {"wire,apply,train,sparse",
                  "comma-separated: wire (pull+push vs gRPC echo, TCP, memcpy), apply (server "
                  "optimizers vs a += b), train (sync examples/s vs compute alone), sparse "
                  "(embedding rows: table lookup vs a hash map, PullRows/PushRows vs echo), "
                  "checkpoint (write and restore vs dd conv=fsync; not in the default set), "
                  "tables (an embedding table's save in full and as a delta; not in the "
                  "default set)"}},
      {"table_rows", {"2000000", "tables: rows in the table (16 floats, Adam)"}},
      {"table_memory_fraction", {"0.1", "tables: the share of the rows a table with a memory "
                                        "budget keeps in memory, (0, 1]"}},
      {"sparse_rows", {"1000000", "sparse: rows in the table (width 64)"}},
      {"checkpoint_mib", {"1024", "checkpoint: the model's size in MiB"}},
      {"checkpoint_dir", {"", "checkpoint, tables: where to write (default: --out, else /tmp)"}},
      {"models", {"128,512-512,2048-2048", "train: hidden layers of each 784-...-10 MLP"}},
      {"sizes", {"4096,65536,1048576,4194304,16777216,67108864",
                 "bytes per pull and per push (wire suite)"}},
      {"call_bytes", {"4194304", "wire: partitions and calls of up to this many bytes, as "
                                 "rpc.call_bytes (0: one partition and call per server)"}},
      {"connections", {"1", "wire: TCP connections per server (rpc.connections_per_server); "
                            "a list, e.g. 1,2,4, gives a row for each"}},
      {"train_connections", {"0", "train: rpc.connections_per_server (0: the config's default)"}},
      {"reps", {"5", "repetitions per figure (median, min, max)"}},
      {"wire_dtype", {"float32", "wire and train suites: float32 or bfloat16 on the wire"}},
      {"train_mode", {"sync", "train suite: sync, async, or async_prefetch (async with "
                              "rpc.async_prefetch: each pull a step ahead)"}},
      {"device", {"cpu", "train suite: the workers' device (cpu, cuda:N or auto), compute-only "
                         "included"}},
      {"rep_seconds", {"0.15", "minimum length of one repetition"}},
      {"train_seconds", {"2", "train suite: each run's steps, as this many seconds at the "
                              "compute-only rate (20 to 3000 steps)"}},
      {"out", {"", "directory for bench.csv"}},
      {"bin_dir", {"", "directory with ps_server (default: next to pstrain)"}},
      {"serve_echo", {"", "internal: serve the gRPC echo on this address"}},
  };
  if (WantsHelp(argv)) {
    std::cout << "pstrain bench flags:\n" << Args::Usage(flags);
    return 0;
  }
  auto args = Args::Parse(argv, flags);
  if (!args.ok()) return Fail("bench", std::string(args.status().message()));
  StopSignal& stop = StopOnTerminationSignals();
  KeepGrpcUntilExit();
  if (!args->Get("serve_echo").empty()) return ServeEcho(args->Get("serve_echo"), &stop);
  BenchOptions o;
  o.bin_dir = args->Get("bin_dir");
  o.out_dir = args->Get("out");
  o.suites = absl::StrSplit(args->Get("suites"), ',', absl::SkipEmpty());
  o.models = absl::StrSplit(args->Get("models"), ',', absl::SkipEmpty());
  for (const std::string& m : o.models) {
    for (absl::string_view h : absl::StrSplit(m, '-')) {
      int units = 0;
      if (!absl::SimpleAtoi(h, &units) || units < 1 || units > 65536) {
        return Fail("bench", absl::StrCat("--models: \"", m, "\" is not like 512-512"));
      }
    }
  }
  for (absl::string_view part : absl::StrSplit(args->Get("sizes"), ',', absl::SkipEmpty())) {
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(part, &bytes) || bytes < 64 || bytes > (int64_t{1} << 30) ||
        bytes % 64 != 0) {
      return Fail("bench", absl::StrCat("--sizes: \"", part,
                                        "\" is not a multiple of 64 bytes in 64..1 GiB"));
    }
    o.sizes.push_back(bytes);
  }
  auto call_bytes = args->GetInt("call_bytes");
  if (!call_bytes.ok() || *call_bytes < 0 || *call_bytes > (int64_t{64} << 20)) {
    return Fail("bench", "--call_bytes: expected 0..67108864");
  }
  o.call_bytes = *call_bytes;
  o.connections.clear();
  for (absl::string_view part : absl::StrSplit(args->Get("connections"), ',', absl::SkipEmpty())) {
    int k = 0;
    if (!absl::SimpleAtoi(part, &k) || k < 1 || k > 16) {
      return Fail("bench", absl::StrCat("--connections: \"", part, "\" is not in 1..16"));
    }
    o.connections.push_back(k);
  }
  if (o.connections.empty()) return Fail("bench", "--connections: expected 1..16, or a list");
  auto train_connections = args->GetInt("train_connections");
  if (!train_connections.ok() || *train_connections < 0 || *train_connections > 16) {
    return Fail("bench", "--train_connections: expected 0..16");
  }
  o.train_connections = static_cast<int>(*train_connections);
  auto reps = args->GetInt("reps");
  auto seconds = args->GetDouble("rep_seconds");
  if (!reps.ok() || *reps < 1 || *reps > 1000) return Fail("bench", "--reps: expected 1..1000");
  if (!seconds.ok() || !(*seconds > 0 && *seconds <= 60)) {
    return Fail("bench", "--rep_seconds: expected (0, 60]");
  }
  o.reps = static_cast<int>(*reps);
  if (args->Get("wire_dtype") != "float32" && args->Get("wire_dtype") != "bfloat16") {
    return Fail("bench", "--wire_dtype: expected float32 or bfloat16");
  }
  o.bfloat16 = args->Get("wire_dtype") == "bfloat16";
  if (args->Get("train_mode") != "sync" && args->Get("train_mode") != "async" &&
      args->Get("train_mode") != "async_prefetch") {
    return Fail("bench", "--train_mode: expected sync, async or async_prefetch");
  }
  o.async_prefetch = args->Get("train_mode") == "async_prefetch";
  o.async_training = args->Get("train_mode") == "async" || o.async_prefetch;
  if (absl::StatusOr<DeviceSpec> device = ParseDeviceSpec(args->Get("device")); !device.ok()) {
    return Fail("bench", absl::StrCat("--device: ", device.status().message()));
  }
  o.device = args->Get("device");
  o.rep_seconds = *seconds;
  auto train_seconds = args->GetDouble("train_seconds");
  if (!train_seconds.ok() || !(*train_seconds > 0 && *train_seconds <= 600)) {
    return Fail("bench", "--train_seconds: expected (0, 600]");
  }
  o.train_seconds = *train_seconds;
  auto sparse_rows = args->GetInt("sparse_rows");
  if (!sparse_rows.ok() || *sparse_rows < 4096 || *sparse_rows > 100000000) {
    return Fail("bench", "--sparse_rows: expected 4096..100000000");
  }
  o.sparse_rows = *sparse_rows;
  auto checkpoint_mib = args->GetInt("checkpoint_mib");
  if (!checkpoint_mib.ok() || *checkpoint_mib < 1 || *checkpoint_mib > 65536) {
    return Fail("bench", "--checkpoint_mib: expected 1..65536");
  }
  o.checkpoint_mib = *checkpoint_mib;
  o.checkpoint_dir = args->Get("checkpoint_dir");
  auto table_rows = args->GetInt("table_rows");
  if (!table_rows.ok() || *table_rows < 100 || *table_rows > 2000000000) {
    return Fail("bench", "--table_rows: expected 100..2000000000");
  }
  o.table_rows = *table_rows;
  auto fraction = args->GetDouble("table_memory_fraction");
  if (!fraction.ok() || !(*fraction > 0 && *fraction <= 1)) {
    return Fail("bench", "--table_memory_fraction: expected a number in (0, 1]");
  }
  o.table_memory_fraction = *fraction;
  return RunBench(o, &stop);
}

int SweepCommand(const std::vector<std::string>& argv) {
  if (WantsHelp(argv)) {
    std::cout << "pstrain sweep flags:\n" << Args::Usage(SweepFlags());
    return 0;
  }
  const std::string self = SelfPath();
  if (self.empty()) return Fail("sweep", "cannot find this program's own path (/proc/self/exe)");
  return RunSweepCommand(argv, self, &StopOnTerminationSignals(), std::cout);
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << pstrain::kUsage;
    return 2;
  }
  const std::string command = argv[1];
  // The commands that compute on the CPU here or start tasks that do (they
  // inherit the environment).
  if (command == "launch" || command == "bench") {
    pstrain::cpu::ReexecWithFittingBlasCore("pstrain", argv);
  }
  std::vector<std::string> rest(argv + 2, argv + argc);
  if (command == "launch") return pstrain::LaunchCommand(rest);
  if (command == "datagen") return pstrain::DatagenCommand(rest);
  if (command == "plan") return pstrain::PlanCommand(rest);
  if (command == "k8s-manifest") return pstrain::K8sManifestCommand(rest);
  if (command == "prometheus-config") return pstrain::PrometheusConfigCommand(rest);
  if (command == "tokens") return pstrain::TokensCommand(rest);
  if (command == "certs") return pstrain::CertsCommand(rest);
  if (command == "bench") return pstrain::BenchCommand(rest);
  if (command == "sweep") return pstrain::SweepCommand(rest);
  if (command == "checkpoint") return pstrain::CheckpointCommand(rest, std::cout, std::cerr);
  if (command == "--help" || command == "-h" || command == "help") {
    std::cout << pstrain::kUsage;
    return 0;
  }
  std::cerr << "pstrain: unknown command \"" << command << "\"\n" << pstrain::kUsage;
  return 2;
}
