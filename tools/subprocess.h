// Child processes for `pstrain launch` and the multi-process tests: spawn with
// fork/exec, optionally capture stdout+stderr through a pipe, signal, and wait
// with a deadline (a pidfd polled with a timeout, no sleep loops). Children get
// PR_SET_PDEATHSIG(SIGKILL), so none outlives a crashed parent. A Subprocess
// is owned by one thread; its destructor kills and reaps a child still running.
#ifndef PSTRAIN_TOOLS_SUBPROCESS_H_
#define PSTRAIN_TOOLS_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pstrain {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is the executable's path
  // Output: a pipe read through output_fd() when `capture_output`, else this
  // file (appended) when set, else inherited.
  bool capture_output = false;
  std::string output_file;
  std::vector<std::string> extra_env;  // "KEY=VALUE"
  // The child leads a process group of its own, and Signal and Stop reach
  // the whole group: a shell command's own children (`sh -c "cd d &&
  // python train.py"`) are signalled with it, and none is left running
  // once the shell is stopped or has exited. Its stdin is /dev/null (not
  // the terminal's foreground group, a read there would stop it).
  bool process_group = false;
};

class Subprocess {
 public:
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(const SpawnOptions& options);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  int output_fd() const { return output_fd_; }  // -1 unless capturing
  int pidfd() const { return pidfd_; }          // readable once the child exits
  bool running() const { return !exit_code_.has_value(); }
  // To the child (its whole group with SpawnOptions::process_group). Once
  // a group's leader is reaped after a SIGTERM, the rest of the group has
  // kGroupGrace from that SIGTERM, then is killed.
  void Signal(int sig);
  // Waits up to `timeout` for the child to exit. Returns its exit code
  // (128 + signal number when killed by a signal) or nullopt if still running.
  std::optional<int> Wait(absl::Duration timeout);
  // Whether the child, reaped, was ended by a signal it did not handle (a
  // kill, a crash), not an exit of its own (which may also be 128 + n, as a
  // daemon's clean stop on SIGTERM is).
  bool killed_by_signal() const { return killed_by_signal_; }
  // SIGTERM, then SIGKILL after `grace`; always reaps. Returns the exit code.
  // With a process group, the group's other members have what is left of
  // `grace` after the leader exited, then are killed.
  int Stop(absl::Duration grace);
  void CloseOutput();

 private:
  Subprocess() = default;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int output_fd_ = -1;
  std::optional<int> exit_code_;
  bool killed_by_signal_ = false;
  bool process_group_ = false;
  bool stopping_ = false;  // in Stop
  absl::Time term_sent_at_ = absl::InfiniteFuture();  // the first SIGTERM's
  // What a group's other members have after a SIGTERM, once the leader is
  // gone (pstrain launch's StopAll grace).
  static constexpr absl::Duration kGroupGrace = absl::Seconds(5);
  // Waits until the group has no member or `deadline`, then kills what is left.
  void EndGroup(absl::Time deadline);
};

struct CommandOutput {
  int exit_code = -1;
  bool timed_out = false;  // stopped at the deadline (SIGTERM, SIGKILL 5 s later)
  std::string output;      // stdout and stderr together
};
// Runs `argv` to its end, or to `timeout`; an error only when it cannot be
// started.
absl::StatusOr<CommandOutput> RunToEnd(const std::vector<std::string>& argv,
                                       absl::Duration timeout);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_SUBPROCESS_H_
