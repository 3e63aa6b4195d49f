#include "tools/run_report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/storage/env.h"

namespace pstrain {

std::string FinishedLines(const nlohmann::json& j, const std::string& output_dir) {
  if (!j.is_object() || !j.contains("global_step") || !j["global_step"].is_number()) return "";
  auto number = [&j](const char* key) {
    return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
  };
  const bool has_auc = j.contains("eval_auc") && j["eval_auc"].is_number();
  const bool has_accuracy = j.contains("eval_accuracy") && j["eval_accuracy"].is_number();
  const std::string held_out =
      has_auc        ? absl::StrFormat("held-out AUC %.4f, log loss %.4f (accuracy %.4f)",
                                       number("eval_auc"), number("eval_log_loss"),
                                       number("eval_accuracy"))
      : has_accuracy ? absl::StrFormat("held-out accuracy %.4f, loss %.4f",
                                       number("eval_accuracy"), number("eval_loss"))
                     : absl::StrFormat("no held-out evaluation, train loss %.4f",
                                       number("train_loss"));
  const std::string model = JoinPath(output_dir, "model_final.pst");
  std::string out = absl::StrFormat(
      "pstrain launch: finished: step %d, %s, %.1f s of training, %.0f examples/s\n",
      static_cast<int64_t>(number("global_step")), held_out, number("train_seconds"),
      number("examples_per_sec"));
  absl::StrAppend(&out, "pstrain launch: model in ", model, " (pstrain checkpoint export ", model,
                  " --format=safetensors --out=DIR)\n");
  // Where the workers' time went, from their reports (summary.json).
  const nlohmann::json split = j.value("step_time_ms", nlohmann::json::object());
  const char* kPhases[] = {"pull", "data", "compute", "push"};
  double ms[4] = {0, 0, 0, 0}, total = 0;
  for (int i = 0; i < 4; ++i) {
    if (split.is_object() && split.contains(kPhases[i]) && split[kPhases[i]].is_number()) {
      ms[i] = split[kPhases[i]].get<double>();
      total += ms[i];
    }
  }
  if (total > 0) {
    absl::StrAppend(&out, "pstrain launch: a worker's step, on average:");
    for (int i = 0; i < 4; ++i) {
      absl::StrAppendFormat(&out, " %s %.2f ms (%.0f%%)%s", kPhases[i], ms[i],
                            100.0 * ms[i] / total, i < 3 ? "," : "\n");
    }
  }
  return out;
}

}  // namespace pstrain
