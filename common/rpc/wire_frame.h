// Frames: how tensor payloads cross gRPC without protobuf copying them.
//
// A frame is a fixed32 little-endian header length, a protobuf header (a
// PushRequest or PullResponse whose TensorProtos carry dtype and shape but no
// content; a PushRowsRequest or PullRowsResponse naming its rows), then the
// payload: every tensor's content in header order, or the ids and rows.
// Sending, the payload slices point at the tensors' own memory (no
// user-space copy; a keepalive is released when gRPC lets go of the slice).
// Receiving, the payload is a view of the slices gRPC received (no copy
// either); the header, a few hundred bytes, is the only thing parsed.
// DecodeFrame validates the header length and the protobuf parse; each
// caller then checks that the payload is exactly the bytes its header calls
// for.
#ifndef PSTRAIN_COMMON_RPC_WIRE_FRAME_H_
#define PSTRAIN_COMMON_RPC_WIRE_FRAME_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/base/segmented_bytes.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "proto/ps_service.pb.h"

namespace pstrain {

// One tensor's content to send. `release` (may be empty) runs once gRPC no
// longer references the bytes; until then they must stay valid and unchanged.
struct OutgoingPayload {
  const void* data = nullptr;
  int64_t bytes = 0;
  std::function<void()> release;
};

grpc::ByteBuffer EncodeFrame(const google::protobuf::MessageLite& header,
                             std::vector<OutgoingPayload> payload);

// A received frame: `payload` views `slices`, which keep the bytes alive.
struct IncomingFrame {
  std::vector<grpc::Slice> slices;
  SegmentedBytes payload;
};
absl::Status DecodeFrame(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* header,
                         IncomingFrame* frame);

// Push and pull messages whose contents sit inside their protos, to and from
// frames (tests and tools; these copy).
grpc::ByteBuffer EncodePushFrame(PushRequest request);
absl::Status DecodePullFrame(const grpc::ByteBuffer& buffer, PullResponse* response);

// A blocking raw unary call (tests and tools), bounded by the context's
// deadline.
grpc::Status RawCall(grpc::GenericStub* stub, grpc::ClientContext* context,
                     const std::string& method, const grpc::ByteBuffer& request,
                     grpc::ByteBuffer* response);

// Plain protobuf messages to and from a ByteBuffer (the small requests and
// replies of the raw methods).
grpc::ByteBuffer SerializeMessage(const google::protobuf::MessageLite& message);
absl::Status ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_RPC_WIRE_FRAME_H_
