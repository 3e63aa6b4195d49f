#include "tools/datagen.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "catch2/catch.hpp"
#include "common/base/embedding_ids.h"
#include "common/cluster/feature_schema.h"
#include "common/storage/env.h"
#include "common/cluster/sizing.h"
#include "worker/data/criteo_reader.h"
#include "worker/data/csv_reader.h"
#include "worker/data/idx_reader.h"
#include "google/protobuf/text_format.h"

namespace pstrain {
namespace {

// `name` under the test's temporary directory.
std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp ? tmp : "/tmp", "/", name);
}

TEST_CASE("digits are deterministic, balanced and seed-dependent", "[datagen]") {
  IdxArray a, la, b, lb, c, lc;
  RenderDigits(200, 5, 1.0, &a, &la);
  RenderDigits(200, 5, 1.0, &b, &lb);
  RenderDigits(200, 6, 1.0, &c, &lc);
  CHECK(a.data == b.data);
  CHECK(la.data == lb.data);
  CHECK(a.data != c.data);
  CHECK(a.dims == std::vector<int64_t>{200, 28, 28});
  std::array<int, 10> counts{};
  for (uint8_t l : la.data) {
    REQUIRE(l < 10);
    ++counts[l];
  }
  for (int n : counts) CHECK(n == 20);
}

TEST_CASE("datagen refuses sizes beyond this machine's memory before allocating", "[datagen]") {
  const std::string dir = TempPath("too_big");
  DigitsOptions o;
  o.train_examples = 3000000000;  // 2.2 TiB of pixels: it aborted with std::bad_alloc
  absl::Status st = WriteDigitsDataset(Env::Default(), dir, o);
  CHECK(absl::IsResourceExhausted(st));
  CHECK(std::string(st.message()).find("datagen --format=idx of 3000000000 examples needs") !=
        std::string::npos);
  CHECK(absl::IsResourceExhausted(WriteDigitsCsv(Env::Default(), dir, o)));
  CriteoOptions c;
  c.train_examples = 100000000;  // 22 GB of text at once; this machine may hold it or not
  c.test_examples = 10;
  if (PhysicalMemoryBytes() < int64_t{22} << 30) {
    CHECK(absl::IsResourceExhausted(WriteCriteoDataset(Env::Default(), dir, c).status()));
  } else {
    WARN("criteo's size check not exercised: this machine holds 22 GB of text");
  }
}

TEST_CASE("digits carry their class in the pixels", "[datagen]") {
  // Nearest-class-mean on clean renders must separate the classes far above
  // chance: the data is learnable, not noise.
  IdxArray train, ltrain, test, ltest;
  RenderDigits(1000, 1, 0.3, &train, &ltrain);
  RenderDigits(300, 2, 0.3, &test, &ltest);
  std::vector<std::vector<double>> mean(10, std::vector<double>(784, 0));
  std::array<int, 10> n{};
  for (int i = 0; i < 1000; ++i) {
    ++n[ltrain.data[i]];
    for (int p = 0; p < 784; ++p) mean[ltrain.data[i]][p] += train.data[i * 784 + p];
  }
  for (int k = 0; k < 10; ++k) {
    for (double& v : mean[k]) v /= n[k];
  }
  int correct = 0;
  for (int i = 0; i < 300; ++i) {
    int best = -1;
    double best_d = 1e300;
    for (int k = 0; k < 10; ++k) {
      double d = 0;
      for (int p = 0; p < 784; ++p) {
        const double e = test.data[i * 784 + p] - mean[k][p];
        d += e * e;
      }
      if (d < best_d) {
        best_d = d;
        best = k;
      }
    }
    correct += best == ltest.data[i];
  }
  CHECK(correct > 150);  // chance is 30
}

TEST_CASE("the CSV digits are the IDX digits, scaled, and the CSV reader reads them back",
          "[datagen]") {
  const std::string base = TempPath("digits");
  DigitsOptions o;
  o.train_examples = 50;
  o.test_examples = 20;
  o.seed = 4;
  REQUIRE(WriteDigitsDataset(Env::Default(), base + "/idx", o).ok());
  REQUIRE(WriteDigitsCsv(Env::Default(), base + "/csv", o).ok());
  auto idx = LoadIdxDataset(Env::Default(), base + "/idx/t10k-images-idx3-ubyte",
                            base + "/idx/t10k-labels-idx1-ubyte", 784, 10, true);
  CsvOptions co;
  co.input_dim = 784;
  co.num_labels = 10;
  co.max_malformed = 0;
  CsvStats stats;
  auto csv = LoadCsvDataset(Env::Default(), base + "/csv/test.csv", co, &stats);
  REQUIRE(idx.ok());
  REQUIRE(csv.ok());
  CHECK(stats.had_header);
  CHECK(csv->size == 20);
  CHECK(csv->y == idx->y);
  double worst = 0;
  for (size_t i = 0; i < idx->x.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(idx->x[i] - csv->x[i])));
  }
  CHECK(worst <= 5e-4);  // 3 decimals
  auto train = LoadCsvDataset(Env::Default(), base + "/csv/train.csv", co);
  REQUIRE(train.ok());
  CHECK(train->size == 50);
}

TEST_CASE("criteo: a click-through dataset the reader loads, with its ground truth scored",
          "[datagen][criteo]") {
  const std::string base = TempPath("criteo");
  CriteoOptions o;
  o.train_examples = 3000;
  o.test_examples = 2000;
  o.values_per_field = 500;
  o.seed = 4;
  auto truth = WriteCriteoDataset(Env::Default(), base + "_a", o);
  REQUIRE(truth.ok());
  // The hidden model separates clicks well but not perfectly.
  CHECK(truth->test_auc > 0.7);
  CHECK(truth->test_auc < 0.95);
  CHECK(truth->positive_rate > 0.1);
  CHECK(truth->positive_rate < 0.5);
  CHECK(truth->test_log_loss > 0.2);
  CriteoStats stats;
  auto train = LoadCriteoDataset(Env::Default(), base + "_a/train.tsv", 0, &stats);
  REQUIRE(train.ok());
  CHECK(train->size == 3000);
  CHECK(stats.malformed == 0);
  // About 5% of the 39 feature fields are empty.
  const double empty = static_cast<double>(stats.empty_fields) / (3000.0 * 39);
  CHECK(empty > 0.03);
  CHECK(empty < 0.07);
  auto test = LoadCriteoDataset(Env::Default(), base + "_a/test.tsv", 0);
  REQUIRE(test.ok());
  CHECK(test->size == 2000);
  // Same seed, same bytes; another seed, another dataset.
  REQUIRE(WriteCriteoDataset(Env::Default(), base + "_b", o).ok());
  o.seed = 5;
  REQUIRE(WriteCriteoDataset(Env::Default(), base + "_c", o).ok());
  auto a = Env::Default()->ReadFile(base + "_a/train.tsv");
  auto b = Env::Default()->ReadFile(base + "_b/train.tsv");
  auto c = Env::Default()->ReadFile(base + "_c/train.tsv");
  REQUIRE(a.ok());
  CHECK(*a == *b);
  CHECK(*a != *c);
  o.missing = 1.5;
  CHECK_FALSE(WriteCriteoDataset(Env::Default(), base + "_d", o).ok());
}

TEST_CASE("criteo: multi-hot fields hold 1 to max_values values, read with the schema written",
          "[datagen][criteo][schema]") {
  const std::string base = TempPath("criteo_multi");
  CriteoOptions o;
  o.train_examples = 2000;
  o.test_examples = 500;
  o.seed = 6;
  REQUIRE(WriteCriteoDataset(Env::Default(), base + "_one", o).ok());
  const std::string one_hot = Env::Default()->ReadFile(base + "_one/train.tsv").value();
  o.multi_hot = 3;
  o.max_values = 5;
  auto truth = WriteCriteoDataset(Env::Default(), base, o);
  REQUIRE(truth.ok());
  CHECK(truth->test_auc > 0.7);
  // The schema beside the files reads them: 23 one-hot fields, 3 of up to 5.
  auto text = Env::Default()->ReadFile(base + "/schema.pbtxt");
  REQUIRE(text.ok());
  FeatureSchema schema;
  REQUIRE(google::protobuf::TextFormat::ParseFromString(*text, &schema));
  CHECK(CheckFeatureSchema(schema, "data.schema").ok());
  const ClickThroughLayout layout(schema);
  CHECK(layout.fields() == 26);
  CHECK(layout.id_slots() == 23 + 3 * 5);
  CriteoStats stats;
  auto train = LoadCriteoDataset(Env::Default(), base + "/train.tsv", 0, &stats, layout);
  REQUIRE(train.ok());
  CHECK(stats.malformed == 0);
  CHECK(train->size == 2000);
  // Cells of every size from 1 to 5 values (an empty one is the empty value).
  std::vector<int> sizes(6, 0);
  for (int64_t e = 0; e < train->size; ++e) {
    for (int f = 0; f < 3; ++f) {
      int n = 0;
      for (int j = 0; j < 5; ++j) n += train->ids[e * 38 + 23 + f * 5 + j] != kNoId;
      ++sizes[n];
    }
  }
  CHECK(sizes[0] == 0);
  for (int n = 1; n <= 5; ++n) CHECK(sizes[n] > 600);
  // Without the schema, Criteo's layout refuses the lines ('|' is not hex).
  CHECK_FALSE(LoadCriteoDataset(Env::Default(), base + "/train.tsv", 0).ok());
  // The one-hot fields are drawn as without multi-hot ones: the first line's
  // numbers and first 23 categorical columns are the same.
  const std::string multi = Env::Default()->ReadFile(base + "/train.tsv").value();
  const std::string first_a = one_hot.substr(0, one_hot.find('\n'));
  const std::string first_b = multi.substr(0, multi.find('\n'));
  const std::vector<absl::string_view> a = absl::StrSplit(first_a, '\t');
  const std::vector<absl::string_view> b = absl::StrSplit(first_b, '\t');
  REQUIRE(a.size() == 40);
  REQUIRE(b.size() == 40);
  CHECK(std::vector<absl::string_view>(a.begin() + 1, a.begin() + 37) ==
        std::vector<absl::string_view>(b.begin() + 1, b.begin() + 37));
  o.multi_hot = 27;
  CHECK_FALSE(WriteCriteoDataset(Env::Default(), base + "_bad", o).ok());
}

TEST_CASE("criteo: --multi_hot_table puts the multi-hot fields on a table of their own, one "
          "vocabulary",
          "[datagen][criteo][schema]") {
  const std::string base = TempPath("criteo_items");
  CriteoOptions o;
  o.train_examples = 3000;
  o.test_examples = 500;
  o.seed = 8;
  o.multi_hot = 2;
  o.max_values = 3;
  o.multi_hot_table = "items";
  REQUIRE(WriteCriteoDataset(Env::Default(), base, o).ok());
  FeatureSchema schema;
  REQUIRE(google::protobuf::TextFormat::ParseFromString(
      Env::Default()->ReadFile(base + "/schema.pbtxt").value(), &schema));
  REQUIRE(CheckFeatureSchema(schema, "data.schema").ok());
  CHECK(FieldTables(schema, "features") == [] {
    std::vector<std::string> t(24, "features");
    t.push_back("items");
    t.push_back("items");
    return t;
  }());
  // The two fields draw from one set of items: their ids meet (each field's
  // own ids would not: a field's id hashes its index).
  auto train = LoadCriteoDataset(Env::Default(), base + "/train.tsv", 0, nullptr,
                                 ClickThroughLayout(schema));
  REQUIRE(train.ok());
  REQUIRE(train->id_fields == 24 + 2 * 3);
  std::set<uint64_t> first, second, one_hot;
  for (int64_t e = 0; e < train->size; ++e) {
    const uint64_t* ids = train->ids.data() + e * 30;
    for (int j = 0; j < 3; ++j) {
      if (ids[24 + j] != kNoId) first.insert(ids[24 + j]);
      if (ids[27 + j] != kNoId) second.insert(ids[27 + j]);
    }
    one_hot.insert(ids[23]);
  }
  size_t shared = 0;
  for (uint64_t id : first) shared += second.count(id);
  CHECK(shared > first.size() / 2);
  for (uint64_t id : first) CHECK(one_hot.count(id) == 0);
  o.multi_hot = 0;
  CHECK(absl::IsInvalidArgument(WriteCriteoDataset(Env::Default(), base + "_bad", o).status()));
}

TEST_CASE("criteo: --zipf draws a field's values by Zipf's law; the default law is flatter",
          "[datagen][criteo]") {
  const std::string base = TempPath("criteo_zipf");
  CriteoOptions o;
  o.train_examples = 20000;
  o.test_examples = 100;
  o.values_per_field = 100000;
  o.missing = 0;
  o.seed = 6;
  // Per field: the share of draws on its most frequent value, and how many
  // values it drew, averaged over the 26 fields.
  auto draws = [&](double zipf, const std::string& dir) {
    o.zipf = zipf;
    REQUIRE(WriteCriteoDataset(Env::Default(), dir, o).ok());
    auto data = LoadCriteoDataset(Env::Default(), dir + "/train.tsv", 0);
    REQUIRE(data.ok());
    REQUIRE(data->id_fields == 26);
    double top = 0, distinct = 0;
    for (int f = 0; f < data->id_fields; ++f) {
      std::map<uint64_t, int64_t> count;
      for (int64_t e = 0; e < data->size; ++e) ++count[data->ids[e * data->id_fields + f]];
      int64_t most = 0;
      for (const auto& [id, n] : count) most = std::max(most, n);
      top += static_cast<double>(most) / static_cast<double>(data->size) / data->id_fields;
      distinct += static_cast<double>(count.size()) / data->id_fields;
    }
    return std::make_pair(top, distinct);
  };
  // Value 0 takes the mass of [1, 2) under the density x^(-1.4) on
  // [1, 100001): (1 - 2^-0.4) / (1 - 100001^-0.4) = 0.2446. Under the
  // default law value 0 is u^4 < 1 / 100000: 100000^(-1/4) = 0.0562.
  const auto [zipf_top, zipf_distinct] = draws(1.4, base + "_a");
  const auto [flat_top, flat_distinct] = draws(0, base + "_b");
  WARN("top value's share " << zipf_top << " (Zipf 1.4) and " << flat_top
                            << " (default); distinct values per field " << zipf_distinct
                            << " and " << flat_distinct);
  CHECK(std::fabs(zipf_top - 0.2446) < 0.01);
  CHECK(std::fabs(flat_top - 0.0562) < 0.005);
  CHECK(zipf_distinct < flat_distinct / 2);
  for (double bad : {1.0, 0.5, -1.0, 4.5, std::nan("")}) {
    o.zipf = bad;
    CHECK(absl::IsInvalidArgument(WriteCriteoDataset(Env::Default(), base + "_c", o).status()));
  }
}

}  // namespace
}  // namespace pstrain
