#include "tools/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace pstrain {

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("spawn: empty argv");
  struct stat st;
  if (::stat(options.argv[0].c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
      ::access(options.argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("spawn: ", options.argv[0], " is not executable"));
  }
  int pipe_fds[2] = {-1, -1};
  if (options.capture_output && ::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  int file_fd = -1;
  if (!options.capture_output && !options.output_file.empty()) {
    file_fd = ::open(options.output_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (file_fd < 0) {
      return absl::InternalError(absl::StrCat("open ", options.output_file, ": ", strerror(errno)));
    }
  }
  // Everything the child needs is prepared before fork (no allocation after).
  std::vector<char*> argv;
  for (const std::string& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  // extra_env wins over an inherited variable of the same name (getenv
  // takes the first of two).
  auto overridden = [&options](const char* e) {
    for (const std::string& x : options.extra_env) {
      const size_t eq = x.find('=');
      if (eq != std::string::npos && std::strncmp(e, x.c_str(), eq + 1) == 0) return true;
    }
    return false;
  };
  for (char** e = environ; *e != nullptr; ++e) {
    if (!overridden(*e)) envp.push_back(*e);
  }
  for (const std::string& e : options.extra_env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) _exit(127);  // the parent died before prctl
    if (options.process_group) {
      ::setpgid(0, 0);
      // In a group of its own it is not the terminal's foreground: a read
      // of the terminal would stop it (SIGTTIN). Its stdin is empty.
      const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    }
    int out = options.capture_output ? pipe_fds[1] : file_fd;
    if (out >= 0) {
      ::dup2(out, STDOUT_FILENO);
      ::dup2(out, STDERR_FILENO);
    }
    // Restore default signal handling the parent may have changed.
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, nullptr);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    ::execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  // (Also here: a signal sent before the child ran its setpgid reaches it.)
  if (options.process_group) ::setpgid(pid, pid);
  std::unique_ptr<Subprocess> proc(new Subprocess());
  proc->pid_ = pid;
  proc->process_group_ = options.process_group;
  proc->pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (options.capture_output) {
    ::close(pipe_fds[1]);
    proc->output_fd_ = pipe_fds[0];
  }
  if (file_fd >= 0) ::close(file_fd);
  return proc;
}

Subprocess::~Subprocess() {
  if (running()) Stop(absl::Seconds(2));
  CloseOutput();
  if (pidfd_ >= 0) ::close(pidfd_);
}

void Subprocess::Signal(int sig) {
  if (!running()) return;
  if (sig == SIGTERM && term_sent_at_ == absl::InfiniteFuture()) term_sent_at_ = absl::Now();
  ::kill(process_group_ ? -pid_ : pid_, sig);
}

void Subprocess::CloseOutput() {
  if (output_fd_ >= 0) ::close(output_fd_);
  output_fd_ = -1;
}

std::optional<int> Subprocess::Wait(absl::Duration timeout) {
  if (exit_code_.has_value()) return exit_code_;
  if (pidfd_ >= 0) {
    struct pollfd pfd = {pidfd_, POLLIN, 0};
    int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
    int rc;
    do {
      rc = ::poll(&pfd, 1, ms < 0 ? 0 : ms);
    } while (rc < 0 && errno == EINTR);
    if (rc == 0) return std::nullopt;
  }
  int status = 0;
  // Without a pidfd (old kernels) this blocks; with one, the child has exited.
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, pidfd_ >= 0 ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return std::nullopt;
  if (r < 0) {
    exit_code_ = 255;
  } else if (WIFEXITED(status)) {
    exit_code_ = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    exit_code_ = 128 + WTERMSIG(status);
    killed_by_signal_ = true;
  } else {
    exit_code_ = 255;
  }
  // A group whose leader exited: what it left running goes too, at once
  // where it exited on its own, after the grace where it was asked to stop
  // (a script's SIGTERM handler may outlive the shell that ran it).
  if (process_group_ && !stopping_) {
    EndGroup(term_sent_at_ == absl::InfiniteFuture() ? absl::InfinitePast()
                                                     : term_sent_at_ + kGroupGrace);
  }
  return exit_code_;
}

int Subprocess::Stop(absl::Duration grace) {
  if (!running()) return *exit_code_;
  const absl::Time grace_end = absl::Now() + grace;
  stopping_ = true;  // (Wait leaves the group to the grace below)
  Signal(SIGTERM);
  std::optional<int> code = Wait(grace);
  if (!code.has_value()) {
    Signal(SIGKILL);
    code = Wait(absl::Seconds(10));
  }
  stopping_ = false;
  // The leader is gone; the rest of its group has what is left of the
  // grace to end on SIGTERM, then is killed: none is left behind.
  if (process_group_) EndGroup(grace_end);
  return code.value_or(255);
}

void Subprocess::EndGroup(absl::Time deadline) {
  // (The group's id stays taken while any member lives, so these signals
  // reach no other process.)
  while (::kill(-pid_, 0) == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ::kill(-pid_, SIGKILL);
}

absl::StatusOr<CommandOutput> RunToEnd(const std::vector<std::string>& argv,
                                       absl::Duration timeout) {
  SpawnOptions so;
  so.argv = argv;
  so.capture_output = true;
  absl::StatusOr<std::unique_ptr<Subprocess>> proc = Subprocess::Spawn(so);
  if (!proc.ok()) return proc.status();
  CommandOutput result;
  const absl::Time deadline = absl::Now() + timeout;
  char buf[65536];
  while ((*proc)->output_fd() >= 0) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) {
      result.timed_out = true;
      break;
    }
    pollfd pfd = {(*proc)->output_fd(), POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(ms)) <= 0) continue;
    const ssize_t n = ::read((*proc)->output_fd(), buf, sizeof(buf));
    if (n <= 0) {
      (*proc)->CloseOutput();
      break;
    }
    result.output.append(buf, static_cast<size_t>(n));
  }
  std::optional<int> code;
  if (!result.timed_out)
    code = (*proc)->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
  if (!code.has_value()) {
    result.timed_out = true;
    code = (*proc)->Stop(absl::Seconds(5));
  }
  result.exit_code = *code;
  return result;
}

}  // namespace pstrain
