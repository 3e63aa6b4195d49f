#include "common/client/eval_report.h"

#include <cmath>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace pstrain {

absl::Status CheckEvalReport(const ProgressReport& report) {
  if (report.eval_size() == 0) return absl::OkStatus();
  if (report.eval_size() > kMaxEvalMetrics) {
    return absl::InvalidArgumentError(absl::StrCat("an evaluation of ", report.eval_size(),
                                                   " metrics; at most ", kMaxEvalMetrics));
  }
  if (report.eval_step() < 0 || report.eval_examples() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("an evaluation at step ", report.eval_step(), " of ", report.eval_examples(),
                     " examples: both must be >= 0"));
  }
  for (int i = 0; i < report.eval_size(); ++i) {
    const std::string& name = report.eval(i).name();
    bool ok = !name.empty() && name.size() <= static_cast<size_t>(kMaxEvalMetricName) &&
              !absl::ascii_isdigit(static_cast<unsigned char>(name[0]));
    for (char c : name) ok = ok && (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_');
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "evaluation metric name \"", absl::CHexEscape(name.substr(0, kMaxEvalMetricName)),
          "\": expected 1 to ", kMaxEvalMetricName,
          " letters, digits and underscores, not starting with a digit"));
    }
    if (!std::isfinite(report.eval(i).value())) {
      return absl::InvalidArgumentError(absl::StrCat("evaluation metric ", name, ": ",
                                                     report.eval(i).value(), " is not finite"));
    }
    for (int j = 0; j < i; ++j) {
      if (report.eval(j).name() == name) {
        return absl::InvalidArgumentError(
            absl::StrCat("evaluation metric ", name, " given twice"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace pstrain
