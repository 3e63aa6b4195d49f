// The fan-out without a network: calls whose `start` ends them on threads of
// their own, through windows.
#include "common/rpc/fan_out.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"

namespace pstrain {
namespace {

TEST_CASE("CallAll waits for every call and returns the first failure, named", "[rpc][fan_out]") {
  std::vector<std::thread> threads;
  std::atomic<int> started{0};
  absl::Status st = CallAll(
      4, absl::Seconds(5), /*wait_for_ready=*/false,
      [](int c) { return "call " + std::to_string(c); },
      [&](int c, grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
        CHECK(ctx->deadline() > std::chrono::system_clock::now());
        ++started;
        threads.emplace_back([c, done = std::move(done)] {
          absl::SleepFor(absl::Milliseconds(10 * (4 - c)));
          done(c == 2 ? grpc::Status(grpc::StatusCode::NOT_FOUND, "no such thing")
                      : grpc::Status::OK);
        });
      });
  for (std::thread& t : threads) t.join();
  CHECK(started == 4);
  CHECK(absl::IsNotFound(st));
  CHECK(st.message() == "call 2: no such thing");
}

TEST_CASE("CallAll starts at most a window's calls at once, the rest as earlier ones end",
          "[rpc][fan_out]") {
  CallWindow window(2);
  std::atomic<int> running{0}, most{0};
  std::vector<std::thread> threads;
  absl::Mutex threads_mu;
  absl::Status st = CallAll(
      6, absl::Seconds(5), false, [](int c) { return std::to_string(c); },
      [&](int, grpc::ClientContext*, std::function<void(grpc::Status)> done) {
        const int now = ++running;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        absl::MutexLock lock(&threads_mu);
        threads.emplace_back([&running, done = std::move(done)] {
          absl::SleepFor(absl::Milliseconds(5));
          --running;
          done(grpc::Status::OK);
        });
      },
      [&window](int) { return &window; });
  {
    absl::MutexLock lock(&threads_mu);
    for (std::thread& t : threads) t.join();
  }
  CHECK(st.ok());
  CHECK(most <= 2);
  CHECK(most >= 1);
}

TEST_CASE("StartInWindow: a call cancelled before its turn ends unstarted with CANCELLED",
          "[rpc][fan_out]") {
  CallWindow window(1);
  std::atomic<bool> cancelled{false};
  std::function<void(grpc::Status)> first_done;
  StartInWindow(
      &window, &cancelled,
      [&first_done](std::function<void(grpc::Status)> done) { first_done = std::move(done); },
      [](grpc::Status) {});
  bool second_started = false;
  grpc::Status second = grpc::Status::OK;
  StartInWindow(
      &window, &cancelled, [&second_started](std::function<void(grpc::Status)>) {
        second_started = true;
      },
      [&second](grpc::Status st) { second = std::move(st); });
  cancelled = true;
  first_done(grpc::Status::OK);  // frees the window: the second's turn
  CHECK_FALSE(second_started);
  CHECK(second.error_code() == grpc::StatusCode::CANCELLED);
}

}  // namespace
}  // namespace pstrain
