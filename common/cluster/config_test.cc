#include "common/cluster/config.h"

#include <array>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/feature_schema.h"
#include "google/protobuf/text_format.h"

namespace pstrain {
namespace {

const char kGood[] = R"(
model { mlp { input_dim: 784 hidden_units: 64 num_classes: 10 } }
data { train_images: "a" train_labels: "b" batch_size: 32 }
optimizer { learning_rate: 0.1 sgd {} }
sync { replicas_to_aggregate: 2 }
max_steps: 100
seed: 7
)";

TEST_CASE("without max_steps, only a stream of parts runs, until stopped", "[config]") {
  std::string no_steps = kGood;
  no_steps.replace(no_steps.find("max_steps: 100"), 14, "");
  auto refused = ParseTrainingConfig(no_steps, "x.pbtxt");
  REQUIRE_FALSE(refused.ok());
  CHECK(
      std::string(refused.status().message())
          .find("max_steps: expected a positive count (none with data.train_dir: until stopped)") !=
      std::string::npos);
  const std::string stream = R"(
model { click_through { table: "t" hidden_units: 16 } }
embedding_tables { name: "t" dim: 8 }
data { format: CRITEO train_dir: "parts" batch_size: 32 }
optimizer { learning_rate: 0.1 sgd {} }
)";
  auto c = ParseTrainingConfig(stream, "x.pbtxt");
  INFO(c.status());
  REQUIRE(c.ok());
  CHECK(c->max_steps() == kUntilStopped);
  CHECK(RunsUntilStopped(c->max_steps()));
  CHECK(StepText(250, c->max_steps()) == "250");
  CHECK(StepText(250, 600) == "250/600");
  std::string with_cosine = stream;
  with_cosine.replace(with_cosine.find("sgd {}"), 6, "sgd {} schedule { kind: COSINE }");
  auto cosine = ParseTrainingConfig(with_cosine, "x.pbtxt");
  REQUIRE_FALSE(cosine.ok());
  CHECK(std::string(cosine.status().message())
            .find("COSINE needs decay_steps in a run without "
                  "max_steps") != std::string::npos);
}

TEST_CASE("data.progressive_eval: a click-through model's, instead of test_tsv, with "
          "eval_every_steps", "[config]") {
  const std::string base = R"(
model { click_through { table: "t" hidden_units: 16 } }
embedding_tables { name: "t" dim: 8 }
optimizer { learning_rate: 0.1 sgd {} }
)";
  auto parse = [&](const std::string& data, const std::string& rest) {
    return ParseTrainingConfig(base + "data { " + data + " }\n" + rest, "x.pbtxt");
  };
  auto ok = parse(R"(format: CRITEO train_dir: "parts" batch_size: 32 progressive_eval: true)",
                  "eval_every_steps: 50");
  INFO(ok.status());
  CHECK(ok.ok());
  for (const auto& [data, rest, error] : std::vector<std::tuple<std::string, std::string,
                                                                std::string>>{
           {R"(format: CRITEO train_dir: "parts" batch_size: 32 progressive_eval: true)", "",
            "data.progressive_eval: reports every eval_every_steps: give eval_every_steps > 0"},
           {R"(format: CRITEO train_tsv: "a" test_tsv: "b" batch_size: 32 progressive_eval: true)",
            "max_steps: 10 eval_every_steps: 5",
            "data.progressive_eval: scores the training data before it trains on it: leave out "
            "data.test_tsv"},
       }) {
    auto c = parse(data, rest);
    REQUIRE_FALSE(c.ok());
    CHECK_THAT(std::string(c.status().message()), Catch::Contains(error));
  }
  std::string mlp = kGood;
  mlp.replace(mlp.find("batch_size: 32"), 14, "batch_size: 32 progressive_eval: true");
  auto c = ParseTrainingConfig(mlp, "x.pbtxt");
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(std::string(c.status().message()),
             Catch::Contains("data.progressive_eval: scores a click-through model's training "
                             "data: format: CRITEO only"));
}

TEST_CASE("a training config parses and gets defaults", "[config]") {
  auto c = ParseTrainingConfig(kGood, "demo.pbtxt");
  REQUIRE(c.ok());
  CHECK(c->model().mlp().hidden_units_size() == 1);
  CHECK(IsSyncMode(*c));
  CHECK(c->rpc().rpc_timeout_ms() > 0);
  CHECK(c->rpc().step_timeout_ms() > 0);
  CHECK(c->compute_threads() == 1);
  CHECK(c->placement().partition_min_bytes() > 0);
  CHECK(c->rpc().call_bytes() == (4 << 20));
  CHECK(c->rpc().calls_in_flight() == 16);
}

TEST_CASE("a config or spec path that is a directory says so", "[config]") {
  const char* dir = std::getenv("TEST_TMPDIR");
  REQUIRE(dir != nullptr);
  absl::StatusOr<TrainingConfig> c = LoadTrainingConfig(dir);
  CHECK(absl::IsInvalidArgument(c.status()));
  CHECK(std::string(c.status().message()).find("not a file") != std::string::npos);
  absl::StatusOr<ClusterSpec> s = ClusterSpec::FromFile(dir);
  CHECK(std::string(s.status().message()).find("not a file") != std::string::npos);
}

TEST_CASE("syntax errors name line and column", "[config]") {
  auto c =
      ParseTrainingConfig("max_steps: 10\nseed: 1\nmodel { mlp { input_dim: x } }\n", "bad.pbtxt");
  REQUIRE_FALSE(c.ok());
  std::string msg(c.status().message());
  CHECK(msg.find("bad.pbtxt:3:") != std::string::npos);

  c = ParseTrainingConfig("no_such_field: 1\n", "bad.pbtxt");
  REQUIRE_FALSE(c.ok());
  CHECK(std::string(c.status().message()).find("bad.pbtxt:1:1") != std::string::npos);
}

TEST_CASE("semantic errors name the field", "[config]") {
  std::string text = kGood;
  text.replace(text.find("batch_size: 32"), 14, "batch_size: 0");
  auto c = ParseTrainingConfig(text, "x.pbtxt");
  REQUIRE_FALSE(c.ok());
  CHECK(std::string(c.status().message()).find("data.batch_size") != std::string::npos);

  text = kGood;
  text.replace(text.find("max_steps: 100"), 14, "max_steps: -1");
  c = ParseTrainingConfig(text, "x.pbtxt");
  REQUIRE_FALSE(c.ok());
  CHECK(std::string(c.status().message()).find("max_steps") != std::string::npos);

  for (const char* rate : {"inf", "nan", "0", "-1"}) {
    INFO(rate);
    text = kGood;
    const size_t at = text.find("learning_rate: ");
    REQUIRE(at != std::string::npos);
    text.replace(at, text.find_first_of(" \n}", at + 15) - at,
                 absl::StrCat("learning_rate: ", rate));
    c = ParseTrainingConfig(text, "x.pbtxt");
    REQUIRE_FALSE(c.ok());
    CHECK(std::string(c.status().message()).find("optimizer.learning_rate") != std::string::npos);
  }

  // The gradient bound: non-negative, finite, and its relative part with a floor.
  for (const auto& [fields, expect] : std::vector<std::pair<std::string, std::string>>{
           {"max_gradient_norm: -1", "optimizer.max_gradient_norm: expected >= 0"},
           {"max_relative_gradient_norm: inf", "optimizer.max_relative_gradient_norm"},
           {"max_relative_gradient_norm: 2", "needs optimizer.max_gradient_norm > 0 too"}}) {
    INFO(fields);
    text = kGood;
    const size_t at = text.find("learning_rate: ");
    REQUIRE(at != std::string::npos);
    text.insert(at, fields + " ");
    c = ParseTrainingConfig(text, "x.pbtxt");
    REQUIRE_FALSE(c.ok());
    CHECK(std::string(c.status().message()).find(expect) != std::string::npos);
  }
  text = kGood;
  text.insert(text.find("learning_rate: "), "max_gradient_norm: 5 max_relative_gradient_norm: 2 ");
  CHECK(ParseTrainingConfig(text, "x.pbtxt").ok());

  // A call must stay under the message cap.
  for (const char* bytes : {"-1", "67108865"}) {
    INFO(bytes);
    c = ParseTrainingConfig(absl::StrCat(kGood, "\nrpc { call_bytes: ", bytes, " }\n"), "x.pbtxt");
    REQUIRE_FALSE(c.ok());
    CHECK(std::string(c.status().message()).find("rpc.call_bytes") != std::string::npos);
  }
  c = ParseTrainingConfig(absl::StrCat(kGood, "\nrpc { call_bytes: 65536 }\n"), "x.pbtxt");
  REQUIRE(c.ok());
  CHECK(c->rpc().call_bytes() == 65536);
  // The window on calls in flight per server.
  for (const char* calls : {"-1", "4097"}) {
    INFO(calls);
    c = ParseTrainingConfig(absl::StrCat(kGood, "\nrpc { calls_in_flight: ", calls, " }\n"),
                            "x.pbtxt");
    REQUIRE_FALSE(c.ok());
    CHECK(std::string(c.status().message()).find("rpc.calls_in_flight") != std::string::npos);
  }
  c = ParseTrainingConfig(absl::StrCat(kGood, "\nrpc { calls_in_flight: 1 }\n"), "x.pbtxt");
  REQUIRE(c.ok());
  CHECK(c->rpc().calls_in_flight() == 1);
  // TCP connections per server.
  for (const char* connections : {"-1", "17"}) {
    INFO(connections);
    c = ParseTrainingConfig(
        absl::StrCat(kGood, "\nrpc { connections_per_server: ", connections, " }\n"), "x.pbtxt");
    REQUIRE_FALSE(c.ok());
    CHECK(std::string(c.status().message()).find("rpc.connections_per_server") !=
          std::string::npos);
  }
  c = ParseTrainingConfig(absl::StrCat(kGood, "\nrpc { connections_per_server: 16 }\n"), "x.pbtxt");
  REQUIRE(c.ok());
  CHECK(c->rpc().connections_per_server() == 16);
  // Pulls a step ahead: async only, and not with rpc.sequential.
  c = ParseTrainingConfig(absl::StrCat(kGood, "\nrpc { async_prefetch: true }\n"), "x.pbtxt");
  REQUIRE_FALSE(c.ok());
  CHECK(std::string(c.status().message()).find("rpc.async_prefetch: only in async mode") !=
        std::string::npos);
  std::string async = kGood;
  async.replace(async.find("sync { replicas_to_aggregate: 2 }"), 33, "async {}");
  c = ParseTrainingConfig(absl::StrCat(async, "\nrpc { async_prefetch: true sequential: true }\n"),
                          "x.pbtxt");
  REQUIRE_FALSE(c.ok());
  CHECK(std::string(c.status().message()).find("not with rpc.sequential") != std::string::npos);
  c = ParseTrainingConfig(absl::StrCat(async, "\nrpc { async_prefetch: true }\n"), "x.pbtxt");
  REQUIRE(c.ok());
  CHECK(c->rpc().async_prefetch());
}

TEST_CASE(
    "a feature schema of the user's own sizes the click-through model; bad ones are "
    "refused by field",
    "[config][schema]") {
  const std::string base = R"(
model { click_through { table: "t" hidden_units: 16 } }
embedding_tables { name: "t" dim: 8 }
data { format: CRITEO train_tsv: "a.csv" batch_size: 32 SCHEMA }
optimizer { learning_rate: 0.1 sgd {} }
max_steps: 10
)";
  auto with = [&](const std::string& schema) {
    std::string text = base;
    text.replace(text.find("SCHEMA"), 6, schema);
    return ParseTrainingConfig(text, "x.pbtxt");
  };
  // Criteo's layout without a schema.
  auto criteo = with("");
  REQUIRE(criteo.ok());
  CHECK(criteo->model().click_through().numeric_inputs() == 13);
  CHECK(criteo->model().click_through().categorical_fields() == 26);
  CHECK(ExpandModelConfig(criteo->model())->input_dim() == 13 + 26 * 8);
  const std::string schema = R"(schema { separator: "," header: true
    columns { name: "id" }
    columns { name: "price" kind: NUMERIC }
    columns { name: "user" kind: CATEGORICAL hash_buckets: 1000 }
    columns { name: "views" kind: NUMERIC log1p: true integer: true }
    columns { name: "item" kind: CATEGORICAL }
    columns { name: "ad" kind: CATEGORICAL hex: true }
    columns { name: "clicked" kind: LABEL } })";
  auto c = with(schema);
  INFO(c.status());
  REQUIRE(c.ok());
  CHECK(c->model().click_through().numeric_inputs() == 2);
  CHECK(c->model().click_through().categorical_fields() == 3);
  CHECK(ExpandModelConfig(c->model())->input_dim() == 2 + 3 * 8);
  // Stated counts must match the data's.
  std::string stated = base;
  stated.replace(stated.find("hidden_units: 16"), 16, "hidden_units: 16 categorical_fields: 2");
  stated.replace(stated.find("SCHEMA"), 6, schema);
  auto mismatch = ParseTrainingConfig(stated, "x.pbtxt");
  REQUIRE_FALSE(mismatch.ok());
  CHECK(std::string(mismatch.status().message())
            .find("model.click_through.categorical_fields: is 2, the data has 3 categorical "
                  "column(s)") != std::string::npos);
  for (
      const auto& [bad, why] : std::vector<std::pair<std::string, std::string>>{
          {R"(schema { separator: ", " columns { kind: LABEL } columns { kind: CATEGORICAL } })",
           "data.schema.separator: expected one character"},
          {R"(schema { columns { kind: LABEL } columns { kind: LABEL }
                       columns { kind: CATEGORICAL } })",
           "data.schema.columns: expected exactly one LABEL column"},
          {R"(schema { columns { kind: LABEL } columns { kind: NUMERIC } })",
           "data.schema.columns: expected at least one CATEGORICAL column"},
          {R"(schema { columns { kind: LABEL } columns { kind: CATEGORICAL log1p: true } })",
           "data.schema.columns[1].log1p: applies to NUMERIC columns only"},
          {R"(schema { columns { kind: LABEL } columns { kind: NUMERIC hex: true }
                       columns { kind: CATEGORICAL } })",
           "data.schema.columns[1].hex: applies to CATEGORICAL columns only"},
          {R"(schema { columns { kind: LABEL } columns { kind: CATEGORICAL hash_buckets: -1 } })",
           "data.schema.columns[1].hash_buckets: expected 0 (no hashing) or 1..2^40"},
          {R"(schema { columns { kind: LABEL } columns { kind: CATEGORICAL max_values: 2000 } })",
           "data.schema.columns[1].max_values: expected 0..1024"},
          {R"(schema { columns { kind: LABEL } columns { kind: NUMERIC max_values: 3 }
                       columns { kind: CATEGORICAL } })",
           "data.schema.columns[1].max_values: applies to CATEGORICAL columns only"},
          {R"(schema { columns { kind: LABEL }
                       columns { kind: CATEGORICAL value_separator: ";" } })",
           "data.schema.columns[1].value_separator: needs max_values > 1"},
          {R"(schema { columns { kind: LABEL }
                       columns { kind: CATEGORICAL max_values: 4 value_separator: "\t" } })",
           "data.schema.columns[1].value_separator: expected one character, not a newline, a "
           "quote or the column separator"},
          {R"(schema { separator: "|" columns { kind: LABEL }
                       columns { kind: CATEGORICAL max_values: 4 } })",
           "data.schema.columns[1].value_separator: the default \"|\" is the column separator"},
          {R"(schema { columns { kind: LABEL }
                       columns { kind: CATEGORICAL count: 100 max_values: 1000 } })",
           "data.schema.columns: expected at most 65536 ids an example"},
      }) {
    auto refused = with(bad);
    INFO(bad);
    REQUIRE_FALSE(refused.ok());
    CHECK(std::string(refused.status().message()).find(why) != std::string::npos);
  }
  // A multi-hot column is one bag of up to max_values ids.
  auto multi = with(R"(schema { columns { kind: LABEL } columns { kind: NUMERIC }
    columns { kind: CATEGORICAL count: 2 } columns { kind: CATEGORICAL max_values: 5 } })");
  REQUIRE(multi.ok());
  CHECK(multi->model().click_through().categorical_fields() == 3);
  CHECK(FieldIdSlots(multi->data().schema()) == std::vector<int>{1, 1, 5});
  // No numeric column: the model's input is the bags alone.
  auto bags_only = with(R"(schema { columns { kind: CATEGORICAL count: 3 }
    columns { kind: LABEL } })");
  REQUIRE(bags_only.ok());
  CHECK(bags_only->model().click_through().numeric_inputs() == 0);
  CHECK(ExpandModelConfig(bags_only->model())->input_dim() == 3 * 8);
  // A count is that many columns.
  auto counted = with(R"(schema { columns { kind: LABEL }
    columns { kind: NUMERIC count: 3 } columns { kind: CATEGORICAL count: 40 } })");
  REQUIRE(counted.ok());
  CHECK(counted->model().click_through().numeric_inputs() == 3);
  CHECK(counted->model().click_through().categorical_fields() == 40);
  CHECK(EffectiveSchema(counted->data().schema()).columns_size() == 44);
  for (const char* bad : {"count: -1", "count: 5000"}) {
    auto refused =
        with(absl::StrCat("schema { columns { kind: LABEL } columns { kind: "
                          "CATEGORICAL ",
                          bad, " } }"));
    REQUIRE_FALSE(refused.ok());
    INFO(refused.status().message());
    CHECK(std::string(refused.status().message())
              .find("data.schema.columns[1].count: expected "
                    "0..4096") != std::string::npos);
  }
  // A schema describes click-through files only.
  auto csv = ParseTrainingConfig(
      "model { mlp { input_dim: 4 num_classes: 2 } }\ndata { format: CSV train_csv: \"a\" "
      "batch_size: 8 schema { separator: \",\" } }\noptimizer { learning_rate: 0.1 sgd {} }\n"
      "max_steps: 10\n",
      "x.pbtxt");
  REQUIRE_FALSE(csv.ok());
  CHECK(std::string(csv.status().message())
            .find("data.schema: describes format: CRITEO files "
                  "only") != std::string::npos);
}

TEST_CASE("columns look up tables of their own; the bags' width is their dims' sum",
          "[config][schema]") {
  const std::string base = R"(
model { click_through { table: "t" hidden_units: 16 } }
embedding_tables { name: "t" dim: 8 }
embedding_tables { name: "items" dim: 4 optimizer { learning_rate: 0.05 adagrad {} } }
TABLES
data { format: CRITEO train_tsv: "a.csv" batch_size: 32 schema { columns { kind: LABEL }
  columns { kind: NUMERIC count: 2 } COLUMNS } }
optimizer { learning_rate: 0.1 sgd {} }
max_steps: 10
)";
  auto with = [&](const std::string& columns, const std::string& tables = "") {
    std::string text = base;
    text.replace(text.find("COLUMNS"), 7, columns);
    text.replace(text.find("TABLES"), 6, tables);
    return ParseTrainingConfig(text, "x.pbtxt");
  };
  // Two columns on the model's table (8 wide), three on "items" (4 wide),
  // two of them sharing one vocabulary.
  auto c = with(R"(columns { kind: CATEGORICAL count: 2 }
    columns { name: "item" kind: CATEGORICAL table: "items" vocabulary: "item" }
    columns { name: "seen" kind: CATEGORICAL table: "items" vocabulary: "item" max_values: 5 }
    columns { name: "shop" kind: CATEGORICAL table: "items" })");
  INFO(c.status());
  REQUIRE(c.ok());
  const ClickThroughConfig& ct = c->model().click_through();
  CHECK(ct.categorical_fields() == 5);
  CHECK(ct.bag_inputs() == 2 * 8 + 3 * 4);
  CHECK(ExpandModelConfig(c->model())->input_dim() == 2 + 2 * 8 + 3 * 4);
  CHECK(FieldTables(c->data().schema(), "t") ==
        std::vector<std::string>{"t", "t", "items", "items", "items"});
  // Every column on the model's table, named or not: bag_inputs stays 0
  // (the config as it was before columns had tables).
  auto same = with(R"(columns { kind: CATEGORICAL count: 2 table: "t" })");
  REQUIRE(same.ok());
  CHECK(same->model().click_through().bag_inputs() == 0);
  CHECK(ExpandModelConfig(same->model())->input_dim() == 2 + 2 * 8);
  for (const auto& [columns, tables, why] : std::vector<std::array<std::string, 3>>{
           {R"(columns { kind: CATEGORICAL table: "nope" })", "",
            "data.schema.columns[2].table: no embedding_tables entry named \"nope\""},
           {R"(columns { kind: CATEGORICAL table: "fixed" })",
            R"(embedding_tables { name: "fixed" dim: 4 num_rows: 100 })",
            "data.schema.columns[2].table: table fixed has num_rows"},
           {R"(columns { kind: NUMERIC table: "items" } columns { kind: CATEGORICAL })", "",
            "data.schema.columns[2].table: applies to CATEGORICAL columns only"},
           {R"(columns { kind: NUMERIC vocabulary: "v" } columns { kind: CATEGORICAL })", "",
            "data.schema.columns[2].vocabulary: applies to CATEGORICAL columns only"},
           {R"(columns { kind: CATEGORICAL vocabulary: "v" table: "items" }
               columns { kind: CATEGORICAL vocabulary: "v" })", "",
            "data.schema.columns[3].vocabulary: \"v\" is also columns[2]'s, whose table, "
            "hash_buckets or hex differ"},
           {R"(columns { kind: CATEGORICAL vocabulary: "v" hash_buckets: 10 }
               columns { kind: CATEGORICAL vocabulary: "v" })", "",
            "data.schema.columns[3].vocabulary"},
       }) {
    auto refused = with(columns, tables);
    INFO(columns);
    REQUIRE_FALSE(refused.ok());
    INFO(refused.status().message());
    CHECK(std::string(refused.status().message()).find(why) != std::string::npos);
  }
  // A stated width must be the tables'.
  auto stated = [&](int width) {
    std::string text = base;
    text.replace(text.find("hidden_units: 16"), 16,
                 absl::StrCat("hidden_units: 16 bag_inputs: ", width));
    text.replace(text.find("COLUMNS"), 7,
                 R"(columns { kind: CATEGORICAL } columns { kind: CATEGORICAL table: "items" })");
    text.replace(text.find("TABLES"), 6, "");
    return ParseTrainingConfig(text, "x.pbtxt");
  };
  CHECK(stated(12).ok());
  auto wrong = stated(20);
  REQUIRE_FALSE(wrong.ok());
  CHECK(std::string(wrong.status().message())
            .find("model.click_through.bag_inputs: is 20, the columns' tables give 12") !=
        std::string::npos);
}

TEST_CASE("a cross network: in a sequential model, or over a click-through model's input",
          "[config][cross]") {
  auto ct = ParseTrainingConfig(R"(
model { click_through { table: "t" hidden_units: 16 cross_layers: 3 } }
embedding_tables { name: "t" dim: 8 }
data { format: CRITEO train_tsv: "a.tsv" batch_size: 32 }
optimizer { learning_rate: 0.1 sgd {} }
max_steps: 10
)",
                                "x.pbtxt");
  INFO(ct.status());
  REQUIRE(ct.ok());
  auto seq = ExpandModelConfig(ct->model());
  REQUIRE(seq.ok());
  REQUIRE(seq->layer_size() == 5);  // cross, dense, relu, dense, loss
  CHECK(seq->layer(0).cross().layers() == 3);
  CHECK(seq->layer(1).dense().units() == 16);
  ModelConfig model = ct->model();
  for (const auto& [layers, why] : std::vector<std::pair<int, std::string>>{
           {17, "model.click_through.cross_layers: expected 0..16"},
           {-1, "model.click_through.cross_layers: expected 0..16"}}) {
    model.mutable_click_through()->set_cross_layers(layers);
    auto refused = ExpandModelConfig(model);
    REQUIRE_FALSE(refused.ok());
    CHECK(std::string(refused.status().message()).find(why) != std::string::npos);
  }
  // Kernels of width^2 floats: a click-through input of 26,013 is refused.
  model.mutable_click_through()->set_cross_layers(1);
  model.mutable_click_through()->set_embedding_dim(1000);
  auto wide = ExpandModelConfig(model);
  REQUIRE_FALSE(wide.ok());
  CHECK(std::string(wide.status().message()).find("inputs^2 x layers at most 2^28") !=
        std::string::npos);
  ModelConfig s;
  REQUIRE(google::protobuf::TextFormat::ParseFromString(
      "sequential { input_dim: 4 layer { cross { layers: 20 } } layer { dense { units: 2 } } "
      "layer { softmax_cross_entropy {} } }",
      &s));
  auto bad = ExpandModelConfig(s);
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message())
            .find("model.sequential.layer[0].cross.layers: expected 1..16") != std::string::npos);
}

TEST_CASE("DLRM's dot interaction: filled in for a click-through model; bad ones refused",
          "[config][dot]") {
  const std::string base = R"(
model { click_through { table: "t" hidden_units: 16 DOT } }
embedding_tables { name: "t" dim: 8 }
embedding_tables { name: "u" dim: 4 }
data { format: CRITEO train_tsv: "a.tsv" batch_size: 32 SCHEMA }
optimizer { learning_rate: 0.1 sgd {} }
max_steps: 10
)";
  auto with = [&](const std::string& dot, const std::string& schema = "") {
    std::string text = base;
    text.replace(text.find("DOT"), 3, dot);
    text.replace(text.find("SCHEMA"), 6, schema);
    return ParseTrainingConfig(text, "x.pbtxt");
  };
  auto c = with("dot { bottom_units: 32 bottom_units: 8 }");
  INFO(c.status());
  REQUIRE(c.ok());
  auto seq = ExpandModelConfig(c->model());
  REQUIRE(seq.ok());
  const DotConfig& dot = seq->layer(0).dot();
  CHECK(dot.dense_inputs() == 13);
  CHECK(dot.dim() == 8);
  CHECK(dot.bottom_units_size() == 2);
  CHECK(seq->layer(1).dense().units() == 16);
  for (const auto& [text, schema, why] : std::vector<std::array<std::string, 3>>{
           {"dot { bottom_units: 32 }", "",
            "model.click_through.dot.bottom_units: the last must be dim, 8"},
           {"dot { dim: 4 }", "", "model.click_through.dot.dim: is 4, the model's is 8"},
           {"dot {} cross_layers: 1", "", "model.click_through.dot: not with cross_layers"},
           {"dot {}",
            "schema { columns { kind: LABEL } columns { kind: NUMERIC } "
            "columns { kind: CATEGORICAL } columns { kind: CATEGORICAL table: \"u\" } }",
            "data.schema.columns[3].table: table u has dim 4; model.click_through.dot needs"},
           {"dot {}", "schema { columns { kind: LABEL } columns { kind: CATEGORICAL count: 3 } }",
            "model.click_through.dot: needs numeric columns"},
       }) {
    auto refused = with(text, schema);
    INFO(text << " " << schema);
    REQUIRE_FALSE(refused.ok());
    INFO(refused.status().message());
    CHECK(std::string(refused.status().message()).find(why) != std::string::npos);
  }
  // In a sequential model: its width from the input.
  ModelConfig s;
  REQUIRE(google::protobuf::TextFormat::ParseFromString(
      "sequential { input_dim: 11 layer { dot { dense_inputs: 3 dim: 2 } } "
      "layer { dense { units: 2 } } layer { softmax_cross_entropy {} } }",
      &s));
  CHECK(ExpandModelConfig(s).ok());
  s.mutable_sequential()->mutable_layer(0)->mutable_dot()->set_dim(3);
  auto bad = ExpandModelConfig(s);
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message())
            .find("model.sequential.layer[0].dot.dim: expected 1..1024, dividing the 8") !=
        std::string::npos);
}

TEST_CASE("consistency settings are checked: no configuration can wait forever", "[config]") {
  struct Case {
    const char* replace;
    const char* field;
  };
  for (const Case& k : {
           Case{"sync { replicas_to_aggregate: 2 min_replicas: 1 }", "sync.min_replicas"},
           Case{"sync { replicas_to_aggregate: 2 min_replicas: 3 step_deadline_ms: 100 }",
                "sync.min_replicas"},
           Case{"sync { step_deadline_ms: -5 }", "sync.step_deadline_ms"},
           Case{"sync { step_deadline_ms: 60000 }", "sync.step_deadline_ms"},
           Case{"async { staleness_bound: -1 }", "async.staleness_bound"},
       }) {
    std::string text = kGood;
    text.replace(text.find("sync { replicas_to_aggregate: 2 }"), 33, k.replace);
    auto c = ParseTrainingConfig(text, "x.pbtxt");
    INFO(k.replace);
    REQUIRE_FALSE(c.ok());
    CHECK(std::string(c.status().message()).find(k.field) != std::string::npos);
  }
  std::string text = kGood;
  text.replace(text.find("sync { replicas_to_aggregate: 2 }"), 33,
               "sync { replicas_to_aggregate: 2 min_replicas: 1 step_deadline_ms: 500 }");
  CHECK(ParseTrainingConfig(text, "x.pbtxt").ok());
}

TEST_CASE("checkpoint settings are checked and keep defaults to 3", "[config][checkpoint]") {
  auto c = ParseTrainingConfig(std::string(kGood) + "checkpoint { dir: \"ck\" every_steps: 50 }\n",
                               "x.pbtxt");
  REQUIRE(c.ok());
  CHECK(c->checkpoint().keep() == 3);
  CHECK(c->checkpoint().every_steps() == 50);
  struct Case {
    const char* extra;
    const char* says;
  };
  for (const Case& k : {
           Case{"checkpoint { dir: \"ck\" every_steps: -1 }", "checkpoint.every_steps"},
           Case{"checkpoint { dir: \"ck\" keep: -2 }", "checkpoint.keep"},
           Case{"checkpoint { every_steps: 10 }", "without checkpoint.dir"},
           Case{"checkpoint { every_seconds: 10 }", "without checkpoint.dir"},
           Case{"checkpoint { dir: \"ck\" every_seconds: -1 }", "checkpoint.every_seconds"},
           Case{"checkpoint { dir: \"ck\" full_every: -1 }", "checkpoint.full_every"},
           Case{"checkpoint { dir: \"ck\" full_every: 1001 }", "checkpoint.full_every"},
           Case{"checkpoint { serving_dir: \"s\" }", "checkpoint.serving_dir: set without"},
           Case{"checkpoint { dir: \"ck\" stop_save_seconds: -2 }", "checkpoint.stop_save_seconds"},
           Case{"checkpoint { dir: \"ck\" stop_save_seconds: 3601 }",
                "checkpoint.stop_save_seconds"},
       }) {
    INFO(k.extra);
    auto bad = ParseTrainingConfig(std::string(kGood) + k.extra + "\n", "x.pbtxt");
    REQUIRE_FALSE(bad.ok());
    CHECK(std::string(bad.status().message()).find(k.says) != std::string::npos);
  }
  std::string async = kGood;
  async.replace(async.find("sync { replicas_to_aggregate: 2 }"), 33, "async {}");
  // Embedding tables are checkpointed with the variables.
  CHECK(ParseTrainingConfig(std::string(kGood) +
                                "checkpoint { dir: \"ck\" }\nembedding_tables { name: \"t\" "
                                "dim: 4 }\n",
                            "x.pbtxt")
            .ok());
  // Async runs checkpoint too (the chief takes a cut with pushes held).
  auto a = ParseTrainingConfig(async + "checkpoint { dir: \"ck\" }\n", "x.pbtxt");
  REQUIRE(a.ok());
  CHECK(a->checkpoint().keep() == 3);
  // A stopped run's save: 20 s by default, as set, or none.
  CHECK(StopSaveTimeout(*a) == absl::Seconds(20));
  for (const auto& [extra, want] : std::vector<std::pair<std::string, absl::Duration>>{
           {"checkpoint { dir: \"ck\" stop_save_seconds: 90 }", absl::Seconds(90)},
           {"checkpoint { dir: \"ck\" stop_save_seconds: -1 }", absl::ZeroDuration()},
           {"", absl::ZeroDuration()}}) {
    auto c2 = ParseTrainingConfig(std::string(kGood) + extra + "\n", "x.pbtxt");
    REQUIRE(c2.ok());
    CHECK(StopSaveTimeout(*c2) == want);
  }
}

TEST_CASE("embedding tables are checked and get their defaults", "[config][embedding]") {
  auto c = ParseTrainingConfig(std::string(kGood) +
                                   "embedding_tables { name: \"ads\" dim: 16 }\n"
                                   "embedding_tables { name: \"user\" dim: 8 num_rows: 100 "
                                   "optimizer { learning_rate: 0.05 ftrl {} } }\n",
                               "x.pbtxt");
  REQUIRE(c.ok());
  CHECK(c->embedding_tables(0).init_scale() == 0.25f);  // 1/sqrt(16)
  CHECK(c->embedding_tables(1).optimizer().ftrl().initial_accumulator_value() == 0.1f);
  struct Case {
    const char* table;
    const char* field;
  };
  for (const Case& k : {
           Case{"name: \"\" dim: 4", "embedding_tables[0].name"},
           Case{"name: \"a b\" dim: 4", "embedding_tables[0].name"},
           Case{"name: \"a\" dim: 0", "embedding_tables[0].dim"},
           Case{"name: \"a\" dim: 4 num_rows: -1", "embedding_tables[0].num_rows"},
           Case{"name: \"a\" dim: 4 init_scale: -1", "embedding_tables[0].init_scale"},
           Case{"name: \"a\" dim: 4 expire_after_steps: -1", "expire_after_steps"},
           Case{"name: \"a\" dim: 4 admit_after: -1", "admit_after"},
           Case{"name: \"a\" dim: 4 memory_budget_bytes: -1", "memory_budget_bytes"},
           Case{"name: \"a\" dim: 4 optimizer { learning_rate: 0 }", "learning_rate"},
       }) {
    INFO(k.table);
    auto bad = ParseTrainingConfig(std::string(kGood) + "embedding_tables { " + k.table + " }\n",
                                   "x.pbtxt");
    REQUIRE_FALSE(bad.ok());
    CHECK(std::string(bad.status().message()).find(k.field) != std::string::npos);
  }
  auto twice = ParseTrainingConfig(std::string(kGood) +
                                       "embedding_tables { name: \"a\" dim: 4 }\n"
                                       "embedding_tables { name: \"a\" dim: 8 }\n",
                                   "x.pbtxt");
  REQUIRE_FALSE(twice.ok());
  CHECK(std::string(twice.status().message()).find("duplicate table a") != std::string::npos);
}

TEST_CASE("fingerprints are stable and tell configs apart", "[config]") {
  auto a = ParseTrainingConfig(kGood, "a");
  auto b = ParseTrainingConfig(kGood, "b");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(ConfigFingerprint(*a) == ConfigFingerprint(*b));
  b->set_seed(8);
  CHECK(ConfigFingerprint(*a) != ConfigFingerprint(*b));
}

TEST_CASE("an external model's run fingerprint covers its variables' names and shapes",
          "[config]") {
  auto builtin = ParseTrainingConfig(kGood, "a");
  REQUIRE(builtin.ok());
  const std::vector<VariableSpec> vars = {{"fc.weight", {10, 64}}, {"fc.bias", {10}}};
  // A built-in model's variables follow from its config.
  CHECK(RunFingerprint(*builtin, vars) == ConfigFingerprint(*builtin));

  TrainingConfig external = *builtin;
  external.mutable_model()->Clear();
  external.mutable_model()->mutable_external()->set_variables("/tmp/net.safetensors");
  const uint64_t base = RunFingerprint(external, vars);
  CHECK(base != ConfigFingerprint(external));
  CHECK(RunFingerprint(external, vars) == base);
  CHECK(RunFingerprint(external, {{"fc.weight", {10, 64}}, {"fc.bias", {11}}}) != base);
  CHECK(RunFingerprint(external, {{"fc.weight", {640}}, {"fc.bias", {10}}}) != base);
  CHECK(RunFingerprint(external, {{"fc.bias", {10}}, {"fc.weight", {10, 64}}}) != base);
  CHECK(RunFingerprint(external, {{"fc.weigh", {10, 64}}, {"fc.bias", {10}}}) != base);
  CHECK(RunFingerprint(external, {{"fc.weight", {10, 64}}}) != base);
}

}  // namespace
}  // namespace pstrain
