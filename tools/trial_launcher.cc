#include "tools/trial_launcher.h"

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/storage/env.h"
#include "tools/local_ports.h"
#include "tools/subprocess.h"

namespace pstrain {

std::string TrialDirectory(const std::string& out_dir, int trial) {
  return JoinPath(out_dir, absl::StrCat("trial-", trial));
}

std::string LaunchError(const std::string& log_path, int code) {
  std::string first_error, last_word;
  std::ifstream in(log_path);
  for (std::string line; std::getline(in, line);) {
    if (absl::StartsWith(line, "pstrain launch: ") && !absl::StrContains(line, "started ") &&
        !absl::StrContains(line, "calls are signed")) {
      last_word = line.substr(16);
    }
    if (absl::StartsWith(line, "srun: error: ")) last_word = line;
    // A task's line: "<date> <time> chief:0 E message", which pstrain
    // launch prefixes with "[chief:0] ". A task stopped by the launcher's
    // signal says only that; the cause came before.
    absl::string_view rest = line;
    if (absl::StartsWith(rest, "[")) {
      const size_t space = rest.find(' ');
      if (space == absl::string_view::npos) continue;
      rest.remove_prefix(space + 1);
    }
    std::vector<std::string> words = absl::StrSplit(rest, absl::MaxSplits(' ', 4));
    if (first_error.empty() && words.size() == 5 && (words[3] == "E" || words[3] == "C") &&
        !absl::StartsWith(words[4], "stopping: received ")) {
      first_error = absl::StrCat(words[2], ": ", words[4]);
    }
  }
  if (!first_error.empty()) return first_error;
  return last_word.empty() ? absl::StrCat("pstrain launch exited with code ", code) : last_word;
}

std::map<int, std::string> ParseArrayStates(const std::string& job, absl::string_view squeue) {
  std::map<int, std::string> states;
  const std::string prefix = job + "_";
  for (absl::string_view line : absl::StrSplit(squeue, '\n', absl::SkipWhitespace())) {
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.size() != 2) continue;
    absl::string_view id = words[0];
    int task = 0;
    if (absl::ConsumePrefix(&id, prefix) && absl::SimpleAtoi(id, &task) && task >= 0) {
      states[task] = std::string(words[1]);
    }
  }
  return states;
}

namespace {

class LocalRun : public TrialRun {
 public:
  LocalRun(std::unique_ptr<Subprocess> launch, std::string log)
      : launch_(std::move(launch)), log_(std::move(log)), start_(absl::Now()) {}
  // One SIGTERM: a second makes a launch stop at once, without its save.
  void Terminate() override {
    if (!terminated_) launch_->Signal(SIGTERM);
    terminated_ = true;
  }
  std::optional<int> Poll() override { return launch_->Wait(absl::ZeroDuration()); }
  int Kill(absl::Duration grace) override {
    Terminate();
    std::optional<int> code = launch_->Wait(grace);
    return code.has_value() ? *code : launch_->Stop(absl::ZeroDuration());
  }
  std::optional<absl::Time> running_since() const override { return start_; }
  std::string Error(int code) const override { return LaunchError(log_, code); }

 private:
  std::unique_ptr<Subprocess> launch_;
  const std::string log_;
  const absl::Time start_;
  bool terminated_ = false;
};

class LocalLauncher : public TrialLauncher {
 public:
  explicit LocalLauncher(const LocalTrialOptions& o) : o_(o) {}
  int capacity() const override { return o_.parallel; }
  absl::StatusOr<std::string> Prepare(const std::vector<int>&) override { return ""; }
  absl::StatusOr<std::unique_ptr<TrialRun>> Start(int trial) override {
    const std::string dir = TrialDirectory(o_.out_dir, trial);
    const std::string spec = JoinPath(dir, "cluster.json");
    RETURN_IF_ERROR(
        WriteFileAtomically(Env::Default(), spec, LocalClusterSpecJson(o_.num_ps, o_.num_workers)));
    SpawnOptions so;
    so.argv = {o_.pstrain,         "launch",
               "--cluster_spec",   spec,
               "--config",         JoinPath(dir, "config.pbtxt"),
               "--progress=false", "--metrics=false",
               "--overwrite"};
    if (!o_.bin_dir.empty()) so.argv.push_back("--bin_dir=" + o_.bin_dir);
    so.output_file = JoinPath(dir, "launch.log");
    so.process_group = true;
    ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> launch, Subprocess::Spawn(so));
    return std::unique_ptr<TrialRun>(new LocalRun(std::move(launch), so.output_file));
  }
  std::string Describe() const override {
    return absl::StrCat(o_.parallel, " at once, ", o_.num_ps, " ps and ", o_.num_workers,
                        " worker(s) each");
  }

 private:
  const LocalTrialOptions o_;
};

// A word for a shell script, in single quotes.
std::string ShellWord(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

constexpr absl::Duration kSlurmCommandTimeout = absl::Seconds(60);
constexpr char kSlurmJobName[] = "pstrain-sweep";
// How often squeue is asked (the sweep's rounds are 100 ms).
constexpr absl::Duration kSlurmRefresh = absl::Seconds(1);
// A task gone from squeue may take this long to show its exit code on a
// shared file system.
constexpr absl::Duration kExitCodeGrace = absl::Seconds(10);

// A Slurm client tool (sbatch, squeue, scancel) found in PATH, as a shell
// would.
absl::StatusOr<std::string> SlurmTool(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = JoinPath(dir.empty() ? "." : std::string(dir), name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::FailedPreconditionError(
      absl::StrCat(name,
                   " is not in PATH: --slurm needs Slurm's client tools (sbatch, squeue, "
                   "scancel; Debian's slurm-client)"));
}

absl::StatusOr<std::string> Slurm(std::vector<std::string> argv) {
  ASSIGN_OR_RETURN(argv[0], SlurmTool(argv[0]));
  ASSIGN_OR_RETURN(CommandOutput r, RunToEnd(argv, kSlurmCommandTimeout));
  if (r.exit_code != 0) {
    return absl::UnavailableError(absl::StrCat(absl::StrJoin(argv, " "),
                                               r.timed_out ? ": no answer in 60 s" : ": failed",
                                               ": ", absl::StripAsciiWhitespace(r.output)));
  }
  return r.output;
}

// "ID_K STATE" lines of squeue for the array's tasks (active ones only
// unless `all`), by task.
absl::StatusOr<std::map<int, std::string>> ArrayStates(const std::string& job, bool all) {
  // Ended tasks by the array's name: with -t all, squeue -j <array> may
  // list none of them once the array's own record is one of its tasks'.
  std::vector<std::string> argv = {"squeue", "-h", "-r", "-o", "%i %T"};
  if (all) {
    argv.insert(argv.end(), {"-tall", "--name=" + std::string(kSlurmJobName)});
  } else {
    argv.insert(argv.end(), {"-j", job});
  }
  ASSIGN_OR_RETURN(std::string out, Slurm(argv));
  return ParseArrayStates(job, out);
}

class SlurmLauncher;

class SlurmRun : public TrialRun {
 public:
  SlurmRun(SlurmLauncher* launcher, int trial, std::string dir)
      : launcher_(launcher), trial_(trial), dir_(std::move(dir)) {}
  void Terminate() override;
  std::optional<int> Poll() override;
  int Kill(absl::Duration grace) override;
  std::optional<absl::Time> running_since() const override { return running_since_; }
  std::string Error(int code) const override;

 private:
  std::optional<int> ExitCode() const;
  SlurmLauncher* const launcher_;
  const int trial_;
  const std::string dir_;
  std::optional<absl::Time> running_since_;
  std::optional<absl::Time> gone_since_;  // no longer in squeue
  std::string end_state_;                 // Slurm's, once gone without an exit code
  bool terminated_ = false;
};

class SlurmLauncher : public TrialLauncher {
 public:
  explicit SlurmLauncher(const SlurmTrialOptions& o) : o_(o) {}
  int capacity() const override { return 1 << 20; }  // the array's own limit throttles
  absl::StatusOr<std::string> Prepare(const std::vector<int>& trials) override;
  absl::StatusOr<std::unique_ptr<TrialRun>> Start(int trial) override {
    return std::unique_ptr<TrialRun>(new SlurmRun(this, trial, TrialDirectory(o_.out_dir, trial)));
  }
  void Refresh() override {
    if (job_.empty() || absl::Now() < next_refresh_) return;
    next_refresh_ = absl::Now() + kSlurmRefresh;
    absl::StatusOr<std::map<int, std::string>> states = ArrayStates(job_, false);
    // squeue not answering says nothing of the tasks: keep the last states.
    if (!states.ok()) return;
    states_ = std::move(*states);
    answered_ = true;
  }
  std::string Describe() const override {
    return absl::StrCat(
        "a Slurm job array, ",
        o_.parallel > 0 ? absl::StrCat(o_.parallel, " at once") : "as many at once as Slurm places",
        ", ", o_.num_ps, " ps and ", o_.num_workers, " worker(s) each");
  }

  // The task's state in squeue; empty once it has left it; nullopt while
  // squeue has not answered yet.
  std::optional<std::string> State(int trial) const {
    if (!answered_) return std::nullopt;
    auto it = states_.find(trial);
    return it == states_.end() ? "" : it->second;
  }
  std::string TaskId(int trial) const { return absl::StrCat(job_, "_", trial); }
  // Slurm's last word on an ended task (COMPLETED, CANCELLED, TIMEOUT,
  // ...), while it still remembers it; empty if it does not.
  std::string EndState(int trial) const {
    absl::StatusOr<std::map<int, std::string>> states = ArrayStates(job_, true);
    if (!states.ok() || states->count(trial) == 0) return "";
    return states->at(trial);
  }

 private:
  std::string Script() const;
  const SlurmTrialOptions o_;
  std::string job_;
  std::map<int, std::string> states_;
  bool answered_ = false;  // squeue has answered once since the array was submitted
  absl::Time next_refresh_ = absl::InfinitePast();
};

// `s` for a comment line of a script: no line breaks or other controls.
std::string CommentText(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  return out;
}

std::string SlurmLauncher::Script() const {
  const int tasks = 1 + o_.num_ps + o_.num_workers;
  std::vector<std::string> launch = {
      "\"$bin\"",
      "launch",
      "--slurm",
      absl::StrCat("--ps=", o_.num_ps),
      absl::StrCat("--workers=", o_.num_workers),
      "--config=\"$dir/config.pbtxt\"",
      absl::StrCat("--base_port=$((", o_.base_port, " + k * ", tasks, "))"),
      "--auth_secret_file=\"$auth/cluster.secret\""};
  if (!o_.bin_dir.empty()) launch.push_back("--bin_dir=" + ShellWord(o_.bin_dir));
  return absl::StrCat(
      "#!/bin/bash\n"
      "# pstrain sweep ",
      CommentText(o_.sweep_file),
      ": task k of this job array runs trial k,\n"
      "# ",
      CommentText(o_.out_dir), "/trial-k/config.pbtxt, as a pstrain job of ", tasks,
      " tasks\n"
      "# (1 chief, ",
      o_.num_ps, " ps, ", o_.num_workers,
      " worker(s)); written by the sweep,\n"
      "# which submitted it with sbatch --array and follows its tasks.\n"
      "set -uo pipefail\n"
      "bin=",
      ShellWord(o_.pstrain), "\n",
      "k=$SLURM_ARRAY_TASK_ID\n"
      "dir=",
      ShellWord(o_.out_dir), "/trial-$k\n",
      "# A secret of this trial's own, removed when the task ends.\n"
      "auth=$dir/auth\n"
      "rm -rf \"$auth\" \"$dir/exit_code\"\n"
      "date +%s.%N > \"$dir/started\"\n"
      "trap 'rm -rf \"$auth\"' EXIT\n"
      "trap 'exit 143' TERM INT\n"
      "\"$bin\" tokens --out \"$auth\" >/dev/null || exit 1\n"
      "echo \"pstrain sweep: trial $k as Slurm job ${SLURM_JOB_ID:-?} on "
      "${SLURM_JOB_NODELIST:-?}\"\n"
      "srun --kill-on-bad-exit=1 --distribution=block ",
      absl::StrJoin(launch, " "), "\n",
      "rc=$?\n"
      "echo \"$rc\" > \"$dir/exit_code.tmp\" && mv \"$dir/exit_code.tmp\" \"$dir/exit_code\"\n"
      "exit \"$rc\"\n");
}

absl::StatusOr<std::string> SlurmLauncher::Prepare(const std::vector<int>& trials) {
  if (trials.empty()) return "";
  const int tasks = 1 + o_.num_ps + o_.num_workers;
  const int64_t top = o_.base_port + static_cast<int64_t>(trials.back() + 1) * tasks - 1;
  if (top > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--base_port ", o_.base_port, ": trial ", trials.back(), "'s ", tasks,
                     " tasks would listen past port 65535; a lower --base_port"));
  }
  Env* env = Env::Default();
  for (int trial : trials) {
    for (const char* name : {"exit_code", "started"}) {
      (void)env->DeleteFile(JoinPath(TrialDirectory(o_.out_dir, trial), name));
    }
  }
  const std::string script = JoinPath(o_.out_dir, "sweep.sbatch");
  RETURN_IF_ERROR(WriteFileAtomically(env, script, Script()));
  std::string array = absl::StrJoin(trials, ",");
  if (o_.parallel > 0) absl::StrAppend(&array, "%", o_.parallel);
  std::vector<std::string> argv = {"sbatch",
                                   "--parsable",
                                   absl::StrCat("--job-name=", kSlurmJobName),
                                   "--array=" + array,
                                   absl::StrCat("--ntasks=", tasks),
                                   "--output=" + JoinPath(o_.out_dir, "trial-%a/launch.log")};
  argv.insert(argv.end(), o_.sbatch_args.begin(), o_.sbatch_args.end());
  argv.push_back(script);
  ASSIGN_OR_RETURN(std::string out, Slurm(argv));
  // "<id>" or "<id>;<cluster>".
  const std::string id = std::string(absl::StripAsciiWhitespace(out.substr(0, out.find(';'))));
  int64_t number = 0;
  if (!absl::SimpleAtoi(id, &number)) {
    return absl::UnavailableError("sbatch --parsable printed no job id: " + out);
  }
  job_ = id;
  RETURN_IF_ERROR(WriteFileAtomically(env, JoinPath(o_.out_dir, "slurm_job"), job_ + "\n"));
  return absl::StrCat("submitted ", trials.size(), " trial(s) as Slurm job array ", job_, " (",
                      script, "; squeue -r -j ", job_, ")");
}

// The time a task's script wrote into `path` (Unix seconds), if it is one of
// the last year by this clock (an hour of skew allowed): anything else is not
// the script's.
std::optional<absl::Time> StartedAt(const std::string& path) {
  auto text = Env::Default()->ReadFile(path);
  double secs = 0;
  if (!text.ok() || !absl::SimpleAtod(absl::StripAsciiWhitespace(*text), &secs) ||
      !std::isfinite(secs)) {
    return std::nullopt;
  }
  const absl::Time at = absl::UnixEpoch() + absl::Seconds(secs);
  const absl::Time now = absl::Now();
  if (at < now - absl::Hours(24 * 365) || at > now + absl::Hours(1)) return std::nullopt;
  return at;
}

std::optional<int> SlurmRun::ExitCode() const {
  auto text = Env::Default()->ReadFile(JoinPath(dir_, "exit_code"));
  int code = 0;
  if (!text.ok() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &code)) {
    return std::nullopt;
  }
  return code;
}

void SlurmRun::Terminate() {
  if (terminated_) return;
  terminated_ = true;
  const std::string id = launcher_->TaskId(trial_);
  // A pending task is cancelled; a running one's srun step gets one
  // SIGTERM, not the batch script: every task of the step gets it, so its
  // servers stop at once and its chief cannot save first.
  std::vector<std::string> argv = {"scancel", "--quiet", id};
  if (running_since_.has_value()) argv.insert(argv.begin() + 1, "--signal=TERM");
  (void)Slurm(argv);
}

std::optional<int> SlurmRun::Poll() {
  const std::optional<std::string> known = launcher_->State(trial_);
  const std::string state = known.value_or("");
  if (!running_since_.has_value()) {
    // When its task began (it writes the time first), else when squeue
    // first showed it running.
    running_since_ = StartedAt(JoinPath(dir_, "started"));
    if (!running_since_.has_value() && !state.empty() && state != "PENDING") {
      running_since_ = absl::Now();
    }
  }
  if (std::optional<int> code = ExitCode(); code.has_value()) return code;
  if (!known.has_value()) return std::nullopt;  // squeue has said nothing yet
  if (!state.empty()) {
    gone_since_.reset();  // (listed again after a squeue that missed it)
    end_state_.clear();
    return std::nullopt;
  }
  if (!gone_since_.has_value()) {
    // Slurm forgets an ended task soon (MinJobAge): ask at once.
    gone_since_ = absl::Now();
    end_state_ = launcher_->EndState(trial_);
  }
  // A task that ended by itself wrote its exit code; one Slurm ended
  // (CANCELLED, TIMEOUT, NODE_FAIL, ...) may not have.
  const bool by_itself = end_state_.empty() || end_state_ == "COMPLETED" || end_state_ == "FAILED";
  if (by_itself && absl::Now() - *gone_since_ < kExitCodeGrace) return std::nullopt;
  return 1;
}

int SlurmRun::Kill(absl::Duration grace) {
  Terminate();
  const absl::Time end = absl::Now() + grace;
  for (;;) {
    launcher_->Refresh();
    if (std::optional<int> code = Poll(); code.has_value()) return *code;
    if (absl::Now() >= end) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  // Slurm's own end: SIGTERM to every process of the task, SIGKILL after
  // its KillWait.
  (void)Slurm({"scancel", "--quiet", launcher_->TaskId(trial_)});
  return 137;
}

std::string SlurmRun::Error(int code) const {
  const std::string log = JoinPath(dir_, "launch.log");
  if (ExitCode().has_value()) return LaunchError(log, code);
  // Ended before srun returned: by Slurm, or its script failed first
  // (FAILED: what its output says).
  if (end_state_ == "FAILED") {
    return absl::StrCat("Slurm job ", launcher_->TaskId(trial_), " FAILED: ",
                        LaunchError(log, code));
  }
  return absl::StrCat("Slurm job ", launcher_->TaskId(trial_), " ended",
                      end_state_.empty() ? "" : " " + end_state_,
                      " without its exit code (scancel, its time limit or its node ended it)");
}

}  // namespace

std::unique_ptr<TrialLauncher> LocalTrials(const LocalTrialOptions& options) {
  return std::make_unique<LocalLauncher>(options);
}

std::unique_ptr<TrialLauncher> SlurmTrials(const SlurmTrialOptions& options) {
  return std::make_unique<SlurmLauncher>(options);
}

absl::StatusOr<std::string> LiveSlurmArray(const std::string& out_dir) {
  auto text = Env::Default()->ReadFile(JoinPath(out_dir, "slurm_job"));
  if (!text.ok()) return std::string();
  const std::string job(absl::StripAsciiWhitespace(*text));
  absl::StatusOr<std::map<int, std::string>> states = ArrayStates(job, false);
  if (!states.ok()) {
    // squeue -j of a job Slurm has forgotten fails with "Invalid job id".
    if (absl::StrContains(states.status().message(), "Invalid job id")) return std::string();
    return absl::UnavailableError(absl::StrCat("cannot ask Slurm whether job array ", job,
                                               " (", out_dir, "/slurm_job) still runs: ",
                                               states.status().message()));
  }
  return states->empty() ? std::string() : job;
}

}  // namespace pstrain
