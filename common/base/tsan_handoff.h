#ifndef PSTRAIN_COMMON_BASE_TSAN_HANDOFF_H_
#define PSTRAIN_COMMON_BASE_TSAN_HANDOFF_H_

// Tells ThreadSanitizer of an order that a library it does not see makes.
//
// gRPC's core orders a call's start before its completion callback, which
// runs on one of its threads; Debian's gRPC is not instrumented, so under
// TSan (--config=tsan) everything the starting thread wrote before the call
// (a mutex made on its stack, the call's state) would look unordered with
// what the callback then reads. Copy one token into both sides: Release()
// on the starting thread just before the call starts, Acquire() first thing
// in the callback. Per call, so it adds no order between unrelated calls.
// Outside TSan it is empty and both are no-ops.

#include "absl/base/config.h"  // ABSL_HAVE_THREAD_SANITIZER: GCC's or clang's TSan

#if defined(ABSL_HAVE_THREAD_SANITIZER)
#include <sanitizer/tsan_interface.h>

#include <memory>
#endif

namespace pstrain {

class HandoffToken {
 public:
#if defined(ABSL_HAVE_THREAD_SANITIZER)
  HandoffToken() : address_(std::make_shared<char>()) {}
  void Release() const { __tsan_release(address_.get()); }
  void Acquire() const { __tsan_acquire(address_.get()); }

 private:
  std::shared_ptr<char> address_;  // shared by the copies: one sync object
#else
  void Release() const {}
  void Acquire() const {}
#endif
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_BASE_TSAN_HANDOFF_H_
