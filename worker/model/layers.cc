#include "worker/model/layers.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace pstrain {

std::vector<VariableSpec> DenseLayer::Variables() const {
  return {{absl::StrCat(name(), "/kernel"), {input_dim(), output_dim()}},
          {absl::StrCat(name(), "/bias"), {output_dim()}}};
}

absl::Status DenseLayer::Forward(const PassContext& ctx, const float* x, float* y) {
  const int in = input_dim(), out = output_dim();
  // y = broadcast(b), then y += x W: the bias is the GEMM's starting value.
  RETURN_IF_ERROR(ctx.backend->BroadcastRows(params_[1], ctx.batch, out, y));
  return ctx.backend->Gemm(false, false, ctx.batch, out, in, 1.0f, x, in, params_[0], out, 1.0f, y,
                           out);
}

absl::Status DenseLayer::Backward(const PassContext& ctx, const float* x, const float* /*y*/,
                                  const float* dy, float* dx) {
  const int in = input_dim(), out = output_dim();
  // dW[in, out] = x^T dy; db = column sums of dy; dx[batch, in] = dy W^T.
  RETURN_IF_ERROR(ctx.backend->Gemm(true, false, in, out, ctx.batch, 1.0f, x, in, dy, out, 0.0f,
                                    grads_[0], out));
  RETURN_IF_ERROR(ctx.backend->SumRows(dy, ctx.batch, out, grads_[1]));
  if (dx == nullptr) return absl::OkStatus();
  return ctx.backend->Gemm(false, true, ctx.batch, in, out, 1.0f, dy, out, params_[0], out, 0.0f,
                           dx, in);
}

std::vector<VariableSpec> CrossLayer::Variables() const {
  std::vector<VariableSpec> v;
  for (int l = 0; l < layers_; ++l) {
    v.push_back({absl::StrCat(name(), "/kernel", l), {input_dim(), input_dim()}});
    v.push_back({absl::StrCat(name(), "/bias", l), {input_dim()}});
  }
  return v;
}

absl::Status CrossLayer::Forward(const PassContext& ctx, const float* x, float* y) {
  const int d = input_dim();
  const int64_t n = static_cast<int64_t>(ctx.batch) * d;
  if (scratch_.data() == nullptr) scratch_ = DeviceArray<float>(ctx.backend);
  RETURN_IF_ERROR(scratch_.Reserve(static_cast<size_t>(n) * (2 * layers_ + 2)));
  scratch_rows_ = ctx.batch;
  for (int l = 0; l < layers_; ++l) {
    const float* xl = l == 0 ? x : Slice(ctx, layers_ + l - 1);
    float* u = Slice(ctx, l);
    float* out = l + 1 == layers_ ? y : Slice(ctx, layers_ + l);
    // u = b, then u += x_l W; out = x_l, then out += x0 * u.
    RETURN_IF_ERROR(ctx.backend->BroadcastRows(params_[2 * l + 1], ctx.batch, d, u));
    RETURN_IF_ERROR(
        ctx.backend->Gemm(false, false, ctx.batch, d, d, 1.0f, xl, d, params_[2 * l], d, 1.0f, u, d));
    RETURN_IF_ERROR(ctx.backend->CopyOnDevice(out, xl, static_cast<size_t>(n) * sizeof(float)));
    RETURN_IF_ERROR(ctx.backend->MultiplyAdd(x, u, n, out));
  }
  return absl::OkStatus();
}

absl::Status CrossLayer::Backward(const PassContext& ctx, const float* x, const float* /*y*/,
                                  const float* dy, float* dx) {
  const int d = input_dim();
  const int64_t n = static_cast<int64_t>(ctx.batch) * d;
  if (scratch_rows_ != ctx.batch) {
    return absl::FailedPreconditionError("cross layer: backward without its forward pass");
  }
  float* du = Slice(ctx, 2 * layers_ + 1);
  const float* g = dy;  // dL/dx_{l+1}
  for (int l = layers_ - 1; l >= 0; --l) {
    const float* xl = l == 0 ? x : Slice(ctx, layers_ + l - 1);
    const float* u = Slice(ctx, l);
    // du = g * x0; dL/dx0 gains g * u (gathered in dx); dW_l = x_l^T du;
    // db_l = column sums of du; dL/dx_l = g + du W_l^T.
    RETURN_IF_ERROR(ctx.backend->Multiply(g, x, n, du));
    if (dx != nullptr) {
      RETURN_IF_ERROR(l + 1 == layers_ ? ctx.backend->Multiply(g, u, n, dx)
                                       : ctx.backend->MultiplyAdd(g, u, n, dx));
    }
    RETURN_IF_ERROR(ctx.backend->Gemm(true, false, d, d, ctx.batch, 1.0f, xl, d, du, d, 0.0f,
                                      grads_[2 * l], d));
    RETURN_IF_ERROR(ctx.backend->SumRows(du, ctx.batch, d, grads_[2 * l + 1]));
    // x_0 is x0 itself: its path's gradient joins dx.
    float* next = l > 0 ? Slice(ctx, 2 * layers_ - 1 + (l % 2)) : dx;
    if (next == nullptr) break;
    if (l > 0) {
      RETURN_IF_ERROR(ctx.backend->CopyOnDevice(next, g, static_cast<size_t>(n) * sizeof(float)));
    } else {
      RETURN_IF_ERROR(ctx.backend->Add(g, n, next));
    }
    RETURN_IF_ERROR(ctx.backend->Gemm(false, true, ctx.batch, d, d, 1.0f, du, d, params_[2 * l], d,
                                      1.0f, next, d));
    g = next;
  }
  return absl::OkStatus();
}

absl::Status ReluLayer::Forward(const PassContext& ctx, const float* x, float* y) {
  return ctx.backend->Relu(x, static_cast<int64_t>(ctx.batch) * input_dim(), y);
}

absl::Status ReluLayer::Backward(const PassContext& ctx, const float* /*x*/, const float* y,
                                 const float* dy, float* dx) {
  if (dx == nullptr) return absl::OkStatus();
  return ctx.backend->ReluGrad(y, dy, static_cast<int64_t>(ctx.batch) * input_dim(), dx);
}

absl::Status GeluLayer::Forward(const PassContext& ctx, const float* x, float* y) {
  return ctx.backend->Gelu(x, static_cast<int64_t>(ctx.batch) * input_dim(), y);
}

absl::Status GeluLayer::Backward(const PassContext& ctx, const float* x, const float* /*y*/,
                                 const float* dy, float* dx) {
  if (dx == nullptr) return absl::OkStatus();
  return ctx.backend->GeluGrad(x, dy, static_cast<int64_t>(ctx.batch) * input_dim(), dx);
}

absl::Status DropoutLayer::Forward(const PassContext& ctx, const float* x, float* y) {
  const int64_t n = static_cast<int64_t>(ctx.batch) * input_dim();
  if (!ctx.training || rate_ == 0.0f) {
    return ctx.backend->CopyOnDevice(y, x, static_cast<size_t>(n) * sizeof(float));
  }
  return ctx.backend->Dropout(x, n, rate_, ctx.seed, y);
}

absl::Status DropoutLayer::Backward(const PassContext& ctx, const float* /*x*/, const float* /*y*/,
                                    const float* dy, float* dx) {
  if (dx == nullptr) return absl::OkStatus();
  const int64_t n = static_cast<int64_t>(ctx.batch) * input_dim();
  if (!ctx.training || rate_ == 0.0f) {
    return ctx.backend->CopyOnDevice(dx, dy, static_cast<size_t>(n) * sizeof(float));
  }
  return ctx.backend->DropoutGrad(dy, n, rate_, ctx.seed, dx);
}

const char* LossLayer::name() const {
  return kind_ == Kind::kSoftmaxCrossEntropy ? "softmax_cross_entropy" : "sigmoid_cross_entropy";
}

absl::Status LossLayer::Compute(Backend* backend, const float* logits, const int32_t* labels,
                                int rows, float divisor, float* dlogits, double* row_loss,
                                int32_t* predicted) const {
  if (kind_ == Kind::kSoftmaxCrossEntropy) {
    return backend->SoftmaxCrossEntropy(logits, labels, rows, classes_, divisor, dlogits, row_loss,
                                        predicted);
  }
  return backend->SigmoidCrossEntropy(logits, labels, rows, classes_, divisor, dlogits, row_loss,
                                      predicted);
}

}  // namespace pstrain
