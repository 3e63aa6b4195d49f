#include "common/runtime/allocator.h"

#include <malloc.h>

#include "common/base/wire_limits.h"

namespace pstrain {

void TuneAllocator() {
  // Every step frees and reallocates the transport's multi-megabyte receive
  // buffers; glibc would hand the heap's top back to the kernel each time and
  // fault it in (zeroed) again on the next step. Keep up to one maximal
  // message of it instead: page faults per step drop from ~50 to ~4 on a
  // 1 MiB sync step (tests/data_path_test.cc).
  mallopt(M_TRIM_THRESHOLD, kMaxMessageBytes);
  // Setting the trim threshold also freezes glibc's mmap threshold at 128
  // KiB, so every larger buffer (a row pull's reply, a frame's slices) would
  // be a fresh mapping, faulted in page by page and unmapped on free. Serve
  // blocks up to glibc's 32 MiB cap from the heap, where they are reused.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
}

}  // namespace pstrain
