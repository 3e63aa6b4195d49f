// The largest protobuf message pstrain sends or accepts, in either
// direction. The RPC layer configures gRPC with it (common/rpc/rpc.h); the
// cluster's sizing checks that every partition fits in one message
// (common/cluster/sizing.h), and the allocator keeps a message's worth of
// heap (common/runtime/allocator.h).
#ifndef PSTRAIN_COMMON_BASE_WIRE_LIMITS_H_
#define PSTRAIN_COMMON_BASE_WIRE_LIMITS_H_

namespace pstrain {

inline constexpr int kMaxMessageBytes = 256 << 20;

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_BASE_WIRE_LIMITS_H_
