// ExpandModelConfig: each model kind as its stack of layers, checked.
#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/cluster/config.h"
#include "common/cluster/config_internal.h"
#include "common/cluster/feature_schema.h"

namespace pstrain {
namespace {

using config_internal::FieldError;

constexpr int kMaxInput = 1 << 24, kMaxUnits = 100000;

// A dot layer over `width` inputs; *out_width (optional) its output's.
absl::Status CheckDotLayer(const DotConfig& dot, int width, const std::string& field,
                           const std::string& source, int* out_width) {
  if (dot.dense_inputs() < 1 || dot.dense_inputs() > 4096 || dot.dense_inputs() >= width) {
    return FieldError(source, field + ".dense_inputs",
                      absl::StrCat("expected 1..4096, fewer than the layer's ", width, " inputs"));
  }
  if (dot.dim() < 1 || dot.dim() > 1024 || (width - dot.dense_inputs()) % dot.dim() != 0) {
    return FieldError(source, field + ".dim",
                      absl::StrCat("expected 1..1024, dividing the ", width - dot.dense_inputs(),
                                   " inputs after the dense ones into vectors"));
  }
  for (int i = 0; i < dot.bottom_units_size(); ++i) {
    if (dot.bottom_units(i) < 1 || dot.bottom_units(i) > 65536) {
      return FieldError(source, absl::StrCat(field, ".bottom_units[", i, "]"),
                        "expected 1..65536");
    }
  }
  if (dot.bottom_units_size() > 0 && *dot.bottom_units().rbegin() != dot.dim()) {
    return FieldError(source, field + ".bottom_units",
                      absl::StrCat("the last must be dim, ", dot.dim(), " (the bottom MLP's "
                                   "output is one of the vectors whose dots are taken)"));
  }
  const int64_t vectors = (width - dot.dense_inputs()) / dot.dim() + 1;
  const int64_t out = dot.dim() + vectors * (vectors - 1) / 2;
  if (out > (1 << 24)) {
    return FieldError(source, field,
                      absl::StrCat(vectors, " vectors give ", out,
                                   " outputs; expected at most 16777216"));
  }
  if (out_width != nullptr) *out_width = static_cast<int>(out);
  return absl::OkStatus();
}

// A click-through model: the numeric features and the bags (then DCN-v2's
// cross layers or DLRM's dot, when asked), the MLP and a sigmoid loss.
absl::StatusOr<SequentialConfig> ExpandClickThrough(const ClickThroughConfig& ct,
                                                    const std::string& source) {
  SequentialConfig seq;
  // The numeric features and a bag of embedding_dim per categorical field
  // (Criteo's 13 and 26 where the config was not validated against data).
  // (A validated config always has categorical fields; its numeric inputs
  // may be none.)
  const bool counted = ct.categorical_fields() > 0;
  const int numeric = counted ? ct.numeric_inputs() : kCriteoIntegerFields;
  const int fields = counted ? ct.categorical_fields() : kCriteoCategoricalFields;
  if (numeric < 0 || numeric > 4096 || fields > 4096) {
    return FieldError(source, "model.click_through.numeric_inputs/categorical_fields",
                      "expected 0..4096 and 1..4096");
  }
  if (ct.embedding_dim() <= 0 || ct.embedding_dim() > 65536) {
    return FieldError(source, "model.click_through.embedding_dim",
                      "expected the table's dim (1..65536)");
  }
  if (ct.activation() != RELU && ct.activation() != GELU) {
    return FieldError(source, "model.click_through.activation", "expected RELU or GELU");
  }
  if (ct.bag_inputs() < 0 || ct.bag_inputs() > kMaxInput) {
    return FieldError(source, "model.click_through.bag_inputs", "expected 0..16777216");
  }
  const int64_t input = numeric + (ct.bag_inputs() > 0 ? int64_t{ct.bag_inputs()}
                                                       : int64_t{fields} * ct.embedding_dim());
  if (input > kMaxInput) {
    return FieldError(source, "model.click_through",
                      absl::StrCat("an input of ", input, " floats (", numeric, " numbers and ",
                                   fields, " bags of ", input - numeric,
                                   " floats); expected at most ", kMaxInput));
  }
  seq.set_input_dim(static_cast<int>(input));
  if (ct.cross_layers() < 0 || ct.cross_layers() > 16) {
    return FieldError(source, "model.click_through.cross_layers", "expected 0..16");
  }
  if (input * input * ct.cross_layers() > (int64_t{1} << 28)) {
    return FieldError(source, "model.click_through.cross_layers",
                      absl::StrCat("kernels of ", input, " x ", input,
                                   " floats each: expected inputs^2 x layers at most 2^28"));
  }
  if (ct.cross_layers() > 0) seq.add_layer()->mutable_cross()->set_layers(ct.cross_layers());
  if (ct.has_dot()) {
    if (ct.cross_layers() > 0) {
      return FieldError(source, "model.click_through.dot",
                        "not with cross_layers: one or the other");
    }
    if (numeric == 0) {
      return FieldError(source, "model.click_through.dot",
                        "needs numeric columns (the bottom MLP's input)");
    }
    if (ct.bag_inputs() > 0 && ct.bag_inputs() != int64_t{fields} * ct.embedding_dim()) {
      return FieldError(source, "model.click_through.dot",
                        "needs every column's table of the model's dim");
    }
    for (const auto& [value, name] : {std::pair{ct.dot().dense_inputs(), "dense_inputs"},
                                      std::pair{ct.dot().dim(), "dim"}}) {
      const int want = std::string(name) == "dim" ? ct.embedding_dim() : numeric;
      if (value != 0 && value != want) {
        return FieldError(source, absl::StrCat("model.click_through.dot.", name),
                          absl::StrCat("is ", value, ", the model's is ", want,
                                       ": leave it out"));
      }
    }
    DotConfig* dot = seq.add_layer()->mutable_dot();
    *dot = ct.dot();
    dot->set_dense_inputs(numeric);
    dot->set_dim(ct.embedding_dim());
    RETURN_IF_ERROR(CheckDotLayer(*dot, static_cast<int>(input), "model.click_through.dot",
                                  source, nullptr));
  }
  for (int units : ct.hidden_units()) {
    if (units <= 0 || units > 65536) {
      return FieldError(source, "model.click_through.hidden_units", "expected each in 1..65536");
    }
    seq.add_layer()->mutable_dense()->set_units(units);
    if (ct.activation() == GELU) {
      seq.add_layer()->mutable_gelu();
    } else {
      seq.add_layer()->mutable_relu();
    }
  }
  seq.add_layer()->mutable_dense()->set_units(1);
  seq.add_layer()->mutable_sigmoid_cross_entropy();
  return seq;
}

// The classic classifier: dense + activation [+ dropout] per hidden layer.
absl::StatusOr<SequentialConfig> ExpandMlp(const MlpConfig& mlp, const std::string& source) {
  SequentialConfig seq;
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

}  // namespace

absl::StatusOr<SequentialConfig> ExpandModelConfig(const ModelConfig& model,
                                                   const std::string& source) {
  if (model.has_click_through()) return ExpandClickThrough(model.click_through(), source);
  if (model.has_mlp()) return ExpandMlp(model.mlp(), source);
  SequentialConfig seq;
  if (!model.has_sequential()) {
    return FieldError(source, "model",
                      "expected model { mlp { ... } }, model { sequential { ... } } or "
                      "model { click_through { ... } }");
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
      case LayerConfig::kDot:
        RETURN_IF_ERROR(CheckDotLayer(layer.dot(), width, field + ".dot", source, &width));
        break;
      case LayerConfig::kCross:
        if (layer.cross().layers() < 0 || layer.cross().layers() > 16) {
          return FieldError(source, field + ".cross.layers", "expected 1..16 (0 means 1)");
        }
        if (int64_t{width} * width * std::max(1, layer.cross().layers()) > (int64_t{1} << 28)) {
          return FieldError(source, field + ".cross",
                            absl::StrCat("kernels of ", width, " x ", width,
                                         " floats each: expected width^2 x layers at most 2^28"));
        }
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
                          "expected one of dense, relu, gelu, dropout, cross, dot, "
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


}  // namespace pstrain
