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
    RETURN_IF_ERROR(ctx.backend->Gemm(false, false, ctx.batch, d, d, 1.0f, xl, d, params_[2 * l],
                                      d, 1.0f, u, d));
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

DotLayer::DotLayer(std::string name, int input_dim, int dense_inputs, int dim,
                   std::vector<int> bottom_units)
    : Layer(std::move(name), input_dim,
            dim + ((input_dim - dense_inputs) / dim + 1) * ((input_dim - dense_inputs) / dim) / 2),
      dense_(dense_inputs),
      dim_(dim),
      vectors_((input_dim - dense_inputs) / dim + 1),
      units_(bottom_units.empty() ? std::vector<int>{dim} : std::move(bottom_units)) {
  int in = dense_;
  size_t at = 0, widest = static_cast<size_t>(dim_);
  auto take = [&at](size_t floats) {
    const size_t offset = at;
    at += floats;
    return offset;
  };
  for (size_t k = 0; k < units_.size(); ++k) {
    bottom_.push_back(std::make_unique<DenseLayer>(absl::StrCat(this->name(), "/bottom", k), in,
                                                   units_[k]));
    pre_.push_back(take(units_[k]));
    post_.push_back(take(units_[k]));
    widest = std::max(widest, static_cast<size_t>(units_[k]));
    in = units_[k];
  }
  dense_in_ = take(dense_);
  t_ = take(static_cast<size_t>(vectors_) * dim_);
  dt_ = take(static_cast<size_t>(vectors_) * dim_);
  dh_ = take(dim_);
  tmp_ = take(dim_);
  g_[0] = take(widest);
  g_[1] = take(widest);
  ddense_ = take(dense_);
  per_row_ = at;
}

std::vector<VariableSpec> DotLayer::Variables() const {
  std::vector<VariableSpec> v;
  for (const auto& layer : bottom_) {
    for (VariableSpec& s : layer->Variables()) v.push_back(std::move(s));
  }
  return v;
}

void DotLayer::BindBottom() {
  for (size_t k = 0; k < bottom_.size(); ++k) {
    bottom_[k]->Bind({params_[2 * k], params_[2 * k + 1]}, {grads_[2 * k], grads_[2 * k + 1]});
  }
}

absl::Status DotLayer::Forward(const PassContext& ctx, const float* x, float* y) {
  const int b = ctx.batch, width = input_dim(), out = output_dim();
  if (scratch_.data() == nullptr) scratch_ = DeviceArray<float>(ctx.backend);
  RETURN_IF_ERROR(scratch_.Reserve(per_row_ * static_cast<size_t>(b)));
  scratch_rows_ = b;
  BindBottom();
  // The bottom MLP over the dense columns, gathered first.
  RETURN_IF_ERROR(ctx.backend->CopyMatrix(x, width, At(ctx, dense_in_), dense_, b, dense_));
  const float* h = At(ctx, dense_in_);
  for (size_t k = 0; k < bottom_.size(); ++k) {
    RETURN_IF_ERROR(bottom_[k]->Forward(ctx, h, At(ctx, pre_[k])));
    RETURN_IF_ERROR(ctx.backend->Relu(At(ctx, pre_[k]), int64_t{b} * units_[k], At(ctx, post_[k])));
    h = At(ctx, post_[k]);
  }
  // The vectors: h, then the input's F vectors; y = [h | their dots].
  const int row = vectors_ * dim_;
  float* t = At(ctx, t_);
  RETURN_IF_ERROR(ctx.backend->CopyMatrix(h, dim_, t, row, b, dim_));
  RETURN_IF_ERROR(ctx.backend->CopyMatrix(x + dense_, width, t + dim_, row, b, row - dim_));
  RETURN_IF_ERROR(ctx.backend->CopyMatrix(h, dim_, y, out, b, dim_));
  return ctx.backend->PairwiseDots(t, b, vectors_, dim_, y + dim_, out);
}

absl::Status DotLayer::Backward(const PassContext& ctx, const float* x, const float* /*y*/,
                                const float* dy, float* dx) {
  const int b = ctx.batch, width = input_dim(), out = output_dim(), row = vectors_ * dim_;
  if (scratch_rows_ != b) {
    return absl::FailedPreconditionError("dot layer: backward without its forward pass");
  }
  BindBottom();
  float* dt = At(ctx, dt_);
  RETURN_IF_ERROR(
      ctx.backend->PairwiseDotsGrad(At(ctx, t_), dy + dim_, out, b, vectors_, dim_, dt));
  // dL/dh: its dots' part and its own columns of y.
  float* g = At(ctx, dh_);
  RETURN_IF_ERROR(ctx.backend->CopyMatrix(dt, row, g, dim_, b, dim_));
  RETURN_IF_ERROR(ctx.backend->CopyMatrix(dy, out, At(ctx, tmp_), dim_, b, dim_));
  RETURN_IF_ERROR(ctx.backend->Add(At(ctx, tmp_), int64_t{b} * dim_, g));
  for (size_t k = bottom_.size(); k-- > 0;) {
    float* dpre = At(ctx, g_[k % 2]);
    RETURN_IF_ERROR(ctx.backend->ReluGrad(At(ctx, post_[k]), g, int64_t{b} * units_[k], dpre));
    const float* in = k == 0 ? At(ctx, dense_in_) : At(ctx, post_[k - 1]);
    float* din = k == 0 ? (dx != nullptr ? At(ctx, ddense_) : nullptr) : At(ctx, g_[(k + 1) % 2]);
    RETURN_IF_ERROR(bottom_[k]->Backward(ctx, in, At(ctx, pre_[k]), dpre, din));
    g = din;
  }
  if (dx == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(ctx.backend->CopyMatrix(At(ctx, ddense_), dense_, dx, width, b, dense_));
  return ctx.backend->CopyMatrix(dt + dim_, row, dx + dense_, width, b, row - dim_);
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
