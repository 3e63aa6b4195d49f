// ThreadSanitizer's defaults, linked into every binary of --config=tsan
// (through @system_libs//:absl; see .bazelrc). TSAN_OPTIONS, where set,
// is read after them.
//
// Debian's gRPC and protobuf are not instrumented: TSan does not see the
// atomics with which gRPC's threads hand a buffer to each other, only the
// memcpy, memset and free calls they make, so every such call would be
// reported as racing with the last instrumented access. With
// ignore_noninstrumented_modules those calls count only for the
// synchronization they do (their locks, the file descriptors they write and
// read), never as accesses. Everything the project compiles, and Abseil's
// locks (built from source here), is checked.
//
// history_size=7 (the most; the default is 2) keeps each thread's last
// accesses long enough that a report can name the earlier access's stack:
// under the data path's load a server's gRPC threads make so many that with
// less a report said only "[failed to restore the stack]". It costs memory
// per thread, not time.
#include <cstdint>

#include "absl/random/internal/pool_urbg.h"
#include "absl/types/span.h"

extern "C" const char* __tsan_default_options() {
  return "ignore_noninstrumented_modules=1:halt_on_error=1:second_deadlock_stack=1:"
         "history_size=7";
}

// Reports of gRPC's own handoffs, from one of its threads to another through
// its uninstrumented core, suppressed (each kind was seen in this suite):
//  - an access on top of a stack in gRPC++'s call and callback code
//    (grpc::internal::, compiled inline into our binaries, so instrumented);
//  - any access under a call's op set (CallOpSet: filled on the thread that
//    starts a call or a reply, finalized on the completion queue's) or its
//    interceptor batch (InterceptorBatchMethodsImpl: run from Finish, run
//    again and destroyed from the queue). The project's interceptors
//    (StatsInterceptor, IdentityInterceptor) run under these, so a race of
//    theirs would be hidden: they add to atomic counters and to a histogram
//    of atomics, and read a process-lifetime identity, nothing else;
//  - a server reply's completion tag, run by the queue's thread and then
//    destroyed (CallbackWithSuccessTag's destructor) by another;
//  - a server call's completion tag run (CallbackWithSuccessTag::Run reads
//    its std::function; last session also ServerCallbackCall::Unref under
//    it), racing with a write whose stack TSan cannot restore even at
//    history_size=7: always the same offset (11432) of a 12951-byte block
//    that libgpr allocated, a call's arena (3 reports in checkpoint_test
//    and cluster_test, 2026-11-24). Our reactors' OnDone and OnCancel never
//    run under this frame: they are not inlineable
//    (ServerReactor::InternalInlineable() is false), so gRPC runs them from
//    its executor; under it runs only gRPC's inline code (the tag's
//    function, MaybeDone, the call's reference count);
//  - a client call's completion callback, the std::function that
//    CallbackUnaryCallImpl's constructor copies into the call on the thread
//    that starts it and the queue's thread invokes (what the callback then
//    does is ordered after the start by HandoffToken, common/tsan_handoff.h);
//  - the absl::Status that gRPC's core creates or annotates on one thread
//    (StatusCreate, StatusSetInt, StatusSetTime) and reads or releases on
//    another (StatusGetInt, StatusToProto), its reference count kept by
//    code inlined into libgrpc.
// How TSan matches (compiler-rt, tsan_suppressions.cpp): a report is dropped
// when any of its stacks matches: either access, and the creation stack of
// each thread it names. race: matches any frame's function, file or module
// (inlined frames included: --config=tsan keeps the line tables); race_top:
// the top frame only; a pattern matches as a substring unless anchored with
// ^ or $. So a race of ours whose other access sits in one of these would be
// hidden too, and no pattern names a function on the path of our callbacks:
// the completion queue's threads are created inside a call's start, so their
// creation stacks hold our frames, and every callback runs under gRPC++'s
// CallbackWithStatusTag::Run.
extern "C" const char* __tsan_default_suppressions() {
  return "race_top:^grpc::internal::\n"
         "race:^grpc::internal::CallOpSet<\n"
         "race:^grpc::internal::InterceptorBatchMethodsImpl::\n"
         "race:^grpc::internal::CallbackWithSuccessTag::~CallbackWithSuccessTag\n"
         "race:^grpc::internal::CallbackWithSuccessTag::Run\n"
         "race:^grpc::internal::CallbackUnaryCallImpl<*>::CallbackUnaryCallImpl\n"
         "race:^grpc_core::Status\n"
         "race:^grpc_core::internal::StatusToProto\n";
}

// Debian's gRPC seeds its back-off jitter from Abseil's random pool
// (RandenPool<uint8_t>::Fill, in libabsl_random_internal_pool_urbg), which
// nothing of ours uses, so no instrumented copy was linked and gRPC called
// Debian's: its uninstrumented code inlines SpinLock::Lock and then calls
// the executable's instrumented SpinLock::SlowLock, whose annotations find
// no matching lock and stop TSan on its own check ("((thr->ignore_sync)) >
// ((0))", data_path_test, 2026-11-25). This reference links the instrumented
// pool into every binary, exported (-rdynamic) like the rest of Abseil, so
// gRPC's calls bind to it. Never called.
extern "C" void PstrainTsanLinkRandenPool() {
  absl::random_internal::RandenPool<uint8_t>::Fill(absl::Span<uint8_t>());
}
