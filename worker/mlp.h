// A multi-layer perceptron classifier on the CPU: dense layers with ReLU
// between them and a softmax cross-entropy loss, forward and backward through
// OpenBLAS's sgemm. Parameters are float32 tensors in the order of
// Variables(): dense{i}/kernel [in, out] then dense{i}/bias [out]. The math is
// deterministic for a fixed BLAS thread count, so runs are reproducible.
// An Mlp keeps scratch buffers: one instance per thread.
#ifndef PSTRAIN_WORKER_MLP_H_
#define PSTRAIN_WORKER_MLP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/placement.h"
#include "common/tensor.h"
#include "proto/config.pb.h"

namespace pstrain {

struct EvalResult {
  double loss = 0;  // mean cross-entropy
  int64_t correct = 0;
  int64_t count = 0;
  double accuracy() const { return count > 0 ? static_cast<double>(correct) / count : 0; }
};

class Mlp {
 public:
  explicit Mlp(const MlpConfig& config);

  const std::vector<VariableSpec>& variables() const { return variables_; }
  int input_dim() const { return dims_.front(); }
  int num_classes() const { return dims_.back(); }

  // Deterministic initial values from `seed`: Glorot-uniform kernels, zero biases.
  std::vector<Tensor> Initialize(uint64_t seed) const;

  // Mean loss over the batch and its gradients (same order and shapes as the
  // parameters). `x` is [batch, input_dim] row-major; labels in [0, classes).
  absl::Status ComputeGradients(const std::vector<Tensor>& params, const float* x,
                                const int32_t* labels, int batch, std::vector<Tensor>* grads,
                                float* loss);

  // Loss and accuracy over `n` examples, in chunks.
  absl::Status Evaluate(const std::vector<Tensor>& params, const float* x, const int32_t* labels,
                        int64_t n, EvalResult* result);

 private:
  absl::Status CheckParams(const std::vector<Tensor>& params) const;
  // Fills activations_ for a batch; returns logits in activations_.back().
  void Forward(const std::vector<Tensor>& params, const float* x, int batch);

  std::vector<int> dims_;  // input, hidden..., classes
  std::vector<VariableSpec> variables_;
  // Scratch: activations_[l] is the input of layer l ([batch, dims_[l]]);
  // the last entry holds the logits.
  std::vector<std::vector<float>> activations_;
  std::vector<float> delta_, delta_prev_;
};

// Sets OpenBLAS's thread count (1 keeps the math reproducible and leaves
// cores to the other processes of a local cluster).
void SetBlasThreads(int threads);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_MLP_H_
