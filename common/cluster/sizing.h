// Whether a model fits before anything is allocated for it: each parameter
// server's share against the largest message, and each process's memory
// against the machine's. Refusals are one line naming the variable, the
// bytes and the limit, where the allocation would otherwise die with
// std::bad_alloc (exit 134) or a transport error tens of seconds in.
#ifndef PSTRAIN_COMMON_CLUSTER_SIZING_H_
#define PSTRAIN_COMMON_CLUSTER_SIZING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/cluster/placement.h"

namespace pstrain {

// The memory this process may use, in bytes: the machine's physical
// memory, or its cgroup's (cgroup v2 memory.max: a container's limit) where
// that is less.
int64_t PhysicalMemoryBytes();

// "1.5 GiB", "12.0 MiB", "3.5 KiB", "512 B".
std::string FormatBytes(int64_t bytes);

// `what` needs `bytes` of memory: refused when that is more than `limit`
// (RESOURCE_EXHAUSTED naming both).
absl::Status CheckMemory(const std::string& what, int64_t bytes, int64_t limit);

// Each partition of `placement`, `copies` times (its values and optimizer
// slots, which a resume's Initialize carries together), must fit in one
// message: pulls, pushes and Initialize travel as calls of whole partitions
// (a server's share may be any size). The first one too big is named, with
// the fix.
absl::Status CheckPartitionsFitMessages(const Placement& placement, int64_t max_message_bytes,
                                        int copies = 1);

// What a worker or the chief holds at least: the parameters twice (the
// pulled values and the model's own; a worker also its gradients).
int64_t ModelProcessBytes(const std::vector<VariableSpec>& variables);

// The RPC message memory one server needs at once for a job's data calls
// (the largest over `placement`'s servers): each of `num_workers` workers'
// pulls and pushes, and the chief's pulls, `calls_in_flight` calls in each
// direction of whole partitions of up to `call_bytes` (the chief's, of up
// to `chief_call_bytes`; or one partition more), never more than the
// server's share; `wire_bytes_per_float` is 4 (float32 on the wire) or 2
// (bfloat16). Dense variables only. Saturates rather than overflows.
int64_t JobInflightBytes(const Placement& placement, int num_workers, int calls_in_flight,
                         int64_t call_bytes, int64_t chief_call_bytes, int wire_bytes_per_float);

// Both checks for `process` ("the chief", "worker:1") on this machine, with
// pstrain's message cap.
absl::Status CheckModelFits(const std::vector<VariableSpec>& variables,
                            const Placement& placement, const std::string& process);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CLUSTER_SIZING_H_
