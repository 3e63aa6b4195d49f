#include "worker/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/cluster/config.h"
#include "common/cluster/sizing.h"
#include "common/base/status_macros.h"
#include "common/storage/env.h"
#include "common/storage/safetensors_reader.h"
#include "worker/model/cpu_ops.h"

namespace pstrain {
namespace {

// Prefixes a failure with the layer and pass it happened in.
absl::Status InLayer(absl::Status st, const std::string& layer, const char* pass) {
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat("layer ", layer, " (", pass, "): ", st.message()));
}

// A one-output model's logits, in place, as the sigmoid's probabilities.
void ToProbabilities(std::vector<float>* logits) {
  for (float& s : *logits) s = 1.0f / (1.0f + std::exp(-s));
}

// A per-layer stream for dropout, from (step seed, layer index).
uint64_t LayerSeed(uint64_t seed, size_t layer) {
  return cpu::Mix64(seed ^ (0xD1B54A32D192ED03ULL * (layer + 1)));
}

struct Built {
  int input_dim = 0;
  std::vector<std::unique_ptr<Layer>> layers;
  std::unique_ptr<LossLayer> loss;
};

// Layers named by kind and a per-kind count: dense0, relu0, dense1, ... so
// the variable names of the classic MLP (dense{i}/kernel, dense{i}/bias) stay.
absl::StatusOr<Built> BuildLayers(const ModelConfig& config) {
  ASSIGN_OR_RETURN(SequentialConfig seq, ExpandModelConfig(config));
  Built b;
  b.input_dim = seq.input_dim();
  int width = seq.input_dim();
  int dense = 0, relu = 0, gelu = 0, dropout = 0, cross = 0, dot = 0;
  for (const LayerConfig& l : seq.layer()) {
    switch (l.layer_case()) {
      case LayerConfig::kDense:
        b.layers.push_back(
            std::make_unique<DenseLayer>(absl::StrCat("dense", dense++), width, l.dense().units()));
        width = l.dense().units();
        break;
      case LayerConfig::kRelu:
        b.layers.push_back(std::make_unique<ReluLayer>(absl::StrCat("relu", relu++), width));
        break;
      case LayerConfig::kGelu:
        b.layers.push_back(std::make_unique<GeluLayer>(absl::StrCat("gelu", gelu++), width));
        break;
      case LayerConfig::kCross:
        b.layers.push_back(std::make_unique<CrossLayer>(absl::StrCat("cross", cross++), width,
                                                        std::max(1, l.cross().layers())));
        break;
      case LayerConfig::kDot:
        b.layers.push_back(std::make_unique<DotLayer>(
            absl::StrCat("dot", dot++), width, l.dot().dense_inputs(), l.dot().dim(),
            std::vector<int>(l.dot().bottom_units().begin(), l.dot().bottom_units().end())));
        width = b.layers.back()->output_dim();
        break;
      case LayerConfig::kDropout:
        b.layers.push_back(std::make_unique<DropoutLayer>(absl::StrCat("dropout", dropout++), width,
                                                          l.dropout().rate()));
        break;
      case LayerConfig::kSoftmaxCrossEntropy:
        b.loss = std::make_unique<LossLayer>(LossLayer::Kind::kSoftmaxCrossEntropy, width);
        break;
      case LayerConfig::kSigmoidCrossEntropy:
        b.loss = std::make_unique<LossLayer>(LossLayer::Kind::kSigmoidCrossEntropy, width);
        break;
      default:
        return absl::InvalidArgumentError("unknown layer");  // ExpandModelConfig refuses these
    }
  }
  return b;
}

}  // namespace

absl::Status CheckConfiguredModelFits(const TrainingConfig& config, int num_ps,
                                      const std::string& process) {
  ASSIGN_OR_RETURN(std::vector<VariableSpec> specs, ModelVariables(config.model()));
  ASSIGN_OR_RETURN(Placement placement,
                   Placement::Compute(specs, num_ps, config.placement().partition_min_bytes(),
                                      config.placement().partition_max_bytes()));
  return CheckModelFits(specs, placement, process);
}

absl::StatusOr<std::vector<VariableSpec>> ModelVariables(const ModelConfig& config) {
  if (config.has_external()) {
    ASSIGN_OR_RETURN(SafetensorsIndex index,
                     ReadSafetensorsIndex(Env::Default(), config.external().variables(),
                                          kMaxExternalVariablesBytes));
    std::vector<VariableSpec> vars;
    for (SafetensorsEntry& e : index.entries) {
      vars.push_back(VariableSpec{std::move(e.name), std::move(e.shape)});
    }
    return vars;
  }
  ASSIGN_OR_RETURN(Built b, BuildLayers(config));
  std::vector<VariableSpec> vars;
  for (const auto& layer : b.layers) {
    for (VariableSpec& v : layer->Variables()) vars.push_back(std::move(v));
  }
  return vars;
}

absl::StatusOr<std::unique_ptr<Model>> Model::CreateExternal(const ExternalModelConfig& config,
                                                              Backend* backend) {
  std::unique_ptr<Model> m(new Model(backend, /*input_dim=*/0));
  std::vector<std::string> names;
  ASSIGN_OR_RETURN(m->external_values_, ReadSafetensors(Env::Default(), config.variables(),
                                                        kMaxExternalVariablesBytes, &names));
  for (size_t v = 0; v < names.size(); ++v) {
    m->param_offsets_.push_back(m->param_count_);
    m->param_count_ += static_cast<size_t>(m->external_values_[v].num_elements());
    m->variables_.push_back(VariableSpec{names[v], m->external_values_[v].shape()});
  }
  RETURN_IF_ERROR(m->Allocate());
  return m;
}

absl::Status Model::CheckComputable() const {
  if (!external()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "an external model (model.external) has no layers here: its own framework's workers "
      "compute it (pstrain launch --worker_cmd, docs/pytorch.md)");
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelConfig& config, Backend* backend) {
  if (config.has_external()) return CreateExternal(config.external(), backend);
  ASSIGN_OR_RETURN(Built b, BuildLayers(config));
  std::unique_ptr<Model> m(new Model(backend, b.input_dim));
  m->layers_ = std::move(b.layers);
  m->loss_ = std::move(b.loss);
  RETURN_IF_ERROR(m->Allocate());
  return m;
}

Model::~Model() = default;

absl::Status Model::Allocate() {
  std::vector<std::pair<size_t, size_t>>& layer_vars = layer_vars_;
  layer_vars.clear();
  for (const auto& layer : layers_) {
    layer_vars.emplace_back(variables_.size(), 0);
    for (VariableSpec& v : layer->Variables()) {
      param_offsets_.push_back(param_count_);
      param_count_ += static_cast<size_t>(v.num_elements());
      variables_.push_back(std::move(v));
      ++layer_vars.back().second;
    }
    max_width_ = std::max(max_width_, layer->output_dim());
  }
  params_ = DeviceArray<float>(backend_);
  grads_ = DeviceArray<float>(backend_);
  RETURN_IF_ERROR(params_.Reserve(param_count_));
  RETURN_IF_ERROR(grads_.Reserve(param_count_));
  if (backend_->host_memory()) {
    host_params_ = params_.data();
    host_grads_ = grads_.data();
  } else {
    host_params_block_ = DeviceArray<float>(backend_, /*host=*/true);
    host_grads_block_ = DeviceArray<float>(backend_, /*host=*/true);
    RETURN_IF_ERROR(host_params_block_.Reserve(param_count_));
    RETURN_IF_ERROR(host_grads_block_.Reserve(param_count_));
    host_params_ = host_params_block_.data();
    host_grads_ = host_grads_block_.data();
  }
  std::fill(host_params_, host_params_ + param_count_, 0.0f);
  downloaded_.assign(variables_.size(), 0);
  early_layers_.reserve(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    std::vector<const float*> p;
    std::vector<float*> g;
    for (size_t v = layer_vars[l].first; v < layer_vars[l].first + layer_vars[l].second; ++v) {
      p.push_back(params_.data() + param_offsets_[v]);
      g.push_back(grads_.data() + param_offsets_[v]);
    }
    layers_[l]->Bind(std::move(p), std::move(g));
  }
  activations_.clear();
  for (size_t l = 0; l < layers_.size(); ++l) activations_.emplace_back(backend_);
  input_ = DeviceArray<float>(backend_);
  input_grad_ = DeviceArray<float>(backend_);
  host_input_grad_ = DeviceArray<float>(backend_, /*host=*/true);
  delta_[0] = DeviceArray<float>(backend_);
  delta_[1] = DeviceArray<float>(backend_);
  labels_ = DeviceArray<int32_t>(backend_);
  predicted_ = DeviceArray<int32_t>(backend_);
  row_loss_ = DeviceArray<double>(backend_);
  return absl::OkStatus();
}

absl::Status Model::EnsureRows(int rows) {
  if (rows <= rows_) return absl::OkStatus();
  const size_t r = static_cast<size_t>(rows);
  for (size_t l = 0; l < layers_.size(); ++l) {
    RETURN_IF_ERROR(activations_[l].Reserve(r * layers_[l]->output_dim()));
  }
  if (!backend_->host_memory()) {
    RETURN_IF_ERROR(input_.Reserve(r * input_dim_));
    RETURN_IF_ERROR(labels_.Reserve(r));
  }
  RETURN_IF_ERROR(delta_[0].Reserve(r * max_width_));
  RETURN_IF_ERROR(delta_[1].Reserve(r * max_width_));
  RETURN_IF_ERROR(predicted_.Reserve(r));
  RETURN_IF_ERROR(row_loss_.Reserve(r));
  host_row_loss_.resize(r);
  host_predicted_.resize(r);
  rows_ = rows;
  return absl::OkStatus();
}

std::string Model::Summary() const {
  std::string s = absl::StrCat(input_dim_);
  for (const auto& layer : layers_) {
    absl::StrAppend(&s, " -> ", layer->name());
    if (!layer->Variables().empty()) absl::StrAppend(&s, "(", layer->output_dim(), ")");
  }
  if (external()) {
    return absl::StrCat("external (", variables_.size(), " variables from a file; its layers in "
                        "the workers' own framework); ", param_count_, " parameters");
  }
  absl::StrAppend(&s, " -> ", loss_->name(), "; ", param_count_, " parameters");
  return s;
}

std::vector<Tensor> Model::Initialize(uint64_t seed) const {
  if (external()) return external_values_;
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

std::vector<float*> Model::host_parameter_pointers() {
  std::vector<float*> p;
  for (size_t v = 0; v < variables_.size(); ++v) p.push_back(host_parameters(v));
  return p;
}

std::vector<const float*> Model::host_gradient_pointers() const {
  std::vector<const float*> p;
  for (size_t v = 0; v < variables_.size(); ++v) p.push_back(host_gradients(v));
  return p;
}

absl::Status Model::UploadParameters() {
  if (backend_->host_memory()) return absl::OkStatus();
  return InLayer(backend_->CopyToDevice(params_.data(), host_params_, param_count_ * sizeof(float)),
                 "parameters", "upload");
}

absl::Status Model::SetParameters(const std::vector<Tensor>& params) {
  if (params.size() != variables_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the model has ", variables_.size(),
                                                   " variables, got ", params.size(), " tensors"));
  }
  for (size_t v = 0; v < params.size(); ++v) {
    if (params[v].shape() != variables_[v].shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(variables_[v].name, " has shape ", params[v].ShapeString()));
    }
  }
  for (size_t v = 0; v < params.size(); ++v) {
    std::memcpy(host_parameters(v), params[v].data(), params[v].num_elements() * sizeof(float));
  }
  return UploadParameters();
}

const float* Model::host_input_gradient() const {
  return backend_->host_memory() ? input_grad_.data() : host_input_grad_.data();
}

double Model::ClipGradientsByGlobalNorm(float max_norm, double extra_squared) {
  double sum = extra_squared;
  for (size_t i = 0; i < param_count_; ++i) {
    const double g = host_grads_[i];
    sum += g * g;
  }
  const double norm = std::sqrt(sum);
  if (std::isfinite(norm) && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / norm);
    for (size_t i = 0; i < param_count_; ++i) host_grads_[i] *= scale;
  }
  return norm;
}

void Model::CopyGradients(std::vector<Tensor>* grads) const {
  grads->resize(variables_.size());
  for (size_t v = 0; v < variables_.size(); ++v) {
    Tensor& g = (*grads)[v];
    if (g.shape() != variables_[v].shape) g = Tensor(variables_[v].shape);
    std::memcpy(g.data(), host_gradients(v), g.num_elements() * sizeof(float));
  }
}

absl::Status Model::CheckLabels(const int32_t* labels, int64_t n) const {
  const int limit = num_labels();
  for (int64_t r = 0; r < n; ++r) {
    if (labels[r] < 0 || labels[r] >= limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", labels[r], " of example ", r, " is not in [0, ", limit, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Model::Stage(const float* x, const int32_t* labels, int rows, const float** x_device,
                          const int32_t** labels_device) {
  RETURN_IF_ERROR(StageLabels(labels, rows, labels_device));
  if (backend_->host_memory()) {
    *x_device = x;
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(
      InLayer(backend_->CopyToDevice(input_.data(), x,
                                     static_cast<size_t>(rows) * input_dim_ * sizeof(float)),
              "input", "upload"));
  *x_device = input_.data();
  return absl::OkStatus();
}

absl::Status Model::StageLabels(const int32_t* labels, int rows, const int32_t** labels_device) {
  if (backend_->host_memory()) {
    *labels_device = labels;
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(InLayer(
      backend_->CopyToDevice(labels_.data(), labels, static_cast<size_t>(rows) * sizeof(int32_t)),
      "labels", "upload"));
  *labels_device = labels_.data();
  return absl::OkStatus();
}

absl::Status Model::Forward(const float* x_device, int rows, bool training, uint64_t seed) {
  const float* in = x_device;
  for (size_t l = 0; l < layers_.size(); ++l) {
    PassContext ctx{backend_, rows, training, LayerSeed(seed, l)};
    RETURN_IF_ERROR(InLayer(layers_[l]->Forward(ctx, in, activations_[l].data()),
                            layers_[l]->name(), "forward"));
    in = activations_[l].data();
  }
  return absl::OkStatus();
}

absl::Status Model::ComputeGradients(const float* x, const int32_t* labels, int batch,
                                     uint64_t seed, float* loss) {
  RETURN_IF_ERROR(StageBatch(x, labels, batch));
  RETURN_IF_ERROR(ForwardBackward(seed));
  return FinishStep(loss);
}

absl::Status Model::BeginStage(const int32_t* labels, int batch) {
  staged_rows_ = 0;
  RETURN_IF_ERROR(CheckComputable());
  if (batch <= 0) return absl::InvalidArgumentError("empty batch");
  RETURN_IF_ERROR(CheckLabels(labels, batch));
  return EnsureRows(batch);
}

absl::Status Model::StageBatch(const float* x, const int32_t* labels, int batch) {
  RETURN_IF_ERROR(BeginStage(labels, batch));
  RETURN_IF_ERROR(Stage(x, labels, batch, &staged_x_, &staged_labels_));
  staged_rows_ = batch;
  return absl::OkStatus();
}

absl::Status Model::StageBatchWith(const int32_t* labels, int batch,
                                   const std::function<absl::Status(float* x)>& fill) {
  RETURN_IF_ERROR(BeginStage(labels, batch));
  // (On the CPU the input is otherwise read in place, so EnsureRows keeps none.)
  RETURN_IF_ERROR(input_.Reserve(static_cast<size_t>(batch) * input_dim_));
  RETURN_IF_ERROR(InLayer(fill(input_.data()), "input", "assemble"));
  RETURN_IF_ERROR(StageLabels(labels, batch, &staged_labels_));
  staged_x_ = input_.data();
  staged_rows_ = batch;
  return absl::OkStatus();
}

absl::Status Model::ForwardBackward(uint64_t seed) {
  const int batch = staged_rows_;
  if (batch <= 0) return absl::FailedPreconditionError("ForwardBackward without a staged batch");
  RETURN_IF_ERROR(Forward(staged_x_, batch, /*training=*/true, seed));
  if (keep_scores_) {
    if (output_dim() != 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "scores are kept for a model of one output; this one has ",
          output_dim()));
    }
    scores_.resize(static_cast<size_t>(batch));
    RETURN_IF_ERROR(InLayer(backend_->CopyToHost(scores_.data(), activations_.back().data(),
                                                 scores_.size() * sizeof(float)),
                            "scores", "download"));
  }
  // dL/dlogits for the batch mean goes to delta_[0]; the layers then pass
  // the gradient down, alternating between the two delta buffers.
  int cur = 0;
  RETURN_IF_ERROR(InLayer(
      loss_->Compute(backend_, activations_.back().data(), staged_labels_, batch,
                     static_cast<float>(batch), delta_[cur].data(), row_loss_.data(), nullptr),
      loss_->name(), "forward"));
  // On a device, a layer whose gradients are wanted early has them copied
  // to the host right behind its backward pass, with a mark after the copy;
  // the layers below keep computing while the host waits for each mark in
  // turn and hands the layer over.
  const bool early_device = gradients_ready_ && !backend_->host_memory();
  std::fill(downloaded_.begin(), downloaded_.end(), 0);
  early_layers_.clear();
  for (size_t l = layers_.size(); l-- > 0;) {
    PassContext ctx{backend_, batch, /*training=*/true, LayerSeed(seed, l)};
    const float* layer_in = l == 0 ? staged_x_ : activations_[l - 1].data();
    float* dx = delta_[1 - cur].data();
    if (l == 0) {
      dx = nullptr;
      if (input_gradient_) {
        RETURN_IF_ERROR(input_grad_.Reserve(static_cast<size_t>(batch) * input_dim_));
        dx = input_grad_.data();
      }
    }
    RETURN_IF_ERROR(
        InLayer(layers_[l]->Backward(ctx, layer_in, activations_[l].data(), delta_[cur].data(), dx),
                layers_[l]->name(), "backward"));
    cur = 1 - cur;
    const auto [first, count] = layer_vars_[l];
    if (!gradients_ready_ || count == 0) continue;
    if (!early_device) {
      gradients_ready_(first, first + count);
      continue;
    }
    const size_t begin = param_offsets_[first];
    const size_t end =
        first + count < param_offsets_.size() ? param_offsets_[first + count] : param_count_;
    RETURN_IF_ERROR(InLayer(backend_->CopyToHost(host_grads_ + begin, grads_.data() + begin,
                                                 (end - begin) * sizeof(float)),
                            layers_[l]->name(), "gradient download"));
    RETURN_IF_ERROR(InLayer(backend_->RecordEvent(static_cast<int>(early_layers_.size())),
                            layers_[l]->name(), "gradient download"));
    early_layers_.push_back(l);
  }
  for (size_t k = 0; k < early_layers_.size(); ++k) {
    const size_t l = early_layers_[k];
    RETURN_IF_ERROR(
        InLayer(backend_->WaitEvent(static_cast<int>(k)), layers_[l]->name(), "gradient download"));
    const auto [first, count] = layer_vars_[l];
    std::fill(downloaded_.begin() + first, downloaded_.begin() + first + count, 1);
    gradients_ready_(first, first + count);
  }
  return absl::OkStatus();
}

absl::Status Model::FinishStep(float* loss) {
  const int batch = staged_rows_;
  if (batch <= 0) return absl::FailedPreconditionError("FinishStep without a staged batch");
  if (!backend_->host_memory()) {
    // Every variable whose gradients were not handed over early (those are
    // on the host already, and may be on the wire: not written again).
    size_t v = 0;
    while (v < variables_.size()) {
      if (downloaded_[v]) {
        ++v;
        continue;
      }
      size_t w = v;
      while (w < variables_.size() && !downloaded_[w]) ++w;
      const size_t begin = param_offsets_[v];
      const size_t end = w < variables_.size() ? param_offsets_[w] : param_count_;
      RETURN_IF_ERROR(InLayer(backend_->CopyToHost(host_grads_ + begin, grads_.data() + begin,
                                                   (end - begin) * sizeof(float)),
                              "gradients", "download"));
      v = w;
    }
  }
  if (input_gradient_ && input_gradient_to_host_ && !backend_->host_memory()) {
    const size_t n = static_cast<size_t>(batch) * input_dim_;
    RETURN_IF_ERROR(host_input_grad_.Reserve(n));
    RETURN_IF_ERROR(InLayer(
        backend_->CopyToHost(host_input_grad_.data(), input_grad_.data(), n * sizeof(float)),
        "input gradient", "download"));
  }
  RETURN_IF_ERROR(InLayer(backend_->CopyToHost(host_row_loss_.data(), row_loss_.data(),
                                               static_cast<size_t>(batch) * sizeof(double)),
                          loss_->name(), "download"));
  RETURN_IF_ERROR(InLayer(backend_->Synchronize(), "step", "synchronize"));
  double total = 0;
  for (int r = 0; r < batch; ++r) total += host_row_loss_[r];
  *loss = static_cast<float>(total / batch);
  if (keep_scores_) {
    ToProbabilities(&scores_);
  }
  return absl::OkStatus();
}

absl::Status Model::Evaluate(const float* x, const int32_t* labels, int64_t n, EvalResult* result) {
  *result = EvalResult();
  staged_rows_ = 0;  // evaluation reuses the step's buffers
  RETURN_IF_ERROR(CheckComputable());
  RETURN_IF_ERROR(CheckLabels(labels, n));
  const int64_t chunk = 512;
  double total = 0;
  for (int64_t start = 0; start < n; start += chunk) {
    const int rows = static_cast<int>(std::min(chunk, n - start));
    RETURN_IF_ERROR(EnsureRows(rows));
    const float* xd = nullptr;
    const int32_t* yd = nullptr;
    RETURN_IF_ERROR(Stage(x + start * input_dim_, labels + start, rows, &xd, &yd));
    RETURN_IF_ERROR(Forward(xd, rows, /*training=*/false, 0));
    RETURN_IF_ERROR(InLayer(
        loss_->Compute(backend_, activations_.back().data(), yd, rows, static_cast<float>(rows),
                       nullptr, row_loss_.data(), predicted_.data()),
        loss_->name(), "evaluate"));
    RETURN_IF_ERROR(backend_->CopyToHost(host_row_loss_.data(), row_loss_.data(),
                                         static_cast<size_t>(rows) * sizeof(double)));
    RETURN_IF_ERROR(backend_->CopyToHost(host_predicted_.data(), predicted_.data(),
                                         static_cast<size_t>(rows) * sizeof(int32_t)));
    if (output_dim() == 1) {
      const size_t at = result->scores.size();
      result->scores.resize(at + rows);
      RETURN_IF_ERROR(backend_->CopyToHost(result->scores.data() + at, activations_.back().data(),
                                           static_cast<size_t>(rows) * sizeof(float)));
    }
    RETURN_IF_ERROR(InLayer(backend_->Synchronize(), "evaluate", "synchronize"));
    for (int r = 0; r < rows; ++r) {
      total += host_row_loss_[r];
      if (host_predicted_[r] == labels[start + r]) ++result->correct;
    }
  }
  result->count = n;
  result->loss = n > 0 ? total / n : 0;
  ToProbabilities(&result->scores);
  return absl::OkStatus();
}

}  // namespace pstrain
