// gRPC's library for the whole life of the process.
#ifndef PSTRAIN_COMMON_RPC_GRPC_LIFETIME_H_
#define PSTRAIN_COMMON_RPC_GRPC_LIFETIME_H_

namespace pstrain {

// Takes one reference to gRPC's library that is never given back (safe to
// call more than once: one reference in all), so that the last gRPC server,
// channel or completion queue going away does not run gRPC's global
// shutdown. That shutdown joins gRPC's executor threads, and one of them may
// be blocked in epoll_wait until its next timer: measured here with
// gRPC 1.51, a ps_server told to stop after training exited ~10 s late in
// 4 of 8 runs (stuck in grpc::Server::~Server -> grpc_shutdown ->
// Executor::ShutdownAll), and `pstrain launch` waited for it. A process that
// ends has no more use for gRPC; its exit reclaims the threads and memory.
// Every daemon calls it from SetUpDaemon, and `pstrain launch` and `pstrain
// bench` once their stop signals are set up. The threads gRPC starts here
// block SIGINT and SIGTERM, as StopOnTerminationSignals asks of every thread
// (common/base/shutdown.h), whether or not the caller had blocked them.
void KeepGrpcUntilExit();

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_RPC_GRPC_LIFETIME_H_
