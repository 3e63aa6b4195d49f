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
