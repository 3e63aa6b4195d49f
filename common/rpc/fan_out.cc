#include "common/rpc/fan_out.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/base/tsan_handoff.h"
#include "common/rpc/rpc.h"

namespace pstrain {

void StartInWindow(CallWindow* window, const std::atomic<bool>* cancelled,
                   std::function<void(std::function<void(grpc::Status)>)> start,
                   std::function<void(grpc::Status)> ended) {
  const HandoffToken handoff;  // the start, through gRPC's core, before `done`
  std::function<void(grpc::Status)> done = [window, handoff,
                                            ended = std::move(ended)](grpc::Status st) {
    handoff.Acquire();
    if (window != nullptr) window->Release();
    ended(std::move(st));
  };
  auto begin = [cancelled, handoff, start = std::move(start), done = std::move(done)]() mutable {
    if (cancelled->load(std::memory_order_acquire)) {
      done(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled before it started"));
      return;
    }
    handoff.Release();
    start(std::move(done));
  };
  if (window != nullptr) {
    window->Start(std::move(begin));
  } else {
    begin();
  }
}

absl::Status CallAll(int n, absl::Duration timeout, bool wait_for_ready,
                     const std::function<std::string(int)>& name,
                     const std::function<void(int, grpc::ClientContext*,
                                              std::function<void(grpc::Status)>)>& start,
                     const std::function<CallWindow*(int)>& window) {
  absl::Mutex mu;
  int pending = n;
  std::atomic<bool> cancelled{false};  // calls still waiting in a window end unstarted
  std::vector<grpc::Status> statuses(n);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  for (int c = 0; c < n; ++c) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    SetDeadline(contexts.back().get(), timeout);
    contexts.back()->set_wait_for_ready(wait_for_ready);
  }
  for (int c = 0; c < n; ++c) {
    // The window's next call may begin in `done`; this frame waits for it.
    StartInWindow(
        window ? window(c) : nullptr, &cancelled,
        [&start, &contexts, c](std::function<void(grpc::Status)> done) {
          start(c, contexts[c].get(), std::move(done));
        },
        [&mu, &pending, &statuses, c](grpc::Status st) {
          absl::MutexLock lock(&mu);
          statuses[c] = std::move(st);
          --pending;
        });
  }
  {
    absl::MutexLock lock(&mu);
    auto done = [&pending]() { return pending == 0; };
    if (!mu.AwaitWithTimeout(absl::Condition(&done), timeout + absl::Seconds(5))) {
      // gRPC enforces the deadlines; this is a guard against a stuck library.
      // After TryCancel gRPC runs every callback promptly (a call still
      // waiting in its window ends without starting), and they refer to
      // this frame, so waiting for them is both bounded and required.
      cancelled.store(true, std::memory_order_release);
      for (auto& ctx : contexts) ctx->TryCancel();
      mu.Await(absl::Condition(&done));
    }
  }
  for (int s = 0; s < n; ++s) {
    if (!statuses[s].ok()) return FromGrpcStatus(statuses[s], name(s));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
