#include "common/rpc/wire_frame.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/tensor.h"
#include "common/rpc/rpc.h"

namespace pstrain {
namespace {

void RunRelease(void* user_data) {
  auto* release = static_cast<std::function<void()>*>(user_data);
  (*release)();
  delete release;
}

void NoRelease(void*) {}

}  // namespace

grpc::ByteBuffer EncodeFrame(const google::protobuf::MessageLite& header,
                             std::vector<OutgoingPayload> payload) {
  std::string head(4, '\0');
  const std::string body = header.SerializeAsString();
  const uint32_t len = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) head[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  head += body;
  std::vector<grpc::Slice> slices;
  slices.reserve(payload.size() + 1);
  slices.emplace_back(head);
  for (OutgoingPayload& p : payload) {
    if (p.bytes == 0) {
      if (p.release) p.release();
      continue;
    }
    void* data = const_cast<void*>(p.data);  // gRPC only reads send slices
    if (p.release) {
      slices.emplace_back(data, static_cast<size_t>(p.bytes), &RunRelease,
                          new std::function<void()>(std::move(p.release)));
    } else {
      slices.emplace_back(data, static_cast<size_t>(p.bytes), &NoRelease, nullptr);
    }
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::Status DecodeFrame(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* header,
                         IncomingFrame* frame) {
  frame->slices.clear();
  frame->payload = SegmentedBytes();
  grpc::Status st = buffer.Dump(&frame->slices);
  if (!st.ok()) return absl::InternalError(absl::StrCat("frame: ", st.error_message()));
  SegmentedBytes all;
  for (const grpc::Slice& s : frame->slices) {
    all.Append(absl::string_view(reinterpret_cast<const char*>(s.begin()), s.size()));
  }
  if (all.size() < 4) return absl::InvalidArgumentError("frame: shorter than its header length");
  unsigned char len_bytes[4];
  all.CopyTo(0, 4, len_bytes);
  const int64_t len = static_cast<int64_t>(len_bytes[0]) | static_cast<int64_t>(len_bytes[1]) << 8 |
                      static_cast<int64_t>(len_bytes[2]) << 16 |
                      static_cast<int64_t>(len_bytes[3]) << 24;
  if (len > all.size() - 4 || len > (64 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame: header of ", len, " bytes in a ", all.size(), "-byte message"));
  }
  std::string head(len, '\0');
  all.CopyTo(4, len, head.data());
  if (!header->ParseFromString(head)) {
    return absl::InvalidArgumentError("frame: header does not parse");
  }
  // The payload: the rest of the slices, viewed in place.
  int64_t skip = 4 + len;
  for (const grpc::Slice& s : frame->slices) {
    const int64_t n = static_cast<int64_t>(s.size());
    if (skip >= n) {
      skip -= n;
      continue;
    }
    frame->payload.Append(
        absl::string_view(reinterpret_cast<const char*>(s.begin()) + skip, n - skip));
    skip = 0;
  }
  return absl::OkStatus();
}

grpc::ByteBuffer EncodePushFrame(PushRequest request) {
  std::vector<OutgoingPayload> payload;
  for (NamedTensor& nt : *request.mutable_gradients()) {
    auto content = std::make_shared<std::string>(std::move(*nt.mutable_tensor()->mutable_content()));
    nt.mutable_tensor()->clear_content();
    payload.push_back({content->data(), static_cast<int64_t>(content->size()),
                       [content]() mutable { content.reset(); }});
  }
  return EncodeFrame(request, std::move(payload));
}

absl::Status DecodePullFrame(const grpc::ByteBuffer& buffer, PullResponse* response) {
  IncomingFrame frame;
  absl::Status st = DecodeFrame(buffer, response, &frame);
  if (!st.ok()) return st;
  int64_t offset = 0;
  for (NamedTensor& nt : *response->mutable_tensors()) {
    const TensorProto& t = nt.tensor();
    const int64_t bytes = DenseFloatBytes(absl::MakeConstSpan(t.shape().data(), t.shape_size()));
    if (bytes < 0) return absl::InvalidArgumentError("pull frame: bad shape");
    if (frame.payload.size() - offset < bytes) {
      return absl::InvalidArgumentError("pull frame: payload too short");
    }
    std::string* content = nt.mutable_tensor()->mutable_content();
    content->resize(bytes);
    frame.payload.CopyTo(offset, bytes, content->data());
    offset += bytes;
  }
  if (offset != frame.payload.size()) {
    return absl::InvalidArgumentError("pull frame: payload longer than its tensors");
  }
  return absl::OkStatus();
}

grpc::Status RawCall(grpc::GenericStub* stub, grpc::ClientContext* context,
                     const std::string& method, const grpc::ByteBuffer& request,
                     grpc::ByteBuffer* response) {
  return AwaitCall(context, [&](std::function<void(grpc::Status)> done) {
    stub->UnaryCall(context, method, grpc::StubOptions(), &request, response, std::move(done));
  });
}

grpc::ByteBuffer SerializeMessage(const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message) {
  grpc::Slice slice;
  grpc::Status st = buffer.DumpToSingleSlice(&slice);
  if (!st.ok()) return absl::InternalError(absl::StrCat("message: ", st.error_message()));
  if (!message->ParseFromArray(slice.begin(), static_cast<int>(slice.size()))) {
    return absl::InvalidArgumentError("message does not parse");
  }
  return absl::OkStatus();
}

}  // namespace pstrain
