// The train suite of `pstrain bench` (TrainSuite, run by the harness,
// tools/bench/harness.cc): training examples/s of each --models MLP
// (784-...-10, MNIST-like digits that datagen writes, batch 64 per worker)
// through `pstrain launch` with 1 ps + 1 worker and 2 ps + 2 workers, sync
// by default (--train_mode), beside the worker's own forward and backward
// alone: the same model on the workers' device (on the CPU one BLAS thread,
// as the cluster's workers run), no network. A second table runs the 1 + 1
// cluster again with rpc.sequential (pull, compute and push strictly in
// turn) and shows how much of the wait on the wire the overlap hides.

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/cluster/config.h"
#include "common/storage/env.h"
#include "nlohmann/json.hpp"
#include "tools/bench/harness.h"
#include "tools/datagen.h"
#include "tools/local_ports.h"
#include "worker/model/device.h"
#include "worker/model/model.h"

namespace pstrain::bench {
namespace {

// Examples/s of forward + backward alone: the worker's own model on the
// workers' device (on the CPU one BLAS thread, as the cluster's workers
// run), batch 64, no network.
absl::StatusOr<double> ComputeOnly(const BenchOptions& o, const TrainingConfig& config) {
  ASSIGN_OR_RETURN(DeviceSpec spec, ParseDeviceSpec(config.device()));
  ASSIGN_OR_RETURN(OpenedDevice device, OpenDevice(spec, config.compute_threads()));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                   Model::Create(config.model(), device.backend.get()));
  RETURN_IF_ERROR(model->SetParameters(model->Initialize(config.seed())));
  const int batch = config.data().batch_size();
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> pixel(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(batch) * model->input_dim());
  std::vector<int32_t> y(batch);
  for (float& v : x) v = pixel(rng);
  for (int32_t& v : y) v = static_cast<int32_t>(rng() % model->num_labels());
  float loss = 0;
  RETURN_IF_ERROR(model->ComputeGradients(x.data(), y.data(), batch, 1, &loss));  // warm-up
  int64_t steps = 0;
  const absl::Time start = absl::Now();
  do {
    RETURN_IF_ERROR(model->UploadParameters());
    RETURN_IF_ERROR(model->ComputeGradients(x.data(), y.data(), batch, steps, &loss));
    ++steps;
  } while (steps < 5 || absl::Now() - start < absl::Seconds(4 * o.rep_seconds));
  return static_cast<double>(steps) * batch / absl::ToDoubleSeconds(absl::Now() - start);
}

// What one training run measured: the chief's examples/s (first report to
// the end, so start-up is not counted), and the workers' mean time per
// step waiting on pulls and pushes (summary.json's step_time_ms).
struct RunResult {
  double examples_per_sec = 0;
  double comm_wait_ms = 0;
};

std::string HiddenUnits(const std::string& hidden) {
  std::string units;
  for (absl::string_view h : absl::StrSplit(hidden, '-', absl::SkipEmpty())) {
    absl::StrAppend(&units, " hidden_units: ", h);
  }
  return units;
}

std::string TrainMode(const BenchOptions& o) {
  return o.async_prefetch ? "async (rpc.async_prefetch)" : o.async_training ? "async" : "sync";
}

// The training config of one run: the MLP 784-`hidden`-10 on the digits in
// `data_dir`, `steps` steps, its output in `out`; the mode, device, wire
// dtype and connections from the options.
std::string TrainConfigText(const BenchOptions& o, const std::string& data_dir,
                            const std::string& hidden, int64_t steps, const std::string& out,
                            bool sequential = false) {
  return absl::StrCat(
      "model { mlp { input_dim: 784", HiddenUnits(hidden), " num_classes: 10 } }\n",
      "data { train_images: \"", JoinPath(data_dir, "train-images-idx3-ubyte"),
      "\" train_labels: \"", JoinPath(data_dir, "train-labels-idx1-ubyte"),
      "\" batch_size: 64 shuffle: true normalize: true }\n",
      "optimizer { learning_rate: 0.05 sgd {} }\n", o.async_training ? "async" : "sync",
      " {}\nmax_steps: ", steps, "\nseed: 1\neval_every_steps: 0\ncompute_threads: 1\ndevice: \"",
      o.device, "\"\noutput_dir: \"", out, "\"\n", "rpc { wire_dtype: \"",
      o.bfloat16 ? "bfloat16" : "float32", "\"", sequential ? " sequential: true" : "",
      // The overlap table's sequential run has no pull ahead either.
      o.async_prefetch && !sequential ? " async_prefetch: true" : "",
      " connections_per_server: ", o.train_connections, " }\n");
}

// One run through `pstrain launch` on free ports; `sequential`:
// rpc.sequential (pull, compute and push strictly in turn).
absl::StatusOr<RunResult> ClusterRun(const BenchOptions& o, const std::string& dir,
                                     const std::string& hidden, int ps, int workers, int64_t steps,
                                     bool sequential = false) {
  const std::string spec = JoinPath(dir, "cluster.json");
  RETURN_IF_ERROR(WriteFileAtomically(Env::Default(), spec, LocalClusterSpecJson(ps, workers)));
  const std::string out = JoinPath(dir, "out");
  const std::string config = JoinPath(dir, "train.pbtxt");
  RETURN_IF_ERROR(WriteFileAtomically(Env::Default(), config,
                                      TrainConfigText(o, dir, hidden, steps, out, sequential)));
  SpawnOptions so;
  // Each run of a model replaces the last one's outputs in `out`.
  so.argv = {"/proc/self/exe", "launch", "--cluster_spec=" + spec, "--config=" + config,
             "--progress=false", "--overwrite"};
  if (!o.bin_dir.empty()) so.argv.push_back("--bin_dir=" + o.bin_dir);
  so.output_file = JoinPath(dir, "launch.log");
  ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> launch, Subprocess::Spawn(so));
  std::optional<int> code = launch->Wait(absl::Seconds(300));
  if (!code.has_value()) {
    launch->Stop(absl::Seconds(5));
    return absl::DeadlineExceededError(
        absl::StrCat("training run did not end in 300 s; see ", so.output_file));
  }
  if (*code != 0) {
    return absl::InternalError(
        absl::StrCat("training run exited ", *code, "; see ", so.output_file));
  }
  ASSIGN_OR_RETURN(std::string summary, Env::Default()->ReadFile(JoinPath(out, "summary.json")));
  const nlohmann::json j = nlohmann::json::parse(summary, nullptr, /*allow_exceptions=*/false);
  auto number = [&j](const char* a, const char* b) -> const nlohmann::json* {
    if (!j.is_object() || !j.contains(a)) return nullptr;
    const nlohmann::json* v = &j[a];
    if (b != nullptr) v = v->is_object() && v->contains(b) ? &(*v)[b] : nullptr;
    return v != nullptr && v->is_number() ? v : nullptr;
  };
  const nlohmann::json* rate = number("examples_per_sec", nullptr);
  const nlohmann::json* pull = number("step_time_ms", "pull");
  const nlohmann::json* push = number("step_time_ms", "push");
  if (rate == nullptr || pull == nullptr || push == nullptr) {
    return absl::DataLossError(
        absl::StrCat("no examples_per_sec or step_time_ms in ", out, "/summary.json"));
  }
  return RunResult{rate->get<double>(), pull->get<double>() + push->get<double>()};
}

}  // namespace

absl::Status TrainSuite(BenchContext* ctx) {
  const BenchOptions& o = ctx->options();
  const std::string dir = absl::StrCat("/tmp/pstrain-bench-train-", ::getpid());
  RETURN_IF_ERROR(Env::Default()->CreateDirs(dir));
  DigitsOptions digits;
  digits.train_examples = 8192;
  digits.test_examples = 64;
  RETURN_IF_ERROR(WriteDigitsDataset(Env::Default(), dir, digits));
  std::cout << "\n== train: " << TrainMode(o) << " examples/s, batch 64 per worker, workers on "
            << o.device << (o.device == "cpu" ? " (1 BLAS thread each)" : "")
            << " (median [min-max] of " << o.reps << ") ==\n";
  std::cout << absl::StrFormat("%-18s %-24s %-24s %-24s %10s %10s\n", "model", "compute-only",
                               "1 ps + 1 worker", "2 ps + 2 workers", "1+1/comp", "2+2/comp");
  // The same 1 + 1 run again with rpc.sequential, to show how much of the
  // communication the overlap hides (printed after this table).
  std::vector<std::string> overlap_lines;
  for (const std::string& hidden : o.models) {
    ASSIGN_OR_RETURN(TrainingConfig config,
                     ParseTrainingConfig(TrainConfigText(o, dir, hidden, 1, dir), "bench"));
    std::vector<double> compute, one, two, seq, one_wait, seq_wait;
    for (int rep = 0; rep < o.reps; ++rep) {
      RETURN_IF_ERROR(ctx->CheckStop());
      ASSIGN_OR_RETURN(double c, ComputeOnly(o, config));
      compute.push_back(c);
      // About --train_seconds of training at the compute-only rate, at
      // least 20 steps.
      const int64_t steps =
          std::clamp<int64_t>(static_cast<int64_t>(o.train_seconds * c / 64), 20, 3000);
      ASSIGN_OR_RETURN(RunResult r1, ClusterRun(o, dir, hidden, 1, 1, steps));
      one.push_back(r1.examples_per_sec);
      one_wait.push_back(r1.comm_wait_ms);
      ASSIGN_OR_RETURN(RunResult rs, ClusterRun(o, dir, hidden, 1, 1, steps, /*sequential=*/true));
      seq.push_back(rs.examples_per_sec);
      seq_wait.push_back(rs.comm_wait_ms);
      ASSIGN_OR_RETURN(RunResult r2, ClusterRun(o, dir, hidden, 2, 2, steps));
      two.push_back(r2.examples_per_sec);
    }
    const Stats sc = Summarize(compute), s1 = Summarize(one), s2 = Summarize(two);
    auto f = [](const Stats& s) {
      return absl::StrFormat("%.0f [%.0f-%.0f]", s.median, s.min, s.max);
    };
    const std::string name = absl::StrCat("784-", hidden, "-10");
    std::cout << absl::StrFormat("%-18s %-24s %-24s %-24s %9.2fx %9.2fx\n", name, f(sc), f(s1),
                                 f(s2), s1.median / sc.median, s2.median / sc.median)
              << std::flush;
    // Async rows say so in the CSV (and the plot's labels).
    const std::string what =
        o.async_training ? absl::StrCat(name, o.async_prefetch ? " async_prefetch" : " async")
                         : name;
    ctx->Add("train", absl::StrCat(what, " compute_only"), 0, 0, 1, sc);
    ctx->Add("train", what, 0, 1, 1, s1);
    ctx->Add("train", what, 0, 2, 2, s2);
    // Hidden: the share of the sequential run's wait on the wire that the
    // overlapped run no longer waits for.
    const Stats ss = Summarize(seq), w1 = Summarize(one_wait), ws = Summarize(seq_wait);
    auto ms = [](const Stats& s) {
      return absl::StrFormat("%.2f [%.2f-%.2f]", s.median, s.min, s.max);
    };
    overlap_lines.push_back(absl::StrFormat(
        "%-18s %-24s %-24s %-22s %-22s %7.0f%% %9.2fx\n", name, f(s1), f(ss), ms(w1), ms(ws),
        ws.median > 0 ? 100.0 * (1.0 - w1.median / ws.median) : 0.0, s1.median / ss.median));
    ctx->Add("overlap", absl::StrCat(what, " sequential examples/s"), 0, 1, 1, ss);
    ctx->Add("overlap", absl::StrCat(what, " wait ms/step overlapped"), 0, 1, 1, w1);
    ctx->Add("overlap", absl::StrCat(what, " wait ms/step sequential"), 0, 1, 1, ws);
  }
  if (!overlap_lines.empty()) {
    std::cout << "\n== train: what the overlap hides, " << TrainMode(o)
              << " 1 ps + 1 worker: examples/s, and "
                 "the worker's wait on pulls + pushes per step (median [min-max]) ==\n"
              << absl::StrFormat("%-18s %-24s %-24s %-22s %-22s %8s %10s\n", "model",
                                 "overlapped ex/s", "rpc.sequential ex/s", "wait ms overlapped",
                                 "wait ms sequential", "hidden", "speed-up");
    for (const std::string& line : overlap_lines) std::cout << line;
    std::cout << std::flush;
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);  // kept when a run failed, for its logs
  return absl::OkStatus();
}

}  // namespace pstrain::bench
