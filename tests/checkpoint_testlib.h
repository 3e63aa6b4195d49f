// Helpers of the checkpoint suites (tests/checkpoint_test.cc,
// tests/recovery_test.cc): a job's spec and config written out, run under
// `pstrain launch` (to its end, or killed), and its model and checkpoints
// compared bitwise.
#ifndef PSTRAIN_TESTS_CHECKPOINT_TESTLIB_H_
#define PSTRAIN_TESTS_CHECKPOINT_TESTLIB_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/storage/tensor_file.h"
#include "tests/cluster_testlib.h"
#include "tools/subprocess.h"

namespace pstrain {
namespace testing {

// Adam (two slots per element), checkpoints every 50 steps, all kept.
ConfigOptions CheckpointOptions(const std::string& ckpt_dir, int max_steps);

struct Job {
  std::string spec;
  std::string config;
  std::string out;
};

Job WriteJob(const std::string& dir, ConfigOptions o, int ps);

CommandResult RunJob(const Job& job, bool resume);

// Runs the job to its end; it must succeed.
void RunJobOk(const Job& job, bool resume);

std::string ChiefLog(const Job& job);

TensorMap FinalModel(const Job& job);

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b);

// Every variable of `want` is in `got` with the same bits, and no other.
void CheckSameModel(const TensorMap& got, const TensorMap& want);

// The number after the first (or `last`) `prefix` in `text` (-1 when absent).
int64_t NumberAfter(const std::string& text, const std::string& prefix, bool last = false);

// `pstrain launch` of `job` with `flags` added, its output in DIR/launch.out.
std::unique_ptr<Subprocess> SpawnLaunch(const Job& job, const std::string& dir,
                                        const std::vector<std::string>& flags = {});

// Values, slots and update counts of two checkpoints, variable by variable.
void CheckSameCheckpoint(const std::string& got_dir, const std::string& want_dir);

// Every row of every table, by id: values, slots, update counts and
// last-touched steps bitwise (each table more than 100 rows).
void CheckSameTables(const std::string& got_dir, const std::string& want_dir);

void CopyCheckpoint(const std::string& from_dir, int64_t step, const std::string& to_dir);

// Starts the job under `pstrain launch` and, once `ready()` holds (or 120 s
// pass, or the launch ends), kills every process of it with SIGKILL.
// `flags`: more flags of the launch.
void LaunchAndKillAll(const Job& job, const std::string& dir, const std::function<bool()>& ready,
                      const std::vector<std::string>& flags = {});

}  // namespace testing
}  // namespace pstrain

#endif  // PSTRAIN_TESTS_CHECKPOINT_TESTLIB_H_
