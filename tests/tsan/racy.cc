// A data race on purpose, for tests/tsan_test: two threads add to one plain
// int with no lock. Under ThreadSanitizer (--config=tsan) this process must
// be reported; elsewhere it is never run.
#include <cstdio>
#include <thread>

namespace {

int counter = 0;

__attribute__((noinline)) void RacyIncrement() {
  for (int i = 0; i < 100000; ++i) counter = counter + 1;
}

}  // namespace

int main() {
  std::thread a(RacyIncrement);
  std::thread b(RacyIncrement);
  a.join();
  b.join();
  std::printf("%d\n", counter);
  return 0;
}
