// The columns of click-through data (FeatureSchema, proto/config.proto):
// Criteo's layout when a config gives none, their counts (the model's input
// is the numeric columns and a bag per categorical one), and their checks.
#ifndef PSTRAIN_COMMON_CLUSTER_FEATURE_SCHEMA_H_
#define PSTRAIN_COMMON_CLUSTER_FEATURE_SCHEMA_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/config.pb.h"

namespace pstrain {

constexpr int kCriteoIntegerFields = 13;
constexpr int kCriteoCategoricalFields = 26;

// Criteo's display-advertising layout, as DLRM and TorchRec read it.
FeatureSchema CriteoSchema();
// `schema` (Criteo's columns where it has none), each column once (a
// count expanded into numbered columns), its separator set.
FeatureSchema EffectiveSchema(const FeatureSchema& schema);

int NumericColumns(const FeatureSchema& schema);      // of the effective schema
int CategoricalColumns(const FeatureSchema& schema);  // of the effective schema
char SchemaSeparator(const FeatureSchema& schema);    // a tab unless set
// Per categorical column of the effective schema, the ids an example holds
// for it: max_values for a multi-hot one, else 1 (an example's ids are these
// places one column after another; a multi-hot cell's unused ones kNoId).
std::vector<int> FieldIdSlots(const FeatureSchema& schema);
// Per categorical column of the effective schema, the table its values look
// up: its own `table`, else `table` (the model's).
std::vector<std::string> FieldTables(const FeatureSchema& schema, const std::string& table);
// The column's separator between a multi-hot cell's values ('|' unless set).
char ValueSeparator(const FeatureColumn& column);

// INVALID_ARGUMENT naming the field ("data.schema.columns[3].hash_buckets:
// ...") for a separator of other than one character, not exactly one label
// column, no categorical column, a numeric column marked hex or bucketed,
// a categorical one marked log1p or integer, negative buckets, more than
// 4096 columns (counts included), max_values outside 0..1024 or on a
// column not categorical, a value_separator of other than one character,
// without max_values > 1, or equal to the separator, more than 65536 ids
// an example (multi-hot values included), a table or vocabulary on a
// column not categorical, columns of one vocabulary with different tables,
// hash_buckets or hex. `field` is the
// schema's path in the config.
absl::Status CheckFeatureSchema(const FeatureSchema& schema, const std::string& field);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CLUSTER_FEATURE_SCHEMA_H_
