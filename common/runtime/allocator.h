// glibc settings for a process that moves multi-megabyte messages: freed
// buffers stay in the heap for reuse instead of going back to the kernel.
// Every daemon calls it (SetUpDaemon); `pstrain bench` too, so that its
// client side measures as a worker runs.
#ifndef PSTRAIN_COMMON_RUNTIME_ALLOCATOR_H_
#define PSTRAIN_COMMON_RUNTIME_ALLOCATOR_H_

namespace pstrain {

void TuneAllocator();

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_RUNTIME_ALLOCATOR_H_
