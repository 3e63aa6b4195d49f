#include "tools/trial_launcher.h"

#include <cstdlib>
#include <map>
#include <string>

#include "catch2/catch.hpp"
#include "common/storage/env.h"

namespace pstrain {
namespace {

std::string WriteLog(const std::string& name, const std::string& text) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = JoinPath(tmp != nullptr ? tmp : "/tmp", name);
  REQUIRE(WriteFileAtomically(Env::Default(), path, text).ok());
  return path;
}

TEST_CASE("squeue's lines give each task of the array its state", "[sweep][slurm]") {
  const std::map<int, std::string> states = ParseArrayStates(
      "12", "12_0 RUNNING\n  12_3 PENDING\n120_1 RUNNING\n12_x RUNNING\n12_2\n\n7_1 PENDING\n"
            "12_10 COMPLETING\n");
  CHECK(states == std::map<int, std::string>{{0, "RUNNING"}, {3, "PENDING"}, {10, "COMPLETING"}});
  CHECK(ParseArrayStates("12", "").empty());
  CHECK(ParseArrayStates("12", "slurm_load_jobs error: Invalid job id specified\n").empty());
}

TEST_CASE("a failed launch's error is the first a task logged, not the stop that followed it",
          "[sweep]") {
  // pstrain launch's log: task lines prefixed with the task.
  const std::string local = WriteLog(
      "local.log",
      "pstrain launch: started 3 task(s); logs in d/logs\n"
      "[ps:0] 2026-11-29 11:47:33.593 ps:0 E stopping: received Terminated\n"
      "[chief:0] 2026-11-29 11:47:33.595 chief:0 E training failed: NOT_FOUND: open x\n"
      "pstrain launch: chief:0 exited with code 1 (log: d/logs/chief-0.log); stopped every task\n");
  CHECK(LaunchError(local, 1) == "chief:0: training failed: NOT_FOUND: open x");
  // Killed: only the stop's lines, then the launcher's word.
  const std::string killed = WriteLog(
      "killed.log",
      "[ps:0] 2026-11-29 11:47:33.593 ps:0 E stopping: received Terminated\n"
      "pstrain launch: chief:0 exited with code 137 (log: l); stopped every task\n");
  CHECK(LaunchError(killed, 1) == "chief:0 exited with code 137 (log: l); stopped every task");
  // A Slurm task's output: the daemons' lines as they are, and srun's.
  const std::string slurm = WriteLog(
      "slurm.log",
      "pstrain launch --slurm: rank 0 of 3 on n1 is chief:0 at n1:8470\n"
      "2026-11-29 11:47:33.595 worker:0 E reading the data: DATA_LOSS: torn record\n"
      "srun: error: n1: task 2: Exited with exit code 1\n");
  CHECK(LaunchError(slurm, 1) == "worker:0: reading the data: DATA_LOSS: torn record");
  const std::string srun = WriteLog("srun.log", "srun: error: n1: task 0: Killed\n");
  CHECK(LaunchError(srun, 137) == "srun: error: n1: task 0: Killed");
  CHECK(LaunchError(WriteLog("empty.log", ""), 3) == "pstrain launch exited with code 3");
}

}  // namespace
}  // namespace pstrain
