#include "common/config.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/text_format.h"

namespace pstrain {
namespace {

// Keeps the first error with its position (protobuf reports 0-based lines).
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (has_error_) return;
    has_error_ = true;
    line_ = line + 1;
    column_ = column + 1;
    message_ = message;
  }
  bool has_error() const { return has_error_; }
  std::string Describe(const std::string& source) const {
    return absl::StrCat(source, ":", line_, ":", column_, ": ", message_);
  }

 private:
  bool has_error_ = false;
  int line_ = 0;
  int column_ = 0;
  std::string message_;
};

absl::Status FieldError(const std::string& source, const std::string& field,
                        const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("training config ", source, ": field ", field, ": ", what));
}

}  // namespace

absl::StatusOr<TrainingConfig> ParseTrainingConfig(const std::string& text,
                                                   const std::string& source) {
  TrainingConfig config;
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    std::string where = errors.has_error() ? errors.Describe(source) : source;
    return absl::InvalidArgumentError(absl::StrCat("training config ", where));
  }
  RETURN_IF_ERROR(ValidateAndFillDefaults(&config, source));
  return config;
}

absl::StatusOr<TrainingConfig> LoadTrainingConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("training config ", path, ": cannot open"));
  std::stringstream buf;
  buf << in.rdbuf();
  return ParseTrainingConfig(buf.str(), path);
}

absl::Status ValidateAndFillDefaults(TrainingConfig* c, const std::string& source) {
  if (c->model().model_case() == ModelConfig::MODEL_NOT_SET) {
    return FieldError(source, "model",
                      "expected model { mlp { ... } } or model { sequential { ... } }");
  }
  RETURN_IF_ERROR(ExpandModelConfig(c->model(), source).status());
  DataConfig* d = c->mutable_data();
  if (d->format() == IDX) {
    if (d->train_images().empty() || d->train_labels().empty()) {
      return FieldError(source, "data.train_images/train_labels", "expected IDX file paths");
    }
    if (d->test_images().empty() != d->test_labels().empty()) {
      return FieldError(source, "data.test_images/test_labels", "expected both or neither");
    }
  } else if (d->format() == CSV) {
    if (d->train_csv().empty()) return FieldError(source, "data.train_csv", "expected a CSV path");
    if (d->csv_label_column() < 0) {
      return FieldError(source, "data.csv_label_column", "expected a column index >= 0");
    }
  } else {
    return FieldError(source, "data.format", "expected IDX or CSV");
  }
  if (d->max_malformed_lines() < -1) {
    return FieldError(source, "data.max_malformed_lines", "expected >= -1 (-1 = none allowed)");
  }
  if (d->max_malformed_lines() == 0) d->set_max_malformed_lines(100);
  if (d->prefetch_batches() < 0 || d->prefetch_batches() > 1024) {
    return FieldError(source, "data.prefetch_batches", "expected 0..1024 (0 = 4)");
  }
  if (d->prefetch_batches() == 0) d->set_prefetch_batches(4);
  if (d->batch_size() <= 0 || d->batch_size() > (1 << 20)) {
    return FieldError(source, "data.batch_size", "expected 1..1048576");
  }
  if (!(c->optimizer().learning_rate() > 0.0f)) {
    return FieldError(source, "optimizer.learning_rate", "expected a positive number");
  }
  if (c->optimizer().kind_case() == OptimizerConfig::KIND_NOT_SET) {
    c->mutable_optimizer()->mutable_sgd();
  }
  if (c->mode_case() == TrainingConfig::MODE_NOT_SET) c->mutable_sync();
  if (c->has_sync() && c->sync().replicas_to_aggregate() < 0) {
    return FieldError(source, "sync.replicas_to_aggregate", "expected >= 0 (0 = all workers)");
  }
  if (c->has_async() && c->async().staleness_bound() < 0) {
    return FieldError(source, "async.staleness_bound", "expected >= 0 (0 = unbounded)");
  }
  if (c->max_steps() <= 0) return FieldError(source, "max_steps", "expected a positive count");
  if (c->eval_every_steps() < 0) return FieldError(source, "eval_every_steps", "expected >= 0");
  if (c->placement().partition_min_bytes() < 0) {
    return FieldError(source, "placement.partition_min_bytes", "expected >= 0");
  }
  if (c->placement().partition_max_bytes() < 0) {
    return FieldError(source, "placement.partition_max_bytes", "expected >= 0");
  }
  if (c->placement().partition_max_bytes() == 0) {
    c->mutable_placement()->set_partition_max_bytes(4 << 20);
  }
  if (c->placement().partition_min_bytes() == 0) {
    c->mutable_placement()->set_partition_min_bytes(256 * 1024);
  }
  RpcConfig* rpc = c->mutable_rpc();
  if (rpc->rpc_timeout_ms() < 0 || rpc->step_timeout_ms() < 0 || rpc->startup_timeout_ms() < 0) {
    return FieldError(source, "rpc", "expected non-negative timeouts");
  }
  if (rpc->wire_dtype().empty()) rpc->set_wire_dtype("float32");
  if (rpc->wire_dtype() != "float32" && rpc->wire_dtype() != "bfloat16") {
    return FieldError(source, "rpc.wire_dtype", "expected float32 or bfloat16");
  }
  if (rpc->rpc_timeout_ms() == 0) rpc->set_rpc_timeout_ms(10000);
  if (rpc->step_timeout_ms() == 0) rpc->set_step_timeout_ms(60000);
  if (rpc->startup_timeout_ms() == 0) rpc->set_startup_timeout_ms(60000);
  if (c->compute_threads() < 0 || c->compute_threads() > 256) {
    return FieldError(source, "compute_threads", "expected 0..256");
  }
  if (c->compute_threads() == 0) c->set_compute_threads(1);
  if (c->output_dir().empty()) c->set_output_dir("pstrain_output");
  if (!ParseDeviceSpec(c->device()).ok()) {
    return FieldError(source, "device", "expected \"auto\", \"cpu\" or \"cuda:N\"");
  }
  if (c->device().empty()) c->set_device("auto");
  return absl::OkStatus();
}

uint64_t ConfigFingerprint(const TrainingConfig& config) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    config.SerializeToCodedStream(&out);
  }
  uint64_t h = 1469598103934665603ULL;  // FNV-1a 64
  for (unsigned char ch : bytes) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return h;
}

bool IsSyncMode(const TrainingConfig& config) { return !config.has_async(); }

absl::StatusOr<SequentialConfig> ExpandModelConfig(const ModelConfig& model,
                                                   const std::string& source) {
  constexpr int kMaxInput = 1 << 24, kMaxUnits = 100000;
  SequentialConfig seq;
  if (model.has_mlp()) {
    const MlpConfig& mlp = model.mlp();
    if (mlp.input_dim() <= 0 || mlp.input_dim() > kMaxInput) {
      return FieldError(source, "model.mlp.input_dim", "expected 1..16777216");
    }
    if (mlp.num_classes() < 2 || mlp.num_classes() > kMaxUnits) {
      return FieldError(source, "model.mlp.num_classes", "expected 2..100000");
    }
    if (mlp.activation() != RELU && mlp.activation() != GELU) {
      return FieldError(source, "model.mlp.activation", "expected RELU or GELU");
    }
    if (!(mlp.dropout() >= 0.0f && mlp.dropout() < 1.0f)) {
      return FieldError(source, "model.mlp.dropout", "expected a rate in [0, 1)");
    }
    seq.set_input_dim(mlp.input_dim());
    for (int units : mlp.hidden_units()) {
      if (units <= 0 || units > 65536) {
        return FieldError(source, "model.mlp.hidden_units", "expected each in 1..65536");
      }
      seq.add_layer()->mutable_dense()->set_units(units);
      if (mlp.activation() == GELU) {
        seq.add_layer()->mutable_gelu();
      } else {
        seq.add_layer()->mutable_relu();
      }
      if (mlp.dropout() > 0.0f) seq.add_layer()->mutable_dropout()->set_rate(mlp.dropout());
    }
    seq.add_layer()->mutable_dense()->set_units(mlp.num_classes());
    seq.add_layer()->mutable_softmax_cross_entropy();
    return seq;
  }
  if (!model.has_sequential()) {
    return FieldError(source, "model",
                      "expected model { mlp { ... } } or model { sequential { ... } }");
  }
  seq = model.sequential();
  if (seq.input_dim() <= 0 || seq.input_dim() > kMaxInput) {
    return FieldError(source, "model.sequential.input_dim", "expected 1..16777216");
  }
  int width = seq.input_dim();
  bool has_dense = false;
  for (int i = 0; i < seq.layer_size(); ++i) {
    const LayerConfig& layer = seq.layer(i);
    const std::string field = absl::StrCat("model.sequential.layer[", i, "]");
    const bool last = i + 1 == seq.layer_size();
    switch (layer.layer_case()) {
      case LayerConfig::kDense:
        if (layer.dense().units() <= 0 || layer.dense().units() > kMaxUnits) {
          return FieldError(source, field + ".dense.units", "expected 1..100000");
        }
        width = layer.dense().units();
        has_dense = true;
        break;
      case LayerConfig::kRelu:
      case LayerConfig::kGelu:
        break;
      case LayerConfig::kDropout:
        if (!(layer.dropout().rate() >= 0.0f && layer.dropout().rate() < 1.0f)) {
          return FieldError(source, field + ".dropout.rate", "expected a rate in [0, 1)");
        }
        break;
      case LayerConfig::kSoftmaxCrossEntropy:
      case LayerConfig::kSigmoidCrossEntropy:
        if (!last) return FieldError(source, field, "a loss must be the last layer");
        if (!has_dense) return FieldError(source, field, "expected a dense layer before the loss");
        if (layer.has_softmax_cross_entropy() && width < 2) {
          return FieldError(source, field, "softmax cross-entropy needs at least 2 outputs");
        }
        break;
      default:
        return FieldError(source, field,
                          "expected one of dense, relu, gelu, dropout, "
                          "softmax_cross_entropy, sigmoid_cross_entropy");
    }
  }
  if (seq.layer_size() == 0 || (!seq.layer().rbegin()->has_softmax_cross_entropy() &&
                                !seq.layer().rbegin()->has_sigmoid_cross_entropy())) {
    return FieldError(source, "model.sequential.layer",
                      "expected a loss as the last layer (softmax_cross_entropy or "
                      "sigmoid_cross_entropy)");
  }
  return seq;
}

absl::StatusOr<DeviceSpec> ParseDeviceSpec(const std::string& text) {
  DeviceSpec spec;
  if (text.empty() || text == "auto") return spec;
  if (text == "cpu") {
    spec.kind = DeviceSpec::Kind::kCpu;
    return spec;
  }
  int index = 0;
  if (absl::StartsWith(text, "cuda:") && absl::SimpleAtoi(text.substr(5), &index) && index >= 0 &&
      index < 1024 && text.substr(5) == absl::StrCat(index)) {
    spec.kind = DeviceSpec::Kind::kCuda;
    spec.index = index;
    return spec;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", text, "\": expected \"auto\", \"cpu\" or \"cuda:N\""));
}

}  // namespace pstrain
