#include "common/cluster/config.h"

#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/cluster/config_internal.h"
#include "common/cluster/feature_schema.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/text_format.h"

namespace pstrain {

absl::Status config_internal::FieldError(const std::string& source, const std::string& field,
                                         const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("training config ", source, ": field ", field, ": ", what));
}

namespace {

using config_internal::FieldError;

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


// A float field that must lie in [lo, hi) (or [lo, hi] when closed), with
// `fallback` filled in where it was left out.
template <typename Message>
absl::Status CheckRange(Message* m, bool (Message::*has)() const, float (Message::*get)() const,
                        void (Message::*set)(float), float fallback, double lo, double hi,
                        bool closed, const std::string& source, const std::string& field) {
  if (!(m->*has)()) (m->*set)(fallback);
  const double v = (m->*get)();
  if (!(v >= lo && (closed ? v <= hi : v < hi))) {
    return FieldError(source, field,
                      absl::StrCat("expected a value in [", lo, ", ", hi, closed ? "]" : ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateEmbeddingTables(TrainingConfig* c, const std::string& source) {
  std::set<std::string> names;
  for (int i = 0; i < c->embedding_tables_size(); ++i) {
    EmbeddingTableConfig* t = c->mutable_embedding_tables(i);
    const std::string field = absl::StrCat("embedding_tables[", i, "]");
    if (t->name().empty() || t->name().size() > 128 ||
        t->name().find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                    "0123456789_-./") != std::string::npos) {
      return FieldError(source, field + ".name",
                        "expected 1..128 characters of letters, digits, _ - . /");
    }
    if (!names.insert(t->name()).second) {
      return FieldError(source, field + ".name", absl::StrCat("duplicate table ", t->name()));
    }
    if (t->dim() <= 0 || t->dim() > 65536) {
      return FieldError(source, field + ".dim", "expected 1..65536");
    }
    if (t->num_rows() < 0) {
      return FieldError(source, field + ".num_rows", "expected >= 0 (0 = hashed)");
    }
    if (!t->has_init_scale()) t->set_init_scale(1.0f / std::sqrt(static_cast<float>(t->dim())));
    if (!(t->init_scale() >= 0) || !std::isfinite(t->init_scale())) {
      return FieldError(source, field + ".init_scale", "expected >= 0");
    }
    if (t->expire_after_steps() < 0) {
      return FieldError(source, field + ".expire_after_steps", "expected >= 0 (0 = never)");
    }
    if (t->admit_after() < 0) {
      return FieldError(source, field + ".admit_after", "expected >= 0 (0 = at first touch)");
    }
    if (t->memory_budget_bytes() < 0) {
      return FieldError(source, field + ".memory_budget_bytes", "expected >= 0 (0 = no budget)");
    }
    if (t->has_optimizer()) {
      RETURN_IF_ERROR(
          ValidateAndFillOptimizerDefaults(t->mutable_optimizer(), c->max_steps(), source));
    }
  }
  return absl::OkStatus();
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
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("training config ", path, ": not a file (a directory?)"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("training config ", path, ": cannot open"));
  std::stringstream buf;
  buf << in.rdbuf();
  return ParseTrainingConfig(buf.str(), path);
}

namespace {

// A click-through file's columns, a problem named as FieldError names one.
absl::Status CheckSchema(const FeatureSchema& schema, const std::string& source) {
  absl::Status st = CheckFeatureSchema(schema, "data.schema");
  if (st.ok()) return st;
  const std::string message(st.message());
  const size_t colon = message.find(": ");
  return FieldError(source, message.substr(0, colon), message.substr(colon + 2));
}

// A click-through model's categorical columns: each one's table an
// embedding_tables entry, hashed (the readers' ids are 64-bit hashes), and
// model.click_through.bag_inputs their dims' sum where any column looks up a
// table of its own.
absl::Status ValidateFieldTables(TrainingConfig* c, const std::string& source) {
  ClickThroughConfig* ct = c->mutable_model()->mutable_click_through();
  auto check = [&](const std::string& name, const std::string& field,
                   int64_t* dim) -> absl::Status {
    const EmbeddingTableConfig* table = nullptr;
    for (const EmbeddingTableConfig& t : c->embedding_tables()) {
      if (t.name() == name) table = &t;
    }
    if (table == nullptr) {
      return FieldError(source, field,
                        absl::StrCat("no embedding_tables entry named \"", name, "\""));
    }
    if (table->num_rows() > 0) {
      return FieldError(source, field,
                        absl::StrCat("table ", name,
                                     " has num_rows, but the model's ids are 64-bit hashes: "
                                     "expected a hashed table (num_rows 0)"));
    }
    *dim = table->dim();
    return absl::OkStatus();
  };
  int64_t model_dim = 0;
  RETURN_IF_ERROR(check(ct->table(), "model.click_through.table", &model_dim));
  const FeatureSchema& schema = c->data().schema();
  int64_t width = int64_t{CategoricalColumns(schema)} * model_dim;
  bool own = false;
  for (int i = 0; i < schema.columns_size(); ++i) {
    const FeatureColumn& col = schema.columns(i);
    if (col.kind() != FeatureColumn::CATEGORICAL || col.table().empty() ||
        col.table() == ct->table()) {
      continue;
    }
    int64_t dim = 0;
    const std::string field = absl::StrCat("data.schema.columns[", i, "].table");
    RETURN_IF_ERROR(check(col.table(), field, &dim));
    if (ct->has_dot() && dim != model_dim) {
      return FieldError(source, field,
                        absl::StrCat("table ", col.table(), " has dim ", dim,
                                     "; model.click_through.dot needs every table's dim equal to ",
                                     ct->table(), "'s, ", model_dim));
    }
    width += std::max(1, col.count()) * (dim - model_dim);
    own = true;
  }
  const int64_t expected = own ? width : 0;
  if (ct->bag_inputs() != 0 && ct->bag_inputs() != expected) {
    return FieldError(source, "model.click_through.bag_inputs",
                      own ? absl::StrCat("is ", ct->bag_inputs(), ", the columns' tables give ",
                                         width)
                          : std::string("applies where columns look up tables of their own: "
                                        "leave it out"));
  }
  if (width > (1 << 24)) {
    return FieldError(source, "model.click_through",
                      absl::StrCat("bags of ", width, " floats; expected at most 16777216"));
  }
  ct->set_bag_inputs(static_cast<int>(expected));
  return absl::OkStatus();
}

// The model and its embedding tables: a click-through model's table named
// and its width filled in; CRITEO data only with one.
absl::Status ValidateModel(TrainingConfig* c, const std::string& source) {
  RETURN_IF_ERROR(ValidateEmbeddingTables(c, source));
  if (c->model().has_click_through()) {
    ClickThroughConfig* ct = c->mutable_model()->mutable_click_through();
    const EmbeddingTableConfig* table = nullptr;
    for (const EmbeddingTableConfig& t : c->embedding_tables()) {
      if (t.name() == ct->table()) table = &t;
    }
    if (table == nullptr) {
      return FieldError(source, "model.click_through.table",
                        absl::StrCat("no embedding_tables entry named \"", ct->table(), "\""));
    }
    if (ct->embedding_dim() != 0 && ct->embedding_dim() != table->dim()) {
      return FieldError(source, "model.click_through.embedding_dim",
                        absl::StrCat("is ", ct->embedding_dim(), ", table ", table->name(),
                                     " has dim ", table->dim()));
    }
    ct->set_embedding_dim(table->dim());
    if (c->data().format() != CRITEO) {
      return FieldError(source, "model.click_through", "needs data { format: CRITEO }");
    }
    // The model's input: the data's numeric columns and a bag per categorical
    // one. data.schema is checked here, before its counts are summed (CRITEO
    // data always has this model, so every schema read is checked).
    RETURN_IF_ERROR(CheckSchema(c->data().schema(), source));
    const int numeric = NumericColumns(c->data().schema());
    const int fields = CategoricalColumns(c->data().schema());
    if (ct->numeric_inputs() != 0 && ct->numeric_inputs() != numeric) {
      return FieldError(source, "model.click_through.numeric_inputs",
                        absl::StrCat("is ", ct->numeric_inputs(), ", the data has ", numeric,
                                     " numeric column(s)"));
    }
    if (ct->categorical_fields() != 0 && ct->categorical_fields() != fields) {
      return FieldError(source, "model.click_through.categorical_fields",
                        absl::StrCat("is ", ct->categorical_fields(), ", the data has ", fields,
                                     " categorical column(s)"));
    }
    ct->set_numeric_inputs(numeric);
    ct->set_categorical_fields(fields);
    RETURN_IF_ERROR(ValidateFieldTables(c, source));
  } else if (c->data().format() == CRITEO) {
    return FieldError(source, "data.format", "CRITEO data needs model { click_through { ... } }");
  }
  return absl::OkStatus();
}

// An external model: its variables file named; the data is the workers'
// own (their script reads it), so the config names no files, only the
// batch each worker computes a step on (for the learning rate's scaling
// and the throughput figures).
absl::Status ValidateExternal(const TrainingConfig& c, const std::string& source) {
  if (c.model().external().variables().empty()) {
    return FieldError(source, "model.external.variables",
                      "expected the .safetensors file of the model's variables "
                      "(pstrain.torch.write_variables writes it)");
  }
  const DataConfig& d = c.data();
  for (const std::string* f : {&d.train_images(), &d.train_labels(), &d.test_images(),
                               &d.test_labels(), &d.train_csv(), &d.test_csv(), &d.train_tsv(),
                               &d.test_tsv(), &d.train_dir()}) {
    if (!f->empty()) {
      return FieldError(source, "data",
                        absl::StrCat("names a file (", *f, ") with model.external: its workers "
                                     "read their own data; give only data { batch_size }"));
    }
  }
  if (d.format() != IDX) {
    return FieldError(source, "data.format", "is not used with model.external (the workers "
                                             "read their own data)");
  }
  if (d.batch_size() <= 0 || d.batch_size() > (1 << 20)) {
    return FieldError(source, "data.batch_size",
                      "expected 1..1048576: the examples each worker computes a step on");
  }
  return absl::OkStatus();
}

// The data: the files of its format, malformed lines, prefetch, batch size.
absl::Status ValidateData(DataConfig* d, const std::string& source) {
  if (!d->train_dir().empty() && d->format() != CRITEO) {
    return FieldError(source, "data.train_dir", "is read with format: CRITEO only");
  }
  if (d->has_schema() && d->format() != CRITEO) {
    return FieldError(source, "data.schema", "describes format: CRITEO files only");
  }
  if (d->progressive_eval() && d->format() != CRITEO) {
    return FieldError(source, "data.progressive_eval",
                      "scores a click-through model's training data: format: CRITEO only");
  }
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
  } else if (d->format() == CRITEO) {
    if (d->train_tsv().empty() == d->train_dir().empty()) {
      return FieldError(source, "data.train_tsv/train_dir",
                        "expected one: a TSV file, or a directory of part files to follow");
    }
    if (!d->train_dir().empty() && d->shuffle()) {
      return FieldError(source, "data.shuffle",
                        "does not apply to data.train_dir (parts are read in order, once)");
    }
    if (d->progressive_eval() && !d->test_tsv().empty()) {
      return FieldError(source, "data.progressive_eval",
                        "scores the training data before it trains on it: leave out "
                        "data.test_tsv (one held-out source)");
    }
  } else {
    return FieldError(source, "data.format", "expected IDX, CSV or CRITEO");
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
  return absl::OkStatus();
}

// Sync's quorum and deadline, async's staleness bound.
absl::Status ValidateMode(const TrainingConfig& c, const std::string& source) {
  if (c.has_sync()) {
    const SyncConfig& s = c.sync();
    if (s.replicas_to_aggregate() < 0) {
      return FieldError(source, "sync.replicas_to_aggregate", "expected >= 0 (0 = all workers)");
    }
    if (s.step_deadline_ms() < 0) {
      return FieldError(source, "sync.step_deadline_ms", "expected >= 0 (0 = none)");
    }
    if (s.min_replicas() < 0) {
      return FieldError(source, "sync.min_replicas", "expected >= 0 (0 = replicas_to_aggregate)");
    }
    if (s.replicas_to_aggregate() > 0 && s.min_replicas() > s.replicas_to_aggregate()) {
      return FieldError(source, "sync.min_replicas", "expected <= replicas_to_aggregate");
    }
    if (s.min_replicas() > 0 && s.step_deadline_ms() == 0) {
      return FieldError(source, "sync.min_replicas",
                        "needs sync.step_deadline_ms (the time after which a step goes on "
                        "with fewer gradients)");
    }
  }
  if (c.has_async() && c.async().staleness_bound() < 0) {
    return FieldError(source, "async.staleness_bound", "expected >= 0 (0 = unbounded)");
  }
  return absl::OkStatus();
}

// Partition sizes, with their defaults.
absl::Status ValidatePlacement(PlacementConfig* placement, const std::string& source) {
  if (placement->partition_min_bytes() < 0) {
    return FieldError(source, "placement.partition_min_bytes", "expected >= 0");
  }
  if (placement->partition_max_bytes() < 0) {
    return FieldError(source, "placement.partition_max_bytes", "expected >= 0");
  }
  if (placement->partition_max_bytes() == 0) {
    placement->set_partition_max_bytes(4 << 20);
  }
  if (placement->partition_min_bytes() == 0) {
    placement->set_partition_min_bytes(256 * 1024);
  }
  return absl::OkStatus();
}

// Timeouts, the wire's dtype, calls and connections, with their
// defaults; a sync step's deadline under the step timeout.
absl::Status ValidateRpc(TrainingConfig* c, const std::string& source) {
  RpcConfig* rpc = c->mutable_rpc();
  if (rpc->rpc_timeout_ms() < 0 || rpc->step_timeout_ms() < 0 || rpc->startup_timeout_ms() < 0) {
    return FieldError(source, "rpc", "expected non-negative timeouts");
  }
  if (rpc->wire_dtype().empty()) rpc->set_wire_dtype("float32");
  if (rpc->wire_dtype() != "float32" && rpc->wire_dtype() != "bfloat16") {
    return FieldError(source, "rpc.wire_dtype", "expected float32 or bfloat16");
  }
  if (rpc->call_bytes() < 0 || rpc->call_bytes() > (int64_t{64} << 20)) {
    // Well under the 256 MiB message cap: a call of many small partitions
    // carries a header entry for each.
    return FieldError(source, "rpc.call_bytes", "expected 0..67108864 (64 MiB; 0 means 4 MiB)");
  }
  if (rpc->call_bytes() == 0) rpc->set_call_bytes(4 << 20);
  if (rpc->calls_in_flight() < 0 || rpc->calls_in_flight() > 4096) {
    return FieldError(source, "rpc.calls_in_flight", "expected 0..4096 (0 means 16)");
  }
  if (rpc->calls_in_flight() == 0) rpc->set_calls_in_flight(16);
  if (rpc->connections_per_server() < 0 || rpc->connections_per_server() > 16) {
    return FieldError(source, "rpc.connections_per_server", "expected 0..16 (0 means 1)");
  }
  if (rpc->connections_per_server() == 0) rpc->set_connections_per_server(1);
  if (rpc->async_prefetch() && !c->has_async()) {
    return FieldError(source, "rpc.async_prefetch", "only in async mode (an async { } block)");
  }
  if (rpc->async_prefetch() && rpc->sequential()) {
    return FieldError(source, "rpc.async_prefetch",
                      "not with rpc.sequential, which sends no pull ahead");
  }
  if (rpc->rpc_timeout_ms() == 0) rpc->set_rpc_timeout_ms(10000);
  if (rpc->step_timeout_ms() == 0) rpc->set_step_timeout_ms(60000);
  if (rpc->startup_timeout_ms() == 0) rpc->set_startup_timeout_ms(60000);
  if (c->has_sync() && c->sync().step_deadline_ms() >= rpc->step_timeout_ms()) {
    return FieldError(source, "sync.step_deadline_ms",
                      absl::StrCat("expected less than rpc.step_timeout_ms (",
                                   rpc->step_timeout_ms(),
                                   "), the longest a worker waits for a step"));
  }
  return absl::OkStatus();
}

// Checkpoints: how often, how many kept; a schedule needs a directory.
absl::Status ValidateCheckpoint(CheckpointConfig* ckpt, const std::string& source) {
  if (ckpt->every_steps() < 0) return FieldError(source, "checkpoint.every_steps", "negative");
  if (ckpt->keep() < 0 || ckpt->keep() > 1000) {
    return FieldError(source, "checkpoint.keep", "expected 0..1000 (0 means 3)");
  }
  if (ckpt->keep() == 0) ckpt->set_keep(3);
  if (ckpt->dir().empty() && ckpt->every_steps() > 0) {
    return FieldError(source, "checkpoint.every_steps", "set without checkpoint.dir");
  }
  if (ckpt->every_seconds() < 0 || ckpt->every_seconds() > 7 * 24 * 3600) {
    return FieldError(source, "checkpoint.every_seconds", "expected 0..604800");
  }
  if (ckpt->dir().empty() && ckpt->every_seconds() > 0) {
    return FieldError(source, "checkpoint.every_seconds", "set without checkpoint.dir");
  }
  if (ckpt->dir().empty() && !ckpt->serving_dir().empty()) {
    return FieldError(source, "checkpoint.serving_dir",
                      "set without checkpoint.dir (a snapshot is written from each checkpoint)");
  }
  if (ckpt->full_every() < 0 || ckpt->full_every() > 1000) {
    return FieldError(source, "checkpoint.full_every",
                      "expected 0..1000 (0 or 1: every save writes every row)");
  }
  if (ckpt->stop_save_seconds() < -1 || ckpt->stop_save_seconds() > 3600) {
    return FieldError(source, "checkpoint.stop_save_seconds",
                      "expected -1 (no save on stop), 0 (20 s) or 1..3600");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateAndFillDefaults(TrainingConfig* c, const std::string& source) {
  // A stream of parts has no end: without max_steps it trains until stopped
  // (set first: the tables' optimizers are checked against it).
  if (c->max_steps() == 0 && !c->data().train_dir().empty()) c->set_max_steps(kUntilStopped);
  if (c->model().model_case() == ModelConfig::MODEL_NOT_SET) {
    return FieldError(source, "model",
                      "expected model { mlp { ... } }, model { sequential { ... } }, "
                      "model { click_through { ... } } or model { external { ... } }");
  }
  RETURN_IF_ERROR(ValidateModel(c, source));
  if (c->model().has_external()) {
    RETURN_IF_ERROR(ValidateExternal(*c, source));
  } else {
    RETURN_IF_ERROR(ExpandModelConfig(c->model(), source).status());
    RETURN_IF_ERROR(ValidateData(c->mutable_data(), source));
  }
  if (c->max_steps() <= 0 || c->max_steps() > kUntilStopped) {
    return FieldError(source, "max_steps",
                      "expected a positive count (none with data.train_dir: until stopped)");
  }
  RETURN_IF_ERROR(ValidateAndFillOptimizerDefaults(c->mutable_optimizer(), c->max_steps(), source));
  if (c->mode_case() == TrainingConfig::MODE_NOT_SET) c->mutable_sync();
  RETURN_IF_ERROR(ValidateMode(*c, source));
  if (c->eval_every_steps() < 0) return FieldError(source, "eval_every_steps", "expected >= 0");
  if (c->data().progressive_eval() && c->eval_every_steps() == 0) {
    return FieldError(source, "data.progressive_eval",
                      "reports every eval_every_steps: give eval_every_steps > 0");
  }
  RETURN_IF_ERROR(ValidatePlacement(c->mutable_placement(), source));
  RETURN_IF_ERROR(ValidateRpc(c, source));
  if (c->compute_threads() < 0 || c->compute_threads() > 256) {
    return FieldError(source, "compute_threads", "expected 0..256");
  }
  if (c->compute_threads() == 0) c->set_compute_threads(1);
  if (c->output_dir().empty()) c->set_output_dir("pstrain_output");
  RETURN_IF_ERROR(ValidateCheckpoint(c->mutable_checkpoint(), source));
  if (!ParseDeviceSpec(c->device()).ok()) {
    return FieldError(source, "device", "expected \"auto\", \"cpu\" or \"cuda:N\"");
  }
  if (c->device().empty()) c->set_device("auto");
  return absl::OkStatus();
}

absl::Status ValidateAndFillOptimizerDefaults(OptimizerConfig* o, int64_t max_steps,
                                              const std::string& source) {
  if (!(o->learning_rate() > 0.0f) || !std::isfinite(o->learning_rate())) {
    return FieldError(source, "optimizer.learning_rate", "expected a positive number");
  }
  constexpr double kBig = 1e30;
  switch (o->kind_case()) {
    case OptimizerConfig::KIND_NOT_SET:
      o->mutable_sgd();
      break;
    case OptimizerConfig::kSgd:
      break;
    case OptimizerConfig::kMomentum: {
      MomentumConfig* m = o->mutable_momentum();
      RETURN_IF_ERROR(CheckRange(m, &MomentumConfig::has_momentum, &MomentumConfig::momentum,
                                 &MomentumConfig::set_momentum, 0.9f, 0, 1, false, source,
                                 "optimizer.momentum.momentum"));
      break;
    }
    case OptimizerConfig::kAdagrad: {
      AdagradConfig* a = o->mutable_adagrad();
      RETURN_IF_ERROR(CheckRange(a, &AdagradConfig::has_initial_accumulator_value,
                                 &AdagradConfig::initial_accumulator_value,
                                 &AdagradConfig::set_initial_accumulator_value, 0.1f, 0, kBig,
                                 true, source, "optimizer.adagrad.initial_accumulator_value"));
      RETURN_IF_ERROR(CheckRange(a, &AdagradConfig::has_epsilon, &AdagradConfig::epsilon,
                                 &AdagradConfig::set_epsilon, 1e-10f, 0, kBig, true, source,
                                 "optimizer.adagrad.epsilon"));
      if (!(a->initial_accumulator_value() > 0 || a->epsilon() > 0)) {
        return FieldError(source, "optimizer.adagrad",
                          "initial_accumulator_value or epsilon must be positive (a zero "
                          "gradient would divide by zero)");
      }
      break;
    }
    case OptimizerConfig::kAdam:
    case OptimizerConfig::kAdamw: {
      const bool w = o->has_adamw();
      const std::string f = w ? "optimizer.adamw." : "optimizer.adam.";
      AdamConfig* a = w ? o->mutable_adamw() : o->mutable_adam();
      RETURN_IF_ERROR(CheckRange(a, &AdamConfig::has_beta1, &AdamConfig::beta1,
                                 &AdamConfig::set_beta1, 0.9f, 0, 1, false, source, f + "beta1"));
      RETURN_IF_ERROR(CheckRange(a, &AdamConfig::has_beta2, &AdamConfig::beta2,
                                 &AdamConfig::set_beta2, 0.999f, 0, 1, false, source,
                                 f + "beta2"));
      RETURN_IF_ERROR(CheckRange(a, &AdamConfig::has_epsilon, &AdamConfig::epsilon,
                                 &AdamConfig::set_epsilon, 1e-8f, 1e-30, kBig, true, source,
                                 f + "epsilon"));
      if (!w) {
        if (a->weight_decay() != 0) {
          return FieldError(source, "optimizer.adam.weight_decay",
                            "Adam has no weight decay here; use adamw { weight_decay: ... }");
        }
      } else {
        RETURN_IF_ERROR(CheckRange(a, &AdamConfig::has_weight_decay, &AdamConfig::weight_decay,
                                   &AdamConfig::set_weight_decay, 0.01f, 0, kBig, true, source,
                                   f + "weight_decay"));
      }
      break;
    }
    case OptimizerConfig::kFtrl: {
      FtrlConfig* a = o->mutable_ftrl();
      RETURN_IF_ERROR(CheckRange(a, &FtrlConfig::has_initial_accumulator_value,
                                 &FtrlConfig::initial_accumulator_value,
                                 &FtrlConfig::set_initial_accumulator_value, 0.1f, 0, kBig, true,
                                 source, "optimizer.ftrl.initial_accumulator_value"));
      if (!(a->l1() >= 0 && a->l2() >= 0 && a->beta() >= 0) || !std::isfinite(a->l1()) ||
          !std::isfinite(a->l2()) || !std::isfinite(a->beta())) {
        return FieldError(source, "optimizer.ftrl", "expected l1, l2 and beta >= 0");
      }
      if (!(a->initial_accumulator_value() > 0 || a->beta() > 0)) {
        return FieldError(source, "optimizer.ftrl",
                          "initial_accumulator_value or beta must be positive");
      }
      break;
    }
    default:
      return FieldError(source, "optimizer", "unknown optimizer");
  }
  LearningRateSchedule* s = o->mutable_schedule();
  if (s->warmup_steps() < 0 || s->decay_steps() < 0) {
    return FieldError(source, "optimizer.schedule", "expected warmup_steps, decay_steps >= 0");
  }
  switch (s->kind()) {
    case LearningRateSchedule::CONSTANT:
      break;
    case LearningRateSchedule::STEP:
      if (s->decay_steps() == 0) {
        return FieldError(source, "optimizer.schedule.decay_steps",
                          "STEP needs the steps between decays (> 0)");
      }
      RETURN_IF_ERROR(CheckRange(s, &LearningRateSchedule::has_decay_rate,
                                 &LearningRateSchedule::decay_rate,
                                 &LearningRateSchedule::set_decay_rate, 0.1f, 0, 1, true, source,
                                 "optimizer.schedule.decay_rate"));
      break;
    case LearningRateSchedule::COSINE:
      if (!(s->min_learning_rate_ratio() >= 0 && s->min_learning_rate_ratio() <= 1)) {
        return FieldError(source, "optimizer.schedule.min_learning_rate_ratio",
                          "expected a value in [0, 1]");
      }
      if (s->decay_steps() == 0 && max_steps == kUntilStopped) {
        return FieldError(source, "optimizer.schedule",
                          "COSINE needs decay_steps in a run without max_steps");
      }
      if (s->decay_steps() == 0 && s->warmup_steps() >= max_steps) {
        return FieldError(source, "optimizer.schedule",
                          "COSINE needs decay_steps, or warmup_steps < max_steps");
      }
      break;
    default:
      return FieldError(source, "optimizer.schedule.kind", "expected CONSTANT, STEP or COSINE");
  }
  if (o->base_batch_size() < 0) {
    return FieldError(source, "optimizer.base_batch_size", "expected >= 0 (0 = no scaling)");
  }
  if (!(o->clip_value() >= 0) || !std::isfinite(o->clip_value())) {
    return FieldError(source, "optimizer.clip_value", "expected >= 0 (0 = off)");
  }
  if (!(o->clip_global_norm() >= 0) || !std::isfinite(o->clip_global_norm())) {
    return FieldError(source, "optimizer.clip_global_norm", "expected >= 0 (0 = off)");
  }
  if (!(o->max_gradient_norm() >= 0) || !std::isfinite(o->max_gradient_norm())) {
    return FieldError(source, "optimizer.max_gradient_norm", "expected >= 0 (0 = off)");
  }
  if (!(o->max_relative_gradient_norm() >= 0) ||
      !std::isfinite(o->max_relative_gradient_norm())) {
    return FieldError(source, "optimizer.max_relative_gradient_norm", "expected >= 0 (0 = off)");
  }
  if (o->max_relative_gradient_norm() > 0 && o->max_gradient_norm() == 0) {
    return FieldError(source, "optimizer.max_relative_gradient_norm",
                      "needs optimizer.max_gradient_norm > 0 too: the floor of a variable whose "
                      "values are zero (a bias at the start), whose every gradient would be "
                      "refused");
  }
  return absl::OkStatus();
}

namespace {

uint64_t Fnv1a(absl::string_view bytes, uint64_t h = 1469598103934665603ULL) {
  for (unsigned char ch : bytes) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace

uint64_t ConfigFingerprint(const TrainingConfig& config) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    config.SerializeToCodedStream(&out);
  }
  return Fnv1a(bytes);
}

uint64_t RunFingerprint(const TrainingConfig& config, const std::vector<VariableSpec>& variables) {
  uint64_t h = ConfigFingerprint(config);
  if (!config.model().has_external()) return h;
  for (const VariableSpec& v : variables) {
    // Length-prefixed name, rank, dims: no two lists read the same.
    std::string bytes = absl::StrCat(v.name.size(), ":", v.name, "/", v.shape.size());
    for (int64_t d : v.shape) absl::StrAppend(&bytes, ",", d);
    h = Fnv1a(bytes + ";", h);
  }
  return h;
}

bool IsSyncMode(const TrainingConfig& config) { return !config.has_async(); }

std::string StepText(int64_t step, int64_t max_steps) {
  return RunsUntilStopped(max_steps) ? absl::StrCat(step) : absl::StrCat(step, "/", max_steps);
}

absl::Duration StopSaveTimeout(const TrainingConfig& config) {
  const CheckpointConfig& c = config.checkpoint();
  if (c.dir().empty() || c.stop_save_seconds() < 0) return absl::ZeroDuration();
  return absl::Seconds(c.stop_save_seconds() == 0 ? 20 : c.stop_save_seconds());
}

std::string OptimizerKindName(const OptimizerConfig& config) {
  switch (config.kind_case()) {
    case OptimizerConfig::kMomentum:
      return "momentum";
    case OptimizerConfig::kAdagrad:
      return "adagrad";
    case OptimizerConfig::kAdam:
      return "adam";
    case OptimizerConfig::kAdamw:
      return "adamw";
    case OptimizerConfig::kFtrl:
      return "ftrl";
    case OptimizerConfig::kSgd:
    case OptimizerConfig::KIND_NOT_SET:
      break;
  }
  return "sgd";
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
