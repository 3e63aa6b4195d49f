#include "ps_server/optimizer.h"

#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

class SgdOptimizer : public Optimizer {
 public:
  explicit SgdOptimizer(float learning_rate) : learning_rate_(learning_rate) {}
  std::string name() const override { return "sgd"; }
  std::vector<std::string> slot_names() const override { return {}; }
  void ApplyRange(const float* in, float* out, const float* grad, int64_t n,
                  OptimizerSlots* slots, int64_t offset, int64_t step) const override {
    const float lr = learning_rate_;
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

 private:
  const float learning_rate_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerConfig& config) {
  if (!(config.learning_rate() > 0.0f)) {
    return absl::InvalidArgumentError("optimizer: learning_rate must be positive");
  }
  switch (config.kind_case()) {
    case OptimizerConfig::kSgd:
    case OptimizerConfig::KIND_NOT_SET:
      return std::unique_ptr<Optimizer>(new SgdOptimizer(config.learning_rate()));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer: unsupported kind ", static_cast<int>(config.kind_case())));
}

}  // namespace pstrain
