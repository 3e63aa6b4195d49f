#include "tools/sweep.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "common/cluster/cluster_spec.h"
#include "common/observability/event_writer.h"
#include "common/storage/env.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "nlohmann/json.hpp"
#include "proto/sweep.pb.h"
#include "tools/python_plot.h"
#include "tools/sweep_kubernetes.h"
#include "tools/sweep_plot_script.h"
#include "tools/sweep_space.h"
#include "tools/trial_launcher.h"

namespace pstrain {
namespace {

constexpr char kStoppedEarly[] = "stopped early";

// The longest a stopped trial's launch may take to save and stop (its
// chief's checkpoint.stop_save_seconds, 20 s by default, and 10 s more).
constexpr absl::Duration kTrialStopGrace = absl::Seconds(40);

std::string TrialDir(const SweepOptions& o, int index) { return TrialDirectory(o.out_dir, index); }

nlohmann::json ResultJson(const TrialResult& r) {
  nlohmann::json params = nlohmann::json::array();
  for (const auto& [field, value] : r.params) params.push_back({field, value});
  return {{"trial", r.index},
          {"params", params},
          {"state", r.state},
          {"error", r.error},
          {"metric", r.metric ? nlohmann::json(*r.metric) : nlohmann::json()},
          {"accuracy", r.accuracy},
          {"loss", r.loss},
          {"auc", r.auc ? nlohmann::json(*r.auc) : nlohmann::json()},
          {"steps", r.steps},
          {"examples_per_sec", r.examples_per_sec},
          {"seconds", r.seconds},
          {"rungs", r.rung_values}};
}

// `key` of object `j` where it is a number; absent otherwise (missing, or
// null: a diverged trial's NaN is written as null).
std::optional<double> NumberAt(const nlohmann::json& j, const std::string& key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? std::optional<double>(it->get<double>()) : std::nullopt;
}

// A finished trial of an earlier sweep in the same directory, or nullopt
// (none, not finished, unreadable); an error when it ran other values.
absl::StatusOr<std::optional<TrialResult>> EarlierResult(const SweepOptions& o,
                                                         const SweepTrial& trial) {
  auto text = Env::Default()->ReadFile(JoinPath(TrialDir(o, trial.index), "trial.json"));
  if (!text.ok()) return std::optional<TrialResult>();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j["params"].is_array()) return std::optional<TrialResult>();
  TrialResult r;
  r.index = trial.index;
  r.params = trial.params;
  std::vector<std::pair<std::string, std::string>> ran;
  for (const auto& p : j["params"]) {
    if (p.is_array() && p.size() == 2 && p[0].is_string() && p[1].is_string()) {
      ran.emplace_back(p[0].get<std::string>(), p[1].get<std::string>());
    }
  }
  if (ran != trial.params) {
    return absl::FailedPreconditionError(
        absl::StrCat(TrialDir(o, trial.index), " ran ", TrialParamsText(ran), ", not ",
                     TrialParamsText(trial.params), ": a changed space needs an --out of its own"));
  }
  r.state = j["state"].is_string() ? j["state"].get<std::string>() : "";
  if (r.state != "finished" && r.state != kStoppedEarly) return std::optional<TrialResult>();
  if (j["rungs"].is_array()) {
    for (const auto& v : j["rungs"]) {
      if (v.is_number()) r.rung_values.push_back(v.get<double>());
    }
  }
  r.metric = NumberAt(j, "metric");
  r.auc = NumberAt(j, "auc");
  r.accuracy = NumberAt(j, "accuracy").value_or(0);
  r.loss = NumberAt(j, "loss").value_or(0);
  r.steps = static_cast<int64_t>(NumberAt(j, "steps").value_or(0));
  r.examples_per_sec = NumberAt(j, "examples_per_sec").value_or(0);
  r.seconds = NumberAt(j, "seconds").value_or(0);
  return std::optional<TrialResult>(r);
}

// A finished launch's summary.json read into `r`.
void ReadSummary(const std::string& dir, const SweepMetric& metric, TrialResult* r) {
  auto text = Env::Default()->ReadFile(JoinPath(dir, "summary.json"));
  nlohmann::json j = text.ok() ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
  if (!j.is_object()) {
    r->state = "failed";
    r->error = absl::StrCat("no readable summary.json in ", dir);
    return;
  }
  r->accuracy = NumberAt(j, "eval_accuracy").value_or(0);
  r->loss = NumberAt(j, "eval_loss").value_or(0);
  r->auc = NumberAt(j, "eval_auc");
  r->steps = static_cast<int64_t>(NumberAt(j, "global_step").value_or(0));
  r->examples_per_sec = NumberAt(j, "examples_per_sec").value_or(0);
  // A collected run's time is its training's (a run's own is its launch's).
  if (r->seconds == 0) r->seconds = NumberAt(j, "train_seconds").value_or(0);
  r->metric = NumberAt(j, metric.summary_key);
  if (r->metric.has_value() && !std::isfinite(*r->metric)) r->metric.reset();  // diverged
  if (!r->metric.has_value()) {
    r->state = "failed";
    r->error = absl::StrCat("the run has no ", metric.name, " (summary.json ", metric.summary_key,
                            " is null)");
  }
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string quoted = "\"";
  for (char c : s) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

// Best first: the finished trials by their metric, then those stopped
// early by their last one, then the rest (failed, stopped); among equals
// by trial.
std::vector<TrialResult> Ranked(std::vector<TrialResult> results, const SweepMetric& metric) {
  auto group = [](const TrialResult& r) {
    if (!r.metric.has_value()) return 2;
    return r.state == "finished" ? 0 : r.state == kStoppedEarly ? 1 : 2;
  };
  std::stable_sort(results.begin(), results.end(),
                   [&metric, &group](const TrialResult& a, const TrialResult& b) {
                     if (group(a) != group(b)) return group(a) < group(b);
                     if (group(a) == 2 || *a.metric == *b.metric) return a.index < b.index;
                     return metric.higher_is_better ? *a.metric > *b.metric : *a.metric < *b.metric;
                   });
  return results;
}

absl::Status WriteCsv(const std::string& path, const std::vector<TrialResult>& ranked,
                      const SweepConfig& sweep, const SweepMetric& metric) {
  std::string csv = "trial";
  for (const SweepParameter& p : sweep.parameters()) {
    absl::StrAppend(&csv, ",", CsvField(p.field()));
  }
  absl::StrAppend(&csv, ",state,metric,accuracy,loss,auc,steps,examples_per_sec,seconds,error\n");
  for (const TrialResult& r : ranked) {
    absl::StrAppend(&csv, r.index);
    for (const auto& [field, value] : r.params) absl::StrAppend(&csv, ",", CsvField(value));
    absl::StrAppend(&csv, ",", r.state, ",", r.metric ? absl::StrFormat("%.6g", *r.metric) : "",
                    ",", r.state == "finished" ? absl::StrFormat("%.6g", r.accuracy) : "", ",",
                    r.state == "finished" ? absl::StrFormat("%.6g", r.loss) : "", ",",
                    r.auc ? absl::StrFormat("%.6g", *r.auc) : "", ",", r.steps, ",",
                    absl::StrFormat("%.1f", r.examples_per_sec), ",",
                    absl::StrFormat("%.1f", r.seconds), ",", CsvField(r.error), "\n");
  }
  return WriteFileAtomically(Env::Default(), path, csv);
}

void PrintTable(std::ostream& out, const std::vector<TrialResult>& ranked, const SweepConfig& sweep,
                const SweepMetric& metric) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"trial"};
  for (const SweepParameter& p : sweep.parameters()) header.push_back(p.field());
  for (const char* h : {"", "steps", "examples/s", "seconds", "state"}) header.push_back(h);
  header[1 + sweep.parameters_size()] = metric.name;
  rows.push_back(header);
  for (const TrialResult& r : ranked) {
    std::vector<std::string> row = {absl::StrCat(r.index)};
    for (const auto& [field, value] : r.params) row.push_back(value);
    row.push_back(r.metric ? absl::StrFormat("%.4f", *r.metric) : "-");
    row.push_back(absl::StrCat(r.steps));
    row.push_back(absl::StrFormat("%.0f", r.examples_per_sec));
    row.push_back(absl::StrFormat("%.1f", r.seconds));
    row.push_back(r.state);
    rows.push_back(std::move(row));
  }
  std::vector<size_t> width(header.size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      absl::StrAppend(&line, c == 0 ? "" : "  ", row[c],
                      std::string(c + 1 < row.size() ? width[c] - row[c].size() : 0, ' '));
    }
    out << line << "\n";
  }
}

// TensorBoard's HParams dashboard: an event file of the sweep's own in a
// directory TensorBoard reads as a run.
constexpr char kHParamsFile[] = "events.out.tfevents.0.pstrain-sweep-hparams";

double NowSecs() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

std::string HParamsEvent(const std::string& tag, const HParamsPluginData& data) {
  TbEvent e;
  e.set_wall_time(NowSecs());
  TbValue* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_tensor()->set_dtype(1);  // DT_FLOAT, of shape [0]
  v->mutable_tensor()->mutable_tensor_shape()->add_dim();
  TbPluginData* plugin = v->mutable_metadata()->mutable_plugin_data();
  plugin->set_plugin_name("hparams");
  plugin->set_content(data.SerializeAsString());
  return TfRecord(e.SerializeAsString());
}

absl::Status WriteHParamsFile(const std::string& dir, const std::string& records) {
  TbEvent first;
  first.set_wall_time(NowSecs());
  first.set_file_version("brain.Event:2");
  RETURN_IF_ERROR(Env::Default()->CreateDirs(dir));
  return WriteFileAtomically(Env::Default(), JoinPath(dir, kHParamsFile),
                             TfRecord(first.SerializeAsString()) + records);
}

// A parameter's value as TensorBoard shows it: a number, a bool or text.
google::protobuf::Value HParamValue(const std::string& text) {
  google::protobuf::Value v;
  char* end = nullptr;
  const double d = std::strtod(text.c_str(), &end);
  if (!text.empty() && end == text.c_str() + text.size()) {
    v.set_number_value(d);
  } else if (text == "true" || text == "false") {
    v.set_bool_value(text == "true");
  } else {
    v.set_string_value(text);
  }
  return v;
}

// The sweep as an HParams experiment, in `out_dir`: each parameter with
// the values it takes, and the evaluation's metrics.
absl::Status WriteHParamsExperiment(const std::string& out_dir, const SweepConfig& sweep,
                                    const std::vector<SweepTrial>& trials) {
  HParamsPluginData data;
  HParamsExperiment* e = data.mutable_experiment();
  e->set_time_created_secs(NowSecs());
  for (int i = 0; i < sweep.parameters_size(); ++i) {
    HParamInfo* info = e->add_hparam_infos();
    info->set_name(sweep.parameters(i).field());
    std::vector<std::string> seen;
    int type = 0;
    for (const SweepTrial& t : trials) {
      const std::string& value = t.params[i].second;
      if (std::find(seen.begin(), seen.end(), value) != seen.end()) continue;
      seen.push_back(value);
      const google::protobuf::Value v = HParamValue(value);
      const int kind = v.has_number_value() ? 3 : v.has_bool_value() ? 2 : 1;
      type = type == 0 || type == kind ? kind : 1;  // mixed kinds: strings
      *info->mutable_domain_discrete()->add_values() = v;
    }
    info->set_type(type);
  }
  for (const char* tag : {"eval/accuracy", "eval/loss", "eval/auc"}) {
    if (std::string(tag) == "eval/auc" && MetricOf(sweep).name != "auc") continue;
    HParamsMetricInfo* m = e->add_metric_infos();
    m->mutable_name()->set_tag(tag);
    m->set_dataset_type(2);  // validation
  }
  return WriteHParamsFile(out_dir, HParamsEvent("_hparams_/experiment", data));
}

// Writes trial.json and the trial's HParams session, and says how it went.
void RecordTrial(const SweepOptions& o, const SweepMetric& metric, size_t total,
                 const TrialResult& r, std::ostream& out) {
  const std::string dir = TrialDir(o, r.index);
  // The trial as an HParams session, beside its chief's scalars.
  HParamsPluginData start, end;
  start.mutable_session_start_info()->set_group_name(absl::StrCat("trial-", r.index));
  start.mutable_session_start_info()->set_start_time_secs(NowSecs() - r.seconds);
  for (const auto& [field, value] : r.params) {
    (*start.mutable_session_start_info()->mutable_hparams())[field] = HParamValue(value);
  }
  end.mutable_session_end_info()->set_status(r.state == "finished" || r.state == kStoppedEarly ? 1
                                             : r.state == "failed"                             ? 2
                                                                                               : 0);
  end.mutable_session_end_info()->set_end_time_secs(NowSecs());
  if (absl::Status st = WriteHParamsFile(JoinPath(dir, "events"),
                                         HParamsEvent("_hparams_/session_start_info", start) +
                                             HParamsEvent("_hparams_/session_end_info", end));
      !st.ok()) {
    out << "trial " << r.index << ": " << st.message() << std::endl;
  }
  if (absl::Status st =
          WriteFileAtomically(Env::Default(), JoinPath(dir, "trial.json"), ResultJson(r).dump(2));
      !st.ok()) {
    out << "trial " << r.index << ": " << st.message() << std::endl;
  }
  out << "trial " << r.index << " (of " << total << ") " << r.state << " after "
      << absl::StrFormat("%.1f", r.seconds) << "s: "
      << ((r.state == "finished" || r.state == kStoppedEarly) && r.metric
              ? absl::StrFormat("%s %.4f at step %d", metric.name, *r.metric, r.steps)
              : absl::StrCat(r.error, " (log: ", JoinPath(dir, "launch.log"), ")"))
      << std::endl;
}

class SweepRunner {
 public:
  SweepRunner(const SweepOptions& o, const SweepSpace& space, TrialLauncher* launcher,
              int64_t max_steps, StopSignal* stop, std::ostream& out)
      : o_(o),
        space_(space),
        metric_(MetricOf(space.sweep)),
        rungs_(space.sweep.early_stopping(), max_steps, metric_.higher_is_better),
        launcher_(launcher),
        stop_(stop),
        out_(out) {}

  // Runs every trial not already finished; their results, by trial.
  std::vector<TrialResult> Run(const std::vector<SweepTrial>& trials,
                               std::map<int, TrialResult> done);

 private:
  struct Running {
    const SweepTrial* trial;
    std::unique_ptr<TrialRun> run;
    std::vector<double> rung_values;  // its metric at each rung reached
    bool stopped_early = false;
    int64_t events_bytes = -1;  // the event files' size when last read
  };
  // The trial's directory: its config, and nothing of an earlier attempt.
  absl::Status WriteTrial(const SweepTrial& trial);
  absl::StatusOr<Running> Start(const SweepTrial& trial);
  // The trials still to run, started until the launcher's capacity.
  void StartMore(const std::vector<SweepTrial>& trials, const std::vector<size_t>& todo,
                 size_t* next, std::vector<Running>* running, std::map<int, TrialResult>* done);
  // Early stopping: the trial's evaluations so far against the rungs it
  // passed; a trial below a rung's cutoff is told to stop.
  void CheckRungs(Running* r);
  TrialResult Finish(Running* r, int code);
  void Record(const TrialResult& r);

  const SweepOptions& o_;
  const SweepSpace& space_;
  const SweepMetric metric_;
  SweepRungs rungs_;
  TrialLauncher* const launcher_;
  StopSignal* const stop_;
  std::ostream& out_;
  size_t total_ = 0;
};

absl::Status SweepRunner::WriteTrial(const SweepTrial& trial) {
  const std::string dir = TrialDir(o_, trial.index);
  Env* env = Env::Default();
  RETURN_IF_ERROR(env->CreateDirs(dir));
  const TrainingConfig trial_config = TrialConfig(trial, space_.sweep, dir);
  std::string config;
  google::protobuf::TextFormat::PrintToString(trial_config, &config);
  RETURN_IF_ERROR(
      WriteFileAtomically(env, JoinPath(dir, "config.pbtxt"),
                          absl::StrCat("# pstrain sweep ", o_.sweep_file, ", trial ", trial.index,
                                       ": ", TrialParamsText(trial.params), "\n", config)));
  // An attempt starts from nothing: none of an earlier one's outcome,
  // model or checkpoints (a local launch's --overwrite would remove them;
  // a Slurm task's daemons would not).
  for (const char* name : {"trial.json", "launch.log", "summary.json", "model_final.pst"}) {
    (void)env->DeleteFile(JoinPath(dir, name));
  }
  const std::string& checkpoints = trial_config.checkpoint().dir();
  if (!checkpoints.empty() && env->IsDirectory(checkpoints)) {
    RETURN_IF_ERROR(DeleteRecursively(env, checkpoints));
  }
  // An earlier attempt's evaluations must not meet this one's rungs (the
  // launch's --overwrite removes them too, but only once it runs).
  const std::string events = JoinPath(dir, "events");
  for (const std::string& name : env->ListDir(events).value_or(std::vector<std::string>())) {
    (void)env->DeleteFile(JoinPath(events, name));
  }
  return absl::OkStatus();
}

absl::StatusOr<SweepRunner::Running> SweepRunner::Start(const SweepTrial& trial) {
  ASSIGN_OR_RETURN(std::unique_ptr<TrialRun> run, launcher_->Start(trial.index));
  out_ << "trial " << trial.index << " (of " << total_ << ") "
       << (run->running_since().has_value() ? "started" : "submitted") << ": "
       << TrialParamsText(trial.params) << " (" << TrialDir(o_, trial.index) << ")" << std::endl;
  return Running{&trial, std::move(run), {}, false, -1};
}

void SweepRunner::CheckRungs(Running* r) {
  const size_t next = r->rung_values.size();
  if (r->stopped_early || next >= rungs_.steps().size() ||
      rungs_.steps()[next] >= r->trial->config.max_steps()) {
    return;
  }
  // Read again only once the files have grown (a round is 100 ms; the
  // chief appends an evaluation every min_steps steps).
  Env* env = Env::Default();
  const std::string dir = JoinPath(TrialDir(o_, r->trial->index), "events");
  int64_t bytes = 0;
  for (const std::string& name : env->ListDir(dir).value_or(std::vector<std::string>())) {
    bytes += env->FileSize(JoinPath(dir, name)).value_or(0);
  }
  if (bytes == r->events_bytes) return;
  auto events = ReadScalarEvents(env, dir);
  if (!events.ok()) return;  // read again on the next round
  r->events_bytes = bytes;
  const std::string tag = "eval/" + metric_.name;
  for (size_t k = next; k < rungs_.steps().size(); ++k) {
    const int64_t rung = rungs_.steps()[k];
    if (rung >= r->trial->config.max_steps()) return;
    auto at = std::find_if(events->begin(), events->end(),
                           [&](const ScalarEvent& e) { return e.tag == tag && e.step >= rung; });
    if (at == events->end()) return;
    // A diverged trial (NaN) is the worst at any rung; it is not recorded.
    const bool finite = std::isfinite(at->value);
    if (finite) r->rung_values.push_back(at->value);
    if (finite && rungs_.Report(static_cast<int>(k), at->value)) continue;
    r->stopped_early = true;
    r->run->Terminate();
    out_ << "trial " << r->trial->index << " (of " << total_ << ") stopped at rung " << k
         << " (step " << rung << "): " << metric_.name << " "
         << absl::StrFormat("%.4f at step %d", at->value, at->step) << ", not in the top 1/"
         << rungs_.reduction() << " there (" << absl::StrFormat("%.4f", rungs_.Cutoff(k)) << ")"
         << std::endl;
    return;
  }
}

TrialResult SweepRunner::Finish(Running* r, int code) {
  TrialResult result;
  result.index = r->trial->index;
  result.params = r->trial->params;
  const std::optional<absl::Time> since = r->run->running_since();
  result.seconds = since.has_value() ? absl::ToDoubleSeconds(absl::Now() - *since) : 0;
  const std::string dir = TrialDir(o_, result.index);
  result.rung_values = r->rung_values;
  if (code == 0) {
    result.state = "finished";
    ReadSummary(dir, metric_, &result);
    return result;
  }
  // How far it trained (its last event) and, stopped early, its last
  // evaluation; a failed trial has no metric to rank by.
  result.state = r->stopped_early ? kStoppedEarly : "failed";
  if (!r->stopped_early) result.error = r->run->Error(code);
  auto events = ReadScalarEvents(Env::Default(), JoinPath(dir, "events"));
  for (const ScalarEvent& e : events.value_or(std::vector<ScalarEvent>())) {
    result.steps = std::max(result.steps, e.step);
    if (!r->stopped_early) continue;
    if (e.tag == "eval/" + metric_.name) result.metric = e.value;
    if (e.tag == "eval/accuracy") result.accuracy = e.value;
    if (e.tag == "eval/loss") result.loss = e.value;
    if (e.tag == "eval/auc") result.auc = e.value;
  }
  if (result.metric.has_value() && !std::isfinite(*result.metric)) result.metric.reset();
  return result;
}

void SweepRunner::Record(const TrialResult& r) { RecordTrial(o_, metric_, total_, r, out_); }

void SweepRunner::StartMore(const std::vector<SweepTrial>& trials, const std::vector<size_t>& todo,
                            size_t* next, std::vector<Running>* running,
                            std::map<int, TrialResult>* done) {
  while (running->size() < static_cast<size_t>(launcher_->capacity()) && *next < todo.size()) {
    const SweepTrial& t = trials[todo[(*next)++]];
    absl::StatusOr<Running> r = Start(t);
    if (!r.ok()) {
      TrialResult failed{t.index, t.params, "failed", std::string(r.status().message())};
      Record(failed);
      (*done)[t.index] = failed;
      continue;
    }
    running->push_back(std::move(*r));
  }
}

std::vector<TrialResult> SweepRunner::Run(const std::vector<SweepTrial>& trials,
                                          std::map<int, TrialResult> done) {
  total_ = trials.size();
  // The rungs as the trials done before left them.
  for (const auto& [index, r] : done) {
    for (size_t k = 0; k < r.rung_values.size(); ++k) {
      (void)rungs_.Report(static_cast<int>(k), r.rung_values[k]);
    }
  }
  // Every trial to run, its directory written before any starts.
  std::vector<size_t> todo;
  std::vector<int> indices;
  for (size_t i = 0; i < trials.size(); ++i) {
    const SweepTrial& t = trials[i];
    if (done.count(t.index) > 0) continue;
    if (absl::Status st = WriteTrial(t); !st.ok()) {
      TrialResult failed{t.index, t.params, "failed", std::string(st.message())};
      Record(failed);
      done[t.index] = failed;
      continue;
    }
    todo.push_back(i);
    indices.push_back(t.index);
  }
  if (absl::StatusOr<std::string> said = launcher_->Prepare(indices); !said.ok()) {
    for (size_t i : todo) {
      TrialResult failed{trials[i].index, trials[i].params, "failed",
                         std::string(said.status().message())};
      Record(failed);
      done[failed.index] = failed;
    }
    todo.clear();
  } else if (!said->empty()) {
    out_ << *said << std::endl;
  }
  std::vector<Running> running;
  size_t next = 0;
  absl::Time last_running = absl::Now();  // when a trial last ran (or the sweep began)
  while (next < todo.size() || !running.empty()) {
    if (stop_->stopped()) {
      // One stop each (the launches save first), then the grace, then kill.
      for (Running& r : running) r.run->Terminate();
      const absl::Time end = absl::Now() + kTrialStopGrace;
      for (Running& r : running) {
        const int code = r.run->Kill(std::max(end - absl::Now(), absl::ZeroDuration()));
        TrialResult result = Finish(&r, code);
        if (code != 0 && result.state != kStoppedEarly) {
          result.state = "stopped";
          result.error = stop_->reason();
        }
        Record(result);
        done[result.index] = result;
      }
      break;
    }
    StartMore(trials, todo, &next, &running, &done);
    launcher_->Refresh();
    for (Running& r : running) CheckRungs(&r);
    for (const Running& r : running) {
      if (r.run->running_since().has_value()) last_running = absl::Now();
    }
    for (size_t i = 0; i < running.size();) {
      Running& r = running[i];
      std::optional<int> code = r.run->Poll();
      // Running for longer than the timeout; or waiting to start while no
      // trial has run for that long (tasks Slurm never places, not tasks
      // queued behind the sweep's other trials).
      const std::optional<absl::Time> since = r.run->running_since();
      const bool late = !code.has_value() &&
                        ((since.has_value() && absl::Now() - *since > o_.trial_timeout) ||
                         (!since.has_value() && absl::Now() - last_running > o_.trial_timeout));
      if (late) code = r.run->Kill(kTrialStopGrace);
      if (!code.has_value()) {
        ++i;
        continue;
      }
      TrialResult result = Finish(&r, *code);
      if (late) {
        result.state = "failed";
        result.error = absl::StrCat("still running after --trial_timeout_s (",
                                    absl::FormatDuration(o_.trial_timeout), "): stopped");
      }
      Record(result);
      done[result.index] = result;
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    }
    stop_->WaitFor(absl::Milliseconds(100));
  }
  std::vector<TrialResult> results;
  for (auto& [index, r] : done) results.push_back(r);
  return results;
}

absl::StatusOr<ClusterSpec> TrialShape(const std::string& path) {
  ASSIGN_OR_RETURN(ClusterSpec spec, ClusterSpec::FromFile(path));
  for (const TaskId& t : spec.AllTasks()) {
    auto hp = ParseHostPort(spec.address(t.job, t.index));
    if (!hp.ok() || !IsLoopbackHost(hp->host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cluster_spec ", path, ": ", t.ToString(),
          " is not on loopback; a sweep runs its "
          "trials on this machine (the spec gives their shape, each trial its own free ports)"));
    }
  }
  return spec;
}

absl::Status Refusal(const std::string& why) { return absl::FailedPreconditionError(why); }

// Where the trials run: a Slurm job array, or launches on this machine.
absl::StatusOr<std::unique_ptr<TrialLauncher>> MakeLauncher(SweepOptions* o) {
  if (o->slurm) {
    ASSIGN_OR_RETURN(const std::string job, LiveSlurmArray(o->out_dir));
    if (!job.empty()) {
      return Refusal(absl::StrCat("--out ", o->out_dir, ": its Slurm job array ", job,
                                  " is still running (squeue -r -j ", job,
                                  "); wait for it or scancel it first"));
    }
    return SlurmTrials({o->out_dir, o->pstrain, o->bin_dir, o->num_ps, o->num_workers, o->parallel,
                        o->base_port, o->sbatch_args, o->sweep_file});
  }
  ASSIGN_OR_RETURN(ClusterSpec shape, TrialShape(o->cluster_spec));
  if (o->parallel <= 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    o->parallel = std::max(1, cores / std::max(1, shape.num_workers()));
  }
  return LocalTrials(
      {o->out_dir, o->pstrain, o->bin_dir, shape.num_ps(), shape.num_workers(), o->parallel});
}

// --collect: each trial's outcome from what its run left in its directory
// (copied back from where it ran).
std::vector<TrialResult> CollectTrials(const SweepOptions& o, const std::vector<SweepTrial>& trials,
                                       const SweepMetric& metric, std::ostream& out) {
  std::vector<TrialResult> results;
  for (const SweepTrial& t : trials) {
    TrialResult r;
    r.index = t.index;
    r.params = t.params;
    const std::string dir = TrialDir(o, t.index);
    if (Env::Default()->FileExists(JoinPath(dir, "summary.json"))) {
      r.state = "finished";
      ReadSummary(dir, metric, &r);
    } else {
      // Not (yet) finished: how far its events go.
      r.state = "unfinished";
      r.error =
          absl::StrCat("no summary.json in ", dir, ": still running, failed, or not copied back");
      auto events = ReadScalarEvents(Env::Default(), JoinPath(dir, "events"));
      for (const ScalarEvent& e : events.value_or(std::vector<ScalarEvent>())) {
        r.steps = std::max(r.steps, e.step);
      }
    }
    RecordTrial(o, metric, trials.size(), r, out);
    results.push_back(r);
  }
  return results;
}

// The ranked table, results.csv, sweep.png, the HParams experiment and
// best.pbtxt. Returns the sweep's exit status.
int ReportSweep(const SweepOptions& o, const SweepSpace& space,
                const std::vector<SweepTrial>& trials, const std::vector<TrialResult>& results,
                const SweepMetric& metric, const SweepRungs& rungs, std::ostream& out) {
  auto fail = [](const absl::Status& st) {
    std::cerr << "pstrain sweep: " << st.message() << "\n";
    return 2;
  };
  const std::vector<TrialResult> ranked = Ranked(results, metric);
  PrintTable(out, ranked, space.sweep, metric);
  if (!rungs.steps().empty()) {
    int64_t trained = 0, full_steps = 0;
    int stopped = 0;
    for (const TrialResult& r : ranked) {
      trained += r.steps;
      stopped += r.state == kStoppedEarly;
    }
    for (const SweepTrial& t : trials) full_steps += t.config.max_steps();
    out << "early stopping: " << stopped << " of " << ranked.size()
        << " trial(s) stopped at a rung; " << trained << " steps trained, "
        << absl::StrFormat("%.0f%%", full_steps > 0 ? 100.0 * trained / full_steps : 0.0)
        << " of the " << full_steps << " that every trial to its max_steps would take" << std::endl;
  }
  if (absl::Status st = WriteHParamsExperiment(o.out_dir, space.sweep, trials); !st.ok()) {
    return fail(st);
  }
  const std::string csv = JoinPath(o.out_dir, "results.csv");
  if (absl::Status st = WriteCsv(csv, ranked, space.sweep, metric); !st.ok()) return fail(st);
  out << "results: " << csv << std::endl;
  out << DrawWithPython(o.out_dir, "sweep_plot.py", kSweepPlotScript,
                        {csv, JoinPath(o.out_dir, "sweep.png"), metric.name},
                        JoinPath(o.out_dir, "sweep.png"))
      << std::endl;
  int failed = 0;
  for (const TrialResult& r : ranked) failed += r.state != "finished" && r.state != kStoppedEarly;
  if (!ranked.empty() && ranked.front().state == "finished" && ranked.front().metric) {
    const TrialResult& best = ranked.front();
    TrainingConfig config = space.base;
    for (const auto& [field, value] : best.params) (void)SetConfigField(&config, field, value);
    std::string text;
    google::protobuf::TextFormat::PrintToString(config, &text);
    const std::string path = JoinPath(o.out_dir, "best.pbtxt");
    if (absl::Status st = WriteFileAtomically(
            Env::Default(), path,
            absl::StrCat("# pstrain sweep ", o.sweep_file, ": the best trial, ", best.index, " (",
                         TrialParamsText(best.params), "): ", metric.name, " ",
                         absl::StrFormat("%.4f", *best.metric), "\n", text));
        !st.ok()) {
      return fail(st);
    }
    out << "best: trial " << best.index << " (" << TrialParamsText(best.params) << "), "
        << metric.name << " " << absl::StrFormat("%.4f", *best.metric) << "; its config: " << path
        << std::endl;
  }
  return failed > 0 ? 1 : 0;
}

}  // namespace

int RunSweep(const SweepOptions& options, StopSignal* stop, std::ostream& out) {
  SweepOptions o = options;
  auto fail = [](const absl::Status& st) {
    std::cerr << "pstrain sweep: " << st.message() << "\n";
    return 2;
  };
  absl::StatusOr<SweepSpace> space = LoadSweepSpace(o.sweep_file);
  if (!space.ok()) return fail(space.status());
  absl::StatusOr<std::vector<SweepTrial>> trials = ExpandSweep(*space);
  if (!trials.ok()) return fail(trials.status());
  const SweepMetric metric = MetricOf(space->sweep);
  int64_t max_steps = 0;
  for (const SweepTrial& t : *trials) max_steps = std::max(max_steps, t.config.max_steps());
  const SweepRungs rungs(space->sweep.early_stopping(), max_steps, metric.higher_is_better);
  if (o.kubernetes) {
    absl::StatusOr<std::string> said = WriteKubernetesTrials(o.kubernetes_options, *space, *trials);
    if (!said.ok()) return fail(said.status());
    out << *said;
    return 0;
  }
  if (o.collect) {
    if (!Env::Default()->IsDirectory(o.out_dir)) {
      return fail(Refusal(absl::StrCat("--collect: --out ", o.out_dir,
                                       " is not a directory (where the trials' directories were "
                                       "copied back)")));
    }
    out << "pstrain sweep: " << trials->size() << " trial(s) (" << space->sweep.search() << " over "
        << space->sweep.parameters_size() << " parameter(s)), collected from " << o.out_dir
        << "; ranked by " << metric.name << std::endl;
    return ReportSweep(o, *space, *trials, CollectTrials(o, *trials, metric, out), metric, rungs,
                       out);
  }
  absl::StatusOr<std::unique_ptr<TrialLauncher>> launcher = MakeLauncher(&o);
  if (!launcher.ok()) return fail(launcher.status());
  Env* env = Env::Default();
  std::map<int, TrialResult> done;
  if (env->IsDirectory(TrialDir(o, 0)) && !o.resume) {
    return fail(Refusal(absl::StrCat("--out ", o.out_dir,
                                     " holds an earlier sweep: --resume to run what it has not "
                                     "finished, or another --out")));
  }
  for (const SweepTrial& t : *trials) {
    if (!o.resume) break;
    absl::StatusOr<std::optional<TrialResult>> r = EarlierResult(o, t);
    if (!r.ok()) return fail(r.status());
    if (r->has_value()) done[t.index] = **r;
  }
  if (absl::Status st = env->CreateDirs(o.out_dir); !st.ok()) return fail(st);
  out << "pstrain sweep: " << trials->size() << " trial(s) (" << space->sweep.search() << " over "
      << space->sweep.parameters_size() << " parameter(s)), " << (*launcher)->Describe()
      << "; ranked by " << metric.name
      << (done.empty() ? "" : absl::StrCat("; ", done.size(), " finished before")) << std::endl;
  if (!rungs.steps().empty()) {
    out << "early stopping: rungs at step(s) " << absl::StrJoin(rungs.steps(), ", ")
        << "; the top 1/" << rungs.reduction() << " at each go on" << std::endl;
  }
  SweepRunner runner(o, *space, launcher->get(), max_steps, stop, out);
  const int code =
      ReportSweep(o, *space, *trials, runner.Run(*trials, std::move(done)), metric, rungs, out);
  if (stop->stopped()) return stop->exit_code() != 0 ? stop->exit_code() : 130;
  return code;
}

}  // namespace pstrain
