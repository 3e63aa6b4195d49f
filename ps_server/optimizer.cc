#include "ps_server/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/cluster/config.h"
#include "common/base/status_macros.h"

namespace pstrain {
namespace {

// Each loop below is one pass over the elements with every operand a
// register-sized vector: GCC at -O3 vectorises them (with a run-time check
// for in == out), and sqrt vectorises because this file is built with
// -fno-math-errno (the square roots here are of non-negative sums).

class SgdOptimizer : public Optimizer {
 public:
  std::string name() const override { return "sgd"; }
  std::vector<std::string> slot_names() const override { return {}; }
  void ApplyRange(const float* in, float* out, const float* grad, int64_t n, OptimizerSlots*,
                  int64_t, const UpdateInfo& u) const override {
    const float lr = u.learning_rate;
    // Two loops the compiler vectorises without run-time alias checks: in
    // place, or into a buffer of its own (the server's next version).
    if (in == out) {
      float* __restrict p = out;
      const float* __restrict g = grad;
      for (int64_t i = 0; i < n; ++i) p[i] = p[i] - lr * g[i];
    } else {
      float* __restrict o = out;
      const float* __restrict x = in;
      const float* __restrict g = grad;
      for (int64_t i = 0; i < n; ++i) o[i] = x[i] - lr * g[i];
    }
  }
};

class MomentumOptimizer : public Optimizer {
 public:
  explicit MomentumOptimizer(const MomentumConfig& c)
      : momentum_(c.momentum()), nesterov_(c.nesterov()) {}
  std::string name() const override { return nesterov_ ? "nesterov" : "momentum"; }
  std::vector<std::string> slot_names() const override { return {"momentum"}; }
  void ApplyRange(const float* in, float* out, const float* grad, int64_t n,
                  OptimizerSlots* slots, int64_t offset, const UpdateInfo& u) const override {
    const float lr = u.learning_rate, mu = momentum_;
    float* __restrict v = (*slots)[0].data() + offset;
    if (nesterov_) {
      for (int64_t i = 0; i < n; ++i) {
        const float g = grad[i];
        v[i] = mu * v[i] + g;
        out[i] = in[i] - lr * (g + mu * v[i]);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        v[i] = mu * v[i] + grad[i];
        out[i] = in[i] - lr * v[i];
      }
    }
  }

 private:
  const float momentum_;
  const bool nesterov_;
};

class AdagradOptimizer : public Optimizer {
 public:
  explicit AdagradOptimizer(const AdagradConfig& c)
      : initial_(c.initial_accumulator_value()), epsilon_(c.epsilon()) {}
  std::string name() const override { return "adagrad"; }
  std::vector<std::string> slot_names() const override { return {"accumulator"}; }
  void InitSlots(int64_t n, OptimizerSlots* slots) const override {
    slots->assign(1, std::vector<float>(n, initial_));
  }
  void ApplyRange(const float* in, float* out, const float* grad, int64_t n,
                  OptimizerSlots* slots, int64_t offset, const UpdateInfo& u) const override {
    const float lr = u.learning_rate, eps = epsilon_;
    float* __restrict acc = (*slots)[0].data() + offset;
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i];
      acc[i] += g * g;
      out[i] = in[i] - lr * g / (std::sqrt(acc[i]) + eps);
    }
  }

 private:
  const float initial_, epsilon_;
};

// Adam, and AdamW when weight_decay > 0 (decoupled: p *= 1 - lr * wd first,
// as PyTorch's AdamW).
class AdamOptimizer : public Optimizer {
 public:
  AdamOptimizer(std::string name, float beta1, float beta2, float epsilon, float weight_decay)
      : name_(std::move(name)),
        beta1_(beta1),
        beta2_(beta2),
        epsilon_(epsilon),
        weight_decay_(weight_decay) {}
  std::string name() const override { return name_; }
  std::vector<std::string> slot_names() const override { return {"m", "v"}; }
  void ApplyRange(const float* in, float* out, const float* grad, int64_t n,
                  OptimizerSlots* slots, int64_t offset, const UpdateInfo& u) const override {
    const double t = static_cast<double>(std::max<int64_t>(u.count, 1));
    // PyTorch's arrangement: p -= (lr / c1) * m / (sqrt(v) / sqrt(c2) + eps).
    const float step_size = static_cast<float>(u.learning_rate / (1.0 - std::pow(beta1_, t)));
    const float inv_sqrt_c2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(beta2_, t)));
    const float b1 = beta1_, b2 = beta2_, eps = epsilon_;
    const float one_b1 = 1.0f - b1, one_b2 = 1.0f - b2;
    const float decay = 1.0f - u.learning_rate * weight_decay_;
    float* __restrict m = (*slots)[0].data() + offset;
    float* __restrict v = (*slots)[1].data() + offset;
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i];
      m[i] = b1 * m[i] + one_b1 * g;
      v[i] = b2 * v[i] + one_b2 * (g * g);
      out[i] = in[i] * decay - step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_c2 + eps);
    }
  }

 private:
  const std::string name_;
  const double beta1_, beta2_;
  const float epsilon_, weight_decay_;
};

class FtrlOptimizer : public Optimizer {
 public:
  explicit FtrlOptimizer(const FtrlConfig& c)
      : initial_(c.initial_accumulator_value()), l1_(c.l1()), l2_(c.l2()), beta_(c.beta()) {}
  std::string name() const override { return "ftrl"; }
  std::vector<std::string> slot_names() const override { return {"z", "n"}; }
  void InitSlots(int64_t n, OptimizerSlots* slots) const override {
    slots->assign(2, std::vector<float>());
    (*slots)[0].assign(n, 0.0f);
    (*slots)[1].assign(n, initial_);
  }
  void ApplyRange(const float* in, float* out, const float* grad, int64_t n,
                  OptimizerSlots* slots, int64_t offset, const UpdateInfo& u) const override {
    const float inv_lr = 1.0f / u.learning_rate, l1 = l1_, two_l2 = 2.0f * l2_, beta = beta_;
    float* __restrict z = (*slots)[0].data() + offset;
    float* __restrict acc = (*slots)[1].data() + offset;
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i];
      const float n_old = acc[i];
      const float n_new = n_old + g * g;
      const float sqrt_new = std::sqrt(n_new);
      const float sigma = (sqrt_new - std::sqrt(n_old)) * inv_lr;
      const float zi = z[i] + g - sigma * in[i];
      z[i] = zi;
      acc[i] = n_new;
      const float quadratic = (beta + sqrt_new) * inv_lr + two_l2;
      // Both sides computed, then selected: the loop stays branch-free and
      // vectorises (quadratic > 0: the config keeps n or beta positive).
      const float w = (std::copysign(l1, zi) - zi) / quadratic;
      out[i] = std::fabs(zi) > l1 ? w : 0.0f;
    }
  }

 private:
  const float initial_, l1_, l2_, beta_;
};

}  // namespace

void Optimizer::InitSlots(int64_t n, OptimizerSlots* slots) const {
  slots->assign(slot_names().size(), std::vector<float>(n, 0.0f));
}

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerConfig& raw) {
  OptimizerConfig config = raw;  // defaults filled where left out
  // The schedule is not the optimizer's business; any max_steps passes.
  RETURN_IF_ERROR(ValidateAndFillOptimizerDefaults(
      &config, std::numeric_limits<int64_t>::max(), "(optimizer)"));
  switch (config.kind_case()) {
    case OptimizerConfig::kSgd:
    case OptimizerConfig::KIND_NOT_SET:
      return std::unique_ptr<Optimizer>(new SgdOptimizer());
    case OptimizerConfig::kMomentum:
      return std::unique_ptr<Optimizer>(new MomentumOptimizer(config.momentum()));
    case OptimizerConfig::kAdagrad:
      return std::unique_ptr<Optimizer>(new AdagradOptimizer(config.adagrad()));
    case OptimizerConfig::kAdam:
    case OptimizerConfig::kAdamw: {
      const bool w = config.has_adamw();
      const AdamConfig& c = w ? config.adamw() : config.adam();
      return std::unique_ptr<Optimizer>(new AdamOptimizer(
          w ? "adamw" : "adam", c.beta1(), c.beta2(), c.epsilon(), w ? c.weight_decay() : 0.0f));
    }
    case OptimizerConfig::kFtrl:
      return std::unique_ptr<Optimizer>(new FtrlOptimizer(config.ftrl()));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer: unsupported kind ", static_cast<int>(config.kind_case())));
}

absl::StatusOr<LearningRate> LearningRate::Create(const OptimizerConfig& raw,
                                                  int64_t global_batch, int64_t max_steps) {
  OptimizerConfig config = raw;  // checked, and defaults filled where left out
  RETURN_IF_ERROR(ValidateAndFillOptimizerDefaults(&config, max_steps, "(optimizer)"));
  LearningRate lr;
  lr.schedule_ = config.schedule();
  lr.base_ = config.learning_rate();
  if (config.base_batch_size() > 0) {
    if (global_batch <= 0) {
      return absl::InvalidArgumentError("optimizer: the linear scaling rule needs a global batch");
    }
    lr.base_ *= static_cast<double>(global_batch) / config.base_batch_size();
  }
  lr.decay_steps_ = lr.schedule_.decay_steps();
  if (lr.schedule_.kind() == LearningRateSchedule::COSINE && lr.decay_steps_ == 0) {
    lr.decay_steps_ = std::max<int64_t>(1, max_steps - lr.schedule_.warmup_steps());
  }
  return lr;
}

float LearningRate::At(int64_t t) const {
  t = std::max<int64_t>(t, 0);
  const int64_t warmup = schedule_.warmup_steps();
  if (t < warmup) {
    return static_cast<float>(base_ * static_cast<double>(t + 1) / static_cast<double>(warmup));
  }
  const int64_t after = t - warmup;
  switch (schedule_.kind()) {
    case LearningRateSchedule::STEP:
      return static_cast<float>(base_ * std::pow(static_cast<double>(schedule_.decay_rate()),
                                                 static_cast<double>(after / decay_steps_)));
    case LearningRateSchedule::COSINE: {
      const double progress =
          static_cast<double>(std::min(after, decay_steps_)) / static_cast<double>(decay_steps_);
      const double r = schedule_.min_learning_rate_ratio();
      return static_cast<float>(base_ * (r + (1.0 - r) * 0.5 * (1.0 + std::cos(M_PI * progress))));
    }
    default:
      return static_cast<float>(base_);
  }
}

void ClipByValue(float* g, int64_t n, float limit) {
  const float lo = -limit;
  for (int64_t i = 0; i < n; ++i) g[i] = std::min(std::max(g[i], lo), limit);
}

}  // namespace pstrain
