// The model on the CPU backend: the classic MLP gives bitwise the numbers of
// the original hand-written implementation (kept here as the reference), a
// whole model with GELU, dropout and either loss passes a finite-difference
// check, runs are reproducible, training learns, and bad input is refused.
#include "worker/model/model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "catch2/catch.hpp"
#include "common/cluster/config.h"
#include "worker/model/deferred_backend.h"
#include "worker/model/test_util.h"

namespace pstrain {
namespace {

using testing::DeferredBackend;
using testing::ParseModel;

using testing::Random;

// The MLP as the project first wrote it (dense + ReLU, softmax cross-entropy,
// OpenBLAS), which an independent reference checked: the layered model must
// reproduce it bit for bit.
void ReferenceMlp(const std::vector<int>& dims, const std::vector<Tensor>& params, const float* x,
                  const int32_t* labels, int batch, std::vector<Tensor>* grads, float* loss) {
  const size_t layers = dims.size() - 1;
  std::vector<std::vector<float>> act(layers + 1);
  act[0].assign(x, x + static_cast<size_t>(batch) * dims[0]);
  for (size_t l = 0; l < layers; ++l) {
    const int in = dims[l], out = dims[l + 1];
    const float* b = params[2 * l + 1].data();
    std::vector<float>& z = act[l + 1];
    z.resize(static_cast<size_t>(batch) * out);
    for (int r = 0; r < batch; ++r) std::copy(b, b + out, z.data() + static_cast<size_t>(r) * out);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, out, in, 1.0f, act[l].data(), in,
                params[2 * l].data(), out, 1.0f, z.data(), out);
    if (l + 1 < layers) {
      for (float& v : z) v = v > 0.0f ? v : 0.0f;
    }
  }
  const int classes = dims.back();
  std::vector<float> delta = act[layers], prev;
  double total = 0;
  for (int r = 0; r < batch; ++r) {
    float* row = delta.data() + static_cast<size_t>(r) * classes;
    const float max = *std::max_element(row, row + classes);
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(row[c] - max));
    const double log_sum = std::log(sum);
    total += log_sum - static_cast<double>(row[labels[r]] - max);
    for (int c = 0; c < classes; ++c) {
      row[c] = static_cast<float>(std::exp(static_cast<double>(row[c] - max) - log_sum)) / batch;
    }
    row[labels[r]] -= 1.0f / batch;
  }
  *loss = static_cast<float>(total / batch);
  grads->resize(params.size());
  for (size_t l = layers; l-- > 0;) {
    const int in = dims[l], out = dims[l + 1];
    Tensor& gw = (*grads)[2 * l];
    Tensor& gb = (*grads)[2 * l + 1];
    gw = Tensor(params[2 * l].shape());
    gb = Tensor(params[2 * l + 1].shape());
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, batch, 1.0f, act[l].data(), in,
                delta.data(), out, 0.0f, gw.data(), out);
    float* db = gb.data();
    for (int r = 0; r < batch; ++r) {
      for (int c = 0; c < out; ++c) db[c] += delta[static_cast<size_t>(r) * out + c];
    }
    if (l == 0) break;
    prev.resize(static_cast<size_t>(batch) * in);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, in, out, 1.0f, delta.data(), out,
                params[2 * l].data(), out, 0.0f, prev.data(), in);
    for (size_t i = 0; i < prev.size(); ++i) {
      if (act[l][i] <= 0.0f) prev[i] = 0.0f;
    }
    delta.swap(prev);
  }
}

TEST_CASE("the layered MLP reproduces the original implementation bit for bit", "[model]") {
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  auto model = Model::Create(
      ParseModel("mlp { input_dim: 20 hidden_units: 16 hidden_units: 8 num_classes: 5 }"),
      cpu.get());
  REQUIRE(model.ok());
  Model& m = **model;
  REQUIRE(m.variables().size() == 6);
  CHECK(m.variables()[0].name == "dense0/kernel");
  CHECK(m.variables()[5].name == "dense2/bias");
  CHECK(m.Summary() ==
        "20 -> dense0(16) -> relu0 -> dense1(8) -> relu1 -> dense2(5) -> softmax_cross_entropy; "
        "517 parameters");
  std::vector<Tensor> params = m.Initialize(7);
  // Non-zero biases so their path is exercised too.
  for (size_t v = 1; v < params.size(); v += 2) {
    params[v].values() = Random(params[v].values().size(), 50 + v, -0.1f, 0.1f);
  }
  REQUIRE(m.SetParameters(params).ok());
  const int batch = 13;
  const std::vector<float> x = Random(batch * 20, 3);
  std::vector<int32_t> y(batch);
  for (int r = 0; r < batch; ++r) y[r] = (r * 3) % 5;

  std::vector<Tensor> ref_grads, grads;
  float ref_loss = 0, loss = 0;
  ReferenceMlp({20, 16, 8, 5}, params, x.data(), y.data(), batch, &ref_grads, &ref_loss);
  REQUIRE(m.ComputeGradients(x.data(), y.data(), batch, /*seed=*/1, &loss).ok());
  m.CopyGradients(&grads);
  CHECK(loss == ref_loss);
  REQUIRE(grads.size() == ref_grads.size());
  for (size_t v = 0; v < grads.size(); ++v) {
    INFO(m.variables()[v].name);
    CHECK(grads[v].values() == ref_grads[v].values());
  }
  // Initialisation is the original's: Glorot-uniform, one generator per variable.
  const double limit = std::sqrt(6.0 / (20 + 16));
  for (float w : params[0].values()) CHECK(std::fabs(w) <= limit);
}

// The mean loss of the model at its current host parameters.
double MeanLoss(Model* m, const std::vector<float>& x, const std::vector<int32_t>& y, int batch,
                uint64_t seed) {
  float loss = 0;
  REQUIRE(m->UploadParameters().ok());
  REQUIRE(m->ComputeGradients(x.data(), y.data(), batch, seed, &loss).ok());
  return loss;
}

void CheckWholeModel(const std::string& config, int input_dim, int labels_limit) {
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  auto model = Model::Create(ParseModel(config), cpu.get());
  REQUIRE(model.ok());
  Model& m = **model;
  std::vector<Tensor> params = m.Initialize(3);
  REQUIRE(m.SetParameters(params).ok());
  const int batch = 6;
  const std::vector<float> x = Random(static_cast<size_t>(batch) * input_dim, 9, -2, 2);
  std::vector<int32_t> y(batch);
  for (int r = 0; r < batch; ++r) y[r] = r % labels_limit;
  const uint64_t seed = 77;
  float loss = 0;
  REQUIRE(m.ComputeGradients(x.data(), y.data(), batch, seed, &loss).ok());
  std::vector<Tensor> grads;
  m.CopyGradients(&grads);
  // Central differences on a sample of every variable's parameters (the
  // dropout mask is fixed by the seed, so the function is smooth almost everywhere).
  const float eps = 3e-3f;
  for (size_t v = 0; v < m.variables().size(); ++v) {
    float* p = m.host_parameters(v);
    const int64_t n = m.variables()[v].num_elements();
    for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 7)) {
      const float saved = p[i];
      p[i] = saved + eps;
      const double up = MeanLoss(&m, x, y, batch, seed);
      p[i] = saved - eps;
      const double down = MeanLoss(&m, x, y, batch, seed);
      p[i] = saved;
      const double numeric = (up - down) / (2.0 * eps);
      const double analytic = grads[v].data()[i];
      INFO(m.variables()[v].name << "[" << i << "]: analytic " << analytic << ", numeric "
                                 << numeric);
      CHECK(std::fabs(numeric - analytic) < 2e-3 + 2e-2 * std::fabs(analytic));
    }
  }
}

TEST_CASE("a whole model with GELU, dropout and either loss passes a finite-difference check",
          "[model]") {
  CheckWholeModel(
      "mlp { input_dim: 6 hidden_units: 5 hidden_units: 4 num_classes: 3 activation: GELU "
      "dropout: 0.25 }",
      6, 3);
  CheckWholeModel(
      "sequential { input_dim: 5 layer { dense { units: 4 } } layer { gelu {} } "
      "layer { dense { units: 1 } } layer { sigmoid_cross_entropy {} } }",
      5, 2);
}

TEST_CASE("a model with a cross network passes a finite-difference check; with it or a dot "
          "interaction a device gives the CPU's numbers bit for bit",
          "[model][cross][dot]") {
  // (The dot layer's differences straddle its bottom ReLUs' kinks at these
  // sizes: layers_test checks it away from them.)
  CheckWholeModel(
      "sequential { input_dim: 5 layer { cross { layers: 2 } } layer { dense { units: 4 } } "
      "layer { gelu {} } layer { dense { units: 1 } } layer { sigmoid_cross_entropy {} } }",
      5, 2);
  for (const char* config :
       {"sequential { input_dim: 5 layer { cross { layers: 2 } } layer { dense { units: 4 } } "
        "layer { relu {} } layer { dense { units: 1 } } layer { sigmoid_cross_entropy {} } }",
        "sequential { input_dim: 5 layer { dot { dense_inputs: 1 dim: 2 bottom_units: 3 "
        "bottom_units: 2 } } layer { dense { units: 4 } } "
        "layer { relu {} } layer { dense { units: 1 } } layer { sigmoid_cross_entropy {} } }"}) {
    INFO(config);
    std::unique_ptr<Backend> cpu = NewCpuBackend(1);
    DeferredBackend device;
    auto mc = Model::Create(ParseModel(config), cpu.get());
    auto md = Model::Create(ParseModel(config), &device);
    REQUIRE(mc.ok());
    REQUIRE(md.ok());
    Model& c = **mc;
    Model& d = **md;
    const bool cross = std::string(config).find("cross {") != std::string::npos;
    // The dot layer: 1 number -> 3 -> 2, and 3 vectors of 2: 2 + 3 outputs.
    CHECK(c.Summary() == (cross ? "5 -> cross0(5) -> dense0(4) -> relu0 -> dense1(1) -> "
                                  "sigmoid_cross_entropy; 89 parameters"
                                : "5 -> dot0(5) -> dense0(4) -> relu0 -> dense1(1) -> "
                                  "sigmoid_cross_entropy; 43 parameters"));
    const std::vector<Tensor> params = c.Initialize(4);
    REQUIRE(c.SetParameters(params).ok());
    REQUIRE(d.SetParameters(params).ok());
    c.set_input_gradient(true);
    d.set_input_gradient(true);
    for (int batch : {16, 9}) {
      const std::vector<float> x = Random(static_cast<size_t>(batch) * 5, batch);
      std::vector<int32_t> y(batch);
      for (int r = 0; r < batch; ++r) y[r] = r % 2;
      float loss_c = 0, loss_d = 0;
      REQUIRE(c.ComputeGradients(x.data(), y.data(), batch, 1, &loss_c).ok());
      REQUIRE(d.ComputeGradients(x.data(), y.data(), batch, 1, &loss_d).ok());
      CHECK(loss_c == loss_d);
      std::vector<Tensor> gc, gd;
      c.CopyGradients(&gc);
      d.CopyGradients(&gd);
      for (size_t v = 0; v < gc.size(); ++v) CHECK(gc[v].values() == gd[v].values());
      CHECK(std::vector<float>(c.host_input_gradient(), c.host_input_gradient() + batch * 5) ==
            std::vector<float>(d.host_input_gradient(), d.host_input_gradient() + batch * 5));
    }
  }
}

TEST_CASE("the same seed gives bitwise the same step; another dropout seed another", "[model]") {
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  const std::string config =
      "mlp { input_dim: 10 hidden_units: 12 hidden_units: 12 num_classes: 4 activation: GELU "
      "dropout: 0.5 }";
  auto a = Model::Create(ParseModel(config), cpu.get());
  auto b = Model::Create(ParseModel(config), cpu.get());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const std::vector<float> x = Random(8 * 10, 1);
  const std::vector<int32_t> y = {0, 1, 2, 3, 3, 2, 1, 0};
  std::vector<Tensor> ga, gb, gc;
  float la = 0, lb = 0, lc = 0;
  REQUIRE((*a)->SetParameters((*a)->Initialize(5)).ok());
  REQUIRE((*b)->SetParameters((*b)->Initialize(5)).ok());
  REQUIRE((*a)->ComputeGradients(x.data(), y.data(), 8, 11, &la).ok());
  (*a)->CopyGradients(&ga);
  REQUIRE((*b)->ComputeGradients(x.data(), y.data(), 8, 11, &lb).ok());
  (*b)->CopyGradients(&gb);
  REQUIRE((*b)->ComputeGradients(x.data(), y.data(), 8, 12, &lc).ok());
  (*b)->CopyGradients(&gc);
  CHECK(la == lb);
  for (size_t v = 0; v < ga.size(); ++v) CHECK(ga[v].values() == gb[v].values());
  CHECK(ga[0].values() != gc[0].values());
}

TEST_CASE("clipping by global norm scales every gradient by one factor, only above the limit",
          "[model]") {
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  auto m = Model::Create(ParseModel("mlp { input_dim: 10 hidden_units: 12 num_classes: 4 }"),
                         cpu.get());
  REQUIRE(m.ok());
  REQUIRE((*m)->SetParameters((*m)->Initialize(5)).ok());
  const std::vector<float> x = Random(8 * 10, 1);
  const std::vector<int32_t> y = {0, 1, 2, 3, 3, 2, 1, 0};
  float loss = 0;
  REQUIRE((*m)->ComputeGradients(x.data(), y.data(), 8, 1, &loss).ok());
  std::vector<Tensor> before, after;
  (*m)->CopyGradients(&before);
  double sum = 0;
  for (const Tensor& g : before) {
    for (float v : g.values()) sum += double{v} * v;
  }
  const double norm = std::sqrt(sum);
  REQUIRE(norm > 0);
  // Above the norm: nothing changes.
  CHECK((*m)->ClipGradientsByGlobalNorm(static_cast<float>(2 * norm)) == Approx(norm));
  (*m)->CopyGradients(&after);
  for (size_t v = 0; v < before.size(); ++v) CHECK(after[v].values() == before[v].values());
  // A quarter of it: every element of every variable scaled by 1/4.
  CHECK((*m)->ClipGradientsByGlobalNorm(static_cast<float>(norm / 4)) == Approx(norm));
  (*m)->CopyGradients(&after);
  double clipped = 0;
  for (size_t v = 0; v < before.size(); ++v) {
    for (int64_t i = 0; i < before[v].num_elements(); ++i) {
      CHECK(after[v].values()[i] == Approx(before[v].values()[i] / 4).margin(1e-9));
      clipped += double{after[v].values()[i]} * after[v].values()[i];
    }
  }
  CHECK(std::sqrt(clipped) == Approx(norm / 4).epsilon(1e-5));
  // Gradients kept elsewhere (embedding rows) count in the norm: with 15x
  // the remaining squared norm beside them, the total is 4x, so a limit of
  // the remaining norm scales by 1/4 again.
  const double remaining = std::sqrt(clipped);
  CHECK((*m)->ClipGradientsByGlobalNorm(static_cast<float>(remaining), 15 * clipped) ==
        Approx(4 * remaining));
  (*m)->CopyGradients(&before);
  CHECK(before[0].values()[0] == Approx(after[0].values()[0] / 4).margin(1e-9));
}

TEST_CASE("a training pass keeps its batch's probabilities, from the parameters it trains "
          "from (progressive validation)", "[model]") {
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  auto model = Model::Create(
      ParseModel("sequential { input_dim: 3 layer { dense { units: 8 } } layer { relu {} } "
                 "layer { dense { units: 1 } } layer { sigmoid_cross_entropy {} } }"),
      cpu.get());
  REQUIRE(model.ok());
  Model& m = **model;
  REQUIRE(m.SetParameters(m.Initialize(3)).ok());
  const int n = 16;
  std::vector<float> x = Random(3 * n, 5);
  std::vector<int32_t> y(n);
  for (int i = 0; i < n; ++i) y[i] = i % 3 == 0;
  EvalResult want;
  REQUIRE(m.Evaluate(x.data(), y.data(), n, &want).ok());
  m.set_keep_scores(true);
  float loss = 0;
  REQUIRE(m.ComputeGradients(x.data(), y.data(), n, 0, &loss).ok());
  REQUIRE(m.scores().size() == static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) CHECK(m.scores()[i] == want.scores[i]);  // no dropout: the same
  CHECK(loss == Approx(want.loss).epsilon(1e-5));
  // A model of more outputs has no one score per example.
  auto classes = Model::Create(ParseModel("mlp { input_dim: 3 hidden_units: 4 num_classes: 2 }"),
                               cpu.get());
  REQUIRE(classes.ok());
  REQUIRE((*classes)->SetParameters((*classes)->Initialize(3)).ok());
  (*classes)->set_keep_scores(true);
  absl::Status st = (*classes)->ComputeGradients(x.data(), y.data(), n, 0, &loss);
  CHECK(absl::IsFailedPrecondition(st));
  CHECK_THAT(std::string(st.message()), Catch::Contains("one output; this one has 2"));
}

TEST_CASE("training with SGD learns a separable problem with either loss", "[model]") {
  for (const char* config :
       {"mlp { input_dim: 2 hidden_units: 16 num_classes: 2 activation: GELU }",
        "sequential { input_dim: 2 layer { dense { units: 16 } } layer { relu {} } "
        "layer { dense { units: 1 } } layer { sigmoid_cross_entropy {} } }"}) {
    INFO(config);
    std::unique_ptr<Backend> cpu = NewCpuBackend(1);
    auto model = Model::Create(ParseModel(config), cpu.get());
    REQUIRE(model.ok());
    Model& m = **model;
    std::vector<Tensor> params = m.Initialize(1);
    REQUIRE(m.SetParameters(params).ok());
    // Label: is the point outside the circle of radius 0.7?
    const int n = 256;
    std::vector<float> x = Random(2 * n, 4);
    std::vector<int32_t> y(n);
    for (int i = 0; i < n; ++i) y[i] = x[2 * i] * x[2 * i] + x[2 * i + 1] * x[2 * i + 1] > 0.49f;
    EvalResult before, after;
    REQUIRE(m.Evaluate(x.data(), y.data(), n, &before).ok());
    for (int step = 0; step < 600; ++step) {
      float loss = 0;
      REQUIRE(m.ComputeGradients(x.data(), y.data(), n, step, &loss).ok());
      for (size_t v = 0; v < m.variables().size(); ++v) {
        float* p = m.host_parameters(v);
        const float* g = m.host_gradients(v);
        for (int64_t i = 0; i < m.variables()[v].num_elements(); ++i) p[i] -= 0.5f * g[i];
      }
      REQUIRE(m.UploadParameters().ok());
    }
    REQUIRE(m.Evaluate(x.data(), y.data(), n, &after).ok());
    INFO("accuracy " << before.accuracy() << " -> " << after.accuracy() << ", loss " << before.loss
                     << " -> " << after.loss);
    CHECK(after.loss < 0.5 * before.loss);
    CHECK(after.accuracy() > 0.9);
    CHECK(after.count == n);
  }
}

TEST_CASE(
    "on a device each layer's gradients are handed over behind its backward pass, "
    "as soon as their copy is done, and never copied twice",
    "[model]") {
  const char* config =
      "mlp { input_dim: 20 hidden_units: 16 hidden_units: 12 num_classes: 5 activation: GELU }";
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  DeferredBackend device;
  auto mc = Model::Create(ParseModel(config), cpu.get());
  auto md = Model::Create(ParseModel(config), &device);
  REQUIRE(mc.ok());
  REQUIRE(md.ok());
  Model& c = **mc;
  Model& d = **md;
  const std::vector<Tensor> params = c.Initialize(4);
  REQUIRE(c.SetParameters(params).ok());
  REQUIRE(d.SetParameters(params).ok());
  const int batch = 24;
  const std::vector<float> x = Random(static_cast<size_t>(batch) * 20, 5);
  std::vector<int32_t> y(batch);
  for (int r = 0; r < batch; ++r) y[r] = (r * 3) % 5;

  // Without a hand-over, every gradient is copied in FinishStep.
  float loss_c = 0, loss_d = 0;
  REQUIRE(d.ComputeGradients(x.data(), y.data(), batch, 1, &loss_d).ok());
  const size_t plain_download = device.download_bytes();
  CHECK(device.waits() == 0);

  struct HandOver {
    size_t first, end;
    size_t still_queued;                    // device work not yet run when it was handed over
    std::vector<std::vector<float>> grads;  // host_gradients() as handed over
  };
  std::vector<HandOver> seen;
  d.set_gradients_ready([&](size_t first, size_t end) {
    HandOver h{first, end, device.queued(), {}};
    for (size_t v = first; v < end; ++v) {
      const float* g = d.host_gradients(v);
      h.grads.emplace_back(g, g + d.variables()[v].num_elements());
    }
    seen.push_back(std::move(h));
  });
  for (uint64_t seed : {2, 3}) {
    INFO("seed " << seed);
    // Another batch each step, so no gradient equals the last step's.
    const std::vector<float> x = Random(static_cast<size_t>(batch) * 20, 5 + seed);
    seen.clear();
    const size_t before = device.download_bytes();
    const int waits_before = device.waits();
    REQUIRE(c.ComputeGradients(x.data(), y.data(), batch, seed, &loss_c).ok());
    REQUIRE(d.ComputeGradients(x.data(), y.data(), batch, seed, &loss_d).ok());
    CHECK(loss_d == loss_c);
    // Three dense layers, the last first; the first two hand-overs come
    // while the layers below are still queued.
    REQUIRE(seen.size() == 3);
    CHECK(device.waits() - waits_before == 3);
    CHECK(seen[0].first == 4);
    CHECK(seen[0].end == 6);
    CHECK(seen[1].first == 2);
    CHECK(seen[1].end == 4);
    CHECK(seen[2].first == 0);
    CHECK(seen[2].end == 2);
    CHECK(seen[0].still_queued > 0);
    CHECK(seen[1].still_queued > 0);
    std::vector<Tensor> reference;
    c.CopyGradients(&reference);
    for (const HandOver& h : seen) {
      for (size_t v = h.first; v < h.end; ++v) {
        INFO(c.variables()[v].name);
        CHECK(h.grads[v - h.first] == reference[v].values());  // bitwise, final when handed over
        const float* g = d.host_gradients(v);
        CHECK(std::vector<float>(g, g + reference[v].values().size()) == reference[v].values());
      }
    }
    // Each gradient byte went to the host once: the early copies and
    // FinishStep's remainder (here none but the loss) add up to the plain step.
    CHECK(device.download_bytes() - before == plain_download);
  }
}

TEST_CASE("buffers are allocated once and reused across steps", "[model]") {
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  size_t used = 0, total = 0, after_first = 0, now = 0;
  {
    auto model = Model::Create(
        ParseModel("mlp { input_dim: 8 hidden_units: 16 num_classes: 4 dropout: 0.2 }"), cpu.get());
    REQUIRE(model.ok());
    Model& m = **model;
    REQUIRE(m.SetParameters(m.Initialize(1)).ok());
    const std::vector<float> x = Random(32 * 8, 2);
    std::vector<int32_t> y(32);
    for (int r = 0; r < 32; ++r) y[r] = r % 4;
    float loss = 0;
    REQUIRE(m.ComputeGradients(x.data(), y.data(), 32, 0, &loss).ok());
    REQUIRE(cpu->MemoryInfo(&after_first, &total).ok());
    CHECK(after_first > 0);
    for (int step = 1; step < 10; ++step) {
      REQUIRE(m.ComputeGradients(x.data(), y.data(), step % 2 ? 32 : 7, step, &loss).ok());
      REQUIRE(cpu->MemoryInfo(&now, &total).ok());
      CHECK(now == after_first);  // no allocation per step, smaller batches included
    }
  }
  REQUIRE(cpu->MemoryInfo(&used, &total).ok());
  CHECK(used == 0);  // everything given back with the model
}

TEST_CASE("bad labels, parameters and configs are refused with a clear error", "[model]") {
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  auto model =
      Model::Create(ParseModel("mlp { input_dim: 3 hidden_units: 2 num_classes: 3 }"), cpu.get());
  REQUIRE(model.ok());
  Model& m = **model;
  const std::vector<float> x(6, 0.5f);
  const std::vector<int32_t> bad = {0, 3};
  float loss = 0;
  absl::Status st = m.ComputeGradients(x.data(), bad.data(), 2, 0, &loss);
  CHECK(absl::IsInvalidArgument(st));
  CHECK(st.message() == "label 3 of example 1 is not in [0, 3)");
  EvalResult r;
  CHECK(absl::IsInvalidArgument(m.Evaluate(x.data(), bad.data(), 2, &r)));
  CHECK(absl::IsInvalidArgument(m.ComputeGradients(x.data(), bad.data(), 0, 0, &loss)));
  std::vector<Tensor> params = m.Initialize(1);
  params[1] = Tensor({3});
  st = m.SetParameters(params);
  CHECK(absl::IsInvalidArgument(st));
  CHECK(st.message() == "dense0/bias has shape [3]");

  auto bad_model = Model::Create(
      ParseModel("sequential { input_dim: 3 layer { relu {} } layer { dense { units: 2 } } }"),
      cpu.get());
  CHECK(absl::IsInvalidArgument(bad_model.status()));
  CHECK(bad_model.status().message().find("loss as the last layer") != std::string::npos);

  auto vars = ModelVariables(
      ParseModel("sequential { input_dim: 3 layer { dense { units: 4 } } layer { gelu {} } "
                 "layer { dropout { rate: 0.1 } } layer { dense { units: 2 } } "
                 "layer { softmax_cross_entropy {} } }"));
  REQUIRE(vars.ok());
  REQUIRE(vars->size() == 4);
  CHECK((*vars)[2].name == "dense1/kernel");
  CHECK((*vars)[2].shape == std::vector<int64_t>{4, 2});
}

}  // namespace
}  // namespace pstrain
