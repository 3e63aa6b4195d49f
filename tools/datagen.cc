#include "tools/datagen.h"

#include <limits>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cluster/feature_schema.h"
#include "google/protobuf/text_format.h"
#include "common/base/embedding_ids.h"
#include "worker/model/binary_metrics.h"
#include "common/cluster/sizing.h"
#include "common/base/status_macros.h"

namespace pstrain {
namespace {

constexpr int kSide = 28;
constexpr double kPi = 3.14159265358979323846;

struct Point {
  double x, y;  // x right, y down, glyph box [0,1]^2
};
using Stroke = std::vector<Point>;

// An arc of an ellipse centred at (cx, cy), angles in degrees (0 = right, 90 = down).
Stroke Arc(double cx, double cy, double rx, double ry, double from, double to, int n = 10) {
  Stroke s;
  for (int i = 0; i <= n; ++i) {
    double a = (from + (to - from) * i / n) * kPi / 180.0;
    s.push_back({cx + rx * std::cos(a), cy + ry * std::sin(a)});
  }
  return s;
}

const std::array<std::vector<Stroke>, 10>& Glyphs() {
  static const auto* glyphs = new std::array<std::vector<Stroke>, 10>{{
      /*0*/ {Arc(0.5, 0.5, 0.28, 0.4, 0, 360, 16)},
      /*1*/ {{{0.35, 0.25}, {0.55, 0.1}, {0.55, 0.9}}, {{0.38, 0.9}, {0.72, 0.9}}},
      /*2*/ {Arc(0.5, 0.32, 0.26, 0.22, 190, 375), {{0.75, 0.4}, {0.22, 0.9}, {0.8, 0.9}}},
      /*3*/ {Arc(0.48, 0.3, 0.25, 0.2, 200, 450), Arc(0.48, 0.7, 0.28, 0.2, 270, 520)},
      /*4*/ {{{0.62, 0.1}, {0.2, 0.65}, {0.82, 0.65}}, {{0.62, 0.1}, {0.62, 0.92}}},
      /*5*/ {{{0.75, 0.1}, {0.3, 0.1}, {0.27, 0.45}}, Arc(0.48, 0.65, 0.28, 0.25, 220, 500)},
      /*6*/ {Arc(0.55, 0.45, 0.3, 0.38, 250, 150), Arc(0.5, 0.68, 0.25, 0.22, 0, 360, 14)},
      /*7*/ {{{0.2, 0.1}, {0.8, 0.1}, {0.42, 0.92}}, {{0.4, 0.5}, {0.7, 0.5}}},
      /*8*/ {Arc(0.5, 0.3, 0.2, 0.2, 0, 360, 14), Arc(0.5, 0.7, 0.26, 0.21, 0, 360, 14)},
      /*9*/ {Arc(0.5, 0.32, 0.25, 0.22, 0, 360, 14), {{0.75, 0.32}, {0.68, 0.92}}},
  }};
  return *glyphs;
}

// Portable uniform doubles from a fixed engine.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double Uniform(double lo, double hi) {
    return lo + (hi - lo) * (static_cast<double>(engine_() >> 11) * 0x1.0p-53);
  }
  uint64_t Next() { return engine_(); }

 private:
  std::mt19937_64 engine_;
};

double SegmentDistance(double px, double py, const Point& a, const Point& b) {
  const double dx = b.x - a.x, dy = b.y - a.y;
  const double len2 = dx * dx + dy * dy;
  double t = len2 > 0 ? ((px - a.x) * dx + (py - a.y) * dy) / len2 : 0;
  t = std::clamp(t, 0.0, 1.0);
  const double ex = a.x + t * dx - px, ey = a.y + t * dy - py;
  return std::sqrt(ex * ex + ey * ey);
}

void RenderOne(int digit, Rng* rng, double k, uint8_t* out) {
  // Affine warp from the glyph box to pixels.
  const double scale = 20.0 * rng->Uniform(1 - 0.15 * k, 1 + 0.1 * k);
  const double angle = rng->Uniform(-0.25, 0.25) * k;
  const double shear = rng->Uniform(-0.25, 0.25) * k;
  const double tx = 14 + rng->Uniform(-3, 3) * k, ty = 14 + rng->Uniform(-3, 3) * k;
  const double width = rng->Uniform(0.9, 1.9);
  const double ca = std::cos(angle), sa = std::sin(angle);
  std::vector<std::pair<Point, Point>> segments;
  for (const Stroke& stroke : Glyphs()[digit]) {
    std::vector<Point> pts;
    for (const Point& p : stroke) {
      double x = p.x - 0.5 + rng->Uniform(-0.04, 0.04) * k;
      double y = p.y - 0.5 + rng->Uniform(-0.04, 0.04) * k;
      x += shear * y;
      pts.push_back({tx + scale * (ca * x - sa * y), ty + scale * (sa * x + ca * y)});
    }
    for (size_t i = 1; i < pts.size(); ++i) segments.emplace_back(pts[i - 1], pts[i]);
  }
  const double ink = rng->Uniform(0.75, 1.0);
  for (int r = 0; r < kSide; ++r) {
    for (int c = 0; c < kSide; ++c) {
      double d = 1e9;
      for (const auto& [a, b] : segments) d = std::min(d, SegmentDistance(c + 0.5, r + 0.5, a, b));
      double v = std::clamp(width - d + 0.5, 0.0, 1.0) * ink;
      v += rng->Uniform(0, 0.12) * k;                               // background noise
      if (rng->Uniform(0, 1) < 0.01 * k) v = rng->Uniform(0.5, 1);  // speckles
      out[r * kSide + c] = static_cast<uint8_t>(std::lround(std::clamp(v, 0.0, 1.0) * 255));
    }
  }
}

}  // namespace

void RenderDigits(int64_t n, uint64_t seed, double difficulty, IdxArray* images, IdxArray* labels) {
  images->dims = {n, kSide, kSide};
  images->data.assign(static_cast<size_t>(n) * kSide * kSide, 0);
  labels->dims = {n};
  labels->data.assign(n, 0);
  Rng rng(seed);
  // Balanced labels in a shuffled order.
  std::vector<uint8_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = static_cast<uint8_t>(i % 10);
  for (int64_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.Next() % i]);
  for (int64_t i = 0; i < n; ++i) {
    labels->data[i] = order[i];
    RenderOne(order[i], &rng, difficulty, images->data.data() + i * kSide * kSide);
  }
}

// The digits are rendered in memory, one split at a time, before they are
// written: `bytes_per_example` of that (IDX: the image and its label; CSV:
// also the text).
absl::Status CheckDigitsFit(const DigitsOptions& options, int64_t bytes_per_example,
                            const char* format) {
  if (options.train_examples <= 0 || options.test_examples < 0) {
    return absl::InvalidArgumentError("datagen: --train must be > 0 and --test >= 0");
  }
  const int64_t n = std::max(options.train_examples, options.test_examples);
  const int64_t bytes = n > std::numeric_limits<int64_t>::max() / bytes_per_example
                            ? std::numeric_limits<int64_t>::max()
                            : n * bytes_per_example;
  return CheckMemory(absl::StrCat("datagen --format=", format, " of ", n, " examples"), bytes,
                     PhysicalMemoryBytes());
}

absl::Status WriteDigitsDataset(Env* env, const std::string& dir, const DigitsOptions& options) {
  RETURN_IF_ERROR(CheckDigitsFit(options, kSide * kSide + 1, "idx"));
  RETURN_IF_ERROR(env->CreateDirs(dir));
  IdxArray images, labels;
  RenderDigits(options.train_examples, options.seed, options.difficulty, &images, &labels);
  RETURN_IF_ERROR(WriteIdxFile(env, JoinPath(dir, "train-images-idx3-ubyte"), images));
  RETURN_IF_ERROR(WriteIdxFile(env, JoinPath(dir, "train-labels-idx1-ubyte"), labels));
  // A different stream for the held-out set.
  RenderDigits(options.test_examples, options.seed * 7919 + 17, options.difficulty, &images,
               &labels);
  RETURN_IF_ERROR(WriteIdxFile(env, JoinPath(dir, "t10k-images-idx3-ubyte"), images));
  RETURN_IF_ERROR(WriteIdxFile(env, JoinPath(dir, "t10k-labels-idx1-ubyte"), labels));
  return absl::OkStatus();
}

namespace {

std::string DigitsCsv(const IdxArray& images, const IdxArray& labels) {
  std::string out = "label";
  for (int p = 0; p < kSide * kSide; ++p) absl::StrAppend(&out, ",p", p);
  out += "\n";
  const int64_t n = labels.dims[0];
  char buf[16];
  for (int64_t i = 0; i < n; ++i) {
    absl::StrAppend(&out, int{labels.data[i]});
    const uint8_t* px = images.data.data() + i * kSide * kSide;
    for (int p = 0; p < kSide * kSide; ++p) {
      if (px[p] == 0) {
        out += ",0";
      } else {
        std::snprintf(buf, sizeof(buf), ",%.3f", px[p] / 255.0);
        out += buf;
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace

absl::Status WriteDigitsCsv(Env* env, const std::string& dir, const DigitsOptions& options) {
  // A line is at most 6 characters a pixel (",0.502"), mostly ",0".
  RETURN_IF_ERROR(CheckDigitsFit(options, kSide * kSide * 7 + 4, "csv"));
  RETURN_IF_ERROR(env->CreateDirs(dir));
  IdxArray images, labels;
  RenderDigits(options.train_examples, options.seed, options.difficulty, &images, &labels);
  RETURN_IF_ERROR(env->WriteFile(JoinPath(dir, "train.csv"), DigitsCsv(images, labels), true));
  RenderDigits(options.test_examples, options.seed * 7919 + 17, options.difficulty, &images,
               &labels);
  RETURN_IF_ERROR(env->WriteFile(JoinPath(dir, "test.csv"), DigitsCsv(images, labels), true));
  return absl::OkStatus();
}

}  // namespace pstrain

namespace pstrain {

FeatureSchema MultiHotSchema(int multi_hot, int max_values, const std::string& table) {
  FeatureSchema s = CriteoSchema();
  FeatureColumn* cats = s.mutable_columns(2);
  cats->set_count(kCriteoCategoricalFields - multi_hot);
  if (multi_hot > 0) {
    FeatureColumn* multi = s.add_columns();
    *multi = *cats;
    multi->set_name("M");
    multi->set_count(multi_hot);
    multi->set_max_values(max_values);
    if (!table.empty()) {
      multi->set_table(table);
      multi->set_vocabulary("item");
    }
  }
  if (cats->count() == 0) s.mutable_columns()->DeleteSubrange(2, 1);
  return s;
}

absl::StatusOr<CriteoTruth> WriteCriteoDataset(Env* env, const std::string& dir,
                                               const CriteoOptions& o) {
  constexpr int kInts = kCriteoIntegerFields, kCats = kCriteoCategoricalFields;
  if (o.train_examples <= 0 || o.test_examples <= 0 || o.train_examples > 100000000 ||
      o.test_examples > 100000000) {
    return absl::InvalidArgumentError("criteo: --train and --test must be 1..100000000");
  }
  if (o.values_per_field < 2 || o.values_per_field > 100000000) {
    return absl::InvalidArgumentError("criteo: --values_per_field must be 2..100000000");
  }
  if (!(o.missing >= 0 && o.missing < 1)) {
    return absl::InvalidArgumentError("criteo: --missing must be in [0, 1)");
  }
  if (!(o.zipf == 0 || (o.zipf > 1 && o.zipf <= 4))) {
    return absl::InvalidArgumentError("criteo: --zipf must be 0 or in (1, 4]");
  }
  if (o.multi_hot < 0 || o.multi_hot > kCats) {
    return absl::InvalidArgumentError(absl::StrCat("criteo: --multi_hot must be 0..", kCats));
  }
  if (o.max_values < 2 || o.max_values > 64) {
    return absl::InvalidArgumentError("criteo: --max_values must be 2..64");
  }
  if (!o.multi_hot_table.empty() && o.multi_hot == 0) {
    return absl::InvalidArgumentError("criteo: --multi_hot_table needs --multi_hot");
  }
  // A split's text is built in memory (about 220 bytes a line, and 9 a
  // multi-hot value) before it is written.
  const int64_t line_bytes = 220 + int64_t{9} * o.multi_hot * (o.max_values + 1) / 2;
  RETURN_IF_ERROR(CheckMemory(
      absl::StrCat("datagen --format=criteo of ", std::max(o.train_examples, o.test_examples),
                   " examples"),
      std::max(o.train_examples, o.test_examples) * line_bytes, PhysicalMemoryBytes()));
  RETURN_IF_ERROR(env->CreateDirs(dir));
  // The hidden model: a bias (about a quarter of impressions are clicks),
  // one weight per integer feature, one per categorical value of each field
  // (drawn from a hash of (seed, field, value), so no table is kept) and one
  // per field for a missing value.
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const double bias = -0.9;
  std::array<double, kInts> int_weight, int_mean;
  for (int j = 0; j < kInts; ++j) {
    int_weight[j] = 0.15 * normal(rng);
    int_mean[j] = 0.5 + 2.0 * std::uniform_real_distribution<double>(0, 1)(rng);
  }
  std::array<double, kCats> missing_weight;
  for (double& w : missing_weight) w = 0.25 * normal(rng);
  const uint64_t weight_seed = MixId(o.seed ^ 0x5851f42d4c957f2dULL);
  auto value_weight = [&](int field, int64_t value) {
    // A standard normal from two uniform draws of the hash (Box-Muller).
    const uint64_t h = MixId(weight_seed ^ MixId((static_cast<uint64_t>(field) << 40) ^
                                                 static_cast<uint64_t>(value)));
    const double u1 = (static_cast<double>(h >> 40) + 0.5) / 16777216.0;
    const double u2 = static_cast<double>((h >> 16) & 0xffffff) / 16777216.0;
    return 0.25 * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2);
  };
  // A field's value k in [0, values_per_field) from a uniform u.
  const double v = static_cast<double>(o.values_per_field);
  const double zipf_top = o.zipf > 1 ? std::pow(v + 1, 1 - o.zipf) - 1 : 0;
  auto draw_value = [&](double u) {
    double x;
    if (o.zipf > 1) {
      // Inverse of the CDF of the density x^(-zipf) on [1, v + 1).
      x = std::pow(zipf_top * u + 1, 1 / (1 - o.zipf)) - 1;
    } else {
      // A power law: value k with density falling as k^(-3/4).
      x = v * std::pow(u, 4.0);
    }
    return std::clamp<int64_t>(static_cast<int64_t>(x), 0, o.values_per_field - 1);
  };
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<float> test_probability;
  std::vector<int32_t> test_labels;
  for (const bool train : {true, false}) {
    const int64_t n = train ? o.train_examples : o.test_examples;
    std::string text;
    text.reserve(static_cast<size_t>(n * line_bytes));
    char hex[17];
    for (int64_t e = 0; e < n; ++e) {
      double logit = bias;
      std::string line;
      std::string fields;
      for (int j = 0; j < kInts; ++j) {
        fields += '\t';
        if (uniform(rng) < o.missing) continue;
        const int64_t v = std::max<int64_t>(
            0, static_cast<int64_t>(std::exp(int_mean[j] + normal(rng))) - 1);
        logit += int_weight[j] * std::log1p(static_cast<double>(v));
        absl::StrAppend(&fields, v);
      }
      for (int f = 0; f < kCats; ++f) {
        fields += '\t';
        if (uniform(rng) < o.missing) {
          logit += missing_weight[f];
          continue;
        }
        // A multi-hot field's cell: 1 to max_values values.
        const int values =
            f < kCats - o.multi_hot
                ? 1
                : 1 + static_cast<int>(uniform(rng) * static_cast<double>(o.max_values));
        // The multi-hot fields of one vocabulary draw from one set of
        // items (one string and weight each), keyed as a 27th field.
        const int key = !o.multi_hot_table.empty() && f >= kCats - o.multi_hot ? kCats : f;
        for (int j = 0; j < std::min(values, std::max(1, o.max_values)); ++j) {
          if (j > 0) fields += '|';
          const int64_t k = draw_value(uniform(rng));
          logit += value_weight(key, k);
          std::snprintf(hex, sizeof(hex), "%08x",
                        static_cast<uint32_t>(MixId(o.seed ^ (static_cast<uint64_t>(key) << 48) ^
                                                    static_cast<uint64_t>(k))));
          fields += hex;
        }
      }
      const double p = 1.0 / (1.0 + std::exp(-logit));
      const int label = uniform(rng) < p ? 1 : 0;
      absl::StrAppend(&text, label, fields, "\n");
      if (!train) {
        test_probability.push_back(static_cast<float>(p));
        test_labels.push_back(label);
      }
    }
    RETURN_IF_ERROR(
        WriteFileAtomically(env, JoinPath(dir, train ? "train.tsv" : "test.tsv"), text));
  }
  if (o.multi_hot > 0) {
    std::string schema;
    if (!google::protobuf::TextFormat::PrintToString(
            MultiHotSchema(o.multi_hot, o.max_values, o.multi_hot_table),
                                                     &schema)) {
      return absl::InternalError("datagen: cannot print the schema");
    }
    RETURN_IF_ERROR(WriteFileAtomically(env, JoinPath(dir, "schema.pbtxt"), schema));
  }
  CriteoTruth truth;
  ASSIGN_OR_RETURN(truth.test_auc, RocAuc(test_probability, test_labels));
  truth.test_log_loss = LogLoss(test_probability, test_labels);
  int64_t positives = 0;
  for (int32_t y : test_labels) positives += y;
  truth.positive_rate = static_cast<double>(positives) / static_cast<double>(test_labels.size());
  return truth;
}

}  // namespace pstrain
