#include "worker/data/csv_reader.h"

#include <charconv>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace pstrain {
namespace {

absl::string_view Trim(absl::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Parses all of `s` (an optional '+' first) as a float: kFinite with the
// value in *out, kOther for a number that is not a finite float ("nan",
// "inf", 1e99), kNone for anything else.
enum class NumberKind { kNone, kFinite, kOther };
NumberKind ParseNumber(absl::string_view s, float* out) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return NumberKind::kNone;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  if (end != s.data() + s.size()) return NumberKind::kNone;
  if (ec == std::errc() && std::isfinite(*out)) return NumberKind::kFinite;
  return ec == std::errc() || ec == std::errc::result_out_of_range ? NumberKind::kOther
                                                                   : NumberKind::kNone;
}

bool ParseInt(absl::string_view s, int64_t* out) {
  if (s.empty()) return false;
  if (s.front() == '+') s.remove_prefix(1);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

std::string Quote(absl::string_view s) {
  return absl::StrCat("\"", s.size() > 40 ? absl::StrCat(s.substr(0, 40), "...") : s, "\"");
}

}  // namespace

absl::StatusOr<Dataset> LoadCsvDataset(Env* env, const std::string& path, const CsvOptions& options,
                                       CsvStats* stats) {
  CsvStats local;
  if (stats == nullptr) stats = &local;
  *stats = CsvStats();
  const int fields_per_line = options.input_dim + 1;
  if (options.input_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": input_dim must be positive"));
  }
  if (options.label_column < 0 || options.label_column >= fields_per_line) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": label column ", options.label_column,
                                                   " is not one of the ", fields_per_line,
                                                   " columns (input_dim + 1)"));
  }
  ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  Dataset d;
  d.dim = options.input_dim;
  std::vector<float> row(options.input_dim);
  bool first = true;
  int64_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripSuffix(line, "\r");
    if (Trim(line).empty()) continue;
    ++stats->lines;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    for (absl::string_view& f : fields) f = Trim(f);
    if (first) {
      first = false;
      // The first line (a header or a record) sets the file's width: one
      // that does not match the model fails here, naming the setting, rather
      // than skipping every line as malformed.
      if (fields.size() != static_cast<size_t>(fields_per_line)) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ":", line_number, ": ", fields.size(),
            " comma-separated fields, but the model's input_dim is ", options.input_dim,
            " (input_dim features and a label: ", fields_per_line, " fields); ",
            fields.size() > 1 ? absl::StrCat("for this file set input_dim: ", fields.size() - 1)
                              : std::string("is it comma-separated?")));
      }
      bool numeric = true;
      float ignored;
      for (absl::string_view f : fields) {
        numeric = numeric && ParseNumber(f, &ignored) != NumberKind::kNone;
      }
      if (!numeric) {
        stats->had_header = true;
        continue;
      }
    }
    std::string reason;
    int64_t label = 0;
    if (fields.size() != static_cast<size_t>(fields_per_line)) {
      reason = absl::StrCat("expected ", fields_per_line, " fields, found ", fields.size());
    } else {
      int col = 0;
      for (int i = 0; i < fields_per_line && reason.empty(); ++i) {
        if (i == options.label_column) {
          if (!ParseInt(fields[i], &label)) {
            reason = absl::StrCat("label ", Quote(fields[i]), " is not an integer");
          } else if (label < 0 || label >= options.num_labels) {
            reason = absl::StrCat("label ", label, " not in [0, ", options.num_labels, ")");
          }
        } else if (ParseNumber(fields[i], &row[col++]) != NumberKind::kFinite) {
          reason = absl::StrCat("field ", i + 1, " is not a finite number: ", Quote(fields[i]));
        }
      }
    }
    if (!reason.empty()) {
      ++stats->malformed;
      if (stats->malformed > options.max_malformed) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": more than ", options.max_malformed,
                                                       " malformed lines (line ", line_number, ": ",
                                                       reason, ")"));
      }
      LOG_WARN("{}:{}: {}; line skipped", path, line_number, reason);
      continue;
    }
    d.x.insert(d.x.end(), row.begin(), row.end());
    d.y.push_back(static_cast<int32_t>(label));
    ++d.size;
  }
  if (d.size == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": no data lines"));
  return d;
}

}  // namespace pstrain
