#include "worker/data/criteo_reader.h"

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/base/embedding_ids.h"
#include "worker/data/partition.h"

namespace pstrain {
namespace {

std::string Line(const std::string& label, const std::string& ints, const std::string& cats) {
  return label + "\t" + ints + "\t" + cats + "\n";
}

// 13 integer fields and 26 categorical ones, tab-separated.
std::string Ints(const std::string& first) {
  std::string s = first;
  for (int i = 1; i < 13; ++i) s += "\t" + std::to_string(i);
  return s;
}
std::string Cats(const std::string& first) {
  std::string s = first;
  for (int i = 1; i < 26; ++i) s += "\t68fd1e64";
  return s;
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  REQUIRE(Env::Default()->WriteFile(path, text, false).ok());
  return path;
}

TEST_CASE("Criteo TSV: integers log-transformed, categories hashed per field, empty fields",
          "[criteo]") {
  const std::string path = WriteTemp(
      "ok.tsv", Line("1", Ints("5"), Cats("05db9164")) + "\r\n" +  // a blank CRLF line
                    Line("0", Ints(""), Cats("")) + Line("0", Ints("-3"), Cats("05DB9164")));
  CriteoStats stats;
  auto d = LoadCriteoDataset(Env::Default(), path, 0, &stats);
  REQUIRE(d.ok());
  REQUIRE(d->size == 3);
  CHECK(d->dim == 13);
  CHECK(d->id_fields == 26);
  CHECK(d->y == std::vector<int32_t>{1, 0, 0});
  CHECK(d->x[0] == Approx(std::log1p(5.0)));
  CHECK(d->x[1] == Approx(std::log1p(1.0)));
  CHECK(d->x[13] == 0.0f);                     // empty
  CHECK(d->x[26] == 0.0f);                     // negative counts clamp to 0
  CHECK(d->ids[0] == FeatureId(0, "05db9164"));
  CHECK(d->ids[26] == FeatureId(0, ""));       // missing is a category of its own
  CHECK(d->ids[26] != FeatureId(1, ""));       // ... per field
  CHECK(d->ids[1] == FeatureId(1, "68fd1e64"));
  CHECK(d->ids[1] != FeatureId(2, "68fd1e64"));  // the same text in another field
  CHECK(d->ids[52] == FeatureId(0, "05DB9164"));  // taken as written
  CHECK(stats.empty_fields == 2);
  CHECK(stats.malformed == 0);
}

TEST_CASE("Criteo TSV: malformed lines are skipped up to the limit, then the load fails",
          "[criteo]") {
  const std::string bad_lines[] = {
      Line("2", Ints("1"), Cats("aa")),                 // label
      Line("1", Ints("x"), Cats("aa")),                 // integer
      Line("1", Ints("1.5"), Cats("aa")),               // integer
      Line("1", Ints("1"), Cats("zz")),                 // not hex
      Line("1", Ints("1"), Cats("0123456789abcdef0")),  // 17 digits
      "1\t2\t3\n",                                      // field count
  };
  std::string text = Line("1", Ints("1"), Cats("aa"));
  for (const std::string& b : bad_lines) text += b;
  const std::string path = WriteTemp("bad.tsv", text);
  CriteoStats stats;
  auto d = LoadCriteoDataset(Env::Default(), path, 6, &stats);
  REQUIRE(d.ok());
  CHECK(d->size == 1);
  CHECK(stats.malformed == 6);
  auto strict = LoadCriteoDataset(Env::Default(), path, 5);
  REQUIRE_FALSE(strict.ok());
  CHECK(std::string(strict.status().message()).find("more than 5 malformed lines") !=
        std::string::npos);
  CHECK(std::string(strict.status().message()).find("line 7") != std::string::npos);
  CHECK_FALSE(LoadCriteoDataset(Env::Default(), WriteTemp("empty.tsv", "\n\n"), 0).ok());
}

TEST_CASE("Criteo examples partition and batch with their ids", "[criteo]") {
  std::string text;
  for (int i = 0; i < 10; ++i) {
    text += Line(i % 2 ? "1" : "0", Ints(std::to_string(i)), Cats(std::to_string(100 + i)));
  }
  auto d = LoadCriteoDataset(Env::Default(), WriteTemp("p.tsv", text), 0);
  REQUIRE(d.ok());
  DataPartition p(&*d, 1, 2, 5, true, 3);  // examples 1, 3, 5, 7, 9
  std::vector<float> x(5 * 13);
  std::vector<int32_t> y(5);
  std::vector<uint64_t> ids(5 * 26);
  p.NextBatch(x.data(), y.data(), ids.data());
  for (int r = 0; r < 5; ++r) {
    const int i = static_cast<int>(std::lround(std::expm1(x[r * 13])));  // the example's index
    CHECK(i % 2 == 1);
    CHECK(y[r] == 1);
    CHECK(ids[r * 26] == FeatureId(0, std::to_string(100 + i)));
  }
}


TEST_CASE("a schema of the user's own: CSV with a header, columns in any order, strings hashed, "
          "buckets",
          "[criteo][schema]") {
  FeatureSchema schema;
  schema.set_separator(",");
  schema.set_header(true);
  auto add = [&](const std::string& name, FeatureColumn::Kind kind) {
    FeatureColumn* c = schema.add_columns();
    c->set_name(name);
    c->set_kind(kind);
    return c;
  };
  add("id", FeatureColumn::IGNORED);
  add("price", FeatureColumn::NUMERIC);
  add("user", FeatureColumn::CATEGORICAL)->set_hash_buckets(4);
  add("views", FeatureColumn::NUMERIC)->set_log1p(true);
  add("item", FeatureColumn::CATEGORICAL);
  add("clicked", FeatureColumn::LABEL);
  const ClickThroughLayout layout(schema);
  CHECK(layout.numeric() == 2);
  CHECK(layout.fields() == 2);
  std::string text = "id,price,user,views,item,clicked\n";
  for (int i = 0; i < 100; ++i) {
    text += std::to_string(i) + ",2.5,user" + std::to_string(i) + "," + std::to_string(i) +
            ",shoes," + std::to_string(i % 2) + "\n";
  }
  text += "x,notanumber,u,1,shoes,1\n";  // malformed: skipped
  text += "y,1,u,1,shoes\n";             // malformed: 5 fields
  CriteoStats stats;
  auto d = LoadCriteoDataset(Env::Default(), WriteTemp("schema.csv", text), 5, &stats, layout);
  REQUIRE(d.ok());
  CHECK(d->size == 100);
  CHECK(stats.malformed == 2);
  CHECK(d->dim == 2);
  CHECK(d->id_fields == 2);
  CHECK(d->x[0] == 2.5f);                                // as it is
  CHECK(d->x[2 * 7 + 1] == static_cast<float>(std::log1p(7.0)));  // log1p
  CHECK(d->y[7] == 1);
  CHECK(d->y[8] == 0);
  // "item" is the second categorical column: the same id as Criteo's
  // field 1 for the same text.
  CHECK(d->ids[1] == FeatureId(1, "shoes"));
  // "user": 100 distinct values, at most 4 ids.
  std::set<uint64_t> users;
  for (int i = 0; i < 100; ++i) users.insert(d->ids[2 * i]);
  CHECK(users.size() <= 4);
  CHECK(users.size() >= 2);
  // Why a line is malformed names the column.
  std::vector<float> dense(2);
  std::vector<uint64_t> ids(2);
  int32_t label = 0;
  CHECK(layout.Parse("1,abc,u,1,shoes,1", dense.data(), ids.data(), &label) ==
        "numeric field 1 (price) is not a number: \"abc\"");
  CHECK(layout.Parse("1,1,u,1,shoes", dense.data(), ids.data(), &label) ==
        "expected 6 \",\"-separated fields, found 5");
  CHECK(layout.Parse("1,1,u,1,shoes,2", dense.data(), ids.data(), &label) ==
        "label \"2\" is not 0 or 1");
}

TEST_CASE("a multi-hot field: a cell of up to max_values values, its places left kNoId",
          "[criteo][schema]") {
  FeatureSchema schema;
  schema.set_separator(",");
  auto add = [&](const std::string& name, FeatureColumn::Kind kind) {
    FeatureColumn* c = schema.add_columns();
    c->set_name(name);
    c->set_kind(kind);
    return c;
  };
  add("clicked", FeatureColumn::LABEL);
  add("user", FeatureColumn::CATEGORICAL);
  FeatureColumn* tags = add("tags", FeatureColumn::CATEGORICAL);
  tags->set_max_values(3);
  tags->set_hex(true);
  add("price", FeatureColumn::NUMERIC);
  const ClickThroughLayout layout(schema);
  CHECK(layout.fields() == 2);
  CHECK(layout.id_slots() == 4);
  std::vector<float> dense(1);
  std::vector<uint64_t> ids(4);
  int32_t label = 0;
  auto parse = [&](const std::string& line) {
    return layout.Parse(line, dense.data(), ids.data(), &label);
  };
  // Three values: each hashed as field 1's value, in the cell's order.
  REQUIRE(parse("1,u7,a|b0|c,2.5") == "");
  CHECK(ids == std::vector<uint64_t>{FeatureId(0, "u7"), FeatureId(1, "a"), FeatureId(1, "b0"),
                                     FeatureId(1, "c")});
  CHECK(dense[0] == 2.5f);
  // One value, and an empty cell (the empty value, as a one-hot field's).
  REQUIRE(parse("0,u7,ff,1") == "");
  CHECK(ids == std::vector<uint64_t>{FeatureId(0, "u7"), FeatureId(1, "ff"), kNoId, kNoId});
  REQUIRE(parse("0,u7,,1") == "");
  CHECK(ids == std::vector<uint64_t>{FeatureId(0, "u7"), FeatureId(1, ""), kNoId, kNoId});
  // Too many values, or one not hex: malformed, naming the column.
  CHECK(parse("1,u7,a|b|c|d,1") == "categorical field 2 (tags) has more than 3 values");
  CHECK(parse("1,u7,a|xyz,1") == "categorical field 2 (tags) is not 1-16 hex digits: \"xyz\"");
  // A dataset holds id_slots() ids an example.
  auto d = LoadCriteoDataset(Env::Default(),
                             WriteTemp("multi.csv", "1,u1,a|b,1\n0,u2,c,2\n1,u3,a|b|c|d,3\n"),
                             5, nullptr, layout);
  REQUIRE(d.ok());
  CHECK(d->size == 2);
  CHECK(d->id_fields == 4);
  CHECK(d->ids[7] == kNoId);
}

TEST_CASE("columns of one vocabulary give equal values one id; other columns their own",
          "[criteo][schema]") {
  FeatureSchema schema;
  schema.set_separator(",");
  auto add = [&](const std::string& name, const std::string& vocabulary, int64_t buckets = 0) {
    FeatureColumn* c = schema.add_columns();
    c->set_name(name);
    c->set_kind(name == "clicked" ? FeatureColumn::LABEL : FeatureColumn::CATEGORICAL);
    c->set_vocabulary(vocabulary);
    c->set_hash_buckets(buckets);
    return c;
  };
  add("clicked", "");
  add("item", "item");
  add("seen", "item")->set_max_values(2);
  add("shop", "");
  add("a", "bucketed", 3);
  add("b", "bucketed", 3);
  add("c", "", 3);
  REQUIRE(CheckFeatureSchema(schema, "data.schema").ok());
  const ClickThroughLayout layout(schema);
  std::vector<float> dense;
  std::vector<uint64_t> ids(layout.id_slots());
  int32_t label = 0;
  REQUIRE(layout.Parse("1,x,y|x,x,v,v,v", dense.data(), ids.data(), &label) == "");
  // "x" of item, of seen and of shop: one id for the vocabulary's two
  // columns, another (the field's own, as without a vocabulary) for shop.
  CHECK(ids[0] == ids[2]);
  CHECK(ids[1] != ids[0]);
  CHECK(ids[3] != ids[0]);
  CHECK(ids[3] == FeatureId(2, "x"));
  CHECK(ids[0] == SpaceFeatureId(VocabularyIdSpace("item"), "x", 1));
  // Bucketed: a and b share their 3 buckets; c has its own.
  CHECK(ids[4] == ids[5]);
  CHECK(ids[6] != ids[4]);
  std::set<uint64_t> a, c;
  for (int i = 0; i < 200; ++i) {
    const std::string v = absl::StrCat("v", i);
    REQUIRE(layout.Parse(absl::StrCat("1,x,x,x,", v, ",", v, ",", v), dense.data(), ids.data(),
                         &label) == "");
    CHECK(ids[4] == ids[5]);
    a.insert(ids[4]);
    c.insert(ids[6]);
  }
  CHECK(a.size() == 3);
  CHECK(c.size() == 3);
  for (uint64_t id : a) CHECK(c.count(id) == 0);
}

}  // namespace
}  // namespace pstrain
