// Helpers of the ParameterServer tests (parameter_server_*_test.cc): a
// small model (w, 2 x 2), its Initialize, pushes and pulls, and pushes as a
// frame carries them. Test-only.
#ifndef PSTRAIN_PS_SERVER_PARAMETER_SERVER_TESTING_H_
#define PSTRAIN_PS_SERVER_PARAMETER_SERVER_TESTING_H_

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "catch2/catch.hpp"
#include "common/base/segmented_bytes.h"
#include "common/base/tensor.h"
#include "common/cluster/config.h"
#include "ps_server/parameter_server.h"

namespace pstrain {

inline constexpr uint64_t kIncarnation = 77;

inline TrainingConfig BaseConfig(bool sync, int replicas = 0, int staleness = 0, float lr = 0.5f) {
  auto c = ParseTrainingConfig(R"(
model { mlp { input_dim: 2 num_classes: 2 } }
data { train_images: "x" train_labels: "y" batch_size: 1 }
optimizer { learning_rate: 0.1 }
max_steps: 1000
)",
                               "test");
  REQUIRE(c.ok());
  c->mutable_optimizer()->set_learning_rate(lr);
  if (sync) {
    c->mutable_sync()->set_replicas_to_aggregate(replicas);
  } else {
    c->mutable_async()->set_staleness_bound(staleness);
  }
  return *c;
}

inline InitializeRequest InitRequest(const TrainingConfig& config, int workers,
                                     std::vector<float> w = {1, 2, 3, 4}) {
  InitializeRequest req;
  req.set_incarnation(kIncarnation);
  *req.mutable_config() = config;
  req.set_num_workers(workers);
  NamedTensor* nt = req.add_variables();
  nt->mutable_ref()->set_variable("w");
  ToProto({2, 2}, w, nt->mutable_tensor());
  return req;
}

inline PushRequest Grad(int worker, int64_t step, std::vector<float> g, std::string var = "w",
                        std::vector<int64_t> shape = {2, 2}) {
  PushRequest req;
  req.set_incarnation(kIncarnation);
  req.set_worker(worker);
  req.set_step(step);
  NamedTensor* nt = req.add_gradients();
  nt->mutable_ref()->set_variable(var);
  ToProto(shape, g, nt->mutable_tensor());
  return req;
}

// A push with no gradients (to a server that holds no partition).
inline PushRequest EmptyPush(int worker, int64_t step) {
  PushRequest req = Grad(worker, step, {});
  req.clear_gradients();
  return req;
}

inline std::vector<float> PullW(ParameterServer& ps, int64_t* version = nullptr) {
  PullRequest req;
  req.set_incarnation(kIncarnation);
  req.set_worker(-1);
  PullResponse resp;
  REQUIRE(ps.Pull(req, &resp).ok());
  if (version) *version = resp.version();
  auto t = FromProto(resp.tensors(0).tensor());
  REQUIRE(t.ok());
  return t->values();
}

// The push as a frame would carry it: the header without contents, the
// payload cut into pieces of 1..13 bytes at a 3-byte offset, so floats start
// at every alignment and straddle pieces.
struct Framed {
  PushRequest header;
  std::string bytes;
  SegmentedBytes payload;
};
inline Framed Frame(const PushRequest& request, uint32_t seed) {
  Framed f;
  f.header = request;
  f.bytes = "xyz";
  for (NamedTensor& nt : *f.header.mutable_gradients()) {
    f.bytes += nt.tensor().content();
    nt.mutable_tensor()->clear_content();
  }
  size_t at = 3;
  while (at < f.bytes.size()) {
    const size_t n =
        std::min<size_t>(1 + (seed = seed * 1103515245u + 12345u) % 13, f.bytes.size() - at);
    f.payload.Append(absl::string_view(f.bytes).substr(at, n));
    at += n;
  }
  return f;
}

// Two workers, SGD at rate 1, two partitions: w [2, 2] and b [2], zeros.
inline InitializeRequest TwoPartitionInit(bool sync) {
  InitializeRequest req = InitRequest(BaseConfig(sync, 0, 0, 1.0f), 2, {0, 0, 0, 0});
  NamedTensor* v = req.add_variables();
  v->mutable_ref()->set_variable("b");
  ToProto({2}, {0, 0}, v->mutable_tensor());
  return req;
}

// Pulls "w" as worker 0, waiting for `min_version` up to `timeout_ms`.
inline absl::Status PullAt(ParameterServer& ps, int64_t min_version, int64_t timeout_ms,
                           std::vector<float>* w = nullptr) {
  PullRequest req;
  req.set_incarnation(kIncarnation);
  req.set_worker(0);
  req.set_min_version(min_version);
  req.set_timeout_ms(timeout_ms);
  PullResponse resp;
  absl::Status st = ps.Pull(req, &resp);
  if (st.ok() && w != nullptr) *w = FromProto(resp.tensors(0).tensor())->values();
  return st;
}

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_PARAMETER_SERVER_TESTING_H_
