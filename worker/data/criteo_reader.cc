#include "worker/data/criteo_reader.h"

#include <charconv>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/base/embedding_ids.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace pstrain {
namespace {

std::string Quote(absl::string_view s) {
  return absl::StrCat("\"", s.size() > 40 ? absl::StrCat(s.substr(0, 40), "...") : s, "\"");
}

bool IsHex(absl::string_view s) {
  if (s.empty() || s.size() > 16) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string ParseCriteoLine(absl::string_view line, float* dense, uint64_t* ids,
                            int64_t* empty_fields) {
  constexpr int kFields = 1 + kCriteoIntegerFields + kCriteoCategoricalFields;
  std::vector<absl::string_view> fields = absl::StrSplit(line, '\t');
  int64_t empty = 0;
  if (fields.size() != kFields) {
    return absl::StrCat("expected ", kFields, " tab-separated fields, found ", fields.size());
  }
  if (fields[0] != "0" && fields[0] != "1") {
    return absl::StrCat("label ", Quote(fields[0]), " is not 0 or 1");
  }
  for (int j = 0; j < kCriteoIntegerFields; ++j) {
    absl::string_view f = fields[1 + j];
    if (f.empty()) {
      dense[j] = 0.0f;
      ++empty;
      continue;
    }
    int64_t v = 0;
    auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
    if (ec != std::errc() || end != f.data() + f.size()) {
      return absl::StrCat("integer field ", j + 1, " is not an integer: ", Quote(f));
    }
    dense[j] = static_cast<float>(std::log1p(static_cast<double>(std::max<int64_t>(v, 0))));
  }
  for (int j = 0; j < kCriteoCategoricalFields; ++j) {
    absl::string_view f = fields[1 + kCriteoIntegerFields + j];
    if (!f.empty() && !IsHex(f)) {
      return absl::StrCat("categorical field ", j + 1, " is not 1-16 hex digits: ", Quote(f));
    }
    empty += f.empty();
    ids[j] = FeatureId(j, f.data(), f.size());
  }
  if (empty_fields != nullptr) *empty_fields += empty;
  return "";
}

absl::StatusOr<Dataset> LoadCriteoDataset(Env* env, const std::string& path, int max_malformed,
                                          CriteoStats* stats) {
  CriteoStats local;
  if (stats == nullptr) stats = &local;
  *stats = CriteoStats();
  ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  Dataset d;
  d.dim = kCriteoIntegerFields;
  d.id_fields = kCriteoCategoricalFields;
  float dense[kCriteoIntegerFields];
  uint64_t ids[kCriteoCategoricalFields];
  int64_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripSuffix(line, "\r");
    if (line.find_first_not_of(" \t") == absl::string_view::npos) continue;
    ++stats->lines;
    int64_t empty = 0;
    const std::string reason = ParseCriteoLine(line, dense, ids, &empty);
    if (!reason.empty()) {
      ++stats->malformed;
      if (stats->malformed > max_malformed) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": more than ", max_malformed,
                                                       " malformed lines (line ", line_number,
                                                       ": ", reason, ")"));
      }
      LOG_WARN("{}:{}: {}; line skipped", path, line_number, reason);
      continue;
    }
    stats->empty_fields += empty;
    d.x.insert(d.x.end(), dense, dense + kCriteoIntegerFields);
    d.ids.insert(d.ids.end(), ids, ids + kCriteoCategoricalFields);
    d.y.push_back(line[0] == '1' ? 1 : 0);
    ++d.size;
  }
  if (d.size == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": no data lines"));
  return d;
}

}  // namespace pstrain
