#include "worker/device.h"

#include <cblas.h>

#include <cmath>
#include <iostream>
#include <random>
#include <vector>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

void CpuDenseForward(const std::vector<float>& x, const std::vector<float>& w,
                     const std::vector<float>& b, int batch, int in, int out, bool relu,
                     std::vector<float>* y) {
  y->assign(static_cast<size_t>(batch) * out, 0.0f);
  for (int r = 0; r < batch; ++r) std::copy(b.begin(), b.end(), y->begin() + r * out);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, out, in, 1.0f, x.data(), in,
              w.data(), out, 1.0f, y->data(), out);
  if (relu) {
    for (float& v : *y) v = v > 0 ? v : 0;
  }
}

TEST_CASE("the CUDA probe answers without crashing, with a reason when there is no GPU",
          "[device]") {
  int count = -1;
  std::string name;
  absl::Status st = CountCudaDevices(&count, &name);
  std::string line = DescribeCudaDevices();
  std::cerr << line << "\n";
  CHECK(line.rfind("CUDA:", 0) == 0);
  if (!st.ok()) {
    CHECK(count == 0);
    CHECK(absl::IsFailedPrecondition(st));
    CHECK_FALSE(st.message().empty());
  }
}

TEST_CASE("CUDA dense forward equals the CPU (compared only where a GPU is present)",
          "[device][cuda]") {
  const int batch = 37, in = 129, out = 65;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(batch * in), w(in * out), b(out), cpu, gpu(batch * out);
  for (float& v : x) v = u(rng);
  for (float& v : w) v = u(rng);
  for (float& v : b) v = u(rng);
  int count = 0;
  std::string name;
  if (!CountCudaDevices(&count, &name).ok() || count == 0) {
    // No GPU: the CUDA path must refuse cleanly rather than crash.
    absl::Status st = CudaDenseForward(x.data(), w.data(), b.data(), batch, in, out, true,
                                       gpu.data());
    CHECK(absl::IsFailedPrecondition(st));
    WARN("CUDA-vs-CPU comparison skipped: " << DescribeCudaDevices());
    return;
  }
  for (bool relu : {false, true}) {
    CpuDenseForward(x, w, b, batch, in, out, relu, &cpu);
    REQUIRE(CudaDenseForward(x.data(), w.data(), b.data(), batch, in, out, relu, gpu.data()).ok());
    double max_err = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      max_err = std::max(max_err, static_cast<double>(std::fabs(cpu[i] - gpu[i])));
    }
    INFO("relu=" << relu << " max abs error " << max_err << " on " << name);
    CHECK(max_err < 1e-3);  // TF32 is off by default for cuBLAS sgemm
  }
}

}  // namespace
}  // namespace pstrain
