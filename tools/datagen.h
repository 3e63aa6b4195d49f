// `pstrain datagen`: deterministic synthetic datasets with learnable structure.
// The digits dataset renders 0-9 from pen strokes with a random affine warp
// (shift, scale, rotation, shear), per-point jitter, stroke width and pixel
// noise, as 28x28 bytes, written as MNIST's four IDX files, so real MNIST
// files can replace it unchanged. Same seed, same bytes.
#ifndef PSTRAIN_TOOLS_DATAGEN_H_
#define PSTRAIN_TOOLS_DATAGEN_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/storage/env.h"
#include "worker/data/idx.h"
#include "worker/data/criteo_reader.h"

namespace pstrain {

struct DigitsOptions {
  int64_t train_examples = 20000;
  int64_t test_examples = 4000;
  uint64_t seed = 1;
  // 0 = clean strokes; 1 = the default amount of warp and noise.
  double difficulty = 1.0;
};

// Renders `n` examples: images [n, 28, 28] and labels [n] (balanced classes).
void RenderDigits(int64_t n, uint64_t seed, double difficulty, IdxArray* images, IdxArray* labels);

// Writes train-images-idx3-ubyte, train-labels-idx1-ubyte,
// t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte into `dir`.
absl::Status WriteDigitsDataset(Env* env, const std::string& dir, const DigitsOptions& options);

// The same digits as CSV: train.csv and test.csv in `dir`, a header line
// "label,p0,...,p783", then the label and the 784 pixels scaled to [0, 1]
// (3 decimals) per line, for the CSV reader (data { format: CSV }).
absl::Status WriteDigitsCsv(Env* env, const std::string& dir, const DigitsOptions& options);

// Synthetic click-through data in the Criteo TSV layout (label, 13 integer
// columns, 26 hexadecimal categorical columns; worker/data/criteo_reader.h),
// drawn from a hidden ground-truth model: the log-odds of a click are a bias,
// plus a weight per integer feature times log(1 + value), plus a weight per
// categorical value (a missing value has a weight of its own). Categorical
// values follow a power law over `values_per_field` values per field, and a
// field is empty with probability `missing`. The labels are Bernoulli draws
// of the model's probability, so the model's own AUC on the held-out part is
// the best a learned model can expect there. Same seed, same bytes.
struct CriteoOptions {
  int64_t train_examples = 200000;
  int64_t test_examples = 50000;
  uint64_t seed = 1;
  int64_t values_per_field = 100;
  double missing = 0.05;
  // How a field's values are drawn: 0, value k with density falling as
  // k^(-3/4) (a long flat tail: most draws land on values seen rarely);
  // above 1, Zipf's law with this exponent, k^(-zipf) (most draws land on
  // the frequent values, as in real click logs).
  double zipf = 0;
  // The last `multi_hot` of the 26 categorical fields are multi-hot: a cell
  // holds 1 to `max_values` values (as many each, uniformly), separated by
  // '|', each drawn as a one-hot field's value; the hidden model adds the
  // weight of each. The files then need data.schema as MultiHotSchema gives
  // it (written to schema.pbtxt beside them).
  int multi_hot = 0;
  int max_values = 4;
  // With multi_hot: the multi-hot fields look up this embedding table of
  // their own and share one vocabulary ("item"): a value is one item
  // whichever of them it appears in (one string, one hidden weight, one
  // row), as a user's recent items are. Empty: each field its own values.
  std::string multi_hot_table;
};

// Criteo's schema with the last `multi_hot` categorical columns multi-hot
// (up to `max_values` values, separated by '|'): what WriteCriteoDataset's
// files with CriteoOptions::multi_hot need.
// With `table`, those columns look up that table, of one vocabulary ("item").
FeatureSchema MultiHotSchema(int multi_hot, int max_values, const std::string& table = "");

// The ground-truth model scored on the held-out part.
struct CriteoTruth {
  double test_auc = 0;
  double test_log_loss = 0;
  double positive_rate = 0;  // of the held-out labels
};

// Writes train.tsv and test.tsv into `dir` (and with multi_hot, schema.pbtxt:
// the data.schema they need, in protobuf text format).
absl::StatusOr<CriteoTruth> WriteCriteoDataset(Env* env, const std::string& dir,
                                               const CriteoOptions& options);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_DATAGEN_H_
