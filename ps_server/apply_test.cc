// The server's applies on their own: how a push's gradients are located and
// checked in its payload, the sync mean (in worker order, bitwise the same
// whether a gradient is read staged or from the received bytes, across
// chunk and segment boundaries), and async's apply-and-publish.
#include "ps_server/apply.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/base/bfloat16.h"
#include "common/base/tensor.h"
#include "common/cluster/config.h"

namespace pstrain {
namespace {

// SGD at rate 0.5, `workers` sync workers (or async), with w of `n` values
// (i / n) and b of 2.
std::shared_ptr<ServerModel> Model(int workers, int64_t n, bool sync = true) {
  auto config = ParseTrainingConfig(std::string(R"(
model { mlp { input_dim: 2 num_classes: 2 } }
data { train_images: "x" train_labels: "y" batch_size: 1 }
optimizer { learning_rate: 0.5 }
max_steps: 10
)") + (sync ? "sync {}" : "async {}"), "test");
  REQUIRE(config.ok());
  InitializeRequest req;
  req.set_incarnation(1);
  *req.mutable_config() = *config;
  req.set_num_workers(workers);
  auto model = NewServerModel(req);
  REQUIRE(model.ok());
  std::vector<float> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(i) / static_cast<float>(n);
  for (const auto& [name, values] :
       std::vector<std::pair<std::string, std::vector<float>>>{{"w", w}, {"b", {1, 2}}}) {
    NamedTensor nt;
    nt.mutable_ref()->set_variable(name);
    ToProto({static_cast<int64_t>(values.size())}, values, nt.mutable_tensor());
    auto p = NewPartition(nt, **model);
    REQUIRE(p.ok());
    (*model)->partitions.emplace(PartitionKey{name, 0}, *std::move(p));
  }
  return *model;
}

PartitionState& Part(ServerModel& model, const std::string& name) {
  return *model.partitions.at(PartitionKey{name, 0});
}

std::vector<float> Current(PartitionState& p) {
  absl::MutexLock lock(&p.mu);
  return *p.current;
}

// A header naming `var` with `n` values of `dtype` (contents in the frame).
void AddHeader(PushRequest* push, const std::string& var, int64_t n, DataType dtype = DT_FLOAT) {
  NamedTensor* nt = push->add_gradients();
  nt->mutable_ref()->set_variable(var);
  nt->mutable_tensor()->set_dtype(dtype);
  nt->mutable_tensor()->add_shape(n);
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// `bytes` seen as segments of `piece` bytes (as gRPC's slices come); a
// view: `bytes` must outlive it.
SegmentedBytes Segments(const std::string& bytes, size_t piece) {
  SegmentedBytes out;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    out.Append(absl::string_view(bytes).substr(at, piece));
  }
  return out;
}

TEST_CASE("apply: a push's gradients are found in its frame, in order", "[ps][apply]") {
  auto model = Model(1, 3);
  PushRequest push;
  AddHeader(&push, "b", 2);
  AddHeader(&push, "w", 3, DT_BFLOAT16);
  const std::string bytes(2 * 4 + 3 * 2, '\0');
  const SegmentedBytes frame(bytes);
  std::vector<GradientRef> grads;
  REQUIRE(LocateGradients(*model, push, &frame, nullptr, &grads).ok());
  REQUIRE(grads.size() == 2);
  CHECK(grads[0].partition == &Part(*model, "b"));
  CHECK(grads[0].offset == 0);
  CHECK_FALSE(grads[0].bfloat16);
  CHECK(grads[1].partition == &Part(*model, "w"));
  CHECK(grads[1].offset == 8);
  CHECK(grads[1].bfloat16);
  CHECK(grads[1].byte_size() == 6);
}

TEST_CASE("apply: a push whose headers do not fit the model or its bytes is refused",
          "[ps][apply]") {
  auto model = Model(1, 3);
  auto refusal = [&model](const PushRequest& push, int64_t frame_bytes) {
    const std::string bytes(static_cast<size_t>(frame_bytes), '\0');
    const SegmentedBytes frame(bytes);
    std::vector<GradientRef> grads;
    absl::Status st = LocateGradients(*model, push, &frame, nullptr, &grads);
    REQUIRE_FALSE(st.ok());
    return std::string(st.message());
  };
  PushRequest unknown;
  AddHeader(&unknown, "v", 3);
  CHECK(absl::StrContains(refusal(unknown, 12), "unknown variable partition v/part0"));
  PushRequest shape;
  AddHeader(&shape, "w", 4);
  CHECK(absl::StrContains(refusal(shape, 16), "has shape [4], variable has [3]"));
  PushRequest dtype;
  AddHeader(&dtype, "w", 3, DT_INVALID);
  CHECK(absl::StrContains(refusal(dtype, 24), "expected dense"));
  PushRequest twice;
  AddHeader(&twice, "b", 2);
  AddHeader(&twice, "b", 2);
  CHECK(absl::StrContains(refusal(twice, 16), "duplicate gradient for b/part0"));
  PushRequest one;
  AddHeader(&one, "w", 3);
  CHECK(absl::StrContains(refusal(one, 11), "payload ends 1 bytes short"));
  CHECK(absl::StrContains(refusal(one, 13), "1 bytes beyond its gradients"));
  PushRequest inside;
  AddHeader(&inside, "w", 3);
  inside.mutable_gradients(0)->mutable_tensor()->set_content("x");
  CHECK(absl::StrContains(refusal(inside, 12), "content inside a frame header"));
}

TEST_CASE("apply: a NaN or Inf anywhere in a gradient is found", "[ps][apply]") {
  auto model = Model(1, 5000);
  std::vector<float> g(5000, 1.0f);
  g[4999] = std::numeric_limits<float>::quiet_NaN();
  const std::string bytes = Bytes({0, 0}) + Bytes(g);
  const SegmentedBytes frame = Segments(bytes, 4097);  // runs split mid-float
  PushRequest push;
  AddHeader(&push, "b", 2);
  AddHeader(&push, "w", 5000);
  std::vector<GradientRef> grads;
  REQUIRE(LocateGradients(*model, push, &frame, nullptr, &grads).ok());
  CHECK(AllFinite(grads[0]));
  CHECK_FALSE(AllFinite(grads[1]));
  CHECK(FirstNonFinite(grads) == &grads[1]);
}

TEST_CASE("apply: the sync mean is taken in worker order, and is bitwise the same read from "
          "the received bytes", "[ps][apply]") {
  const int64_t n = 5000;  // more than two chunks
  std::vector<std::vector<float>> grads(3, std::vector<float>(n));
  for (int w = 0; w < 3; ++w) {
    for (int64_t i = 0; i < n; ++i) grads[w][i] = std::sin(0.37f * i + w) * (1 + w);
  }
  // Expected: w - 0.5 * ((g0 + g1) + g2) / 3, element by element.
  auto model = Model(3, n);
  std::vector<float> expected = Current(Part(*model, "w"));
  for (int64_t i = 0; i < n; ++i) {
    float sum = grads[0][i];
    sum += grads[1][i];
    sum += grads[2][i];
    expected[i] -= 0.5f * (sum / 3.0f);
  }
  Histogram seconds(Histogram::SecondsBounds());

  PartitionState& staged = Part(*model, "w");
  for (int w = 0; w < 3; ++w) staged.staging[w] = grads[w];
  PartitionState::Buffer all_staged = ApplyMean(*model, &staged, {0, 1, 2}, 0, &seconds);
  CHECK(*all_staged == expected);
  CHECK(Current(staged) != expected);  // not published: the caller does that

  // The same with worker 1's gradient read from a frame split in odd places.
  auto model2 = Model(3, n);
  PartitionState& direct = Part(*model2, "w");
  direct.staging[0] = grads[0];
  direct.staging[2] = grads[2];
  const std::string received = Bytes(grads[1]);
  const SegmentedBytes frame = Segments(received, 1001);
  const GradientRef ref{&direct, &frame, 0, false};
  PartitionState::Buffer from_bytes =
      ApplyMean(*model2, &direct, {0, 1, 2}, 0, &seconds, &ref, /*direct_worker=*/1);
  CHECK(*from_bytes == expected);
  CHECK(seconds.Read().cumulative.back() == 2);
  CHECK(direct.apply_nanos.load() > 0);
  absl::MutexLock lock(&direct.apply_mu);
  CHECK(direct.updates == 1);
}

TEST_CASE("apply: async applies each gradient as one update and publishes it", "[ps][apply]") {
  auto model = Model(2, 4, /*sync=*/false);
  PartitionState& w = Part(*model, "w");
  PartitionState& b = Part(*model, "b");
  const std::vector<float> w0 = Current(w);
  std::shared_ptr<const std::vector<float>> pulled;
  {
    absl::MutexLock lock(&w.mu);
    pulled = w.current;  // a pull in flight keeps its version
  }
  std::vector<uint16_t> b_grad(2);
  const std::vector<float> b_values{2.0f, -4.0f};
  FloatsToBfloat16(b_values.data(), 2, b_grad.data());
  const std::string bytes = Bytes({1, 1, 1, 1}) +
                            std::string(reinterpret_cast<const char*>(b_grad.data()), 4);
  const SegmentedBytes frame(bytes);
  PushRequest push;
  AddHeader(&push, "w", 4);
  AddHeader(&push, "b", 2, DT_BFLOAT16);
  std::vector<GradientRef> grads;
  REQUIRE(LocateGradients(*model, push, &frame, nullptr, &grads).ok());
  Histogram seconds(Histogram::SecondsBounds());
  UpdateInfo update;
  update.learning_rate = 0.25f;
  CHECK(ApplyEach(*model, grads, update, &seconds) == 16 + 4);
  for (size_t i = 0; i < 4; ++i) CHECK(Current(w)[i] == w0[i] - 0.25f);
  CHECK(Current(b) == std::vector<float>{1.0f - 0.5f, 2.0f + 1.0f});
  CHECK(*pulled == w0);
  CHECK(w.pushes.load() == 1);
  CHECK(b.push_bytes.load() == 4);
}

}  // namespace
}  // namespace pstrain
