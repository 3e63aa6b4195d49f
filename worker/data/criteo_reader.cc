#include "worker/data/criteo_reader.h"

#include <algorithm>
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

std::string ColumnName(const FeatureColumn& c, size_t i) {
  return c.name().empty() ? absl::StrCat("column ", i + 1) : c.name();
}

}  // namespace

ClickThroughLayout::ClickThroughLayout(const FeatureSchema& schema) {
  const FeatureSchema effective = EffectiveSchema(schema);
  separator_ = SchemaSeparator(effective);
  header_ = effective.header();
  columns_.assign(effective.columns().begin(), effective.columns().end());
  numeric_ = NumericColumns(effective);
  fields_ = CategoricalColumns(effective);
  for (int slots : FieldIdSlots(effective)) id_slots_ += slots;
  for (const FeatureColumn& c : columns_) {
    if (c.kind() != FeatureColumn::CATEGORICAL) continue;
    spaces_.push_back(c.vocabulary().empty() ? FieldIdSpace(static_cast<int>(spaces_.size()))
                                             : VocabularyIdSpace(c.vocabulary()));
  }
}

std::string ClickThroughLayout::Parse(absl::string_view line, float* dense, uint64_t* ids,
                                      int32_t* label, int64_t* empty_fields) const {
  std::vector<absl::string_view> fields = absl::StrSplit(line, separator_);
  int64_t empty = 0;
  if (fields.size() != columns_.size()) {
    return absl::StrCat("expected ", columns_.size(), " ",
                        separator_ == '\t' ? std::string("tab") : Quote(std::string(1, separator_)),
                        "-separated fields, found ", fields.size());
  }
  int n = 0, k = 0;  // the numeric and categorical columns so far
  for (size_t i = 0; i < columns_.size(); ++i) {
    const FeatureColumn& c = columns_[i];
    const absl::string_view f = fields[i];
    switch (c.kind()) {
      case FeatureColumn::LABEL:
        if (f != "0" && f != "1") return absl::StrCat("label ", Quote(f), " is not 0 or 1");
        *label = f[0] == '1' ? 1 : 0;
        break;
      case FeatureColumn::NUMERIC: {
        if (f.empty()) {
          dense[n++] = 0.0f;
          ++empty;
          break;
        }
        double v = 0;
        if (c.integer()) {
          int64_t whole = 0;
          auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), whole);
          if (ec != std::errc() || end != f.data() + f.size()) {
            return absl::StrCat("integer field ", n + 1, " (", ColumnName(c, i),
                                ") is not an integer: ", Quote(f));
          }
          v = static_cast<double>(whole);
        } else {
          auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
          if (ec != std::errc() || end != f.data() + f.size() || !std::isfinite(v)) {
            return absl::StrCat("numeric field ", n + 1, " (", ColumnName(c, i),
                                ") is not a number: ", Quote(f));
          }
        }
        dense[n++] = static_cast<float>(c.log1p() ? std::log1p(std::max(v, 0.0)) : v);
        break;
      }
      case FeatureColumn::CATEGORICAL: {
        empty += f.empty();
        // One value's id: the field's, hashed into its buckets with the
        // hashing trick; a hex column's value checked.
        auto id_of = [&](absl::string_view v, uint64_t* id) -> std::string {
          if (c.hex() && !v.empty() && !IsHex(v)) {
            return absl::StrCat("categorical field ", k + 1, " (", ColumnName(c, i),
                                ") is not 1-16 hex digits: ", Quote(v));
          }
          const uint64_t space = spaces_[k];
          *id = SpaceFeatureId(space, v.data(), v.size());
          if (c.hash_buckets() > 0) {
            // (A field's buckets keyed by its index, a vocabulary's by its
            // space, whose top bit no index has.)
            const uint64_t key =
                c.vocabulary().empty() ? static_cast<uint64_t>(k) << 40 : space;
            *id = MixId(key ^ (*id % static_cast<uint64_t>(c.hash_buckets())));
          }
          if (*id == kNoId) --*id;
          return "";
        };
        const int slots = std::max(1, c.max_values());
        int used = 0;
        if (slots == 1 || f.empty()) {
          if (std::string why = id_of(f, ids); !why.empty()) return why;
          used = 1;
        } else {
          for (absl::string_view v : absl::StrSplit(f, ValueSeparator(c))) {
            if (used == slots) {
              return absl::StrCat("categorical field ", k + 1, " (", ColumnName(c, i),
                                  ") has more than ", slots, " values");
            }
            if (std::string why = id_of(v, ids + used); !why.empty()) return why;
            ++used;
          }
        }
        for (int j = used; j < slots; ++j) ids[j] = kNoId;
        ids += slots;
        ++k;
        break;
      }
      default:
        break;
    }
  }
  if (empty_fields != nullptr) *empty_fields += empty;
  return "";
}

std::string ParseCriteoLine(absl::string_view line, float* dense, uint64_t* ids,
                            int64_t* empty_fields) {
  static const ClickThroughLayout* const criteo = new ClickThroughLayout();
  int32_t label = 0;
  return criteo->Parse(line, dense, ids, &label, empty_fields);
}

absl::StatusOr<Dataset> LoadCriteoDataset(Env* env, const std::string& path, int max_malformed,
                                          CriteoStats* stats, const ClickThroughLayout& layout) {
  CriteoStats local;
  if (stats == nullptr) stats = &local;
  *stats = CriteoStats();
  ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  Dataset d;
  d.dim = layout.numeric();
  d.id_fields = layout.id_slots();
  std::vector<float> dense(static_cast<size_t>(layout.numeric()));
  std::vector<uint64_t> ids(static_cast<size_t>(layout.id_slots()));
  int64_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (line_number == 1 && layout.header()) continue;
    line = absl::StripSuffix(line, "\r");
    if (line.find_first_not_of(" \t") == absl::string_view::npos) continue;
    ++stats->lines;
    int64_t empty = 0;
    int32_t label = 0;
    const std::string reason = layout.Parse(line, dense.data(), ids.data(), &label, &empty);
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
    d.x.insert(d.x.end(), dense.begin(), dense.end());
    d.ids.insert(d.ids.end(), ids.begin(), ids.end());
    d.y.push_back(label);
    ++d.size;
  }
  if (d.size == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": no data lines"));
  return d;
}

}  // namespace pstrain
