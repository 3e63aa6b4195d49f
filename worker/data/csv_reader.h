// CSV files as a Dataset: one example per line, a label column (an integer
// in [0, num_labels)) and input_dim numeric feature columns, comma-separated,
// fields trimmed of blanks, CRLF accepted, blank lines ignored. The first
// non-blank line is a header when any of its fields is not a number; that
// line (header or record) must have input_dim + 1 fields, or the load fails
// at once naming input_dim.
// Malformed lines (a wrong field count, a field that is not a finite number,
// a label out of range) are skipped with a warning naming file and line, up
// to `max_malformed`; one more fails the load. Stateless; thread-safe.
#ifndef PSTRAIN_WORKER_DATA_CSV_READER_H_
#define PSTRAIN_WORKER_DATA_CSV_READER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/storage/env.h"
#include "worker/data/dataset.h"

namespace pstrain {

struct CsvOptions {
  int label_column = 0;  // 0-based, anywhere in the line
  int input_dim = 0;     // feature columns: every line has input_dim + 1 fields
  int num_labels = 2;
  int max_malformed = 100;  // malformed lines tolerated; 0 = none
};

struct CsvStats {
  int64_t lines = 0;      // lines read, the header and blank lines included
  int64_t malformed = 0;  // skipped
  bool had_header = false;
};

absl::StatusOr<Dataset> LoadCsvDataset(Env* env, const std::string& path, const CsvOptions& options,
                                       CsvStats* stats = nullptr);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_CSV_READER_H_
