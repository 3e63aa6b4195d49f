#include "common/grpc_lifetime.h"

#include <grpc/grpc.h>

#include <mutex>

namespace pstrain {

void KeepGrpcUntilExit() {
  static std::once_flag once;
  std::call_once(once, [] { grpc_init(); });
}

}  // namespace pstrain
