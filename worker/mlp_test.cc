#include "worker/mlp.h"

#include <cmath>
#include <random>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

MlpConfig SmallConfig() {
  MlpConfig c;
  c.set_input_dim(5);
  c.add_hidden_units(7);
  c.add_hidden_units(6);
  c.set_num_classes(4);
  return c;
}

TEST_CASE("MLP variables and deterministic initialisation", "[mlp]") {
  Mlp mlp(SmallConfig());
  REQUIRE(mlp.variables().size() == 6);
  CHECK(mlp.variables()[0].name == "dense0/kernel");
  CHECK(mlp.variables()[0].shape == std::vector<int64_t>{5, 7});
  CHECK(mlp.variables()[5].shape == std::vector<int64_t>{4});
  auto a = mlp.Initialize(3), b = mlp.Initialize(3), c = mlp.Initialize(4);
  CHECK(a[0].values() == b[0].values());
  CHECK(a[0].values() != c[0].values());
  for (float v : a[1].values()) CHECK(v == 0.0f);
}

TEST_CASE("MLP gradients match finite differences", "[mlp]") {
  Mlp mlp(SmallConfig());
  std::vector<Tensor> params = mlp.Initialize(11);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& t : params) {
    for (float& v : t.values()) v += 0.1f * u(rng);  // non-zero biases too
  }
  const int batch = 3;
  std::vector<float> x(batch * 5);
  for (float& v : x) v = u(rng);
  std::vector<int32_t> y = {0, 3, 2};
  std::vector<Tensor> grads;
  float loss;
  REQUIRE(mlp.ComputeGradients(params, x.data(), y.data(), batch, &grads, &loss).ok());
  REQUIRE(std::isfinite(loss));

  auto loss_at = [&](std::vector<Tensor>& p) {
    std::vector<Tensor> g;
    float l;
    REQUIRE(mlp.ComputeGradients(p, x.data(), y.data(), batch, &g, &l).ok());
    return static_cast<double>(l);
  };
  const float eps = 1e-3f;  // small enough not to cross a ReLU kink
  int checked = 0;
  for (size_t t = 0; t < params.size(); ++t) {
    for (int64_t i = 0; i < params[t].num_elements(); ++i) {
      const float saved = params[t].values()[i];
      params[t].values()[i] = saved + eps;
      const double up = loss_at(params);
      params[t].values()[i] = saved - eps;
      const double down = loss_at(params);
      params[t].values()[i] = saved;
      const double numeric = (up - down) / (2 * eps);
      const double analytic = grads[t].values()[i];
      INFO(mlp.variables()[t].name << "[" << i << "]");
      CHECK(analytic == Approx(numeric).margin(2e-3).epsilon(2e-2));
      ++checked;
    }
  }
  CHECK(checked == 5 * 7 + 7 + 7 * 6 + 6 + 6 * 4 + 4);
}

TEST_CASE("MLP gradient descent lowers the loss and evaluation counts", "[mlp]") {
  MlpConfig c;
  c.set_input_dim(2);
  c.add_hidden_units(16);
  c.set_num_classes(2);
  Mlp mlp(c);
  std::vector<Tensor> params = mlp.Initialize(1);
  // Label = x0 > x1.
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1, 1);
  const int n = 256;
  std::vector<float> x(n * 2);
  std::vector<int32_t> y(n);
  for (int i = 0; i < n; ++i) {
    x[2 * i] = u(rng);
    x[2 * i + 1] = u(rng);
    y[i] = x[2 * i] > x[2 * i + 1];
  }
  EvalResult before, after;
  REQUIRE(mlp.Evaluate(params, x.data(), y.data(), n, &before).ok());
  std::vector<Tensor> grads;
  float loss;
  for (int step = 0; step < 300; ++step) {
    REQUIRE(mlp.ComputeGradients(params, x.data(), y.data(), n, &grads, &loss).ok());
    for (size_t t = 0; t < params.size(); ++t) {
      for (int64_t i = 0; i < params[t].num_elements(); ++i) {
        params[t].values()[i] -= 0.5f * grads[t].values()[i];
      }
    }
  }
  REQUIRE(mlp.Evaluate(params, x.data(), y.data(), n, &after).ok());
  CHECK(after.loss < before.loss);
  CHECK(after.accuracy() > 0.95);
  CHECK(after.count == n);
}

TEST_CASE("MLP refuses wrong parameter shapes and labels", "[mlp]") {
  Mlp mlp(SmallConfig());
  std::vector<Tensor> params = mlp.Initialize(1);
  std::vector<float> x(5, 0.0f);
  std::vector<int32_t> bad_label = {9};
  std::vector<Tensor> grads;
  float loss;
  CHECK_FALSE(mlp.ComputeGradients(params, x.data(), bad_label.data(), 1, &grads, &loss).ok());
  params.pop_back();
  std::vector<int32_t> y = {0};
  CHECK_FALSE(mlp.ComputeGradients(params, x.data(), y.data(), 1, &grads, &loss).ok());
}

}  // namespace
}  // namespace pstrain
