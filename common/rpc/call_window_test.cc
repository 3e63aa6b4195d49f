#include "common/rpc/call_window.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "catch2/catch.hpp"

namespace pstrain {
namespace {

TEST_CASE("a call window starts at most its limit, the rest in order as calls end", "[call_window]") {
  CallWindow window(2);
  std::vector<int> begun;
  for (int i = 0; i < 6; ++i) window.Start([&begun, i] { begun.push_back(i); });
  CHECK(begun == std::vector<int>{0, 1});
  CHECK(window.stats().in_flight == 2);
  CHECK(window.stats().waiting == 4);
  window.Release();  // call 0 ended: 2 begins in its place
  CHECK(begun == std::vector<int>{0, 1, 2});
  CHECK(window.stats().in_flight == 2);
  for (int i = 0; i < 3; ++i) window.Release();
  CHECK(begun == std::vector<int>{0, 1, 2, 3, 4, 5});
  CHECK(window.stats().waiting == 0);
  window.Release();
  window.Release();
  const CallWindow::Stats st = window.stats();
  CHECK(st.in_flight == 0);
  CHECK(st.peak_in_flight == 2);
  CHECK(st.waited == 4);
  // Room again: the next call begins at once.
  window.Start([&begun] { begun.push_back(6); });
  CHECK(begun.size() == 7);
  window.Release();
}

TEST_CASE("a call window without a limit starts every call at once", "[call_window]") {
  CallWindow window(0);
  int begun = 0;
  for (int i = 0; i < 100; ++i) window.Start([&begun] { ++begun; });
  CHECK(begun == 100);
  CHECK(window.stats().peak_in_flight == 100);
  CHECK(window.stats().waited == 0);
  for (int i = 0; i < 100; ++i) window.Release();
  CHECK(window.stats().in_flight == 0);
}

TEST_CASE("calls that end inside their own begin (refused at once) drain the window",
          "[call_window]") {
  CallWindow window(1);
  int begun = 0;
  // The first call stays in flight; 200,000 more wait behind it, and each
  // of them ends the moment it begins (taken in a loop: recursing once per
  // call would overflow the stack).
  window.Start([&begun] { ++begun; });
  for (int i = 0; i < 200000; ++i) {
    window.Start([&begun, &window] {
      ++begun;
      window.Release();
    });
  }
  CHECK(begun == 1);
  window.Release();
  CHECK(begun == 200001);
  CHECK(window.stats().in_flight == 0);
  CHECK(window.stats().waiting == 0);
}

TEST_CASE("a call window holds its limit with calls started and ended on many threads",
          "[call_window]") {
  constexpr int kLimit = 3, kThreads = 4, kCalls = 2000;
  CallWindow window(kLimit);
  absl::Mutex mu;
  int in_flight = 0, most = 0, begun = 0;  // guarded by mu
  // Ends calls in flight, as gRPC's threads would, until every call has
  // begun and ended.
  auto end_calls = [&] {
    for (;;) {
      {
        absl::MutexLock lock(&mu);
        if (in_flight == 0) {
          if (begun == kThreads * kCalls) return;
          continue;
        }
        --in_flight;
      }
      window.Release();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) threads.emplace_back(end_calls);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kCalls; ++i) {
        window.Start([&] {
          absl::MutexLock lock(&mu);
          ++begun;
          most = std::max(most, ++in_flight);
        });
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(begun == kThreads * kCalls);
  CHECK(most <= kLimit);
  CHECK(window.stats().peak_in_flight == kLimit);
  CHECK(window.stats().in_flight == 0);
  CHECK(window.stats().waiting == 0);
}

}  // namespace
}  // namespace pstrain
