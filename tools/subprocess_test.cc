#include "tools/subprocess.h"

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/time/clock.h"

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

// The child's captured output: to its end, or up to its first newline.
std::string ReadOutput(Subprocess* p, bool first_line = false) {
  std::string out;
  char buf[256];
  ssize_t n;
  while (!(first_line && out.find('\n') != std::string::npos) &&
         (n = ::read(p->output_fd(), buf, sizeof(buf))) > 0) {
    out.append(buf, n);
  }
  return out;
}

// Whether `pid` still runs (a zombie waiting for init to reap it does not).
bool Alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

// Whether `pid` ends (or is a zombie) within `timeout`.
bool GoneWithin(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (Alive(pid) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  return !Alive(pid);
}

TEST_CASE("a child's exit code is returned", "[subprocess]") {
  auto p = Subprocess::Spawn({{"/bin/sh", "-c", "exit 3"}});
  REQUIRE(p.ok());
  auto code = (*p)->Wait(absl::Seconds(10));
  REQUIRE(code.has_value());
  CHECK(*code == 3);
}

TEST_CASE("output can be captured through a pipe", "[subprocess]") {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "echo hello; echo err >&2"};
  o.capture_output = true;
  auto p = Subprocess::Spawn(o);
  REQUIRE(p.ok());
  const std::string out = ReadOutput(p->get());
  CHECK(out == "hello\nerr\n");
  CHECK((*p)->Wait(absl::Seconds(10)).value_or(-1) == 0);
}

TEST_CASE("extra_env wins over an inherited variable of the same name", "[subprocess]") {
  ::setenv("PSTRAIN_SUBPROCESS_TEST", "inherited", 1);
  ::setenv("PSTRAIN_SUBPROCESS_TEST_KEPT", "kept", 1);
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c",
            "env | grep -c '^PSTRAIN_SUBPROCESS_TEST='; echo \"$PSTRAIN_SUBPROCESS_TEST "
            "$PSTRAIN_SUBPROCESS_TEST_KEPT\""};
  o.extra_env = {"PSTRAIN_SUBPROCESS_TEST=mine", "NOT_AN_ASSIGNMENT"};
  o.capture_output = true;
  auto p = Subprocess::Spawn(o);
  REQUIRE(p.ok());
  const std::string out = ReadOutput(p->get());
  CHECK(out == "1\nmine kept\n");
  CHECK((*p)->Wait(absl::Seconds(10)).value_or(-1) == 0);
  ::unsetenv("PSTRAIN_SUBPROCESS_TEST");
  ::unsetenv("PSTRAIN_SUBPROCESS_TEST_KEPT");
}

TEST_CASE("wait has a deadline and stop kills a stubborn child", "[subprocess]") {
  auto p = Subprocess::Spawn({{"/bin/sh", "-c", "trap '' TERM; sleep 30"}});
  REQUIRE(p.ok());
  CHECK_FALSE((*p)->Wait(absl::Milliseconds(50)).has_value());
  int code = (*p)->Stop(absl::Milliseconds(200));
  CHECK(code == 128 + SIGKILL);
  CHECK_FALSE((*p)->running());
}

TEST_CASE("a process group's shell and the command it runs are stopped together",
          "[subprocess]") {
  // The shell runs its command as a child (not the last command: no exec).
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "sleep 300 & echo $!; wait; echo never"};
  o.capture_output = true;
  o.process_group = true;
  auto p = Subprocess::Spawn(o);
  REQUIRE(p.ok());
  const std::string out = ReadOutput(p->get(), /*first_line=*/true);
  const pid_t child = std::stoi(out);
  CHECK(::getpgid(child) == (*p)->pid());
  CHECK(Alive(child));
  CHECK((*p)->Stop(absl::Seconds(5)) == 128 + SIGTERM);
  CHECK(GoneWithin(child, absl::Seconds(10)));
}

TEST_CASE("a process group member that ignores SIGTERM is killed once its shell is gone",
          "[subprocess]") {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "(trap '' TERM; sleep 300) & echo $!; wait"};
  o.capture_output = true;
  o.process_group = true;
  auto p = Subprocess::Spawn(o);
  REQUIRE(p.ok());
  const std::string out = ReadOutput(p->get(), /*first_line=*/true);
  const pid_t child = std::stoi(out);
  CHECK(Alive(child));
  (*p)->Stop(absl::Seconds(5));
  CHECK(GoneWithin(child, absl::Seconds(10)));
}

TEST_CASE("what a process group's shell left running when it exited goes with it; its stdin is "
          "empty", "[subprocess]") {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!; read line; echo \"read: $?\""};
  o.capture_output = true;
  o.process_group = true;
  auto p = Subprocess::Spawn(o);
  REQUIRE(p.ok());
  const std::string out = ReadOutput(p->get());
  const pid_t child = std::stoi(out);
  CHECK(out.find("read: 1") != std::string::npos);  // end of file at once
  CHECK((*p)->Wait(absl::Seconds(10)).value_or(-1) == 0);
  CHECK(GoneWithin(child, absl::Seconds(10)));
}

TEST_CASE("a process group member handling SIGTERM gets its grace after the shell is gone",
          "[subprocess]") {
  // The member takes 0.3 s to leave on SIGTERM, and says so; the shell
  // leaves at once.
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c",
            "(trap 'sleep 0.3; echo member done; exit 0' TERM; sleep 300 & wait) & wait"};
  o.capture_output = true;
  o.process_group = true;
  auto p = Subprocess::Spawn(o);
  REQUIRE(p.ok());
  absl::SleepFor(absl::Milliseconds(300));  // (the traps set)
  (*p)->Signal(SIGTERM);
  REQUIRE((*p)->Wait(absl::Seconds(10)).has_value());
  const std::string out = ReadOutput(p->get());
  CHECK(out == "member done\n");
}

TEST_CASE("a missing executable is a clear error", "[subprocess]") {
  auto p = Subprocess::Spawn({{"/nonexistent/binary"}});
  CHECK(absl::IsNotFound(p.status()));
}

}  // namespace
}  // namespace pstrain
