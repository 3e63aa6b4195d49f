#include "worker/data/csv_reader.h"

#include <cstdlib>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

std::string Write(const std::string& name, const std::string& text) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/" + name;
  REQUIRE(Env::Default()->WriteFile(path, text, false).ok());
  return path;
}

CsvOptions Options(int label_column = 0, int max_malformed = 100) {
  CsvOptions o;
  o.label_column = label_column;
  o.input_dim = 3;
  o.num_labels = 4;
  o.max_malformed = max_malformed;
  return o;
}

TEST_CASE("CSV with and without a header, CRLF, blanks, label anywhere", "[csv]") {
  CsvStats stats;
  auto d =
      LoadCsvDataset(Env::Default(), Write("a.csv", "label,f1,f2,f3\n1,0.5,-2,3e2\n\n3, 1 ,2,3\n"),
                     Options(), &stats);
  REQUIRE(d.ok());
  CHECK(stats.had_header);
  CHECK(stats.lines == 3);
  CHECK(stats.malformed == 0);
  CHECK(d->size == 2);
  CHECK(d->dim == 3);
  CHECK(d->x == std::vector<float>{0.5f, -2.0f, 300.0f, 1.0f, 2.0f, 3.0f});
  CHECK(d->y == std::vector<int32_t>{1, 3});

  auto crlf =
      LoadCsvDataset(Env::Default(), Write("b.csv", "2,1,2,3\r\n0,4,5,6\r\n"), Options(), &stats);
  REQUIRE(crlf.ok());
  CHECK_FALSE(stats.had_header);
  CHECK(crlf->x == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(crlf->y == std::vector<int32_t>{2, 0});

  auto middle = LoadCsvDataset(Env::Default(), Write("c.csv", "1,2,3,4\n"), Options(2));
  REQUIRE(middle.ok());
  CHECK(middle->x == std::vector<float>{1, 2, 4});
  CHECK(middle->y == std::vector<int32_t>{3});
  auto last = LoadCsvDataset(Env::Default(), Write("d.csv", "1,2,3,0\n"), Options(3));
  REQUIRE(last.ok());
  CHECK(last->x == std::vector<float>{1, 2, 3});
  CHECK(last->y == std::vector<int32_t>{0});
  auto bad_column = LoadCsvDataset(Env::Default(), Write("e.csv", "1,2,3,0\n"), Options(4));
  CHECK(absl::IsInvalidArgument(bad_column.status()));
  CHECK(bad_column.status().message().find("label column 4") != std::string::npos);
}

TEST_CASE("malformed CSV lines are counted and skipped, then refused past the limit", "[csv]") {
  const std::string text =
      "1,1,1,1\n"
      "1,2\n"        // line 2: too few fields
      "1,abc,1,1\n"  // 3: not a number
      "1,nan,1,1\n"  // 4: not finite
      "9,1,1,1\n"    // 5: label out of range
      "1.5,1,1,1\n"  // 6: label not an integer
      "2,2,2,2\n";
  const std::string path = Write("bad.csv", text);
  CsvStats stats;
  auto d = LoadCsvDataset(Env::Default(), path, Options(0, 5), &stats);
  REQUIRE(d.ok());
  CHECK(stats.malformed == 5);
  CHECK(d->size == 2);
  CHECK(d->x == std::vector<float>{1, 1, 1, 2, 2, 2});
  CHECK(d->y == std::vector<int32_t>{1, 2});

  auto over = LoadCsvDataset(Env::Default(), path, Options(0, 4), &stats);
  CHECK(absl::IsInvalidArgument(over.status()));
  CHECK(over.status().message() ==
        path + ": more than 4 malformed lines (line 6: label \"1.5\" is not an integer)");
  auto none = LoadCsvDataset(Env::Default(), path, Options(0, 0), &stats);
  CHECK(none.status().message() ==
        path + ": more than 0 malformed lines (line 2: expected 4 fields, found 2)");
  auto range = LoadCsvDataset(Env::Default(), Write("r.csv", "9,1,1,1\n"), Options(0, 0));
  CHECK(range.status().message().find("label 9 not in [0, 4)") != std::string::npos);
  auto nan = LoadCsvDataset(Env::Default(), Write("n.csv", "1,1,inf,1\n"), Options(0, 0));
  CHECK(nan.status().message().find("field 3 is not a finite number: \"inf\"") !=
        std::string::npos);
}

TEST_CASE("empty and missing CSV files are errors", "[csv]") {
  auto empty = LoadCsvDataset(Env::Default(), Write("empty.csv", "\n\n"), Options());
  CHECK(absl::IsInvalidArgument(empty.status()));
  CHECK(empty.status().message().find("no data lines") != std::string::npos);
  auto header_only = LoadCsvDataset(Env::Default(), Write("h.csv", "y,a,b,c\n"), Options());
  CHECK(header_only.status().message().find("no data lines") != std::string::npos);
  auto missing = LoadCsvDataset(Env::Default(), "/nonexistent/x.csv", Options());
  CHECK_FALSE(missing.ok());
}

TEST_CASE("a CSV whose width does not match input_dim fails at its first line, naming input_dim",
          "[csv]") {
  // 64 features and a label (65 fields) read with input_dim 784: one error,
  // at line 1, not a warning per line.
  std::string text;
  for (int line = 0; line < 300; ++line) {
    text += "3";
    for (int f = 0; f < 64; ++f) text += ",0.5";
    text += "\n";
  }
  const std::string path = Write("wide.csv", text);
  CsvOptions o;
  o.input_dim = 784;
  o.num_labels = 10;
  CsvStats stats;
  auto d = LoadCsvDataset(Env::Default(), path, o, &stats);
  CHECK(absl::IsInvalidArgument(d.status()));
  CHECK(d.status().message() ==
        path + ":1: 65 comma-separated fields, but the model's input_dim is 784 (input_dim "
               "features and a label: 785 fields); for this file set input_dim: 64");
  CHECK(stats.malformed == 0);
  // A header of the wrong width says the same; so does a file of one column.
  auto header = LoadCsvDataset(Env::Default(), Write("hw.csv", "label,a,b\n1,2,3\n"), Options());
  CHECK(header.status().message().find(":1: 3 comma-separated fields, but the model's input_dim "
                                       "is 3") != std::string::npos);
  auto one = LoadCsvDataset(Env::Default(), Write("one.csv", "1;2;3;4\n"), Options());
  CHECK(one.status().message().find("is it comma-separated?") != std::string::npos);
  // The right width reads.
  o.input_dim = 64;
  CHECK(LoadCsvDataset(Env::Default(), path, o).ok());
}

}  // namespace
}  // namespace pstrain
