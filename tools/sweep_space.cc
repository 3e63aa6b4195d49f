#include "tools/sweep_space.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/base/status_macros.h"
#include "common/cluster/config.h"
#include "common/storage/env.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace pstrain {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr int kDefaultMaxTrials = 100;

// The first error with its position (protobuf's lines are 0-based).
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!text_.empty()) return;
    text_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// The leaf field at dotted `path` of `root`'s type, or an error naming the
// part that is not a field (or not a message to go into).
absl::StatusOr<const FieldDescriptor*> FindField(const Descriptor* root, const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("a parameter has no field");
  const Descriptor* d = root;
  const FieldDescriptor* f = nullptr;
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    if (d == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", parts[i - 1], " is not a message"));
    }
    f = d->FindFieldByName(parts[i]);
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", d->name(), " has no field \"", parts[i], "\""));
    }
    d = f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()
            ? f->message_type()
            : nullptr;
  }
  return f;
}

bool IsInteger(const FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return true;
    default:
      return false;
  }
}

bool IsNumber(const FieldDescriptor* f) {
  return IsInteger(f) || f->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT ||
         f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE;
}

// A number as the field takes it: whole for an integer field.
absl::StatusOr<std::string> NumberText(const FieldDescriptor* f, const std::string& path,
                                       double v) {
  if (!std::isfinite(v)) return absl::InvalidArgumentError(absl::StrCat(path, ": ", v));
  if (IsInteger(f)) {
    if (v != std::floor(v) || std::fabs(v) > 9.0e15) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", v, " is not a whole number (the field is an integer)"));
    }
    return absl::StrCat(static_cast<int64_t>(v));
  }
  // The shortest text that reads back as the same double: 0.003, not
  // 0.0030000000000000001.
  for (int digits = 1; digits < 17; ++digits) {
    std::string text = absl::StrFormat("%.*g", digits, v);
    if (std::strtod(text.c_str(), nullptr) == v) return text;
  }
  return absl::StrFormat("%.17g", v);
}

// Every value of one parameter for a grid, as text.
absl::StatusOr<std::vector<std::string>> GridValues(const SweepParameter& p,
                                                    const FieldDescriptor* f) {
  std::vector<std::string> out;
  switch (p.space_case()) {
    case SweepParameter::kValues:
      for (double v : p.values().value()) {
        ASSIGN_OR_RETURN(std::string t, NumberText(f, p.field(), v));
        out.push_back(t);
      }
      break;
    case SweepParameter::kChoices:
      out.assign(p.choices().choice().begin(), p.choices().choice().end());
      break;
    case SweepParameter::kRange: {
      const SweepRange& r = p.range();
      if (r.count() < 2) {
        return absl::InvalidArgumentError(
            absl::StrCat(p.field(), ": range.count: expected at least 2 values for a grid"));
      }
      for (int i = 0; i < r.count(); ++i) {
        const double t = static_cast<double>(i) / (r.count() - 1);
        double v = r.log()
                       ? std::exp(std::log(r.min()) + t * (std::log(r.max()) - std::log(r.min())))
                       : r.min() + t * (r.max() - r.min());
        if (i == r.count() - 1) v = r.max();  // exactly, not exp(log(max))
        if (IsInteger(f)) v = std::round(v);
        ASSIGN_OR_RETURN(std::string s, NumberText(f, p.field(), v));
        if (out.empty() || out.back() != s) out.push_back(s);  // integers may repeat
      }
      break;
    }
    case SweepParameter::SPACE_NOT_SET:
      break;
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(p.field(), ": no values (give values, choices or a range)"));
  }
  return out;
}

// One random value of a parameter: a choice or value uniformly, or a
// point of the range (on the log scale where it says so).
absl::StatusOr<std::string> DrawValue(const SweepParameter& p, const FieldDescriptor* f,
                                      std::mt19937_64* rng) {
  if (p.space_case() != SweepParameter::kRange) {
    ASSIGN_OR_RETURN(std::vector<std::string> all, GridValues(p, f));
    std::uniform_int_distribution<size_t> pick(0, all.size() - 1);
    return all[pick(*rng)];
  }
  const SweepRange& r = p.range();
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double t = u(*rng);
  double v = r.log() ? std::exp(std::log(r.min()) + t * (std::log(r.max()) - std::log(r.min())))
                     : r.min() + t * (r.max() - r.min());
  if (IsInteger(f)) v = std::round(v);
  return NumberText(f, p.field(), v);
}

absl::Status CheckParameter(const SweepParameter& p, const FieldDescriptor* f) {
  if (p.space_case() == SweepParameter::SPACE_NOT_SET) {
    return absl::InvalidArgumentError(
        absl::StrCat(p.field(), ": no values (give values, choices or a range)"));
  }
  if ((p.has_values() || p.has_range()) && (!IsNumber(f) || f->is_repeated())) {
    return absl::InvalidArgumentError(absl::StrCat(
        p.field(), ": values and range are for a number field; this one is ",
        f->is_repeated() ? "a list" : f->cpp_type_name(), ": give choices"));
  }
  if (p.has_range()) {
    const SweepRange& r = p.range();
    if (!std::isfinite(r.min()) || !std::isfinite(r.max()) || r.min() > r.max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(p.field(), ": range: expected min <= max, got ", r.min(), "..", r.max()));
    }
    if (r.log() && r.min() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(p.field(), ": range: a log scale needs min > 0"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SetConfigField(TrainingConfig* config, const std::string& path,
                            const std::string& value) {
  ASSIGN_OR_RETURN(const FieldDescriptor* leaf, FindField(TrainingConfig::descriptor(), path));
  // Down to the leaf's message, creating (and choosing) on the way.
  Message* m = config;
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(parts[i]);
    m = m->GetReflection()->MutableMessage(m, f);
  }
  m->GetReflection()->ClearField(m, leaf);
  std::string text;
  if (leaf->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !leaf->is_repeated()) {
    text = absl::StrCat(leaf->name(), " { ", value, " }");
  } else if (leaf->is_repeated()) {
    const absl::string_view v = absl::StripAsciiWhitespace(value);
    text = absl::StrCat(leaf->name(), ": ", absl::StartsWith(v, "[") ? std::string(v)
                                                                    : absl::StrCat("[", v, "]"));
  } else if (leaf->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
    text = absl::StrCat(leaf->name(), ": \"", absl::CEscape(value), "\"");
  } else {
    text = absl::StrCat(leaf->name(), ": ", value);
  }
  google::protobuf::TextFormat::Parser parser;
  FirstError error;
  parser.RecordErrorsTo(&error);
  if (!parser.MergeFromString(text, m)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": \"", value, "\" is not a value of this ", leaf->cpp_type_name(), " field",
        error.text().empty() ? "" : absl::StrCat(" (", error.text(), ")")));
  }
  return absl::OkStatus();
}

absl::StatusOr<SweepSpace> LoadSweepSpace(const std::string& path) {
  Env* env = Env::Default();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("sweep file ", path, ": not a file"));
  }
  ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  SweepSpace space;
  google::protobuf::TextFormat::Parser parser;
  FirstError error;
  parser.RecordErrorsTo(&error);
  if (!parser.ParseFromString(text, &space.sweep)) {
    return absl::InvalidArgumentError(absl::StrCat("sweep file ", path, ":", error.text()));
  }
  SweepConfig& s = space.sweep;
  auto field_error = [&path](const std::string& field, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("sweep file ", path, ": ", field, ": ", what));
  };
  if (s.base_config().empty()) return field_error("base_config", "required");
  if (s.search().empty()) s.set_search("grid");
  if (s.search() != "grid" && s.search() != "random") {
    return field_error("search", absl::StrCat("expected grid or random, got \"", s.search(), "\""));
  }
  if (s.search() == "random" && (s.trials() < 1)) {
    return field_error("trials", "random search needs trials >= 1");
  }
  if (s.search() == "grid" && s.trials() != 0) {
    return field_error("trials", "only for search: \"random\" (a grid runs every combination)");
  }
  if (s.metric().empty()) s.set_metric("accuracy");
  if (s.metric() != "accuracy" && s.metric() != "auc" && s.metric() != "loss") {
    return field_error("metric",
                       absl::StrCat("expected accuracy, auc or loss, got \"", s.metric(), "\""));
  }
  if (s.max_trials() < 0) return field_error("max_trials", "negative");
  if (s.max_trials() == 0) s.set_max_trials(kDefaultMaxTrials);
  if (s.parameters().empty()) return field_error("parameters", "the space is empty");
  if (s.has_early_stopping()) {
    SweepEarlyStopping* e = s.mutable_early_stopping();
    if (e->min_steps() < 1) return field_error("early_stopping.min_steps", "expected >= 1");
    if (e->reduction() == 0) e->set_reduction(3);
    if (e->reduction() < 2 || e->reduction() > 100) {
      return field_error("early_stopping.reduction", "expected 2..100 (0 means 3)");
    }
  }
  for (const SweepParameter& p : s.parameters()) {
    auto f = FindField(TrainingConfig::descriptor(), p.field());
    if (!f.ok()) return field_error("parameters", std::string(f.status().message()));
    if (absl::Status st = CheckParameter(p, *f); !st.ok()) {
      return field_error("parameters", std::string(st.message()));
    }
  }
  space.base_path = s.base_config()[0] == '/' ? s.base_config()
                                             : JoinPath(Dirname(path), s.base_config());
  // Read once: checked whole (its errors name its lines), then kept as
  // written.
  ASSIGN_OR_RETURN(std::string base_text, env->ReadFile(space.base_path));
  RETURN_IF_ERROR(ParseTrainingConfig(base_text, space.base_path).status());
  if (!google::protobuf::TextFormat::ParseFromString(base_text, &space.base)) {
    return absl::InvalidArgumentError(absl::StrCat("training config ", space.base_path));
  }
  return space;
}

absl::StatusOr<std::vector<SweepTrial>> ExpandSweep(const SweepSpace& space) {
  const SweepConfig& s = space.sweep;
  std::vector<const FieldDescriptor*> fields;
  for (const SweepParameter& p : s.parameters()) {
    ASSIGN_OR_RETURN(const FieldDescriptor* f, FindField(TrainingConfig::descriptor(), p.field()));
    fields.push_back(f);
  }
  // Each trial's values, by parameter.
  std::vector<std::vector<std::string>> assignments;
  if (s.search() == "grid") {
    std::vector<std::vector<std::string>> grid;
    int64_t total = 1;
    for (int i = 0; i < s.parameters_size(); ++i) {
      ASSIGN_OR_RETURN(std::vector<std::string> values, GridValues(s.parameters(i), fields[i]));
      total *= static_cast<int64_t>(values.size());
      if (total > s.max_trials()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the grid has more than max_trials (", s.max_trials(), ") trials at parameter ",
            s.parameters(i).field(), ": raise max_trials, or search: \"random\""));
      }
      grid.push_back(std::move(values));
    }
    for (int64_t k = 0; k < total; ++k) {
      std::vector<std::string> one(grid.size());
      int64_t rest = k;
      for (int i = static_cast<int>(grid.size()) - 1; i >= 0; --i) {
        one[i] = grid[i][rest % static_cast<int64_t>(grid[i].size())];
        rest /= static_cast<int64_t>(grid[i].size());
      }
      assignments.push_back(std::move(one));
    }
  } else {
    if (s.trials() > s.max_trials()) {
      return absl::InvalidArgumentError(absl::StrCat("trials (", s.trials(),
                                                     ") is more than max_trials (", s.max_trials(),
                                                     ")"));
    }
    std::mt19937_64 rng(s.seed());
    for (int k = 0; k < s.trials(); ++k) {
      std::vector<std::string> one;
      for (int i = 0; i < s.parameters_size(); ++i) {
        ASSIGN_OR_RETURN(std::string v, DrawValue(s.parameters(i), fields[i], &rng));
        one.push_back(std::move(v));
      }
      assignments.push_back(std::move(one));
    }
  }
  std::vector<SweepTrial> trials;
  for (size_t k = 0; k < assignments.size(); ++k) {
    SweepTrial t;
    t.index = static_cast<int>(k);
    t.config = space.base;
    for (int i = 0; i < s.parameters_size(); ++i) {
      const std::string& field = s.parameters(i).field();
      RETURN_IF_ERROR(SetConfigField(&t.config, field, assignments[k][i]));
      t.params.emplace_back(field, assignments[k][i]);
    }
    // Checked as pstrain launch checks it: the ranges, and what goes together.
    std::string text;
    google::protobuf::TextFormat::PrintToString(t.config, &text);
    std::vector<std::string> named;
    for (const auto& [field, value] : t.params) named.push_back(field + "=" + value);
    const std::string source = absl::StrCat("trial ", k, " (", absl::StrJoin(named, ", "), ")");
    RETURN_IF_ERROR(ParseTrainingConfig(text, source).status());
    trials.push_back(std::move(t));
  }
  return trials;
}

std::string TrialParamsText(const std::vector<std::pair<std::string, std::string>>& params) {
  std::vector<std::string> parts;
  for (const auto& [field, value] : params) parts.push_back(field + "=" + value);
  return absl::StrJoin(parts, ", ");
}

TrainingConfig TrialConfig(const SweepTrial& trial, const SweepConfig& sweep,
                           const std::string& dir) {
  TrainingConfig c = trial.config;
  if (sweep.early_stopping().min_steps() > 0) {
    c.set_eval_every_steps(sweep.early_stopping().min_steps());
    // A trial stopped at a rung is stopped for being worse: no save first.
    if (!c.checkpoint().dir().empty()) c.mutable_checkpoint()->set_stop_save_seconds(-1);
  }
  c.set_output_dir(dir);
  if (!c.checkpoint().dir().empty()) c.mutable_checkpoint()->set_dir(JoinPath(dir, "checkpoints"));
  if (!c.checkpoint().serving_dir().empty()) {
    c.mutable_checkpoint()->set_serving_dir(JoinPath(dir, "serving"));
  }
  return c;
}

SweepMetric MetricOf(const SweepConfig& sweep) {
  if (sweep.metric() == "auc") return {"auc", "eval_auc", true};
  if (sweep.metric() == "loss") return {"loss", "eval_loss", false};
  return {"accuracy", "eval_accuracy", true};
}

SweepRungs::SweepRungs(const SweepEarlyStopping& early, int64_t max_steps, bool higher_is_better)
    : reduction_(early.reduction() > 1 ? early.reduction() : 3),
      higher_is_better_(higher_is_better) {
  for (int64_t step = early.min_steps(); step > 0 && step < max_steps; step *= reduction_) {
    steps_.push_back(step);
    if (step > max_steps / reduction_) break;
  }
  values_.resize(steps_.size());
}

double SweepRungs::Cutoff(int k) const {
  std::vector<double> v = values_[k];
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = (1.0 - 1.0 / reduction_) * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const double cut =
      lo + 1 < v.size() ? v[lo] + (pos - static_cast<double>(lo)) * (v[lo + 1] - v[lo]) : v[lo];
  return higher_is_better_ ? cut : -cut;
}

bool SweepRungs::Report(int k, double value) {
  if (k < 0 || k >= static_cast<int>(values_.size())) return true;
  values_[k].push_back(higher_is_better_ ? value : -value);
  const double cutoff = Cutoff(k);
  return higher_is_better_ ? value >= cutoff : value <= cutoff;
}

}  // namespace pstrain
