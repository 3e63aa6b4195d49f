// Click-through data as a Dataset: one example per line, its columns as
// data.schema describes them (common/cluster/feature_schema.h), Criteo's
// display-advertising layout by default: tab-separated, a label (0 or 1), 13
// integer columns and 26 categorical columns of hexadecimal strings (as DLRM
// and TorchRec read it). Any feature field may be empty.
//
// A NUMERIC column becomes a float (log(1 + max(v, 0)) with log1p, as
// Criteo's integers; an empty one 0); a CATEGORICAL column's value becomes
// the 64-bit id FeatureId(k, text) (common/base/embedding_ids.h) for the
// k-th categorical column, an empty value its own id per field; with
// hash_buckets B, one of B ids of the field. Columns of one vocabulary
// share their ids: the vocabulary's id space in place of the field's. A multi-hot column's cell
// (max_values > 1) holds up to max_values such values, separated by its
// value_separator. Malformed lines (a wrong
// field count, a label that is not 0 or 1, a number that is not one, or not
// whole where the column says integer, a hex column's value that is not
// 1-16 hexadecimal digits, a multi-hot cell of more than max_values values)
// are skipped with a warning naming file and
// line, up to `max_malformed`; one more fails the load. CRLF is accepted,
// blank lines ignored, and with `header` each file's first line skipped.
// Stateless; thread-safe.
#ifndef PSTRAIN_WORKER_DATA_CRITEO_READER_H_
#define PSTRAIN_WORKER_DATA_CRITEO_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cluster/feature_schema.h"
#include "common/storage/env.h"
#include "proto/config.pb.h"
#include "worker/data/dataset.h"

namespace pstrain {

struct CriteoStats {
  int64_t lines = 0;      // non-blank lines read (the header not counted)
  int64_t malformed = 0;  // skipped
  int64_t empty_fields = 0;
};

// A schema's columns, ready to read lines with.
class ClickThroughLayout {
 public:
  // `schema` as a config holds it (checked by CheckFeatureSchema); no
  // columns means Criteo's.
  explicit ClickThroughLayout(const FeatureSchema& schema = FeatureSchema());
  int numeric() const { return numeric_; }
  int fields() const { return fields_; }
  // The ids an example holds: one per field, max_values per multi-hot field.
  int id_slots() const { return id_slots_; }
  bool header() const { return header_; }

  // One line (without its newline or CR) into numeric() dense features,
  // id_slots() ids (field after field; a multi-hot cell's values, then
  // kNoId in its places left) and its label; "" when it is good, else why
  // it is malformed. `empty_fields` (when given) gains the line's empty
  // fields.
  std::string Parse(absl::string_view line, float* dense, uint64_t* ids, int32_t* label,
                    int64_t* empty_fields = nullptr) const;

 private:
  char separator_;
  bool header_;
  std::vector<FeatureColumn> columns_;
  std::vector<uint64_t> spaces_;  // per categorical column, its id space
  int numeric_ = 0, fields_ = 0, id_slots_ = 0;
};

// Criteo's layout: ClickThroughLayout().Parse without the label.
std::string ParseCriteoLine(absl::string_view line, float* dense, uint64_t* ids,
                            int64_t* empty_fields = nullptr);

absl::StatusOr<Dataset> LoadCriteoDataset(Env* env, const std::string& path, int max_malformed,
                                          CriteoStats* stats = nullptr,
                                          const ClickThroughLayout& layout = ClickThroughLayout());

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_CRITEO_READER_H_
