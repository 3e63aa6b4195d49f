// The layers a model is built from, each with its forward and backward pass
// written once against Backend (backend.h), so it runs on the CPU and on CUDA
// alike. A layer keeps no activations of its own: the model owns every
// buffer (allocated once, reused each step) and hands the layer its input,
// output and gradients. Parameters live in the model's contiguous parameter
// block; Bind() points a layer at its slices.
//
// To add a layer: a LayerConfig case in proto/config.proto, a subclass here
// with Forward/Backward (new math goes into cpu_ops and cuda_ops as twins),
// its validation in common/cluster/config.cc, and a case in BuildLayers (model.cc);
// layers_test.cc's finite-difference check then covers it.
// Layers are used by one thread at a time.
#ifndef PSTRAIN_WORKER_MODEL_LAYERS_H_
#define PSTRAIN_WORKER_MODEL_LAYERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/cluster/placement.h"
#include "worker/model/backend.h"

namespace pstrain {

// What a pass needs beyond its tensors.
struct PassContext {
  Backend* backend = nullptr;
  int batch = 0;         // rows of this pass
  bool training = true;  // false: dropout is the identity
  uint64_t seed = 0;     // this layer's random stream for this step (dropout)
};

class Layer {
 public:
  Layer(std::string name, int input_dim, int output_dim)
      : name_(std::move(name)), input_dim_(input_dim), output_dim_(output_dim) {}
  virtual ~Layer() = default;

  const std::string& name() const { return name_; }
  int input_dim() const { return input_dim_; }
  int output_dim() const { return output_dim_; }

  // The variables this layer owns ("dense0/kernel" [in, out], "dense0/bias" [out]).
  virtual std::vector<VariableSpec> Variables() const { return {}; }
  // Device pointers to this layer's parameters and gradients, in Variables() order.
  void Bind(std::vector<const float*> params, std::vector<float*> grads) {
    params_ = std::move(params);
    grads_ = std::move(grads);
  }

  // y[batch, output_dim] from x[batch, input_dim].
  virtual absl::Status Forward(const PassContext& ctx, const float* x, float* y) = 0;
  // Given x, y of the forward pass and dy = dL/dy: writes the parameter
  // gradients (overwriting them) and, unless dx is null, dx = dL/dx.
  virtual absl::Status Backward(const PassContext& ctx, const float* x, const float* y,
                                const float* dy, float* dx) = 0;

 protected:
  std::vector<const float*> params_;
  std::vector<float*> grads_;

 private:
  const std::string name_;
  const int input_dim_;
  const int output_dim_;
};

// y = x W + b: W [in, out], b [out].
class DenseLayer : public Layer {
 public:
  DenseLayer(std::string name, int input_dim, int units)
      : Layer(std::move(name), input_dim, units) {}
  std::vector<VariableSpec> Variables() const override;
  absl::Status Forward(const PassContext& ctx, const float* x, float* y) override;
  absl::Status Backward(const PassContext& ctx, const float* x, const float* y, const float* dy,
                        float* dx) override;
};

class ReluLayer : public Layer {
 public:
  ReluLayer(std::string name, int dim) : Layer(std::move(name), dim, dim) {}
  absl::Status Forward(const PassContext& ctx, const float* x, float* y) override;
  absl::Status Backward(const PassContext& ctx, const float* x, const float* y, const float* dy,
                        float* dx) override;
};

class GeluLayer : public Layer {
 public:
  GeluLayer(std::string name, int dim) : Layer(std::move(name), dim, dim) {}
  absl::Status Forward(const PassContext& ctx, const float* x, float* y) override;
  absl::Status Backward(const PassContext& ctx, const float* x, const float* y, const float* dy,
                        float* dx) override;
};

// DCN-v2's cross network (CrossConfig): `layers` cross layers at the width
// of its input x0, x_{l+1} = x0 * (x_l W_l + b_l) + x_l. Unlike the other
// layers it keeps activations of its own (each layer's x_l W_l + b_l and
// the inner x_l, in one buffer of the backend's memory that grows to the
// largest batch), since its passes span several products; its backward
// pass uses the last forward's. The backend of its passes must outlive it.
class CrossLayer : public Layer {
 public:
  CrossLayer(std::string name, int dim, int layers)
      : Layer(std::move(name), dim, dim), layers_(layers) {}
  std::vector<VariableSpec> Variables() const override;
  absl::Status Forward(const PassContext& ctx, const float* x, float* y) override;
  absl::Status Backward(const PassContext& ctx, const float* x, const float* y, const float* dy,
                        float* dx) override;

 private:
  // [batch, dim] slices of scratch_: u_l = x_l W_l + b_l (l < layers_),
  // then x_l (0 < l < layers_), then two gradients and du.
  float* Slice(const PassContext& ctx, int index) const {
    return scratch_.data() + static_cast<size_t>(index) * ctx.batch * input_dim();
  }
  const int layers_;
  DeviceArray<float> scratch_;
  int scratch_rows_ = 0;  // the batch scratch_ was laid out for
};

// DLRM's bottom MLP and dot interaction (DotConfig) over an input of
// `dense_inputs` numbers and F vectors of `dim`: the numbers through dense +
// ReLU layers to a vector h of dim, then y = [h | the dot products of every
// pair of (h, v_1, ..., v_F)]. Like CrossLayer it keeps its activations in
// a buffer of its own; the backend of its passes must outlive it.
class DotLayer : public Layer {
 public:
  DotLayer(std::string name, int input_dim, int dense_inputs, int dim,
           std::vector<int> bottom_units);
  std::vector<VariableSpec> Variables() const override;
  absl::Status Forward(const PassContext& ctx, const float* x, float* y) override;
  absl::Status Backward(const PassContext& ctx, const float* x, const float* y, const float* dy,
                        float* dx) override;

 private:
  void BindBottom();
  const int dense_, dim_, vectors_;
  const std::vector<int> units_;
  std::vector<std::unique_ptr<DenseLayer>> bottom_;
  // Per bottom layer its dense output and its ReLU's, then the dense
  // inputs, the vectors [batch, vectors, dim], and the backward pass's
  // buffers: offsets in floats per row of the batch.
  std::vector<size_t> pre_, post_;
  size_t dense_in_ = 0, t_ = 0, dt_ = 0, dh_ = 0, tmp_ = 0, g_[2] = {0, 0}, ddense_ = 0;
  size_t per_row_ = 0;
  DeviceArray<float> scratch_;
  int scratch_rows_ = 0;
  float* At(const PassContext& ctx, size_t offset) const {
    return scratch_.data() + offset * static_cast<size_t>(ctx.batch);
  }
};

// Inverted dropout: in training each element is kept with probability
// 1 - rate and scaled by 1 / (1 - rate); the mask is a pure function of
// (ctx.seed, element index), so runs with the same seed are reproducible.
class DropoutLayer : public Layer {
 public:
  DropoutLayer(std::string name, int dim, float rate)
      : Layer(std::move(name), dim, dim), rate_(rate) {}
  absl::Status Forward(const PassContext& ctx, const float* x, float* y) override;
  absl::Status Backward(const PassContext& ctx, const float* x, const float* y, const float* dy,
                        float* dx) override;

 private:
  const float rate_;
};

// The loss at the top of a model: per-row losses (double), predictions and
// dL/dlogits for the mean over `divisor` rows.
class LossLayer {
 public:
  enum class Kind { kSoftmaxCrossEntropy, kSigmoidCrossEntropy };
  LossLayer(Kind kind, int classes) : kind_(kind), classes_(classes) {}

  Kind kind() const { return kind_; }
  const char* name() const;
  int classes() const { return classes_; }
  // Labels accepted: [0, classes) for softmax and for sigmoid with several
  // units (one-hot targets); 0 or 1 for sigmoid with one unit.
  int num_labels() const { return classes_ == 1 ? 2 : classes_; }

  // Any of dlogits, row_loss, predicted may be null.
  absl::Status Compute(Backend* backend, const float* logits, const int32_t* labels, int rows,
                       float divisor, float* dlogits, double* row_loss, int32_t* predicted) const;

 private:
  const Kind kind_;
  const int classes_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_MODEL_LAYERS_H_
