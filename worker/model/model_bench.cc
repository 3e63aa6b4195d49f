// model_bench: worker step time of the model library, forward + backward
// only, on one device. Prints one table row per model (and with --json one
// JSON object per line, which tools/gpu_bench.py reads to compare against
// PyTorch on the same GPU). Not a test: run it by hand, e.g.
//   bazel run -c opt //worker/model:model_bench -- --device=cpu
//   model_bench --device=cuda:0 --json
// "compute" is forward + backward with the batch and the gradients on the
// device (what PyTorch's loop measures); "step" adds this step's copies: the
// batch up, every gradient down (and, on CUDA, every parameter up).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/cluster/config.h"
#include "google/protobuf/text_format.h"
#include "worker/model/device.h"
#include "worker/model/model.h"

ABSL_FLAG(std::string, device, "auto", "auto, cpu or cuda:N");
ABSL_FLAG(int, threads, 0, "BLAS threads on the CPU (0 = every core)");
ABSL_FLAG(std::string, models, "784-1024-1024-10@512,4096-4096-4096-10@4096",
          "comma-separated MLPs as dims@batch");
ABSL_FLAG(double, seconds, 3.0, "time budget per model and measure (at least 3 iterations)");
ABSL_FLAG(bool, json, false, "also print one JSON object per model");

namespace pstrain {
namespace {

struct Timing {
  double median_ms = 0, min_ms = 0;
  int iterations = 0;
};

template <typename Fn>
absl::StatusOr<Timing> TimeIt(Fn fn, double budget_seconds) {
  std::vector<double> ms;
  const absl::Time start = absl::Now();
  while (ms.size() < 3 ||
         (absl::ToDoubleSeconds(absl::Now() - start) < budget_seconds && ms.size() < 200)) {
    const absl::Time t0 = absl::Now();
    absl::Status st = fn();
    if (!st.ok()) return st;
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }
  std::sort(ms.begin(), ms.end());
  return Timing{ms[ms.size() / 2], ms.front(), static_cast<int>(ms.size())};
}

int Run() {
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto spec = ParseDeviceSpec(absl::GetFlag(FLAGS_device));
  if (!spec.ok()) {
    std::cerr << "model_bench: " << spec.status().message() << "\n";
    return 2;
  }
  auto device = OpenDevice(*spec, threads);
  if (!device.ok()) {
    std::cerr << "model_bench: " << device.status().message() << "\n";
    return 1;
  }
  Backend* backend = device->backend.get();
  std::printf("device: %s (%s)\n", backend->Describe().c_str(), device->reason.c_str());
  std::printf("%-22s %6s %12s %12s %10s %6s\n", "model", "batch", "compute ms", "step ms",
              "TFLOP/s", "iters");
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_models), ',')) {
    std::vector<std::string> parts = absl::StrSplit(item, '@');
    std::vector<std::string> dims = absl::StrSplit(parts[0], '-');
    int batch = 0;
    if (parts.size() != 2 || dims.size() < 2 || !absl::SimpleAtoi(parts[1], &batch) || batch <= 0) {
      std::cerr << "model_bench: --models item \"" << item << "\": expected dims@batch\n";
      return 2;
    }
    std::string text = "mlp { input_dim: " + dims.front();
    for (size_t i = 1; i + 1 < dims.size(); ++i) text += " hidden_units: " + dims[i];
    text += " num_classes: " + dims.back() + " }";
    ModelConfig config;
    if (!google::protobuf::TextFormat::ParseFromString(text, &config)) {
      std::cerr << "model_bench: bad model " << item << "\n";
      return 2;
    }
    auto model = Model::Create(config, backend);
    if (!model.ok()) {
      std::cerr << "model_bench: " << model.status() << "\n";
      return 1;
    }
    Model& m = **model;
    absl::Status st = m.SetParameters(m.Initialize(1));
    const size_t x_size = static_cast<size_t>(batch) * m.input_dim();
    std::vector<float> x(x_size);
    std::vector<int32_t> y(batch);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(0, 1);
    for (float& v : x) v = u(rng);
    for (int r = 0; r < batch; ++r) y[r] = r % m.num_labels();
    // Pinned staging for the batch, as the worker's prefetcher provides it.
    DeviceArray<float> xh(backend, /*host=*/true);
    DeviceArray<int32_t> yh(backend, /*host=*/true);
    if (st.ok()) st = xh.Reserve(x_size);
    if (st.ok()) st = yh.Reserve(batch);
    if (!st.ok()) {
      std::cerr << "model_bench: " << st << "\n";
      return 1;
    }
    std::copy(x.begin(), x.end(), xh.data());
    std::copy(y.begin(), y.end(), yh.data());
    float loss = 0;
    uint64_t seed = 0;
    // Warm-up: allocations, cuBLAS heuristics, caches.
    st = m.ComputeGradients(xh.data(), yh.data(), batch, seed++, &loss);
    if (st.ok()) st = m.StageBatch(xh.data(), yh.data(), batch);
    const double budget = absl::GetFlag(FLAGS_seconds);
    auto compute = TimeIt(
        [&]() -> absl::Status {
          absl::Status s = m.ForwardBackward(seed++);
          return s.ok() ? backend->Synchronize() : s;
        },
        budget);
    auto step = TimeIt(
        [&]() -> absl::Status {
          absl::Status s = m.UploadParameters();
          return s.ok() ? m.ComputeGradients(xh.data(), yh.data(), batch, seed++, &loss) : s;
        },
        budget);
    if (!st.ok() || !compute.ok() || !step.ok()) {
      std::cerr << "model_bench: "
                << (!st.ok()        ? st
                    : !compute.ok() ? compute.status()
                                    : step.status())
                << "\n";
      return 1;
    }
    // 2 FLOPs per multiply-add; forward 1 GEMM per dense layer, backward 2.
    double flops = 0;
    for (const VariableSpec& v : m.variables()) {
      if (v.shape.size() == 2) flops += 6.0 * batch * v.shape[0] * v.shape[1];
    }
    const double tflops = flops / (compute->median_ms * 1e-3) / 1e12;
    std::printf("%-22s %6d %12.3f %12.3f %10.2f %6d\n", parts[0].c_str(), batch, compute->median_ms,
                step->median_ms, tflops, compute->iterations);
    if (absl::GetFlag(FLAGS_json)) {
      std::printf(
          "{\"model\": \"%s\", \"batch\": %d, \"device\": \"%s\", \"compute_ms\": %.4f, "
          "\"compute_min_ms\": %.4f, \"step_ms\": %.4f, \"tflops\": %.3f, \"loss\": %.5f}\n",
          parts[0].c_str(), batch, backend->Describe().c_str(), compute->median_ms, compute->min_ms,
          step->median_ms, tflops, loss);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pstrain::Run();
}
