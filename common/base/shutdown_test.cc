#include "common/base/shutdown.h"

#include <signal.h>

#include <thread>

#include "absl/synchronization/notification.h"

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

TEST_CASE("the first stop reason wins and waiters wake", "[shutdown]") {
  StopSignal stop;
  CHECK_FALSE(stop.WaitFor(absl::Milliseconds(5)));
  std::thread t([&stop] { stop.Stop("first", 3); });
  stop.Wait();
  t.join();
  stop.Stop("second", 4);
  CHECK(stop.stopped());
  CHECK(stop.reason() == "first");
  CHECK(stop.exit_code() == 3);
  CHECK(stop.times() == 2);  // a second Ctrl-C is seen, though the first reason stays
}

TEST_CASE("SIGTERM on any thread becomes a stop, even one that never blocked it",
          "[shutdown]") {
  // Threads started before the handler (as OpenBLAS starts its own) must not
  // let the default action kill the process.
  absl::Notification started, release;
  std::thread early([&] {
    started.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(30));
  });
  started.WaitForNotification();
  StopSignal& stop = StopOnTerminationSignals();
  ::kill(::getpid(), SIGTERM);
  CHECK(stop.WaitFor(absl::Seconds(10)));
  CHECK(stop.exit_code() == 128 + SIGTERM);
  CHECK(stop.reason().find("Terminated") != std::string::npos);
  release.Notify();
  early.join();
}

}  // namespace
}  // namespace pstrain
