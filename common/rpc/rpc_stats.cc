#include "common/rpc/rpc_stats.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "google/protobuf/descriptor.h"
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

// What a method's request arrives as in the server's handler.
enum class Request {
  kFrame,     // a raw grpc::ByteBuffer: the methods ps_server/ps_service.h serves raw
              // (frames, common/rpc/wire_frame.h) (a service serving them as
              // protos must not be started through StartServer)
  kProto,     // a generated protobuf message
  kUnknown,   // not a method of a compiled-in service (gRPC answers UNIMPLEMENTED)
};

Request RequestKind(const char* method) {
  if (method == nullptr) return Request::kUnknown;
  if (std::strcmp(method, "/pstrain.PsService/Push") == 0 ||
      std::strcmp(method, "/pstrain.PsService/Pull") == 0 ||
      std::strcmp(method, "/pstrain.PsService/PullRows") == 0 ||
      std::strcmp(method, "/pstrain.PsService/PushRows") == 0) {
    return Request::kFrame;
  }
  // "/package.Service/Method" is a proto method when the generated
  // descriptors know "package.Service.Method".
  std::string name = method[0] == '/' ? method + 1 : method;
  const size_t slash = name.rfind('/');
  if (slash == std::string::npos) return Request::kUnknown;
  name[slash] = '.';
  return google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(name) != nullptr
             ? Request::kProto
             : Request::kUnknown;
}

// The size on the wire of a received message: a ByteBuffer's length, or the
// protobuf's encoded size (generated messages derive from MessageLite alone,
// so the handler's message pointer is one to MessageLite). A message of an
// unknown method is not looked at.
uint64_t ReceivedBytes(void* message, Request kind) {
  if (message == nullptr) return 0;
  switch (kind) {
    case Request::kFrame: return static_cast<grpc::ByteBuffer*>(message)->Length();
    case Request::kProto:
      return static_cast<google::protobuf::MessageLite*>(message)->ByteSizeLong();
    case Request::kUnknown: return 0;
  }
  return 0;
}

// One call's interceptor: times it from its creation (the call's start) to
// its status, and counts its messages' bytes.
class StatsInterceptor final : public grpc::experimental::Interceptor {
 public:
  StatsInterceptor(RpcStats::Method* method, Request kind)
      : method_(method), kind_(kind), start_(std::chrono::steady_clock::now()) {}

  void Intercept(InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      // The serialized form is what gRPC sends anyway (it serializes once).
      if (grpc::ByteBuffer* b = methods->GetSerializedSendMessage(); b != nullptr) {
        method_->sent_bytes.fetch_add(b->Length(), std::memory_order_relaxed);
      }
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      method_->received_bytes.fetch_add(ReceivedBytes(methods->GetRecvMessage(), kind_),
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
  const Request kind_;
  const std::chrono::steady_clock::time_point start_;
};

class ServerFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const absl::string_view name = info->method() == nullptr ? "" : info->method();
    {
      absl::ReaderMutexLock lock(&mu_);
      if (auto it = known_.find(name); it != known_.end()) {
        return new StatsInterceptor(it->second.first, it->second.second);
      }
    }
    const Request kind = RequestKind(info->method());
    if (kind == Request::kUnknown) {
      // Anyone may send any name: unknown ones share one record, so the
      // records and the metrics stay bounded.
      return new StatsInterceptor(ServerRpcStats().Find("/unknown"), kind);
    }
    RpcStats::Method* method = ServerRpcStats().Find(info->method());
    absl::MutexLock lock(&mu_);
    known_.emplace(std::string(name), std::make_pair(method, kind));
    return new StatsInterceptor(method, kind);
  }

 private:
  absl::Mutex mu_;
  // The methods of compiled-in services seen so far.
  std::map<std::string, std::pair<RpcStats::Method*, Request>, std::less<>> known_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> ServerStatsInterceptor() {
  return std::make_unique<ServerFactory>();
}

}  // namespace pstrain
