#include "worker/mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace pstrain {

void SetBlasThreads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

Mlp::Mlp(const MlpConfig& config) {
  dims_.push_back(config.input_dim());
  for (int h : config.hidden_units()) dims_.push_back(h);
  dims_.push_back(config.num_classes());
  for (size_t l = 0; l + 1 < dims_.size(); ++l) {
    variables_.push_back({absl::StrCat("dense", l, "/kernel"), {dims_[l], dims_[l + 1]}});
    variables_.push_back({absl::StrCat("dense", l, "/bias"), {dims_[l + 1]}});
  }
}

std::vector<Tensor> Mlp::Initialize(uint64_t seed) const {
  std::vector<Tensor> params;
  for (size_t i = 0; i < variables_.size(); ++i) {
    const VariableSpec& v = variables_[i];
    Tensor t(v.shape);
    if (v.shape.size() == 2) {
      // A generator per variable, so adding a layer does not shift the others.
      std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + i + 1);
      const double limit = std::sqrt(6.0 / static_cast<double>(v.shape[0] + v.shape[1]));
      for (float& w : t.values()) {
        // 53 random bits -> [0, 1): portable, unlike std::uniform_real_distribution.
        const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
        w = static_cast<float>((2.0 * u - 1.0) * limit);
      }
    }
    params.push_back(std::move(t));
  }
  return params;
}

absl::Status Mlp::CheckParams(const std::vector<Tensor>& params) const {
  if (params.size() != variables_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("MLP expects ", variables_.size(),
                                                   " parameter tensors, got ", params.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].shape() != variables_[i].shape) {
      return absl::InvalidArgumentError(absl::StrCat(variables_[i].name, " has shape ",
                                                     params[i].ShapeString()));
    }
  }
  return absl::OkStatus();
}

void Mlp::Forward(const std::vector<Tensor>& params, const float* x, int batch) {
  const size_t layers = dims_.size() - 1;
  activations_.resize(layers + 1);
  activations_[0].assign(x, x + static_cast<size_t>(batch) * dims_[0]);
  for (size_t l = 0; l < layers; ++l) {
    const int in = dims_[l], out = dims_[l + 1];
    const float* w = params[2 * l].data();
    const float* b = params[2 * l + 1].data();
    std::vector<float>& z = activations_[l + 1];
    z.resize(static_cast<size_t>(batch) * out);
    for (int r = 0; r < batch; ++r) std::copy(b, b + out, z.data() + static_cast<size_t>(r) * out);
    // z[batch, out] += a[batch, in] * w[in, out]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, out, in, 1.0f,
                activations_[l].data(), in, w, out, 1.0f, z.data(), out);
    if (l + 1 < layers) {
      for (float& v : z) v = v > 0.0f ? v : 0.0f;
    }
  }
}

absl::Status Mlp::ComputeGradients(const std::vector<Tensor>& params, const float* x,
                                   const int32_t* labels, int batch, std::vector<Tensor>* grads,
                                   float* loss) {
  if (auto st = CheckParams(params); !st.ok()) return st;
  if (batch <= 0) return absl::InvalidArgumentError("empty batch");
  const int classes = num_classes();
  for (int r = 0; r < batch; ++r) {
    if (labels[r] < 0 || labels[r] >= classes) {
      return absl::InvalidArgumentError(absl::StrCat("label ", labels[r], " out of range"));
    }
  }
  Forward(params, x, batch);
  const size_t layers = dims_.size() - 1;

  // Softmax cross-entropy: delta = (softmax - onehot) / batch.
  delta_.assign(activations_[layers].begin(), activations_[layers].end());
  double total = 0;
  for (int r = 0; r < batch; ++r) {
    float* row = delta_.data() + static_cast<size_t>(r) * classes;
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
    const int in = dims_[l], out = dims_[l + 1];
    Tensor& gw = (*grads)[2 * l];
    Tensor& gb = (*grads)[2 * l + 1];
    if (gw.shape() != params[2 * l].shape()) gw = Tensor(params[2 * l].shape());
    if (gb.shape() != params[2 * l + 1].shape()) gb = Tensor(params[2 * l + 1].shape());
    // gw[in, out] = a^T[in, batch] * delta[batch, out]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, batch, 1.0f,
                activations_[l].data(), in, delta_.data(), out, 0.0f, gw.data(), out);
    float* db = gb.data();
    std::fill(db, db + out, 0.0f);
    for (int r = 0; r < batch; ++r) {
      const float* d = delta_.data() + static_cast<size_t>(r) * out;
      for (int c = 0; c < out; ++c) db[c] += d[c];
    }
    if (l == 0) break;
    // delta_prev[batch, in] = delta[batch, out] * w^T[out, in], masked by ReLU'.
    delta_prev_.resize(static_cast<size_t>(batch) * in);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, in, out, 1.0f, delta_.data(), out,
                params[2 * l].data(), out, 0.0f, delta_prev_.data(), in);
    const std::vector<float>& a = activations_[l];  // post-ReLU output of layer l-1
    for (size_t i = 0; i < delta_prev_.size(); ++i) {
      if (a[i] <= 0.0f) delta_prev_[i] = 0.0f;
    }
    delta_.swap(delta_prev_);
  }
  return absl::OkStatus();
}

absl::Status Mlp::Evaluate(const std::vector<Tensor>& params, const float* x,
                           const int32_t* labels, int64_t n, EvalResult* result) {
  if (auto st = CheckParams(params); !st.ok()) return st;
  *result = EvalResult();
  const int classes = num_classes();
  const int64_t chunk = 512;
  double total = 0;
  for (int64_t start = 0; start < n; start += chunk) {
    const int b = static_cast<int>(std::min(chunk, n - start));
    Forward(params, x + start * input_dim(), b);
    const std::vector<float>& logits = activations_.back();
    for (int r = 0; r < b; ++r) {
      const float* row = logits.data() + static_cast<size_t>(r) * classes;
      const int label = labels[start + r];
      if (label < 0 || label >= classes) {
        return absl::InvalidArgumentError(absl::StrCat("label ", label, " out of range"));
      }
      const float max = *std::max_element(row, row + classes);
      double sum = 0;
      for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(row[c] - max));
      total += std::log(sum) - static_cast<double>(row[label] - max);
      const int predicted = static_cast<int>(std::max_element(row, row + classes) - row);
      if (predicted == label) ++result->correct;
    }
  }
  result->count = n;
  result->loss = n > 0 ? total / n : 0;
  return absl::OkStatus();
}

}  // namespace pstrain
