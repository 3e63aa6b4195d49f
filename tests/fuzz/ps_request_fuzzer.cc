// libFuzzer target: a parameter server holding a model takes any request
// bytes (a Push frame, PushRows, Pull, PullRows, as they arrive over gRPC)
// without crashing, and a refused push or row push changes nothing.
//
// Input: 1 byte choosing the method, then the request's bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/cluster/config.h"
#include "common/base/tensor.h"
#include "common/rpc/wire_frame.h"
#include "ps_server/parameter_server.h"

namespace {

constexpr uint64_t kIncarnation = 7;

pstrain::ParameterServer* Server() {
  static pstrain::ParameterServer* ps = [] {
    auto config = pstrain::ParseTrainingConfig(R"(
model { mlp { input_dim: 2 num_classes: 2 } }
data { train_images: "x" train_labels: "y" batch_size: 1 }
optimizer { learning_rate: 0.1 adam {} }
async { }
max_steps: 1000000000
embedding_tables { name: "t" dim: 2 }
)", "fuzz");
    if (!config.ok()) std::abort();
    auto* server = new pstrain::ParameterServer(absl::Milliseconds(1));
    pstrain::InitializeRequest init;
    init.set_incarnation(kIncarnation);
    *init.mutable_config() = *config;
    init.set_num_workers(2);
    pstrain::NamedTensor* w = init.add_variables();
    w->mutable_ref()->set_variable("w");
    pstrain::ToProto({2, 2}, {1, 2, 3, 4}, w->mutable_tensor());
    if (!server->Initialize(init).ok()) std::abort();
    return server;
  }();
  return ps;
}

// The fuzzer's bytes as a received frame (`frame` keeps its own copy).
bool DecodeBody(const char* body, size_t n, google::protobuf::MessageLite* header,
                pstrain::IncomingFrame* frame) {
  grpc::Slice slice(body, n);
  grpc::ByteBuffer buffer(&slice, 1);
  return pstrain::DecodeFrame(buffer, header, frame).ok();
}

// The dense values and the version, as a chief's pull sees them.
std::string Snapshot(pstrain::ParameterServer* ps) {
  pstrain::PullRequest req;
  req.set_incarnation(kIncarnation);
  req.set_worker(-1);
  pstrain::PullResponse resp;
  if (!ps->Pull(req, &resp).ok()) std::abort();
  return resp.SerializeAsString();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  pstrain::ParameterServer* ps = Server();
  const char* body = reinterpret_cast<const char*>(data + 1);
  const size_t n = size - 1;
  switch (data[0] % 4) {
    case 0: {  // Push, as a frame
      pstrain::PushRequest header;
      pstrain::IncomingFrame frame;
      if (!DecodeBody(body, n, &header, &frame)) return 0;
      const std::string before = Snapshot(ps);
      pstrain::PushResponse resp;
      if (!ps->Push(header, frame.payload, &resp).ok() && Snapshot(ps) != before) std::abort();
      break;
    }
    case 1: {  // PushRows, as a frame
      pstrain::PushRowsRequest header;
      pstrain::IncomingFrame frame;
      if (!DecodeBody(body, n, &header, &frame)) return 0;
      pstrain::PullRowsRequest probe;  // the rows it names, before and after
      probe.set_incarnation(kIncarnation);
      probe.set_worker(-1);
      probe.set_table(header.table());
      if (header.num_ids() > 0 && header.num_ids() <= frame.payload.size() / 8) {
        std::string ids(static_cast<size_t>(header.num_ids()) * 8, '\0');
        frame.payload.CopyTo(0, static_cast<int64_t>(ids.size()), ids.data());
        probe.set_ids(ids);
      }
      pstrain::PullRowsResponse before, after;
      const bool readable = ps->PullRows(probe, &before).ok();
      pstrain::PushRowsResponse resp;
      if (!ps->PushRows(header, frame.payload, &resp).ok() && readable &&
          (!ps->PullRows(probe, &after).ok() || after.rows() != before.rows())) {
        std::abort();
      }
      break;
    }
    case 2: {
      pstrain::PullRequest req;
      if (!req.ParseFromArray(body, static_cast<int>(n))) return 0;
      if (req.timeout_ms() > 1) req.set_timeout_ms(1);
      pstrain::PullResponse resp;
      (void)ps->Pull(req, &resp);
      break;
    }
    case 3: {
      pstrain::PullRowsRequest req;
      if (!req.ParseFromArray(body, static_cast<int>(n))) return 0;
      if (req.timeout_ms() > 1) req.set_timeout_ms(1);
      pstrain::PullRowsResponse resp;
      (void)ps->PullRows(req, &resp);
      break;
    }
  }
  return 0;
}
