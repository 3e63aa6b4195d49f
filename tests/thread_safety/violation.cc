// Must NOT compile under tools/thread_safety.sh: it writes a guarded member
// without its mutex, so a clean run of the script proves the analysis is on.
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace {

class Counter {
 public:
  void Bump() { ++value_; }  // needs mu_

 private:
  absl::Mutex mu_;
  int value_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() {
  Counter c;
  c.Bump();
  return 0;
}
