#include "common/config.h"

#include <fstream>
#include <sstream>

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
  if (!c->model().has_mlp()) return FieldError(source, "model", "expected a model { mlp { ... } }");
  const MlpConfig& mlp = c->model().mlp();
  if (mlp.input_dim() <= 0 || mlp.input_dim() > (1 << 24)) {
    return FieldError(source, "model.mlp.input_dim", "expected 1..16777216");
  }
  if (mlp.num_classes() < 2 || mlp.num_classes() > 100000) {
    return FieldError(source, "model.mlp.num_classes", "expected 2..100000");
  }
  for (int units : mlp.hidden_units()) {
    if (units <= 0 || units > 65536) {
      return FieldError(source, "model.mlp.hidden_units", "expected each in 1..65536");
    }
  }
  const DataConfig& d = c->data();
  if (d.train_images().empty() || d.train_labels().empty()) {
    return FieldError(source, "data.train_images/train_labels", "expected IDX file paths");
  }
  if (d.batch_size() <= 0 || d.batch_size() > (1 << 20)) {
    return FieldError(source, "data.batch_size", "expected 1..1048576");
  }
  if (d.test_images().empty() != d.test_labels().empty()) {
    return FieldError(source, "data.test_images/test_labels", "expected both or neither");
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
  if (c->placement().partition_min_bytes() == 0) {
    c->mutable_placement()->set_partition_min_bytes(256 * 1024);
  }
  RpcConfig* rpc = c->mutable_rpc();
  if (rpc->rpc_timeout_ms() < 0 || rpc->step_timeout_ms() < 0 || rpc->startup_timeout_ms() < 0) {
    return FieldError(source, "rpc", "expected non-negative timeouts");
  }
  if (rpc->rpc_timeout_ms() == 0) rpc->set_rpc_timeout_ms(10000);
  if (rpc->step_timeout_ms() == 0) rpc->set_step_timeout_ms(60000);
  if (rpc->startup_timeout_ms() == 0) rpc->set_startup_timeout_ms(60000);
  if (c->compute_threads() < 0 || c->compute_threads() > 256) {
    return FieldError(source, "compute_threads", "expected 0..256");
  }
  if (c->compute_threads() == 0) c->set_compute_threads(1);
  if (c->output_dir().empty()) c->set_output_dir("pstrain_output");
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

}  // namespace pstrain
