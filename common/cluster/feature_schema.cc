#include "common/cluster/feature_schema.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace pstrain {

FeatureSchema CriteoSchema() {
  FeatureSchema s;
  s.set_separator("\t");
  FeatureColumn* label = s.add_columns();
  label->set_name("label");
  label->set_kind(FeatureColumn::LABEL);
  FeatureColumn* ints = s.add_columns();
  ints->set_name("I");
  ints->set_kind(FeatureColumn::NUMERIC);
  ints->set_log1p(true);
  ints->set_integer(true);
  ints->set_count(kCriteoIntegerFields);
  FeatureColumn* cats = s.add_columns();
  cats->set_name("C");
  cats->set_kind(FeatureColumn::CATEGORICAL);
  cats->set_hex(true);
  cats->set_count(kCriteoCategoricalFields);
  return s;
}

FeatureSchema EffectiveSchema(const FeatureSchema& schema) {
  FeatureSchema given = schema;
  if (given.columns_size() == 0) *given.mutable_columns() = CriteoSchema().columns();
  if (given.separator().empty()) given.set_separator("\t");
  // Each column once: a count becomes that many columns, numbered.
  FeatureSchema s = given;
  s.clear_columns();
  for (const FeatureColumn& c : given.columns()) {
    if (c.count() <= 1) {
      *s.add_columns() = c;
      s.mutable_columns(s.columns_size() - 1)->clear_count();
      continue;
    }
    for (int i = 1; i <= c.count(); ++i) {
      FeatureColumn* one = s.add_columns();
      *one = c;
      one->clear_count();
      one->set_name(absl::StrCat(c.name(), i));
    }
  }
  return s;
}

namespace {
int CountKind(const FeatureSchema& schema, FeatureColumn::Kind kind) {
  if (schema.columns_size() == 0) return CountKind(CriteoSchema(), kind);
  int n = 0;
  for (const FeatureColumn& c : schema.columns()) {
    if (c.kind() == kind) n += c.count() > 1 ? c.count() : 1;
  }
  return n;
}
}  // namespace

int NumericColumns(const FeatureSchema& schema) {
  return CountKind(schema, FeatureColumn::NUMERIC);
}

int CategoricalColumns(const FeatureSchema& schema) {
  return CountKind(schema, FeatureColumn::CATEGORICAL);
}

char SchemaSeparator(const FeatureSchema& schema) {
  return schema.separator().empty() ? '\t' : schema.separator()[0];
}

std::vector<std::string> FieldTables(const FeatureSchema& schema, const std::string& table) {
  std::vector<std::string> tables;
  const FeatureSchema effective = EffectiveSchema(schema);
  for (const FeatureColumn& c : effective.columns()) {
    if (c.kind() == FeatureColumn::CATEGORICAL) {
      tables.push_back(c.table().empty() ? table : c.table());
    }
  }
  return tables;
}

char ValueSeparator(const FeatureColumn& column) {
  return column.value_separator().empty() ? '|' : column.value_separator()[0];
}

std::vector<int> FieldIdSlots(const FeatureSchema& schema) {
  std::vector<int> slots;
  const FeatureSchema effective = EffectiveSchema(schema);
  for (const FeatureColumn& c : effective.columns()) {
    if (c.kind() == FeatureColumn::CATEGORICAL) slots.push_back(std::max(1, c.max_values()));
  }
  return slots;
}

absl::Status CheckFeatureSchema(const FeatureSchema& schema, const std::string& field) {
  auto bad = [&](const std::string& where, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(field, where, ": ", why));
  };
  const std::string& sep = schema.separator();
  if (!sep.empty() && (sep.size() != 1 || sep == "\n" || sep == "\r" || sep == "\"")) {
    return bad(".separator", "expected one character (\"\\t\" or \",\"), not a newline or quote");
  }
  if (schema.columns_size() == 0) return absl::OkStatus();  // Criteo's
  int64_t columns = 0, ids = 0;
  absl::flat_hash_map<std::string, int> vocabularies;  // each one's first column
  for (int i = 0; i < schema.columns_size(); ++i) {
    const FeatureColumn& c = schema.columns(i);
    const std::string at = absl::StrCat(".columns[", i, "]");
    if (c.count() < 0 || c.count() > 4096) return bad(at + ".count", "expected 0..4096");
    columns += c.count() > 1 ? c.count() : 1;
    if (columns > 4096) return bad(".columns", "expected at most 4096 (counts included)");
    const bool numeric = c.kind() == FeatureColumn::NUMERIC;
    const bool categorical = c.kind() == FeatureColumn::CATEGORICAL;
    if ((c.log1p() || c.integer()) && !numeric) {
      return bad(at + (c.log1p() ? ".log1p" : ".integer"), "applies to NUMERIC columns only");
    }
    if ((c.hex() || c.hash_buckets() != 0) && !categorical) {
      return bad(at + (c.hex() ? ".hex" : ".hash_buckets"),
                 "applies to CATEGORICAL columns only");
    }
    if (c.hash_buckets() < 0 || c.hash_buckets() > (int64_t{1} << 40)) {
      return bad(at + ".hash_buckets", "expected 0 (no hashing) or 1..2^40");
    }
    if (c.max_values() < 0 || c.max_values() > 1024) {
      return bad(at + ".max_values", "expected 0..1024");
    }
    if (c.max_values() > 1 && !categorical) {
      return bad(at + ".max_values", "applies to CATEGORICAL columns only");
    }
    const std::string& vs = c.value_separator();
    if (!vs.empty()) {
      if (c.max_values() <= 1) return bad(at + ".value_separator", "needs max_values > 1");
      if (vs.size() != 1 || vs == "\n" || vs == "\r" || vs == "\"" ||
          vs[0] == SchemaSeparator(schema)) {
        return bad(at + ".value_separator",
                   "expected one character, not a newline, a quote or the column separator");
      }
    } else if (c.max_values() > 1 && ValueSeparator(c) == SchemaSeparator(schema)) {
      return bad(at + ".value_separator", "the default \"|\" is the column separator: set another");
    }
    if ((!c.table().empty() || !c.vocabulary().empty()) && !categorical) {
      return bad(at + (c.table().empty() ? ".vocabulary" : ".table"),
                 "applies to CATEGORICAL columns only");
    }
    if (categorical) {
      ids += std::max<int64_t>(1, c.count()) * std::max(1, c.max_values());
      if (ids > 65536) return bad(".columns", "expected at most 65536 ids an example");
    }
    if (c.vocabulary().empty()) continue;
    // A vocabulary's columns read a value the same way into the same rows.
    auto first = vocabularies.try_emplace(c.vocabulary(), i);
    const FeatureColumn& other = schema.columns(first.first->second);
    if (other.table() != c.table() || other.hash_buckets() != c.hash_buckets() ||
        other.hex() != c.hex()) {
      return bad(at + ".vocabulary",
                 absl::StrCat("\"", c.vocabulary(), "\" is also columns[", first.first->second,
                              "]'s, whose table, hash_buckets or hex differ"));
    }
  }
  if (CountKind(schema, FeatureColumn::LABEL) != 1) {
    return bad(".columns", "expected exactly one LABEL column");
  }
  if (CategoricalColumns(schema) == 0) {
    return bad(".columns", "expected at least one CATEGORICAL column (the model's embeddings)");
  }
  return absl::OkStatus();
}

}  // namespace pstrain
