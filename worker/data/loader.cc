#include "worker/data/loader.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "worker/data/criteo_reader.h"
#include "worker/data/csv_reader.h"
#include "worker/data/idx_reader.h"

namespace pstrain {

bool HasTestSplit(const DataConfig& config) {
  if (config.format() == CRITEO) return !config.test_tsv().empty();
  return config.format() == CSV ? !config.test_csv().empty() : !config.test_images().empty();
}

absl::StatusOr<Dataset> LoadDataset(Env* env, const DataConfig& config, DataSplit split,
                                    int input_dim, int num_labels) {
  const bool train = split == DataSplit::kTrain;
  if (config.format() == CRITEO) {
    // The model's input (the numbers and a bag per categorical column) is
    // assembled per batch from the pulled rows, so input_dim is not the
    // file's width here.
    const std::string& path = train ? config.train_tsv() : config.test_tsv();
    CriteoStats stats;
    ASSIGN_OR_RETURN(Dataset d,
                     LoadCriteoDataset(env, path,
                                       config.max_malformed_lines() < 0
                                           ? 0
                                           : config.max_malformed_lines(),
                                       &stats, ClickThroughLayout(config.schema())));
    LOG_INFO("{}: {} click-through examples from {} lines{}", path, d.size, stats.lines,
             stats.malformed > 0 ? absl::StrCat(", ", stats.malformed, " malformed lines skipped")
                                 : "");
    return d;
  }
  if (config.format() == CSV) {
    const std::string& path = train ? config.train_csv() : config.test_csv();
    CsvOptions options;
    options.label_column = config.csv_label_column();
    options.input_dim = input_dim;
    options.num_labels = num_labels;
    // The config's -1 means no malformed line is tolerated (0 there means the default).
    options.max_malformed = config.max_malformed_lines() < 0 ? 0 : config.max_malformed_lines();
    CsvStats stats;
    ASSIGN_OR_RETURN(Dataset d, LoadCsvDataset(env, path, options, &stats));
    LOG_INFO(
        "{}: {} examples from {} lines{}{}", path, d.size, stats.lines,
        stats.had_header ? " (header skipped)" : "",
        stats.malformed > 0 ? absl::StrCat(", ", stats.malformed, " malformed lines skipped") : "");
    return d;
  }
  return LoadIdxDataset(env, train ? config.train_images() : config.test_images(),
                        train ? config.train_labels() : config.test_labels(), input_dim, num_labels,
                        config.normalize());
}

}  // namespace pstrain
