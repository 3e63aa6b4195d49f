// A model: the layers of a training config (common/cluster/config.h's
// ExpandModelConfig) on one backend, with every buffer it needs allocated
// once and reused across steps. Used by the worker to train and by the chief
// to evaluate.
//
// Parameters and gradients each live in one contiguous block, in the order
// of variables(). The host side of each block (pinned memory on CUDA; the
// block itself on the CPU, so no copy at all) is what the parameter-server
// client reads into and pushes from: a step is one copy of every parameter
// to the device, the passes, and one copy of every gradient back.
//
// To add a model: it is a config, not code. Write the layers in
// `model { sequential { ... } }`, or give a named shape (like `mlp`) a
// message in proto/config.proto and its expansion in ExpandModelConfig.
//
// An external model (model { external { variables: FILE } }, a PyTorch
// module's) is only its variables: no layers here, its initial values read
// from the file, its passes refused (the user's own workers compute them).
// The chief initialises, checkpoints and saves it like any other.
//
// A Model belongs to one thread at a time. The math is deterministic on the
// CPU for a fixed BLAS thread count.
#ifndef PSTRAIN_WORKER_MODEL_MODEL_H_
#define PSTRAIN_WORKER_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cluster/placement.h"
#include "common/base/tensor.h"
#include "proto/config.pb.h"
#include "worker/model/backend.h"
#include "worker/model/layers.h"

namespace pstrain {

struct EvalResult {
  double loss = 0;  // mean loss per example
  int64_t correct = 0;
  int64_t count = 0;
  // A model with one output (sigmoid cross-entropy, as click-through
  // models): each example's probability, for AUC and log loss.
  std::vector<float> scores;
  double accuracy() const { return count > 0 ? static_cast<double>(correct) / count : 0; }
};

// The variables of a model config, without building it (for placement); an
// external model's read from its file's header.
absl::StatusOr<std::vector<VariableSpec>> ModelVariables(const ModelConfig& config);

// The largest variables file an external model may name (64 GiB).
inline constexpr int64_t kMaxExternalVariablesBytes = int64_t{64} << 30;

// The model of `config`, placed on `num_ps` servers, against the message cap
// and this machine's memory (common/cluster/sizing.h), before anything is allocated
// for it; `process` ("the chief", "worker:1") names who would hold it.
absl::Status CheckConfiguredModelFits(const TrainingConfig& config, int num_ps,
                                      const std::string& process);

class Model {
 public:
  // `backend` must outlive the model.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const ModelConfig& config, Backend* backend);
  ~Model();

  Backend* backend() const { return backend_; }
  const std::vector<VariableSpec>& variables() const { return variables_; }
  // Defined outside pstrain (model.external): variables only.
  bool external() const { return loss_ == nullptr; }
  int input_dim() const { return input_dim_; }
  int output_dim() const { return external() ? 0 : loss_->classes(); }
  // Labels are integers in [0, num_labels()).
  int num_labels() const { return external() ? 0 : loss_->num_labels(); }
  // "784 -> dense0(128) -> relu0 -> dense1(10) -> softmax_cross_entropy; 101770 parameters".
  std::string Summary() const;

  // Deterministic initial values from `seed`: Glorot-uniform for matrices,
  // zeros for vectors; each variable has its own generator. An external
  // model's: its file's values (the seed unused).
  std::vector<Tensor> Initialize(uint64_t seed) const;

  // Host memory of variable v's parameters; write them, then Upload.
  float* host_parameters(size_t v) { return host_params_ + param_offsets_[v]; }
  // Every variable's host pointer, in variables() order.
  std::vector<float*> host_parameter_pointers();
  absl::Status UploadParameters();
  // Checks shapes, copies into the host block and uploads.
  absl::Status SetParameters(const std::vector<Tensor>& params);

  // Forward and backward on `batch` rows of x [batch, input_dim] (host
  // memory, pinned for speed on CUDA) with their labels. `seed` drives
  // dropout for this step. On return the batch-mean loss is in *loss and the
  // gradients are in host_gradients().
  absl::Status ComputeGradients(const float* x, const int32_t* labels, int batch, uint64_t seed,
                                float* loss);
  // ComputeGradients in its three parts, for benchmarks and for callers that
  // overlap copies with other work: StageBatch copies the batch to the device
  // (x and labels must stay valid until FinishStep: the CPU reads them in
  // place), ForwardBackward leaves the gradients on the device (with
  // set_gradients_ready it brings each layer's to the host and so returns
  // only once the backward pass has run), FinishStep brings the rest and the
  // loss back and waits.
  absl::Status StageBatch(const float* x, const int32_t* labels, int batch);
  // Called during ForwardBackward as soon as variables [first, end) have
  // their final gradients in host_gradients(), layer by layer from the last.
  // On a device each layer's gradients are copied to the host behind its
  // backward pass and handed over once that copy is done, while the layers
  // below still compute; FinishStep then copies only the rest. Lets a
  // worker push a layer while the layers below it are still computing.
  using GradientsReady = std::function<void(size_t first, size_t end)>;
  void set_gradients_ready(GradientsReady ready) { gradients_ready_ = std::move(ready); }
  absl::Status ForwardBackward(uint64_t seed);
  absl::Status FinishStep(float* loss);
  // When on, ForwardBackward also computes dL/dx of the staged input (for
  // what feeds the model, such as embedding bags) and FinishStep brings it to
  // host_input_gradient(), [batch, input_dim], valid until the next step.
  // `to_host` false leaves it on the device only (device_input_gradient(),
  // for DeviceEmbeddingBags::Backward); host_input_gradient() is then not kept.
  void set_input_gradient(bool on, bool to_host = true) {
    input_gradient_ = on;
    input_gradient_to_host_ = to_host;
  }
  const float* host_input_gradient() const;
  // When on, each training pass also keeps its batch's probabilities (a
  // one-output model's: the sigmoid of its logits, computed with the
  // parameters it trains from) in scores() after FinishStep, for
  // progressive validation (data.progressive_eval). A model of more
  // outputs fails the pass.
  void set_keep_scores(bool on) { keep_scores_ = on; }
  const std::vector<float>& scores() const { return scores_; }
  // [batch, input_dim] in the backend's memory, after ForwardBackward.
  const float* device_input_gradient() const { return input_grad_.data(); }
  // StageBatch for an input assembled in the backend's memory: `fill` gets
  // the model's input buffer ([batch, input_dim]) and enqueues what writes
  // it (DeviceEmbeddingBags::Forward); labels as for StageBatch.
  absl::Status StageBatchWith(const int32_t* labels, int batch,
                              const std::function<absl::Status(float* x)>& fill);

  const float* host_gradients(size_t v) const { return host_grads_ + param_offsets_[v]; }
  std::vector<const float*> host_gradient_pointers() const;
  // Scales the host gradients by min(1, max_norm / norm), norm being their
  // L2 norm over every variable (TensorFlow's clip_by_global_norm); returns
  // that norm. A non-finite norm leaves them as they are (the servers refuse
  // non-finite gradients).
  // `extra_squared`: the squared norm of gradients kept elsewhere that the
  // global norm covers too (embedding rows); the caller scales those by
  // the returned norm's factor, min(1, max_norm / norm), itself.
  double ClipGradientsByGlobalNorm(float max_norm, double extra_squared = 0);
  // Copies the gradients into tensors shaped like the variables.
  void CopyGradients(std::vector<Tensor>* grads) const;

  // Mean loss and accuracy over n examples (host memory), in chunks, with
  // dropout off. Uses the parameters last uploaded.
  absl::Status Evaluate(const float* x, const int32_t* labels, int64_t n, EvalResult* result);

 private:
  Model(Backend* backend, int input_dim) : backend_(backend), input_dim_(input_dim) {}
  static absl::StatusOr<std::unique_ptr<Model>> CreateExternal(const ExternalModelConfig& config,
                                                               Backend* backend);
  absl::Status Allocate();
  // FAILED_PRECONDITION for a pass of an external model.
  absl::Status CheckComputable() const;
  absl::Status EnsureRows(int rows);
  absl::Status CheckLabels(const int32_t* labels, int64_t n) const;
  // Runs every layer forward; the logits end in activations_.back().
  absl::Status Forward(const float* x_device, int rows, bool training, uint64_t seed);
  // StageBatch's and StageBatchWith's checks and buffers (no batch staged until they end).
  absl::Status BeginStage(const int32_t* labels, int batch);
  // The input and labels on the device (copied there unless host memory is device memory).
  absl::Status StageLabels(const int32_t* labels, int rows, const int32_t** labels_device);
  absl::Status Stage(const float* x, const int32_t* labels, int rows, const float** x_device,
                     const int32_t** labels_device);
  // The batch of the step in progress (StageBatch).
  int staged_rows_ = 0;
  const float* staged_x_ = nullptr;
  const int32_t* staged_labels_ = nullptr;

  Backend* const backend_;
  const int input_dim_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::pair<size_t, size_t>> layer_vars_;  // per layer: first variable, count
  GradientsReady gradients_ready_;
  // This step, on a device: per variable, whether its gradients were
  // handed over early (and so are on the host already); the layers whose
  // copies were marked, in the order of their marks.
  std::vector<char> downloaded_;
  std::vector<size_t> early_layers_;
  bool input_gradient_ = false;
  bool input_gradient_to_host_ = true;
  bool keep_scores_ = false;
  std::vector<float> scores_;
  DeviceArray<float> input_grad_, host_input_grad_;
  std::unique_ptr<LossLayer> loss_;
  std::vector<VariableSpec> variables_;
  std::vector<Tensor> external_values_;  // an external model's initial values
  std::vector<size_t> param_offsets_;  // per variable, in floats
  size_t param_count_ = 0;
  int max_width_ = 0;  // widest layer output

  // Parameters and gradients on the device, and their host sides.
  DeviceArray<float> params_, grads_, host_params_block_, host_grads_block_;
  float* host_params_ = nullptr;
  float* host_grads_ = nullptr;
  // Per-step buffers, sized for `rows_` rows.
  int rows_ = 0;
  std::vector<DeviceArray<float>> activations_;  // output of layer l
  DeviceArray<float> input_, delta_[2];
  DeviceArray<int32_t> labels_, predicted_;
  DeviceArray<double> row_loss_;
  std::vector<double> host_row_loss_;
  std::vector<int32_t> host_predicted_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_MODEL_MODEL_H_
