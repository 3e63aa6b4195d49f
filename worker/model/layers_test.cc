// Finite-difference checks of every layer and loss on the CPU backend: the
// analytic backward pass must match central differences of the forward pass.
#include "worker/model/layers.h"

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "worker/model/backend.h"
#include "worker/model/cpu_ops.h"
#include "worker/model/test_util.h"

namespace pstrain {
namespace {

using testing::Random;

// Moves values away from a kink (ReLU at 0) so differences do not straddle it.
void AvoidZero(std::vector<float>* v, float margin) {
  for (float& x : *v) {
    if (std::fabs(x) < margin) x = x < 0 ? -margin : margin;
  }
}

// |a - n| <= tol * max(1, |a|, |n|) for every element.
void ExpectClose(const std::vector<double>& analytic, const std::vector<double>& numeric,
                 double tol, const std::string& what) {
  REQUIRE(analytic.size() == numeric.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < analytic.size(); ++i) {
    const double scale = std::max({1.0, std::fabs(analytic[i]), std::fabs(numeric[i])});
    const double err = std::fabs(analytic[i] - numeric[i]) / scale;
    if (err > worst) {
      worst = err;
      at = i;
    }
  }
  INFO(what << ": worst relative error " << worst << " at " << at << " (analytic " << analytic[at]
            << ", numeric " << numeric[at] << ")");
  CHECK(worst <= tol);
}

// Checks a layer's dx and parameter gradients for L = sum(y * r).
// Points `layer` at `params` and at gradients of the same sizes, returned
// (both must outlive its passes).
std::vector<std::vector<float>> BindParameters(Layer* layer,
                                               std::vector<std::vector<float>>* params) {
  std::vector<std::vector<float>> grads;
  for (const auto& p : *params) grads.emplace_back(p.size());
  std::vector<const float*> pp;
  std::vector<float*> gp;
  for (size_t i = 0; i < params->size(); ++i) {
    pp.push_back((*params)[i].data());
    gp.push_back(grads[i].data());
  }
  layer->Bind(pp, gp);
  return grads;
}

// `backend`: the CPU backend to run on (one that outlives the layer, for a
// layer that keeps memory of its own), else one of its own.
void CheckLayer(Layer* layer, std::vector<std::vector<float>> params, std::vector<float> x,
                int batch, bool training, uint64_t seed, double tol, Backend* backend = nullptr) {
  std::unique_ptr<Backend> own = backend == nullptr ? NewCpuBackend(1) : nullptr;
  Backend* cpu = backend != nullptr ? backend : own.get();
  const int in = layer->input_dim(), out = layer->output_dim();
  std::vector<std::vector<float>> grads = BindParameters(layer, &params);
  PassContext ctx{cpu, batch, training, seed};
  const std::vector<float> r = Random(static_cast<size_t>(batch) * out, 99);
  std::vector<float> y(static_cast<size_t>(batch) * out), dx(static_cast<size_t>(batch) * in);

  auto objective = [&]() {
    REQUIRE(layer->Forward(ctx, x.data(), y.data()).ok());
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * r[i];
    return s;
  };
  objective();
  REQUIRE(layer->Backward(ctx, x.data(), y.data(), r.data(), dx.data()).ok());
  const std::vector<float> dx_analytic = dx;
  const std::vector<std::vector<float>> grads_analytic = grads;

  const float eps = 1e-2f;
  auto numeric = [&](std::vector<float>* v) {
    std::vector<double> g(v->size());
    for (size_t i = 0; i < v->size(); ++i) {
      const float saved = (*v)[i];
      (*v)[i] = saved + eps;
      const double up = objective();
      (*v)[i] = saved - eps;
      const double down = objective();
      (*v)[i] = saved;
      g[i] = (up - down) / (2.0 * eps);
    }
    return g;
  };
  ExpectClose(std::vector<double>(dx_analytic.begin(), dx_analytic.end()), numeric(&x), tol,
              layer->name() + " dx");
  for (size_t p = 0; p < params.size(); ++p) {
    ExpectClose(std::vector<double>(grads_analytic[p].begin(), grads_analytic[p].end()),
                numeric(&params[p]), tol, layer->name() + " parameter " + std::to_string(p));
  }
}

TEST_CASE("dense layer gradients match finite differences", "[layers]") {
  const int batch = 5, in = 7, out = 4;
  DenseLayer dense("dense0", in, out);
  auto vars = dense.Variables();
  REQUIRE(vars.size() == 2);
  CHECK(vars[0].name == "dense0/kernel");
  CHECK(vars[0].shape == std::vector<int64_t>{in, out});
  CHECK(vars[1].name == "dense0/bias");
  CHECK(vars[1].shape == std::vector<int64_t>{out});
  CheckLayer(&dense, {Random(in * out, 1), Random(out, 2)}, Random(batch * in, 3), batch, true, 0,
             2e-3);
}

TEST_CASE("cross network: x0 * (x W + b) + x per layer; gradients match finite differences",
          "[layers][cross]") {
  const int batch = 4, dim = 6;
  std::unique_ptr<Backend> backend = NewCpuBackend(1);
  for (int layers : {1, 2, 3}) {
    CrossLayer cross("cross0", dim, layers);
    const auto vars = cross.Variables();
    REQUIRE(vars.size() == 2u * layers);
    CHECK(vars[0].name == "cross0/kernel0");
    CHECK(vars[0].shape == std::vector<int64_t>{dim, dim});
    CHECK(vars[1].name == "cross0/bias0");
    CHECK(vars.back().name == absl::StrCat("cross0/bias", layers - 1));
    std::vector<std::vector<float>> params;
    for (int l = 0; l < layers; ++l) {
      params.push_back(Random(dim * dim, 10 + l, -0.5f, 0.5f));
      params.push_back(Random(dim, 20 + l, -0.5f, 0.5f));
    }
    const std::vector<float> x = Random(batch * dim, 5, -1.0f, 1.0f);
    // The forward pass against the formula, layer by layer in doubles.
    {
      std::unique_ptr<Backend> cpu = NewCpuBackend(1);
      CrossLayer cross("cross0", dim, layers);  // its memory the backend's: destroyed first
      std::vector<std::vector<float>> grads = BindParameters(&cross, &params);
      PassContext ctx{cpu.get(), batch, true, 0};
      std::vector<float> y(batch * dim);
      REQUIRE(cross.Forward(ctx, x.data(), y.data()).ok());
      std::vector<double> xl(x.begin(), x.end());
      for (int l = 0; l < layers; ++l) {
        std::vector<double> next(xl.size());
        for (int b = 0; b < batch; ++b) {
          for (int j = 0; j < dim; ++j) {
            double u = params[2 * l + 1][j];
            for (int k = 0; k < dim; ++k) u += xl[b * dim + k] * params[2 * l][k * dim + j];
            next[b * dim + j] = x[b * dim + j] * u + xl[b * dim + j];
          }
        }
        xl = next;
      }
      for (size_t i = 0; i < y.size(); ++i) CHECK(std::fabs(y[i] - xl[i]) < 1e-5);
      // Without dx the parameters' gradients are the same.
      const std::vector<float> dy = Random(batch * dim, 30);
      std::vector<float> dx(batch * dim);
      REQUIRE(cross.Backward(ctx, x.data(), y.data(), dy.data(), dx.data()).ok());
      const std::vector<std::vector<float>> with_dx = grads;
      REQUIRE(cross.Backward(ctx, x.data(), y.data(), dy.data(), nullptr).ok());
      CHECK(grads == with_dx);
    }
    CheckLayer(&cross, params, x, batch, true, 0, 2e-3, backend.get());
  }
}

TEST_CASE("dot interaction: the bottom MLP's vector and every pair's dot; gradients match "
          "finite differences",
          "[layers][dot]") {
  // 3 numbers and 4 vectors of 2: the bottom (3 -> 5 -> 2) and 5 vectors,
  // so 2 + 10 outputs.
  const int batch = 3, dense = 3, dim = 2, fields = 4, width = dense + fields * dim;
  std::unique_ptr<Backend> backend = NewCpuBackend(1);
  for (const std::vector<int>& units : {std::vector<int>{5, 2}, std::vector<int>{}}) {
    DotLayer dot("dot0", width, dense, dim, units);
    CHECK(dot.output_dim() == dim + 5 * 4 / 2);
    const auto vars = dot.Variables();
    REQUIRE(vars.size() == (units.empty() ? 2u : 4u));
    CHECK(vars[0].name == "dot0/bottom0/kernel");
    CHECK(vars[0].shape == std::vector<int64_t>{dense, units.empty() ? dim : 5});
    // Positive numbers, kernels and biases keep every bottom unit above
    // ReLU's kink (where differences would straddle it); the vectors any sign.
    std::vector<std::vector<float>> params;
    for (const VariableSpec& v : vars) {
      params.push_back(Random(v.num_elements(), 40 + params.size(), 0.1f, 0.8f));
    }
    std::vector<float> x = Random(batch * width, 6, -1.0f, 1.0f);
    for (int b = 0; b < batch; ++b) {
      for (int i = 0; i < dense; ++i) x[b * width + i] = std::fabs(x[b * width + i]) + 0.1f;
    }
    // The forward pass against the formula, in doubles.
    {
      std::vector<std::vector<float>> grads = BindParameters(&dot, &params);
      PassContext ctx{backend.get(), batch, true, 0};
      std::vector<float> y(batch * dot.output_dim());
      REQUIRE(dot.Forward(ctx, x.data(), y.data()).ok());
      for (int b = 0; b < batch; ++b) {
        std::vector<double> h(x.begin() + b * width, x.begin() + b * width + dense);
        for (size_t k = 0; k < params.size() / 2; ++k) {
          const int out = static_cast<int>(params[2 * k + 1].size());
          std::vector<double> next(out);
          for (int j = 0; j < out; ++j) {
            double u = params[2 * k + 1][j];
            for (size_t i = 0; i < h.size(); ++i) u += h[i] * params[2 * k][i * out + j];
            next[j] = std::max(u, 0.0);
          }
          h = next;
        }
        std::vector<std::vector<double>> v = {h};
        for (int f = 0; f < fields; ++f) {
          v.emplace_back(x.begin() + b * width + dense + f * dim,
                         x.begin() + b * width + dense + (f + 1) * dim);
        }
        const float* row = y.data() + b * dot.output_dim();
        for (int k = 0; k < dim; ++k) CHECK(std::fabs(row[k] - h[k]) < 1e-5);
        int p = 0;
        for (int i = 1; i <= fields; ++i) {
          for (int j = 0; j < i; ++j, ++p) {
            double want = 0;
            for (int k = 0; k < dim; ++k) want += v[i][k] * v[j][k];
            INFO("example " << b << " pair " << i << "," << j);
            CHECK(std::fabs(row[dim + p] - want) < 1e-5);
          }
        }
      }
    }
    CheckLayer(&dot, params, x, batch, true, 0, 2e-3, backend.get());
    // A bottom unit below the kink for every example: no gradient reaches
    // its bias (the differences agree: zero).
    params[1][0] = -20.0f;
    CheckLayer(&dot, params, x, batch, true, 0, 2e-3, backend.get());
  }
}

TEST_CASE("relu and gelu gradients match finite differences", "[layers]") {
  const int batch = 4, dim = 9;
  std::vector<float> x = Random(batch * dim, 4, -3, 3);
  AvoidZero(&x, 0.05f);
  ReluLayer relu("relu0", dim);
  CheckLayer(&relu, {}, x, batch, true, 0, 2e-3);
  GeluLayer gelu("gelu0", dim);
  CheckLayer(&gelu, {}, x, batch, true, 0, 2e-3);
}

TEST_CASE("gelu is the exact erf form", "[layers]") {
  const std::vector<float> x = {-3.0f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 3.0f};
  std::vector<float> y(x.size());
  cpu::Gelu(x.data(), static_cast<int64_t>(x.size()), y.data());
  // torch.nn.functional.gelu(torch.tensor(x)) (approximate='none').
  const std::vector<float> expected = {-0.00404969f, -0.15865526f, -0.15426877f, 0.0f,
                                       0.34573123f,  0.84134474f,  2.99595031f};
  for (size_t i = 0; i < x.size(); ++i) CHECK(y[i] == Approx(expected[i]).margin(1e-6));
}

TEST_CASE("dropout: gradients match, the mask is seeded, evaluation is the identity", "[layers]") {
  const int batch = 6, dim = 50;
  DropoutLayer dropout("dropout0", dim, 0.3f);
  std::vector<float> x = Random(batch * dim, 5);
  CheckLayer(&dropout, {}, x, batch, true, /*seed=*/1234, 2e-3);

  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  std::vector<float> a(x.size()), b(x.size()), c(x.size()), e(x.size());
  REQUIRE(dropout.Forward({cpu.get(), batch, true, 7}, x.data(), a.data()).ok());
  REQUIRE(dropout.Forward({cpu.get(), batch, true, 7}, x.data(), b.data()).ok());
  REQUIRE(dropout.Forward({cpu.get(), batch, true, 8}, x.data(), c.data()).ok());
  REQUIRE(dropout.Forward({cpu.get(), batch, false, 7}, x.data(), e.data()).ok());
  CHECK(a == b);  // same seed, same mask
  CHECK(a != c);  // another seed, another mask
  CHECK(e == x);  // evaluation: identity
  int dropped = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == 0.0f) {
      ++dropped;
    } else {
      CHECK(a[i] == Approx(x[i] / 0.7f));
    }
  }
  // 300 elements at rate 0.3: expect ~90 dropped.
  CHECK(dropped > 50);
  CHECK(dropped < 130);
}

// Checks a loss's dlogits for L = mean row loss.
void CheckLoss(LossLayer::Kind kind, int classes, std::vector<int32_t> labels, double tol) {
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  LossLayer loss(kind, classes);
  const int rows = static_cast<int>(labels.size());
  std::vector<float> logits = Random(static_cast<size_t>(rows) * classes, 11, -3, 3);
  std::vector<float> d(logits.size());
  std::vector<double> row_loss(rows);
  std::vector<int32_t> predicted(rows);
  REQUIRE(loss.Compute(cpu.get(), logits.data(), labels.data(), rows, static_cast<float>(rows),
                       d.data(), row_loss.data(), predicted.data())
              .ok());
  auto mean_loss = [&]() {
    REQUIRE(loss.Compute(cpu.get(), logits.data(), labels.data(), rows, static_cast<float>(rows),
                         nullptr, row_loss.data(), nullptr)
                .ok());
    double s = 0;
    for (double l : row_loss) s += l;
    return s / rows;
  };
  std::vector<double> numeric(logits.size());
  const float eps = 1e-2f;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float saved = logits[i];
    logits[i] = saved + eps;
    const double up = mean_loss();
    logits[i] = saved - eps;
    const double down = mean_loss();
    logits[i] = saved;
    numeric[i] = (up - down) / (2.0 * eps);
  }
  ExpectClose(std::vector<double>(d.begin(), d.end()), numeric, tol, loss.name());
}

TEST_CASE("softmax and sigmoid cross-entropy gradients match finite differences", "[layers]") {
  CheckLoss(LossLayer::Kind::kSoftmaxCrossEntropy, 5, {0, 4, 2, 2}, 1e-3);
  CheckLoss(LossLayer::Kind::kSigmoidCrossEntropy, 1, {0, 1, 1, 0, 1}, 1e-3);
  CheckLoss(LossLayer::Kind::kSigmoidCrossEntropy, 3, {2, 0, 1}, 1e-3);
}

TEST_CASE("loss values and predictions", "[layers]") {
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  // Softmax of [0, ln 3] with label 1: p = 3/4, loss = -ln(3/4).
  {
    LossLayer loss(LossLayer::Kind::kSoftmaxCrossEntropy, 2);
    const std::vector<float> logits = {0.0f, std::log(3.0f)};
    const std::vector<int32_t> labels = {1};
    double row = 0;
    int32_t predicted = -1;
    REQUIRE(
        loss.Compute(cpu.get(), logits.data(), labels.data(), 1, 1.0f, nullptr, &row, &predicted)
            .ok());
    CHECK(row == Approx(-std::log(0.75)).epsilon(1e-6));
    CHECK(predicted == 1);
    CHECK(loss.num_labels() == 2);
  }
  // Sigmoid with one unit: logit 2, label 0: loss = ln(1 + e^2); huge logits stay finite.
  {
    LossLayer loss(LossLayer::Kind::kSigmoidCrossEntropy, 1);
    const std::vector<float> logits = {2.0f, -2.0f, 80.0f, -80.0f};
    const std::vector<int32_t> labels = {0, 0, 1, 1};
    std::vector<double> row(4);
    std::vector<int32_t> predicted(4);
    REQUIRE(loss.Compute(cpu.get(), logits.data(), labels.data(), 4, 4.0f, nullptr, row.data(),
                         predicted.data())
                .ok());
    CHECK(row[0] == Approx(std::log1p(std::exp(2.0))).epsilon(1e-9));
    CHECK(row[1] == Approx(std::log1p(std::exp(-2.0))).epsilon(1e-9));
    CHECK(row[2] == Approx(0.0).margin(1e-30));
    CHECK(row[3] == Approx(80.0).epsilon(1e-9));
    CHECK(predicted == std::vector<int32_t>{1, 0, 1, 0});
    CHECK(loss.num_labels() == 2);
  }
}

TEST_CASE("OpenBLAS's SSE3 fall-back on an AVX CPU gets the core type that fits", "[cpu]") {
  // What a VM hiding its CPU's model gave on the H100 machine's Xeon.
  CHECK(cpu::BlasCoreTypeFor("Prescott", true, true, nullptr) == "SkylakeX");
  CHECK(cpu::BlasCoreTypeFor("Core2", false, true, nullptr) == "Haswell");
  CHECK(cpu::BlasCoreTypeFor("Sandybridge", false, true, nullptr) == "Haswell");
  // A fitting choice, a CPU without AVX2, or a user's own setting: nothing.
  CHECK(cpu::BlasCoreTypeFor("Haswell", false, true, nullptr).empty());
  CHECK(cpu::BlasCoreTypeFor("Cooperlake", true, true, nullptr).empty());
  CHECK(cpu::BlasCoreTypeFor("Zen", false, true, nullptr).empty());
  CHECK(cpu::BlasCoreTypeFor("Prescott", false, false, nullptr).empty());
  CHECK(cpu::BlasCoreTypeFor("Prescott", true, true, "Haswell").empty());
  CHECK(cpu::BlasCoreTypeFor("Prescott", true, true, "") == "SkylakeX");
  // This process: OpenBLAS reports a core, and the live decision is one of the above.
  INFO("OpenBLAS core here: " << cpu::BlasCoreName());
  CHECK(!cpu::BlasCoreName().empty());
  const std::string here = cpu::BlasCoreTypeOverride();
  CHECK((here.empty() || here == "SkylakeX" || here == "Haswell"));
}

}  // namespace
}  // namespace pstrain
