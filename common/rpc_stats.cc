#include "common/rpc_stats.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"

namespace pstrain {

RpcStats::Method::Method(std::string service_name, std::string method_name)
    : service(std::move(service_name)), name(std::move(method_name)) {}

RpcStats::Method* RpcStats::Find(const char* full_method) {
  const std::string key = full_method == nullptr ? "" : full_method;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = methods_.find(key);
    if (it != methods_.end()) return it->second.get();
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Method>& m = methods_[key];
  if (m == nullptr) {
    // "/pstrain.PsService/Push" -> ("pstrain.PsService", "Push").
    const std::string trimmed = key.empty() || key[0] != '/' ? key : key.substr(1);
    const size_t slash = trimmed.rfind('/');
    m = slash == std::string::npos
            ? std::make_unique<Method>("", trimmed)
            : std::make_unique<Method>(trimmed.substr(0, slash), trimmed.substr(slash + 1));
  }
  return m.get();
}

std::vector<const RpcStats::Method*> RpcStats::Methods() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<const Method*> out;
  out.reserve(methods_.size());
  for (const auto& [key, m] : methods_) out.push_back(m.get());
  return out;
}

RpcStats& ServerRpcStats() {
  static RpcStats* stats = new RpcStats();
  return *stats;
}

const char* StatusCodeName(int code) {
  // clang-format off
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  // clang-format on
  return code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
}

namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::InterceptorBatchMethods;

// The methods whose messages are wire frames (common/wire_frame.h), which
// both sides handle as raw grpc::ByteBuffers; every other method's messages
// are protobuf messages.
bool IsFramedMethod(const char* method) {
  return method != nullptr && (std::strcmp(method, "/pstrain.PsService/Push") == 0 ||
                               std::strcmp(method, "/pstrain.PsService/Pull") == 0);
}

// The size on the wire of a received message: a ByteBuffer's length, or the
// protobuf's encoded size (generated messages derive from MessageLite alone,
// so the handler's message pointer is one to MessageLite).
uint64_t ReceivedBytes(void* message, bool framed) {
  if (message == nullptr) return 0;
  if (framed) return static_cast<grpc::ByteBuffer*>(message)->Length();
  return static_cast<google::protobuf::MessageLite*>(message)->ByteSizeLong();
}

// One call's interceptor: times it from its creation (the call's start) to
// its status, and counts its messages' bytes.
class StatsInterceptor final : public grpc::experimental::Interceptor {
 public:
  StatsInterceptor(RpcStats::Method* method, bool framed)
      : method_(method), framed_(framed), start_(std::chrono::steady_clock::now()) {}

  void Intercept(InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      // The serialized form is what gRPC sends anyway (it serializes once).
      if (grpc::ByteBuffer* b = methods->GetSerializedSendMessage(); b != nullptr) {
        method_->sent_bytes.fetch_add(b->Length(), std::memory_order_relaxed);
      }
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      method_->received_bytes.fetch_add(ReceivedBytes(methods->GetRecvMessage(), framed_),
                                        std::memory_order_relaxed);
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      Finish(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  void Finish(int code) {
    method_->by_code[static_cast<size_t>(code >= 0 && code <= 16 ? code : 2)].fetch_add(
        1, std::memory_order_relaxed);
    method_->seconds.Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }

  RpcStats::Method* const method_;
  const bool framed_;
  const std::chrono::steady_clock::time_point start_;
};

class ServerFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new StatsInterceptor(ServerRpcStats().Find(info->method()),
                                IsFramedMethod(info->method()));
  }
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> ServerStatsInterceptor() {
  return std::make_unique<ServerFactory>();
}

}  // namespace pstrain
