#include "tools/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/security/auth.h"
#include "common/client/chief_client.h"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/config.h"
#include "common/base/status_macros.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"
#include "common/rpc/rpc.h"
#include "tools/subprocess.h"
#include "common/security/tls.h"
#include "nlohmann/json.hpp"
#include "tools/operator.h"
#include "tools/run_report.h"

namespace pstrain {
namespace {

struct Task {
  TaskId id;
  std::string name;  // "ps:0"
  std::unique_ptr<Subprocess> proc;
  std::ofstream log;
  std::string log_path;
  std::string partial;  // an output line not yet ended
  std::string host;     // from the spec
  MetricsTargets* metrics_targets = nullptr;  // told where it serves /metrics
  bool exited = false;
  // A worker restarted alone: how often, and when its next start is due
  // (InfiniteFuture: none pending).
  int restarts = 0;
  absl::Time restart_at = absl::InfiniteFuture();
  int exit_code = 0;
};

std::string SelfDir() {
  const std::string self = SelfPath();
  return self.empty() ? "." : Dirname(self);
}

bool IsWarningOrError(const std::string& line) {
  // Daemon lines read "<date> <time> <task> <L> message"; L is W, E or C.
  return line.find(" W ") != std::string::npos || line.find(" E ") != std::string::npos ||
         line.find(" C ") != std::string::npos;
}

void EmitLine(Task* t, const std::string& line, bool verbose, bool* progress_shown) {
  t->log << line << "\n";
  t->log.flush();
  // "... metrics on http(s)://host:port/metrics": where this task serves them.
  if (const size_t at = line.find(" metrics on http"); at != std::string::npos) {
    if (*progress_shown) {
      std::cerr << "\r\033[K";
      *progress_shown = false;
    }
    const std::string url = line.substr(at + 12);
    std::cerr << "pstrain launch: metrics: " << t->name << " " << url << "\n";
    if (t->metrics_targets != nullptr) {
      if (absl::Status st = t->metrics_targets->Set(t->name, url); !st.ok()) {
        std::cerr << "pstrain launch: " << t->metrics_targets->path() << ": " << st.message()
                  << "\n";
      }
    }
  }
  // Lines not in the log format (usage errors before logging starts), warnings
  // and errors, and the chief's few lines (evaluations) are echoed.
  const bool log_format = !line.empty() && line[0] >= '0' && line[0] <= '9';
  if (verbose || !log_format || IsWarningOrError(line) || t->id.job == kChiefJob) {
    if (*progress_shown) {
      std::cerr << "\r\033[K";
      *progress_shown = false;
    }
    std::cerr << "[" << t->name << "] " << line << "\n";
  }
}

void DrainOutput(Task* t, bool verbose, bool* progress_shown) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(t->proc->output_fd(), buf, sizeof(buf));
    if (n <= 0) {
      if (n == 0) {  // EOF: the child closed its output
        if (!t->partial.empty()) EmitLine(t, t->partial, verbose, progress_shown);
        t->partial.clear();
        t->proc->CloseOutput();
      }
      return;
    }
    t->partial.append(buf, n);
    size_t pos;
    while ((pos = t->partial.find('\n')) != std::string::npos) {
      EmitLine(t, t->partial.substr(0, pos), verbose, progress_shown);
      t->partial.erase(0, pos + 1);
    }
    if (n < static_cast<ssize_t>(sizeof(buf))) return;
  }
}

std::string FormatProgress(const ChiefStatusResponse& s, absl::Duration elapsed) {
  std::string line = "step " + StepText(s.global_step(), s.max_steps());
  if (s.train_loss() > 0) absl::StrAppendFormat(&line, "  loss %.4f", s.train_loss());
  if (s.eval_step() >= 0 && s.eval_metrics_size() > 0) {
    // A worker's evaluation: its first metric, by name.
    absl::StrAppendFormat(&line, "  eval %s %.4f@%d", s.eval_metrics(0).name(),
                          s.eval_metrics(0).value(), s.eval_step());
  } else if (s.eval_step() >= 0) {
    absl::StrAppendFormat(&line, "  eval acc %.4f@%d", s.eval_accuracy(), s.eval_step());
  }
  if (s.examples_per_sec() > 0) absl::StrAppendFormat(&line, "  %.0f ex/s", s.examples_per_sec());
  if (s.global_step() > 0 && s.max_steps() > s.global_step() && !RunsUntilStopped(s.max_steps())) {
    const double secs = absl::ToDoubleSeconds(elapsed);
    const double eta = secs / s.global_step() * (s.max_steps() - s.global_step());
    absl::StrAppendFormat(&line, "  ETA %.0fs", eta);
  }
  absl::StrAppendFormat(&line, "  [%s, %d worker(s) registered]", s.state(),
                        s.workers_registered());
  return line;
}

// One start of every local task, supervised to the end: what happened.
struct Attempt {
  std::string failure;  // empty when the run ended normally
  int exit_code = 0;
  bool restartable = false;  // a task failed (not a stop signal or a hang)
  bool chief_finished = false;
};

// The wait before restart n (from 0): 1, 2, 4, ... 30 s.
absl::Duration RestartBackoff(int n) {
  return std::min(absl::Seconds(30), absl::Seconds(1) * (int64_t{1} << std::min(n, 5)));
}

// One start of every local task, supervised to the end: tasks started with
// their output captured, failed ones restarted alone where the job can take
// them back, progress shown, and every task stopped at the end. Lives on the
// launcher's thread.
class Supervisor {
 public:
  Supervisor(const LaunchOptions& options, const ClusterSpec& cluster,
             const std::map<std::string, std::string>& bin_for_job, const std::string& log_dir,
             bool append_logs, int* restarts, StopSignal* stop)
      : options_(options),
        cluster_(cluster),
        bin_for_job_(bin_for_job),
        log_dir_(log_dir),
        append_logs_(append_logs),
        restarts_(restarts),
        stop_(stop),
        tty_(::isatty(STDERR_FILENO)),
        chief_(cluster.address(kChiefJob, 0), absl::Milliseconds(300)) {}

  Attempt Run();

 private:
  absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(const TaskId& id, const std::string& host,
                                                    bool restarted_alone);
  std::string WorkerTfConfig(int index) const;
  // Starts every task of this machine; a failure (in `failed`) stops those started.
  bool StartAll(Attempt* failed);
  void RestartDue();
  void WaitForOutput();
  void ReapExited();
  // Whether the task that exited with `code` is restarted by itself.
  bool RestartAlone(Task* t, int code);
  void JudgeEarlyExits();
  // Whether the run is over (all exited, or the others' grace period after
  // the chief's end has passed: then failed).
  bool Over();
  void ShowProgress();
  void StopAll();
  Attempt Result();

  const LaunchOptions& options_;
  const ClusterSpec& cluster_;
  const std::map<std::string, std::string>& bin_for_job_;
  const std::string log_dir_;
  const bool append_logs_;
  int* const restarts_;  // spent of options.max_restarts, over every attempt
  StopSignal* const stop_;
  const bool tty_;
  GrpcChiefClient chief_;
  std::vector<std::unique_ptr<Task>> tasks_;
  absl::Time start_;
  absl::Time next_progress_;
  absl::Time last_plain_progress_;
  bool progress_shown_ = false;
  int exit_code_ = 0;
  std::string failure_;
  bool restartable_ = false;
  bool chief_finished_ = false;
  absl::Time chief_finished_at_;
  // Servers that exited 0, and by when the chief must be ending.
  std::vector<std::pair<const Task*, absl::Time>> early_exits_;
};

// Starts task `id` (on `host`, from the spec) with its output captured.
// A chief restarted alone takes the running job over from its latest
// checkpoint (--resume).
absl::StatusOr<std::unique_ptr<Subprocess>> Supervisor::Spawn(const TaskId& id,
                                                              const std::string& host,
                                                              bool restarted_alone) {
  SpawnOptions so;
  const bool user_worker = id.job == kWorkerJob && !options_.worker_cmd.empty();
  so.argv = {user_worker ? std::string("/bin/sh") : bin_for_job_.at(id.job), "--cluster_spec=" + options_.cluster_spec,
             "--job=" + id.job, absl::StrCat("--task=", id.index),
             "--config=" + options_.config};
  so.argv.insert(so.argv.end(), options_.task_flags.begin(), options_.task_flags.end());
  if ((options_.resume || restarted_alone) && id.job == kChiefJob) so.argv.push_back("--resume");
  if (id.job == kPsJob || id.job == kChiefJob) {
    so.argv.insert(so.argv.end(), options_.server_flags.begin(), options_.server_flags.end());
  }
  if (id.job == kPsJob) {
    so.argv.insert(so.argv.end(), options_.ps_flags.begin(), options_.ps_flags.end());
  }
  if (!options_.init_from.empty() && id.job == kChiefJob) {
    so.argv.push_back("--init_from=" + options_.init_from);
  }
  if (options_.metrics && cluster_.metrics_address(id.job, id.index).empty()) {
    // (A task the spec gives a metrics address serves it there.)
    // The task's own address where it is an IPv4 one (127.0.0.1, or
    // 0.0.0.0 in a container); else loopback.
    in_addr ignored;
    const bool ipv4 = ::inet_pton(AF_INET, host.c_str(), &ignored) == 1;
    so.argv.push_back(absl::StrCat("--metrics_address=", ipv4 ? host : "127.0.0.1", ":0"));
  }
  so.capture_output = true;
  if (user_worker) {
    // The user's command, told what the worker binary would be told.
    so.extra_env.push_back(absl::StrCat(
        "PSTRAIN_WORKER_ARGS=",
        absl::StrJoin(std::vector<std::string>(so.argv.begin() + 1, so.argv.end()), "\n")));
    so.extra_env.push_back(absl::StrCat("TF_CONFIG=", WorkerTfConfig(id.index)));
    // Its output goes through a pipe: Python would hold its prints in a
    // buffer, out of the log until it exits (or lost if it is killed).
    so.extra_env.push_back("PYTHONUNBUFFERED=1");
    so.argv = {"/bin/sh", "-c", options_.worker_cmd};
  }
  // A group of its own: a terminal's Ctrl-C reaches the launcher alone,
  // which stops the tasks in order (the chief first, to save); and a stop
  // or restart of a shell command reaches what it started, not it alone.
  so.process_group = true;
  return Subprocess::Spawn(so);
}

// TensorFlow's TF_CONFIG for worker `index`: the spec's cluster and the task.
std::string Supervisor::WorkerTfConfig(int index) const {
  nlohmann::json cluster = nlohmann::json::object();
  for (const TaskId& id : cluster_.AllTasks()) {
    cluster[id.job].push_back(cluster_.address(id.job, id.index));
  }
  nlohmann::json tf = {{"cluster", cluster}, {"task", {{"type", kWorkerJob}, {"index", index}}}};
  return tf.dump();
}

// Each local task serves /metrics where the spec's "pstrain" extras say,
// or else on a port it picks itself (port 0: no race with other processes
// for a port chosen here); its log line saying where is echoed as
// "pstrain launch: metrics: <task> <url>".
bool Supervisor::StartAll(Attempt* failed) {
  for (const TaskId& id : cluster_.AllTasks()) {
    const std::string& address = cluster_.address(id.job, id.index);
    auto hp = ParseHostPort(address);
    if (!hp.ok() || !IsThisMachine(hp->host)) {
      std::cerr << "pstrain launch: " << id.ToString() << " is on " << address
                << ", not this machine; start it there\n";
      continue;
    }
    auto t = std::make_unique<Task>();
    t->id = id;
    t->name = id.ToString();
    t->log_path = JoinPath(log_dir_, absl::StrCat(id.job, "-", id.index, ".log"));
    t->log.open(t->log_path, append_logs_ ? std::ios::app : std::ios::trunc);
    t->host = hp->host;
    t->metrics_targets = options_.metrics_targets;
    auto proc = Spawn(id, t->host, /*restarted_alone=*/false);
    if (!proc.ok()) {
      for (auto& other : tasks_) other->proc->Stop(absl::Seconds(5));
      failed->failure = absl::StrCat("starting ", t->name, ": ", proc.status().message());
      failed->exit_code = 1;
      return false;
    }
    t->proc = std::move(*proc);
    tasks_.push_back(std::move(t));
  }
  std::cerr << "pstrain launch: started " << tasks_.size() << " task(s); logs in " << log_dir_
            << "\n";
  return true;
}

// Tasks due for a restart alone.
void Supervisor::RestartDue() {
  for (auto& t : tasks_) {
    if (t->restart_at > absl::Now()) continue;
    t->restart_at = absl::InfiniteFuture();
    auto proc = Spawn(t->id, t->host, /*restarted_alone=*/true);
    if (!proc.ok()) {
      failure_ = absl::StrCat("restarting ", t->name, ": ", proc.status().message());
      exit_code_ = 1;
      return;
    }
    t->proc = std::move(*proc);
    t->exited = false;
    t->exit_code = 0;
  }
}

// Waits for output or a child's exit, at most until the next progress tick.
void Supervisor::WaitForOutput() {
  std::vector<pollfd> fds;
  std::vector<std::pair<Task*, bool>> owners;  // (task, is_output)
  for (auto& t : tasks_) {
    if (t->exited) continue;
    if (t->proc->output_fd() >= 0) {
      fds.push_back({t->proc->output_fd(), POLLIN, 0});
      owners.push_back({t.get(), true});
    } else if (t->proc->pidfd() >= 0) {
      fds.push_back({t->proc->pidfd(), POLLIN, 0});
      owners.push_back({t.get(), false});
    }
  }
  const int wait_ms = static_cast<int>(
      std::max<int64_t>(0, absl::ToInt64Milliseconds(next_progress_ - absl::Now())));
  ::poll(fds.data(), fds.size(), std::min(wait_ms, 250));
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    Task* t = owners[i].first;
    if (owners[i].second) DrainOutput(t, options_.verbose, &progress_shown_);
  }
}

// A failed worker is restarted by itself: the others go on (in sync
// mode they wait for it), and it rejoins where the servers say its
// data stood. A failed parameter server likewise: the chief sees it
// come back empty and rolls every server back to the latest
// checkpoint, and the workers follow. Not while a server's early exit
// is pending judgement (the failure is likely the server's: the job
// restarts instead). A chief that died (killed, or crashed: ended by
// a signal) likewise: the restarted one takes the job over from the
// latest checkpoint while the servers and workers wait for it. One
// that failed the run with an error of its own, or was stopped (its
// workers were told to stop too), or that died once a worker had
// finished (no worker would come back to its rollback), restarts the
// job. A task failing again waits 1, 2, 4 ... 30 s first.
bool Supervisor::RestartAlone(Task* t, int code) {
  bool worker_finished = false;
  for (const auto& other : tasks_) {
    worker_finished |= other->id.job == kWorkerJob && other->exited && other->exit_code == 0;
  }
  const bool alone = t->id.job == kWorkerJob || t->id.job == kPsJob ||
                     (t->id.job == kChiefJob && t->proc->killed_by_signal() && !worker_finished);
  if (code == 0 || !failure_.empty() || !alone || *restarts_ >= options_.max_restarts ||
      chief_finished_ || !early_exits_.empty() || stop_->stopped()) {
    return false;
  }
  ++*restarts_;
  const absl::Duration backoff =
      t->restarts == 0 ? absl::ZeroDuration() : RestartBackoff(t->restarts - 1);
  ++t->restarts;
  t->restart_at = absl::Now() + backoff;
  std::cerr << "pstrain launch: " << t->name << " exited with code " << code
            << " (log: " << t->log_path << "); restarting it alone"
            << (backoff > absl::ZeroDuration()
                    ? absl::StrCat(" in ", absl::FormatDuration(backoff))
                    : std::string())
            << (t->id.job == kChiefJob ? ", the others wait for it to take the job over"
                                       : ", the others go on")
            << (t->id.job == kWorkerJob ? "" : " from the latest checkpoint") << " (restart "
            << *restarts_ << " of " << options_.max_restarts << ")\n";
  return true;
}

// Reaps exited tasks (output closed means the process is exiting).
void Supervisor::ReapExited() {
  for (auto& t : tasks_) {
    if (t->exited) continue;
    std::optional<int> code = t->proc->Wait(absl::ZeroDuration());
    if (!code.has_value()) continue;
    if (t->proc->output_fd() >= 0) DrainOutput(t.get(), options_.verbose, &progress_shown_);
    t->exited = true;
    t->exit_code = *code;
    if (RestartAlone(t.get(), *code)) continue;
    if (*code != 0 && failure_.empty()) {
      failure_ = absl::StrCat(t->name, " exited with code ", *code, " (log: ", t->log_path, ")");
      exit_code_ = 1;
      restartable_ = true;
    }
    if (t->id.job == kChiefJob && *code == 0) {
      chief_finished_ = true;
      chief_finished_at_ = absl::Now();
    } else if (*code == 0 && t->id.job == kPsJob && !chief_finished_) {
      // A server leaves with code 0 only when the chief, ending the run,
      // tells it to: it has a few seconds to say so. (Workers leave with
      // 0 when the servers reach max_steps, possibly while the chief is
      // still writing a checkpoint: that is a normal end.)
      early_exits_.push_back({t.get(), absl::Now() + absl::Seconds(5)});
    }
  }
}

// A server that left while the chief still trains fails the run.
void Supervisor::JudgeEarlyExits() {
  if (early_exits_.empty() || !failure_.empty()) return;
  ChiefStatusResponse s;
  // Also a chief that failed or was stopped: its own exit tells why.
  const bool ending =
      chief_finished_ || (chief_.GetStatus(&s).ok() && s.state() != "starting" &&
                          s.state() != "taking over" && s.state() != "training");
  if (ending) {
    early_exits_.clear();
  } else if (absl::Now() >= early_exits_.front().second) {
    const Task* t = early_exits_.front().first;
    failure_ = absl::StrCat(t->name, " exited with code 0 before the chief finished the run",
                            s.max_steps() > 0
                                ? absl::StrCat(" (step ", StepText(s.global_step(), s.max_steps()),
                                               ")")
                                : "",
                            "; log: ", t->log_path);
    exit_code_ = 1;
    restartable_ = true;
  }
}

bool Supervisor::Over() {
  bool all_exited = true;
  for (auto& t : tasks_) all_exited &= t->exited && t->restart_at == absl::InfiniteFuture();
  if (all_exited) return true;
  // After the chief finishes, the others get a grace period to exit.
  if (chief_finished_ && absl::Now() - chief_finished_at_ > absl::Seconds(20)) {
    failure_ = "tasks still running 20 s after the chief finished";
    exit_code_ = 1;
    return true;
  }
  return false;
}

void Supervisor::ShowProgress() {
  if (!options_.progress || chief_finished_) return;
  ChiefStatusResponse s;
  if (!chief_.GetStatus(&s).ok()) return;
  std::string line = FormatProgress(s, absl::Now() - start_);
  if (tty_) {
    std::cerr << "\r\033[K" << line << std::flush;
    progress_shown_ = true;
  } else if (absl::Now() - last_plain_progress_ >= absl::Seconds(5)) {
    std::cerr << "progress: " << line << "\n";
    last_plain_progress_ = absl::Now();
  }
}

// Stops whatever is still running: SIGTERM to all, one shared 5 s grace
// period, then SIGKILL for any task still there. Stopped by a signal with a
// save on stop, the chief first, alone: it saves the steps since its last
// checkpoint while the others train on, and tells the workers to stop.
void Supervisor::StopAll() {
  if (stop_->stopped() && options_.stop_save > absl::ZeroDuration()) {
    for (auto& t : tasks_) {
      if (t->exited || t->id.job != kChiefJob) continue;
      t->proc->Signal(SIGTERM);
      std::cerr << "pstrain launch: " << stop_->reason() << "; the chief saves the steps since "
                << "its last checkpoint first (at most "
                << absl::FormatDuration(options_.stop_save) << ")\n";
      // Every task's output read meanwhile: a full pipe would block a
      // task, the chief's own last lines among them.
      const absl::Time end = absl::Now() + options_.stop_save + absl::Seconds(10);
      std::optional<int> code;
      while (!(code = t->proc->Wait(absl::ZeroDuration())).has_value() && absl::Now() < end) {
        if (stop_->times() > 1) {
          std::cerr << "pstrain launch: signalled again; stopping every task now\n";
          break;
        }
        next_progress_ = absl::Now() + absl::Milliseconds(250);
        WaitForOutput();
        // A task that exited (a worker the chief told to stop) is reaped
        // below; its pidfd stays readable, so the poll above may not wait.
        absl::SleepFor(absl::Milliseconds(50));
      }
      if (!code.has_value()) continue;  // stopped with the others below
      t->exit_code = *code;
      if (t->proc->output_fd() >= 0) DrainOutput(t.get(), options_.verbose, &progress_shown_);
      t->exited = true;
    }
  }
  for (auto& t : tasks_) {
    if (!t->exited) t->proc->Signal(SIGTERM);
  }
  const absl::Time grace_end = absl::Now() + absl::Seconds(5);
  for (auto& t : tasks_) {
    if (t->exited) continue;
    std::optional<int> code =
        t->proc->Wait(std::max(grace_end - absl::Now(), absl::ZeroDuration()));
    t->exit_code = code.has_value() ? *code : t->proc->Stop(absl::ZeroDuration());
    if (t->proc->output_fd() >= 0) DrainOutput(t.get(), options_.verbose, &progress_shown_);
    t->exited = true;
    // A server's code 0 here is not our SIGTERM's (128 + 15): it had left
    // on its own (workers leave with 0 when the stopping chief tells them).
    if (code == 0 && t->id.job == kPsJob && !chief_finished_) {
      early_exits_.push_back({t.get(), absl::Now()});
    }
  }
}

Attempt Supervisor::Result() {
  // A task that left early is often the cause of the failure seen first (a
  // worker whose server went away): name it too.
  for (const auto& [t, ignored] : early_exits_) {
    if (!failure_.empty() && failure_.rfind(t->name + " ", 0) != 0) {
      absl::StrAppend(&failure_, "; ", t->name, " had exited with code 0 before the chief "
                      "finished the run (log: ", t->log_path, ")");
    }
  }
  Attempt a;
  a.failure = failure_;
  a.exit_code = exit_code_;
  // A task failing after the chief finished (while the others shut down)
  // fails the run, but training was done: nothing to restart.
  a.restartable = restartable_ && !chief_finished_ && !stop_->stopped();
  a.chief_finished = chief_finished_;
  if (failure_.empty()) {
    for (auto& t : tasks_) {
      if (t->exit_code != 0 && t->id.job != kChiefJob) {
        std::cerr << "pstrain launch: " << t->name << " ended with code " << t->exit_code << "\n";
      }
    }
  }
  return a;
}

Attempt Supervisor::Run() {
  Attempt failed;
  if (!StartAll(&failed)) return failed;
  start_ = absl::Now();
  next_progress_ = start_ + absl::Seconds(1);
  last_plain_progress_ = start_;
  for (;;) {
    if (stop_->stopped()) {
      failure_ = stop_->reason();
      exit_code_ = stop_->exit_code() != 0 ? stop_->exit_code() : 130;
      break;
    }
    RestartDue();
    if (!failure_.empty()) break;
    WaitForOutput();
    ReapExited();
    JudgeEarlyExits();
    if (!failure_.empty() || Over()) break;
    if (absl::Now() < next_progress_) continue;
    next_progress_ = absl::Now() + absl::Milliseconds(500);
    ShowProgress();
  }
  if (progress_shown_) std::cerr << "\n";
  StopAll();
  return Result();
}

// `restarts` counts the restarts spent (of options.max_restarts); a worker
// that fails is restarted by itself from that budget while the others go on.
Attempt RunOnce(const LaunchOptions& options, const ClusterSpec& cluster,
                const std::map<std::string, std::string>& bin_for_job, const std::string& log_dir,
                bool append_logs, int* restarts, StopSignal* stop) {
  Supervisor supervisor(options, cluster, bin_for_job, log_dir, append_logs, restarts, stop);
  return supervisor.Run();
}

}  // namespace

absl::Status CheckEarlierRun(const LaunchOptions& options, const std::string& output_dir,
                             const std::string& checkpoint_dir) {
  Env* env = Env::Default();
  const std::string summary = JoinPath(output_dir, "summary.json");
  const std::string model = JoinPath(output_dir, "model_final.pst");
  const std::string events = JoinPath(output_dir, "events");
  std::vector<std::string> event_files;
  if (env->IsDirectory(events)) {
    absl::StatusOr<std::vector<std::string>> listed = env->ListDir(events);
    if (listed.ok()) event_files = *listed;
  }
  std::string found;
  if (env->FileExists(summary)) {
    found = "summary.json";
  } else if (env->FileExists(model)) {
    found = "model_final.pst";
  } else if (!event_files.empty()) {
    found = "events/";
  }
  if (found.empty() || options.resume) return absl::OkStatus();
  std::vector<CheckpointInfo> checkpoints;
  if (!checkpoint_dir.empty() && env->IsDirectory(checkpoint_dir)) {
    checkpoints = ListCheckpoints(env, checkpoint_dir).value_or(std::vector<CheckpointInfo>());
  }
  if (!options.overwrite) {
    return absl::FailedPreconditionError(absl::StrCat(
        "output_dir ", output_dir, " holds an earlier run (its ", found, "): pass ",
        checkpoints.empty() ? "" : "--resume to go on from its latest checkpoint, ",
        "--overwrite to start afresh over it, or give this run another output_dir"));
  }
  // --init_from may name one of the checkpoints about to be set aside.
  if (!options.init_from.empty() && !checkpoints.empty() &&
      !RealPath(checkpoint_dir).empty() &&
      RealPath(Dirname(options.init_from)) == RealPath(checkpoint_dir)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--init_from=", options.init_from, " is a checkpoint of the earlier run, which "
        "--overwrite would set aside: copy it out of ", checkpoint_dir,
        " first, or give this run another output_dir and checkpoint.dir"));
  }
  for (const std::string& f : {summary, model}) {
    if (env->FileExists(f)) RETURN_IF_ERROR(env->DeleteFile(f));
  }
  for (const std::string& f : event_files) {
    const std::string path = JoinPath(events, f);
    RETURN_IF_ERROR(env->IsDirectory(path) ? DeleteRecursively(env, path) : env->DeleteFile(path));
  }
  // The earlier run's checkpoints are set aside (renamed ckpt-<n>.rolled-back,
  // kept), so that a restart of the new run never takes one of them.
  std::vector<std::string> moved;
  if (!checkpoints.empty()) {
    RETURN_IF_ERROR(SetAsideCheckpointsAfter(env, checkpoint_dir, -1, &moved));
  }
  std::cerr << "pstrain launch: --overwrite: removed the earlier run's summary, final model and "
               "events from "
            << output_dir
            << (moved.empty() ? std::string()
                              : absl::StrCat("; set its ", moved.size(), " checkpoint(s) aside as ",
                                             checkpoint_dir, "/ckpt-<n>.rolled-back"))
            << "\n";
  return absl::OkStatus();
}

std::string FindBinary(const std::string& bin_dir, const std::string& package,
                       const std::string& name) {
  std::vector<std::string> candidates;
  if (!bin_dir.empty()) {
    candidates = {JoinPath(bin_dir, name), JoinPath(JoinPath(bin_dir, package), name)};
  } else {
    const std::string self = SelfDir();
    candidates = {JoinPath(self, name), JoinPath(JoinPath(self, "../" + package), name)};
  }
  for (const std::string& c : candidates) {
    // A package directory shares the binary's name (runfiles/chief/chief).
    struct stat st;
    if (::stat(c.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(c.c_str(), X_OK) == 0) {
      return c;
    }
  }
  return "";
}


namespace {

// Whether `a` and `b` name one existing file.
bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return !a.empty() && !b.empty() && ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 &&
         sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

absl::StatusOr<std::string> MakeRunSecret(const LaunchOptions& options,
                                          const ClusterSpec& cluster,
                                          const std::string& output_dir) {
  const std::string dir = RealPath(output_dir);
  if (dir.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("output_dir ", output_dir, ": ", std::strerror(errno)));
  }
  const std::string path = JoinPath(dir, kRunSecretFile);
  // Each launch its own: the earlier run's tasks are gone (the launch
  // lock). A secret the user named, whatever its name, is never removed.
  const bool named = SameFile(path, options.secret_file) ||
                     SameFile(path, cluster.auth_secret_file());
  if (!named && ::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot replace ", path, ": ", std::strerror(errno)));
  }
  if (!options.secret_file.empty()) {
    const std::string real = RealPath(options.secret_file);
    if (!real.empty()) return real;
    return options.secret_file[0] == '/' ? options.secret_file
                                         : JoinPath(RealPath("."), options.secret_file);
  }
  if (options.insecure || cluster.insecure() || !cluster.auth_secret_file().empty() ||
      !cluster.tls_dir().empty() || !cluster.AllLoopback()) {
    return std::string();  // the spec's own, or none (ResolveAuth's rules)
  }
  RETURN_IF_ERROR(CreateSecretFile(path));
  return path;
}

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n <= 0 ? std::string() : std::string(buf, static_cast<size_t>(n));
}

int Launch(const LaunchOptions& options, StopSignal* stop) {
  auto cluster = ClusterSpec::FromFile(options.cluster_spec);
  if (!cluster.ok()) {
    std::cerr << "pstrain launch: " << cluster.status().message() << "\n";
    return 2;
  }
  auto config = LoadTrainingConfig(options.config);
  if (!config.ok()) {
    std::cerr << "pstrain launch: " << config.status().message() << "\n";
    return 2;
  }
  const std::string log_dir =
      options.log_dir.empty() ? JoinPath(config->output_dir(), "logs") : options.log_dir;
  if (absl::Status st = Env::Default()->CreateDirs(log_dir); !st.ok()) {
    std::cerr << "pstrain launch: " << st.message() << "\n";
    return 2;
  }
  // One launch per output_dir: a second would overwrite the first's logs,
  // checkpoints and model. The lock goes with this process, however it ends.
  const std::string lock_path = JoinPath(config->output_dir(), ".pstrain-launch.lock");
  if (absl::Status st = Env::Default()->CreateDirs(config->output_dir()); !st.ok()) {
    std::cerr << "pstrain launch: output_dir: " << st.message() << "\n";
    return 2;
  }
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) {
    std::cerr << "pstrain launch: cannot create " << lock_path << ": " << std::strerror(errno)
              << "\n";
    return 2;
  }
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    std::string holder = Env::Default()->ReadFile(lock_path).value_or("");
    while (!holder.empty() && holder.back() == '\n') holder.pop_back();
    std::cerr << "pstrain launch: output_dir " << config->output_dir()
              << " is in use by another launch"
              << (holder.empty() ? "" : absl::StrCat(" (pid ", holder, ")"))
              << "; give this run its own output_dir\n";
    return 2;
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(lock_fd, 0) != 0 || ::write(lock_fd, pid.data(), pid.size()) < 0) {
    std::cerr << "pstrain launch: cannot write " << lock_path << "\n";
  }
  const std::pair<const char*, const char*> binaries[] = {
      {kChiefJob, "chief"}, {kPsJob, "ps_server"}, {kWorkerJob, "worker"}};
  std::map<std::string, std::string> bin_for_job;
  for (const auto& [job, name] : binaries) {
    if (job == std::string(kWorkerJob) && !options.worker_cmd.empty()) continue;
    std::string path = FindBinary(options.bin_dir, job == std::string(kPsJob) ? "ps_server" : job,
                                  name);
    if (path.empty()) {
      std::cerr << "pstrain launch: cannot find the " << name
                << " binary next to pstrain or in --bin_dir (build it with bazel build //...)\n";
      return 2;
    }
    bin_for_job[job] = path;
  }

  if (config->model().has_external() && options.worker_cmd.empty()) {
    std::cerr << "pstrain launch: model.external is computed by the user's own workers: give "
                 "their command with --worker_cmd (e.g. --worker_cmd \"python3 train.py\", "
                 "docs/pytorch.md)\n";
    return 2;
  }
  if (options.max_restarts > 0 && config->checkpoint().dir().empty()) {
    std::cerr << "pstrain launch: --restart=on-failure restarts the job from its latest "
                 "checkpoint: set checkpoint.dir in the config\n";
    return 2;
  }
  // Last of the checks, as it may remove the earlier run's outputs.
  if (absl::Status st =
          CheckEarlierRun(options, config->output_dir(), config->checkpoint().dir());
      !st.ok()) {
    std::cerr << "pstrain launch: " << st.message() << "\n";
    return 2;
  }
  LaunchOptions run = options;
  run.stop_save = StopSaveTimeout(*config);
  absl::StatusOr<std::string> secret = MakeRunSecret(options, *cluster, config->output_dir());
  if (!secret.ok()) {
    std::cerr << "pstrain launch: the run's secret: " << secret.status().message() << "\n";
    return 2;
  }
  if (!secret->empty()) run.task_flags.push_back("--auth_secret_file=" + *secret);
  if (!secret->empty() && options.secret_file.empty()) {
    std::cerr << "pstrain launch: calls are signed with a secret made for this run, " << *secret
              << " (pstrain checkpoint restore takes --auth_secret_file=" << *secret << ")\n";
  }
  if (options.insecure) run.task_flags.push_back("--insecure");
  // The tasks' metrics addresses for Prometheus' file_sd, across restarts.
  MetricsTargets metrics_targets(JoinPath(config->output_dir(), "metrics_targets.json"));
  // Empty from the start (an earlier run's file named its dead ports) to
  // the end, however the launch ends.
  struct EmptiedAtEnd {
    MetricsTargets* targets;
    ~EmptiedAtEnd() {
      if (targets != nullptr) (void)targets->Clear();
    }
  } emptied_at_end{nullptr};
  if (options.metrics) {
    run.metrics_targets = &metrics_targets;
    if (absl::Status st = metrics_targets.Clear(); !st.ok()) {
      std::cerr << "pstrain launch: " << metrics_targets.path() << ": " << st.message() << "\n";
    }
    emptied_at_end.targets = &metrics_targets;
  }
  // The launcher reads the chief's status as the operator.
  if (absl::Status st = ActAsOperator(*cluster, *secret); !st.ok()) {
    std::cerr << "pstrain launch: " << st.message() << "\n";
    return 2;
  }
  for (int restarts = 0, attempts = 0;; ++attempts) {
    Attempt a = RunOnce(run, *cluster, bin_for_job, log_dir, /*append_logs=*/attempts > 0,
                        &restarts, stop);
    if (a.restartable && restarts < options.max_restarts) {
      const absl::Duration backoff = RestartBackoff(restarts);
      std::cerr << "pstrain launch: " << a.failure
                << "; restarting the job from its latest checkpoint in "
                << absl::FormatDuration(backoff) << " (restart " << restarts + 1 << " of "
                << options.max_restarts << ")\n";
      if (stop->WaitFor(backoff)) {
        std::cerr << "pstrain launch: " << stop->reason() << "; not restarting\n";
        return stop->exit_code() != 0 ? stop->exit_code() : 130;
      }
      run.resume = true;  // a checkpoint of this run's own wins over init_from
      ++restarts;
      continue;
    }
    if (!a.failure.empty()) {
      std::cerr << "pstrain launch: " << a.failure << "; stopped every task"
                << (a.restartable && options.max_restarts > 0
                        ? absl::StrCat(" (", options.max_restarts, " restart(s) spent)")
                        : "")
                << "\n";
      return a.exit_code;
    }
    if (!a.chief_finished) return 1;
    break;
  }
  auto summary = Env::Default()->ReadFile(JoinPath(config->output_dir(), "summary.json"));
  if (summary.ok()) {
    std::cerr << FinishedLines(nlohmann::json::parse(*summary, nullptr, false),
                               config->output_dir());
  }
  return 0;
}

}  // namespace pstrain
