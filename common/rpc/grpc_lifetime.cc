#include "common/rpc/grpc_lifetime.h"

#include <grpc/grpc.h>
#include <pthread.h>
#include <signal.h>

#include <mutex>

#include "common/base/shutdown.h"

namespace pstrain {

void KeepGrpcUntilExit() {
  static std::once_flag once;
  std::call_once(once, [] {
    // The threads grpc_init starts inherit this thread's mask: they block
    // the stop signals, whatever the caller did before (common/base/shutdown.h).
    const sigset_t stop_signals = TerminationSignals();
    sigset_t before;
    pthread_sigmask(SIG_BLOCK, &stop_signals, &before);
    grpc_init();
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
  });
}

}  // namespace pstrain
