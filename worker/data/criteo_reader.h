// Click-through data in the Criteo TSV layout as a Dataset: one example per
// line, tab-separated, a label (0 or 1), 13 integer columns and 26
// categorical columns of hexadecimal strings (Criteo's display-advertising
// layout, as DLRM and TorchRec read it). Any feature field may be empty.
//
// Integer features become log(1 + max(v, 0)) (an empty one 0), the usual
// transform of these heavy-tailed counts; categorical values become 64-bit
// ids FeatureId(field, text) (common/base/embedding_ids.h), an empty value its
// own id per field. Malformed lines (a wrong field count, a label that is not
// 0 or 1, an integer field that is not an integer, a categorical field that is
// not 1-16 hexadecimal digits) are skipped with a warning naming file and
// line, up to `max_malformed`; one more fails the load. CRLF is accepted and
// blank lines ignored. Stateless; thread-safe.
#ifndef PSTRAIN_WORKER_DATA_CRITEO_READER_H_
#define PSTRAIN_WORKER_DATA_CRITEO_READER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/storage/env.h"
#include "worker/data/dataset.h"

namespace pstrain {

constexpr int kCriteoIntegerFields = 13;
constexpr int kCriteoCategoricalFields = 26;

struct CriteoStats {
  int64_t lines = 0;      // non-blank lines read
  int64_t malformed = 0;  // skipped
  int64_t empty_fields = 0;
};

// One line (without its newline or CR) into 13 dense features and 26 ids;
// "" when it is good, else why it is malformed. `empty_fields` (when given)
// gains the line's empty fields.
std::string ParseCriteoLine(absl::string_view line, float* dense, uint64_t* ids,
                            int64_t* empty_fields = nullptr);

absl::StatusOr<Dataset> LoadCriteoDataset(Env* env, const std::string& path, int max_malformed,
                                          CriteoStats* stats = nullptr);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_CRITEO_READER_H_
