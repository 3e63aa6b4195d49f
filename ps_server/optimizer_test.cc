// Each optimizer against values computed by hand (in double, from the
// formulas in proto/config.proto, independently of this code), dense and
// over a range of rows; the learning-rate schedules; clipping; the config's
// checks.
#include "ps_server/optimizer.h"

#include <cmath>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "common/cluster/config.h"
#include "google/protobuf/text_format.h"

namespace pstrain {
namespace {

OptimizerConfig Parse(const std::string& text) {
  OptimizerConfig c;
  REQUIRE(google::protobuf::TextFormat::ParseFromString(text, &c));
  return c;
}

// Two updates of p = [1, -2] by g1 = [0.5, -1], g2 = [0.25, 2] at lr 0.1.
std::vector<float> TwoSteps(const std::string& text) {
  auto opt = CreateOptimizer(Parse("learning_rate: 0.1 " + text));
  REQUIRE(opt.ok());
  std::vector<float> p = {1.0f, -2.0f};
  OptimizerSlots slots;
  (*opt)->InitSlots(2, &slots);
  REQUIRE(slots.size() == (*opt)->slot_names().size());
  const std::vector<std::vector<float>> grads = {{0.5f, -1.0f}, {0.25f, 2.0f}};
  for (int t = 0; t < 2; ++t) {
    UpdateInfo u;
    u.learning_rate = 0.1f;
    u.count = t + 1;
    (*opt)->Apply(absl::MakeSpan(p), grads[t], &slots, u);
  }
  return p;
}

void CheckTwoSteps(const std::string& text, double want0, double want1) {
  INFO(text);
  const std::vector<float> p = TwoSteps(text);
  CHECK(p[0] == Approx(want0).epsilon(2e-6));
  CHECK(p[1] == Approx(want1).epsilon(2e-6));
}

TEST_CASE("every optimizer matches its hand-computed values", "[optimizer]") {
  CheckTwoSteps("sgd {}", 1 - 0.1 * 0.75, -2 - 0.1 * 1.0);
  // v = [0.5, -1] then [0.7, 1.1].
  CheckTwoSteps("momentum {}", 0.88, -2.01);
  // p -= lr (g + 0.9 v).
  CheckTwoSteps("momentum { nesterov: true }", 0.817, -2.109);
  CheckTwoSteps("adagrad {}", 0.876559627, -1.99321523);
  // Step 1 of Adam moves each element by lr * sign(g) (bias-corrected).
  CheckTwoSteps("adam {}", 0.80678204, -1.93661035);
  CheckTwoSteps("adamw {}", 0.80488304, -1.93271235);
  CheckTwoSteps("ftrl {}", 0.342037143, -1.39019254);
  CheckTwoSteps("ftrl { l1: 1 l2: 0.5 }", 0.147607132, -1.18608791);
  // A large L1 penalty holds FTRL's weights at exactly zero.
  const std::vector<float> sparse = TwoSteps("ftrl { l1: 100 }");
  CHECK(sparse[0] == 0.0f);
  CHECK(sparse[1] == 0.0f);
}

TEST_CASE("Adam's first update is lr * sign(g) whatever the count's scale", "[optimizer]") {
  auto opt = CreateOptimizer(Parse("learning_rate: 0.01 adam {}"));
  REQUIRE(opt.ok());
  // The bias correction uses the partition's (or row's) own update count:
  // a row first touched at global step 1000 starts as a fresh one would.
  std::vector<float> p = {0.0f, 0.0f};
  OptimizerSlots slots;
  (*opt)->InitSlots(2, &slots);
  UpdateInfo u;
  u.learning_rate = 0.01f;
  u.count = 1;
  (*opt)->Apply(absl::MakeSpan(p), std::vector<float>{3.0f, -0.002f}, &slots, u);
  CHECK(p[0] == Approx(-0.01f).epsilon(1e-5));
  CHECK(p[1] == Approx(0.01f).epsilon(1e-4));
}

TEST_CASE("a range update touches only its rows, values and slots", "[optimizer]") {
  // Rows of width 2 in a 4-row partition; update rows 1 and 2 only, then
  // compare with the dense update of a 2-row partition of the same values.
  for (const char* kind : {"momentum {}", "adagrad {}", "adam {}", "ftrl {}"}) {
    INFO(kind);
    auto opt = CreateOptimizer(Parse(std::string("learning_rate: 0.05 ") + kind));
    REQUIRE(opt.ok());
    std::vector<float> p = {1, 2, 3, 4, 5, 6, 7, 8}, before = p;
    std::vector<float> rows = {3, 4, 5, 6};
    OptimizerSlots slots, row_slots;
    (*opt)->InitSlots(8, &slots);
    (*opt)->InitSlots(4, &row_slots);
    const OptimizerSlots initial = slots;
    const std::vector<float> g = {0.5f, -0.25f, 1.0f, 2.0f};
    UpdateInfo u;
    u.learning_rate = 0.05f;
    for (int t = 1; t <= 3; ++t) {
      u.count = t;
      (*opt)->ApplyRange(p.data() + 2, p.data() + 2, g.data(), 4, &slots, 2, u);
      (*opt)->Apply(absl::MakeSpan(rows), g, &row_slots, u);
    }
    for (int i : {0, 1, 6, 7}) {
      CHECK(p[i] == before[i]);
      for (size_t s = 0; s < slots.size(); ++s) CHECK(slots[s][i] == initial[s][i]);
    }
    for (int i = 0; i < 4; ++i) {
      CHECK(p[2 + i] == rows[i]);
      for (size_t s = 0; s < slots.size(); ++s) CHECK(slots[s][2 + i] == row_slots[s][i]);
      CHECK(p[2 + i] != before[2 + i]);
    }
  }
}

TEST_CASE("applying out of place gives the same bits as in place", "[optimizer]") {
  for (const char* kind : {"sgd {}", "momentum { nesterov: true }", "adagrad {}", "adamw {}",
                           "ftrl { l1: 0.01 }"}) {
    INFO(kind);
    auto opt = CreateOptimizer(Parse(std::string("learning_rate: 0.05 ") + kind));
    REQUIRE(opt.ok());
    std::vector<float> a(1000), out(1000), g(1000);
    for (int i = 0; i < 1000; ++i) {
      a[i] = std::sin(i * 0.1f);
      g[i] = std::cos(i * 0.37f);
    }
    std::vector<float> b = a;
    OptimizerSlots sa, sb;
    (*opt)->InitSlots(1000, &sa);
    (*opt)->InitSlots(1000, &sb);
    UpdateInfo u;
    u.learning_rate = 0.05f;
    (*opt)->Apply(absl::MakeSpan(a), g, &sa, u);
    // Out of place, in two chunks.
    (*opt)->ApplyRange(b.data(), out.data(), g.data(), 300, &sb, 0, u);
    (*opt)->ApplyRange(b.data() + 300, out.data() + 300, g.data() + 300, 700, &sb, 300, u);
    CHECK(a == out);
    CHECK(sa == sb);
  }
}

TEST_CASE("learning-rate schedules: warm-up, step, cosine, linear scaling", "[optimizer]") {
  auto constant = LearningRate::Create(Parse("learning_rate: 0.5"), 64, 100);
  REQUIRE(constant.ok());
  CHECK(constant->At(0) == 0.5f);
  CHECK(constant->At(99) == 0.5f);

  // Linear scaling: global batch 256 over a base of 64 is 4x; warm-up over 4
  // updates reaches the peak at t = 3.
  auto warm = LearningRate::Create(
      Parse("learning_rate: 0.1 base_batch_size: 64 schedule { warmup_steps: 4 }"), 256, 100);
  REQUIRE(warm.ok());
  CHECK(warm->base() == Approx(0.4));
  CHECK(warm->At(0) == Approx(0.1));
  CHECK(warm->At(1) == Approx(0.2));
  CHECK(warm->At(3) == Approx(0.4));
  CHECK(warm->At(50) == Approx(0.4));

  // decay_rate left out: its default, 0.1.
  auto step = LearningRate::Create(
      Parse("learning_rate: 1 schedule { kind: STEP decay_steps: 10 warmup_steps: 2 }"), 1, 100);
  REQUIRE(step.ok());
  CHECK(step->At(2) == Approx(1.0));
  CHECK(step->At(11) == Approx(1.0));
  CHECK(step->At(12) == Approx(0.1));
  CHECK(step->At(32) == Approx(0.001));

  // Cosine over max_steps - warmup = 100 - 0 by default, to a floor of 10%.
  auto cosine = LearningRate::Create(
      Parse("learning_rate: 2 schedule { kind: COSINE min_learning_rate_ratio: 0.1 }"), 1, 100);
  REQUIRE(cosine.ok());
  CHECK(cosine->At(0) == Approx(2.0));
  CHECK(cosine->At(50) == Approx(2.0 * (0.1 + 0.9 * 0.5)));
  CHECK(cosine->At(100) == Approx(0.2));
  CHECK(cosine->At(1000) == Approx(0.2));
  for (int t = 1; t <= 100; ++t) CHECK(cosine->At(t) <= cosine->At(t - 1));
}

TEST_CASE("ClipByValue bounds every element", "[optimizer]") {
  std::vector<float> g = {-5, -0.5, 0, 0.25, 7};
  ClipByValue(g.data(), 5, 1.0f);
  CHECK(g == std::vector<float>{-1, -0.5, 0, 0.25, 1});
}

TEST_CASE("the optimizer config is checked and its defaults filled", "[optimizer][config]") {
  OptimizerConfig adam = Parse("learning_rate: 0.1 adam {}");
  REQUIRE(ValidateAndFillOptimizerDefaults(&adam, 100, "t").ok());
  CHECK(adam.adam().beta1() == 0.9f);
  CHECK(adam.adam().beta2() == 0.999f);
  CHECK(adam.adam().epsilon() == 1e-8f);
  OptimizerConfig again = adam;  // filling is idempotent: a filled config passes again
  REQUIRE(ValidateAndFillOptimizerDefaults(&again, 100, "t").ok());
  CHECK(again.SerializeAsString() == adam.SerializeAsString());
  OptimizerConfig adamw = Parse("learning_rate: 0.1 adamw {}");
  REQUIRE(ValidateAndFillOptimizerDefaults(&adamw, 100, "t").ok());
  CHECK(adamw.adamw().weight_decay() == 0.01f);
  OptimizerConfig momentum = Parse("learning_rate: 0.1 momentum {}");
  REQUIRE(ValidateAndFillOptimizerDefaults(&momentum, 100, "t").ok());
  CHECK(momentum.momentum().momentum() == 0.9f);

  for (const char* bad : {
           "learning_rate: 0",
           "learning_rate: 0.1 adam { beta1: 1 }",
           "learning_rate: 0.1 adam { beta2: -0.1 }",
           "learning_rate: 0.1 adam { weight_decay: 0.1 }",
           "learning_rate: 0.1 adagrad { initial_accumulator_value: 0 epsilon: 0 }",
           "learning_rate: 0.1 momentum { momentum: 1.5 }",
           "learning_rate: 0.1 ftrl { l1: -1 }",
           "learning_rate: 0.1 schedule { kind: STEP }",
           "learning_rate: 0.1 schedule { kind: STEP decay_steps: 5 decay_rate: 2 }",
           "learning_rate: 0.1 schedule { kind: COSINE warmup_steps: 100 }",
           "learning_rate: 0.1 schedule { warmup_steps: -1 }",
           "learning_rate: 0.1 clip_value: -1",
           "learning_rate: 0.1 clip_global_norm: -2",
           "learning_rate: 0.1 base_batch_size: -64",
       }) {
    INFO(bad);
    OptimizerConfig c = Parse(bad);
    absl::Status st = ValidateAndFillOptimizerDefaults(&c, 100, "t");
    CHECK(absl::IsInvalidArgument(st));
    CHECK(st.message().find("optimizer") != std::string::npos);
  }
}

}  // namespace
}  // namespace pstrain
