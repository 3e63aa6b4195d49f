// CUDA against the CPU: every backend operation on random inputs, and whole
// training steps and evaluations of models with every layer kind. Where no
// GPU is present (CI, the CPU-only build) each case says why and checks that
// asking for CUDA fails cleanly instead.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <utility>

#include "catch2/catch.hpp"
#include "absl/strings/str_cat.h"
#include "common/cluster/config.h"
#include "common/testing/skip.h"
#include "worker/model/backend.h"
#include "worker/model/bags_test_util.h"
#include "worker/model/device.h"
#include "worker/model/embedding_bag.h"
#include "worker/model/model.h"
#include "worker/model/test_util.h"

namespace pstrain {
namespace {

// The CUDA backend, or null after reporting why the comparison is skipped.
std::unique_ptr<Backend> CudaOrSkip() {
  absl::StatusOr<std::unique_ptr<Backend>> b = NewCudaBackend(0);
  if (!b.ok()) {
    CHECK(absl::IsFailedPrecondition(b.status()));
    CHECK_FALSE(b.status().message().empty());
    testing::SkipCase("gpu", absl::StrCat("CUDA-vs-CPU comparison: no usable GPU: ",
                                          b.status().message()));
    return nullptr;
  }
  return std::move(*b);
}

using testing::Random;

// Runs `op` on both backends over copies of the inputs; returns the outputs.
template <typename T>
class Twin {
 public:
  Twin(Backend* gpu, std::vector<T> host) : gpu_(gpu), host_(std::move(host)) {
    auto p = gpu_->Allocate(host_.size() * sizeof(T) + 1);
    REQUIRE(p.ok());
    dev_ = static_cast<T*>(*p);
    REQUIRE(gpu_->CopyToDevice(dev_, host_.data(), host_.size() * sizeof(T)).ok());
  }
  ~Twin() { gpu_->Free(dev_); }
  T* cpu() { return host_.data(); }
  T* gpu() { return dev_; }
  std::vector<T> gpu_values() {
    std::vector<T> out(host_.size());
    REQUIRE(gpu_->CopyToHost(out.data(), dev_, out.size() * sizeof(T)).ok());
    REQUIRE(gpu_->Synchronize().ok());
    return out;
  }
  const std::vector<T>& cpu_values() const { return host_; }

 private:
  Backend* gpu_;
  std::vector<T> host_;
  T* dev_ = nullptr;
};

template <typename T>
double MaxRelError(const std::vector<T>& a, const std::vector<T>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    worst = std::max(worst, std::fabs(x - y) / std::max(1.0, std::fabs(x)));
  }
  return worst;
}

TEST_CASE("CUDA operations equal the CPU's", "[cuda]") {
  std::unique_ptr<Backend> gpu = CudaOrSkip();
  if (!gpu) return;
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  std::cerr << "comparing " << gpu->Describe() << " with " << cpu->Describe() << "\n";
  const int m = 37, n = 65, k = 129;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Twin<float> a(gpu.get(), Random(m * k, 1)), b(gpu.get(), Random(k * n, 2)),
          c(gpu.get(), Random(m * n, 3));
      const int lda = ta ? m : k, ldb = tb ? k : n;
      REQUIRE(cpu->Gemm(ta, tb, m, n, k, 0.5f, a.cpu(), lda, b.cpu(), ldb, 1.0f, c.cpu(), n).ok());
      REQUIRE(gpu->Gemm(ta, tb, m, n, k, 0.5f, a.gpu(), lda, b.gpu(), ldb, 1.0f, c.gpu(), n).ok());
      INFO("gemm trans_a=" << ta << " trans_b=" << tb);
      CHECK(MaxRelError(c.cpu_values(), c.gpu_values()) < 1e-5);  // FP32, no TF32
    }
  }
  const int rows = 33, cols = 257;
  const int64_t len = rows * cols;
  Twin<float> x(gpu.get(), Random(len, 4, -4, 4)), dy(gpu.get(), Random(len, 5));
  Twin<float> y(gpu.get(), std::vector<float>(len)), out(gpu.get(), std::vector<float>(len));
  Twin<float> row(gpu.get(), Random(cols, 6));

  REQUIRE(cpu->BroadcastRows(row.cpu(), rows, cols, y.cpu()).ok());
  REQUIRE(gpu->BroadcastRows(row.gpu(), rows, cols, y.gpu()).ok());
  CHECK(y.cpu_values() == y.gpu_values());
  // Column sums add in another order than the CPU's (lanes, then a tree):
  // equal within the float bound rows x eps x sum |x|, over several
  // column tiles, a partial one and more rows than lanes.
  for (auto [sum_rows, sum_cols] : {std::pair{rows, cols}, std::pair{1000, 70}, std::pair{3, 5}}) {
    Twin<float> xs(gpu.get(), Random(int64_t{sum_rows} * sum_cols, 7, -4, 4));
    Twin<float> colsum(gpu.get(), std::vector<float>(sum_cols));
    REQUIRE(cpu->SumRows(xs.cpu(), sum_rows, sum_cols, colsum.cpu()).ok());
    REQUIRE(gpu->SumRows(xs.gpu(), sum_rows, sum_cols, colsum.gpu()).ok());
    const std::vector<float> host = xs.cpu_values(), want = colsum.cpu_values(),
                             got = colsum.gpu_values();
    for (int c = 0; c < sum_cols; ++c) {
      double magnitude = 0;
      for (int r = 0; r < sum_rows; ++r) magnitude += std::fabs(host[int64_t{r} * sum_cols + c]);
      INFO("sum rows " << sum_rows << "x" << sum_cols << " column " << c);
      CHECK(std::fabs(double{got[c]} - double{want[c]}) <=
            sum_rows * std::numeric_limits<float>::epsilon() * magnitude);
    }
  }
  // Elementwise products and sums, rounded as the CPU's (no FMAs).
  REQUIRE(cpu->Multiply(x.cpu(), dy.cpu(), len, y.cpu()).ok());
  REQUIRE(gpu->Multiply(x.gpu(), dy.gpu(), len, y.gpu()).ok());
  CHECK(y.cpu_values() == y.gpu_values());
  REQUIRE(cpu->MultiplyAdd(x.cpu(), dy.cpu(), len, y.cpu()).ok());
  REQUIRE(gpu->MultiplyAdd(x.gpu(), dy.gpu(), len, y.gpu()).ok());
  CHECK(y.cpu_values() == y.gpu_values());
  REQUIRE(cpu->Add(x.cpu(), len, y.cpu()).ok());
  REQUIRE(gpu->Add(x.gpu(), len, y.gpu()).ok());
  CHECK(y.cpu_values() == y.gpu_values());
  // DLRM's dots and their gradient, summed in the CPU's order: equal.
  {
    const int batch = 9, vectors = 27, dim = 16, pairs = vectors * (vectors - 1) / 2;
    Twin<float> t(gpu.get(), Random(batch * vectors * dim, 8));
    Twin<float> dots(gpu.get(), std::vector<float>(batch * (pairs + 3), 0.0f));
    Twin<float> dt(gpu.get(), std::vector<float>(batch * vectors * dim));
    REQUIRE(cpu->PairwiseDots(t.cpu(), batch, vectors, dim, dots.cpu() + 3, pairs + 3).ok());
    REQUIRE(gpu->PairwiseDots(t.gpu(), batch, vectors, dim, dots.gpu() + 3, pairs + 3).ok());
    CHECK(dots.cpu_values() == dots.gpu_values());
    REQUIRE(cpu->PairwiseDotsGrad(t.cpu(), dots.cpu() + 3, pairs + 3, batch, vectors, dim,
                                  dt.cpu()).ok());
    REQUIRE(gpu->PairwiseDotsGrad(t.gpu(), dots.gpu() + 3, pairs + 3, batch, vectors, dim,
                                  dt.gpu()).ok());
    CHECK(dt.cpu_values() == dt.gpu_values());
  }
  // A block of columns into another matrix's (rows of cols, from rows
  // cols apart into rows cols + 3 apart at column 2).
  {
    Twin<float> wide(gpu.get(), std::vector<float>(rows * (cols + 3), 0.0f));
    REQUIRE(cpu->CopyMatrix(x.cpu(), cols, wide.cpu() + 2, cols + 3, rows, cols - 1).ok());
    REQUIRE(gpu->CopyMatrix(x.gpu(), cols, wide.gpu() + 2, cols + 3, rows, cols - 1).ok());
    CHECK(wide.cpu_values() == wide.gpu_values());
  }
  REQUIRE(cpu->Relu(x.cpu(), len, y.cpu()).ok());
  REQUIRE(gpu->Relu(x.gpu(), len, y.gpu()).ok());
  CHECK(y.cpu_values() == y.gpu_values());
  REQUIRE(cpu->ReluGrad(y.cpu(), dy.cpu(), len, out.cpu()).ok());
  REQUIRE(gpu->ReluGrad(y.gpu(), dy.gpu(), len, out.gpu()).ok());
  CHECK(out.cpu_values() == out.gpu_values());
  REQUIRE(cpu->Gelu(x.cpu(), len, y.cpu()).ok());
  REQUIRE(gpu->Gelu(x.gpu(), len, y.gpu()).ok());
  CHECK(MaxRelError(y.cpu_values(), y.gpu_values()) < 1e-6);
  REQUIRE(cpu->GeluGrad(x.cpu(), dy.cpu(), len, out.cpu()).ok());
  REQUIRE(gpu->GeluGrad(x.gpu(), dy.gpu(), len, out.gpu()).ok());
  CHECK(MaxRelError(out.cpu_values(), out.gpu_values()) < 1e-6);
  REQUIRE(cpu->Dropout(x.cpu(), len, 0.3f, 99, y.cpu()).ok());
  REQUIRE(gpu->Dropout(x.gpu(), len, 0.3f, 99, y.gpu()).ok());
  CHECK(y.cpu_values() == y.gpu_values());  // the same counter-based mask
  REQUIRE(cpu->DropoutGrad(dy.cpu(), len, 0.3f, 99, out.cpu()).ok());
  REQUIRE(gpu->DropoutGrad(dy.gpu(), len, 0.3f, 99, out.gpu()).ok());
  CHECK(out.cpu_values() == out.gpu_values());

  for (int classes : {1, 10, 300}) {
    const int r = 70;
    Twin<float> logits(gpu.get(), Random(r * classes, 7, -6, 6));
    std::vector<int32_t> lab(r);
    for (int i = 0; i < r; ++i) lab[i] = classes == 1 ? i % 2 : (i * 7) % classes;
    Twin<int32_t> labels(gpu.get(), lab), predicted(gpu.get(), std::vector<int32_t>(r));
    Twin<float> d(gpu.get(), std::vector<float>(r * classes));
    Twin<double> loss(gpu.get(), std::vector<double>(r));
    for (bool softmax : {true, false}) {
      if (softmax && classes == 1) continue;
      INFO((softmax ? "softmax" : "sigmoid") << " cross-entropy, " << classes << " classes");
      auto run = [&](Backend* be, float* lg, int32_t* lb, float* dd, double* ll, int32_t* pp) {
        return softmax ? be->SoftmaxCrossEntropy(lg, lb, r, classes, 70.0f, dd, ll, pp)
                       : be->SigmoidCrossEntropy(lg, lb, r, classes, 70.0f, dd, ll, pp);
      };
      REQUIRE(
          run(cpu.get(), logits.cpu(), labels.cpu(), d.cpu(), loss.cpu(), predicted.cpu()).ok());
      REQUIRE(
          run(gpu.get(), logits.gpu(), labels.gpu(), d.gpu(), loss.gpu(), predicted.gpu()).ok());
      CHECK(MaxRelError(d.cpu_values(), d.gpu_values()) < 1e-6);
      CHECK(MaxRelError(loss.cpu_values(), loss.gpu_values()) < 1e-12);
      CHECK(predicted.cpu_values() == predicted.gpu_values());
    }
  }
}

using testing::ParseModel;

TEST_CASE("CUDA training steps and evaluation equal the CPU's for every layer kind", "[cuda]") {
  std::unique_ptr<Backend> gpu = CudaOrSkip();
  if (!gpu) return;
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  struct Case {
    const char* config;
    int input_dim;
    int labels;
  };
  for (const Case& c : {
           Case{"mlp { input_dim: 784 hidden_units: 256 hidden_units: 128 num_classes: 10 }", 784,
                10},
           Case{"mlp { input_dim: 100 hidden_units: 64 hidden_units: 64 num_classes: 7 "
                "activation: GELU dropout: 0.2 }",
                100, 7},
           Case{"sequential { input_dim: 40 layer { dense { units: 32 } } layer { gelu {} } "
                "layer { dense { units: 1 } } layer { sigmoid_cross_entropy {} } }",
                40, 2},
           Case{"sequential { input_dim: 40 layer { dot { dense_inputs: 8 dim: 4 "
                "bottom_units: 16 bottom_units: 4 } } layer { dense { units: 32 } } "
                "layer { relu {} } layer { dense { units: 1 } } "
                "layer { sigmoid_cross_entropy {} } }",
                40, 2},
           Case{"sequential { input_dim: 40 layer { cross { layers: 2 } } "
                "layer { dense { units: 32 } } layer { relu {} } "
                "layer { dense { units: 1 } } layer { sigmoid_cross_entropy {} } }",
                40, 2},
       }) {
    INFO(c.config);
    auto mc = Model::Create(ParseModel(c.config), cpu.get());
    auto mg = Model::Create(ParseModel(c.config), gpu.get());
    REQUIRE(mc.ok());
    REQUIRE(mg.ok());
    std::vector<Tensor> params = (*mc)->Initialize(3);
    REQUIRE((*mc)->SetParameters(params).ok());
    REQUIRE((*mg)->SetParameters(params).ok());
    const int batch = 96;
    const std::vector<float> x = Random(static_cast<size_t>(batch) * c.input_dim, 8);
    std::vector<int32_t> y(batch);
    for (int r = 0; r < batch; ++r) y[r] = (r * 5) % c.labels;
    for (int step = 0; step < 3; ++step) {
      float lc = 0, lg = 0;
      REQUIRE((*mc)->ComputeGradients(x.data(), y.data(), batch, step, &lc).ok());
      REQUIRE((*mg)->ComputeGradients(x.data(), y.data(), batch, step, &lg).ok());
      CHECK(lg == Approx(lc).epsilon(1e-5));
      std::vector<Tensor> gc, gg;
      (*mc)->CopyGradients(&gc);
      (*mg)->CopyGradients(&gg);
      for (size_t v = 0; v < gc.size(); ++v) {
        INFO((*mc)->variables()[v].name);
        // Relative to the largest gradient of the variable: sums reordered by cuBLAS.
        double scale = 1e-12, err = 0;
        for (float g : gc[v].values()) scale = std::max(scale, static_cast<double>(std::fabs(g)));
        for (size_t i = 0; i < gc[v].values().size(); ++i) {
          err =
              std::max(err, std::fabs(static_cast<double>(gc[v].values()[i]) - gg[v].values()[i]));
        }
        CHECK(err / scale < 1e-4);
      }
    }
    EvalResult ec, eg;
    REQUIRE((*mc)->Evaluate(x.data(), y.data(), batch, &ec).ok());
    REQUIRE((*mg)->Evaluate(x.data(), y.data(), batch, &eg).ok());
    CHECK(eg.loss == Approx(ec.loss).epsilon(1e-5));
    CHECK(std::abs(eg.correct - ec.correct) <= 1);
  }
}

TEST_CASE("CUDA steps are reproducible run to run", "[cuda]") {
  std::unique_ptr<Backend> gpu = CudaOrSkip();
  if (!gpu) return;
  const char* config =
      "mlp { input_dim: 512 hidden_units: 1024 hidden_units: 1024 num_classes: 10 "
      "activation: GELU dropout: 0.1 }";
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    auto m = Model::Create(ParseModel(config), gpu.get());
    REQUIRE(m.ok());
    REQUIRE((*m)->SetParameters((*m)->Initialize(1)).ok());
    const std::vector<float> x = Random(256 * 512, 2);
    std::vector<int32_t> y(256);
    for (int r = 0; r < 256; ++r) y[r] = r % 10;
    float loss = 0;
    REQUIRE((*m)->ComputeGradients(x.data(), y.data(), 256, 5, &loss).ok());
    std::vector<Tensor> g;
    (*m)->CopyGradients(&g);
    std::vector<float> flat;
    for (const Tensor& t : g) flat.insert(flat.end(), t.values().begin(), t.values().end());
    runs.push_back(std::move(flat));
  }
  CHECK(runs[0] == runs[1]);  // cuBLAS on one stream and our kernels use no atomics
}

TEST_CASE("CUDA hands each layer's gradients over, final, as its copy completes", "[cuda]") {
  std::unique_ptr<Backend> gpu = CudaOrSkip();
  if (!gpu) return;
  const char* config =
      "mlp { input_dim: 512 hidden_units: 1024 hidden_units: 1024 num_classes: 10 "
      "activation: GELU }";
  auto mg = Model::Create(ParseModel(config), gpu.get());
  auto plain = Model::Create(ParseModel(config), gpu.get());
  REQUIRE(mg.ok());
  REQUIRE(plain.ok());
  const std::vector<Tensor> params = (*mg)->Initialize(2);
  REQUIRE((*mg)->SetParameters(params).ok());
  REQUIRE((*plain)->SetParameters(params).ok());
  std::vector<std::pair<size_t, size_t>> order;
  std::vector<std::vector<float>> handed((*mg)->variables().size());
  (*mg)->set_gradients_ready([&](size_t first, size_t end) {
    order.emplace_back(first, end);
    for (size_t v = first; v < end; ++v) {
      const float* g = (*mg)->host_gradients(v);
      handed[v].assign(g, g + (*mg)->variables()[v].num_elements());
    }
  });
  std::vector<int32_t> y(256);
  for (int r = 0; r < 256; ++r) y[r] = r % 10;
  for (uint32_t step = 0; step < 3; ++step) {
    INFO("step " << step);
    const std::vector<float> x = Random(256 * 512, 10 + step);  // new gradients each step
    order.clear();
    float loss = 0, plain_loss = 0;
    REQUIRE((*mg)->ComputeGradients(x.data(), y.data(), 256, step, &loss).ok());
    REQUIRE((*plain)->ComputeGradients(x.data(), y.data(), 256, step, &plain_loss).ok());
    CHECK(loss == plain_loss);
    REQUIRE(order.size() == 3);
    CHECK(order[0] == std::make_pair(size_t{4}, size_t{6}));
    CHECK(order[1] == std::make_pair(size_t{2}, size_t{4}));
    CHECK(order[2] == std::make_pair(size_t{0}, size_t{2}));
    std::vector<Tensor> final_grads, plain_grads;
    (*mg)->CopyGradients(&final_grads);
    (*plain)->CopyGradients(&plain_grads);
    for (size_t v = 0; v < handed.size(); ++v) {
      INFO((*mg)->variables()[v].name);
      CHECK(handed[v] == final_grads[v].values());                // final when handed over
      CHECK(final_grads[v].values() == plain_grads[v].values());  // the same step, bitwise
    }
  }
}

TEST_CASE("CUDA embedding bags equal the host's bit for bit", "[cuda]") {
  std::unique_ptr<Backend> gpu = CudaOrSkip();
  if (!gpu) return;
  constexpr int kDense = 13, kFields = 26, kDim = 16;
  for (Combiner combiner : {Combiner::kSum, Combiner::kMean}) {
    EmbeddingBags host(kDense, kFields, kDim, combiner);
    DeviceEmbeddingBags device(gpu.get(), kDense, kFields, kDim, combiner);
    for (int batch : {300, 120, 450}) {  // the buffers reused, and grown
      INFO((combiner == Combiner::kMean ? "mean" : "sum") << ", batch " << batch);
      // Bags of 0-4 ids of 500, so rows repeat within and across bags.
      testing::CheckDeviceBagsMatchHost(gpu.get(), &device, host,
                                        testing::RandomBags(batch, kFields, batch, 4, 500), 4);
    }
  }
}

TEST_CASE("device selection: auto falls back to the CPU with a reason; cpu is the CPU", "[cuda]") {
  auto cpu = OpenDevice(DeviceSpec{DeviceSpec::Kind::kCpu, 0}, 2);
  REQUIRE(cpu.ok());
  CHECK(cpu->backend->Describe() == "cpu (OpenBLAS, 2 threads)");
  CHECK(cpu->reason == "asked for cpu");
  auto autod = OpenDevice(DeviceSpec{}, 1);
  REQUIRE(autod.ok());
  std::cerr << "auto: " << autod->backend->Describe() << ": " << autod->reason << "\n"
            << DescribeCudaDevices() << "\n";
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok() || *count == 0) {
    CHECK(autod->backend->host_memory());
    CHECK(autod->reason.rfind("auto: no usable GPU", 0) == 0);
    auto cuda = OpenDevice(DeviceSpec{DeviceSpec::Kind::kCuda, 0}, 1);
    CHECK(absl::IsFailedPrecondition(cuda.status()));
    CHECK(cuda.status().message().find("cuda:0 was asked for but cannot be used") !=
          std::string::npos);
  } else {
    CHECK_FALSE(autod->backend->host_memory());
    auto missing = OpenDevice(DeviceSpec{DeviceSpec::Kind::kCuda, *count}, 1);
    CHECK(absl::IsFailedPrecondition(missing.status()));
  }
}

}  // namespace
}  // namespace pstrain
