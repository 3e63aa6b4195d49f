#include "chief/chief_state.h"

#include <cmath>
#include <limits>
#include <thread>

#include "absl/time/clock.h"
#include "catch2/catch.hpp"

namespace pstrain {
namespace {

TEST_CASE("registration waits for initialisation, with a deadline", "[chief]") {
  Chief chief(2, 100, /*incarnation=*/9, /*fingerprint=*/5, 0);
  RegisterWorkerRequest req;
  req.set_worker(1);
  req.set_config_fingerprint(5);
  req.set_timeout_ms(20);
  RegisterWorkerResponse resp;
  CHECK(absl::IsDeadlineExceeded(chief.RegisterWorker(req, &resp)));
  std::thread init([&chief] { chief.MarkInitialized(); });
  req.set_timeout_ms(10000);
  CHECK(chief.RegisterWorker(req, &resp).ok());
  CHECK(resp.incarnation() == 9);
  init.join();
}

TEST_CASE("registration refuses a different config or an unknown worker", "[chief]") {
  Chief chief(2, 100, 9, 5, 0);
  chief.MarkInitialized();
  RegisterWorkerRequest req;
  req.set_worker(0);
  req.set_config_fingerprint(6);
  RegisterWorkerResponse resp;
  CHECK(absl::IsFailedPrecondition(chief.RegisterWorker(req, &resp)));
  req.set_config_fingerprint(5);
  req.set_worker(2);
  CHECK(absl::IsInvalidArgument(chief.RegisterWorker(req, &resp)));
}

// A report of incarnation 9, the one the cases' chiefs run.
ProgressReport Report(int worker, int64_t global_step) {
  ProgressReport r;
  r.set_incarnation(9);
  r.set_worker(worker);
  r.set_global_step(global_step);
  return r;
}

TEST_CASE("a worker registering again rejoins; its earlier process's work still counts",
          "[chief]") {
  Chief chief(2, 1000, 9, 5, 0);
  chief.MarkInitialized();
  RegisterWorkerRequest req;
  req.set_worker(1);
  req.set_config_fingerprint(5);
  RegisterWorkerResponse resp;
  REQUIRE(chief.RegisterWorker(req, &resp).ok());
  CHECK_FALSE(resp.rejoin());
  ProgressReport r = Report(1, 30);
  r.set_local_steps(30);
  r.set_examples(960);
  r.set_push_seconds(2.0);
  ProgressResponse presp;
  REQUIRE(chief.ReportProgress(r, &presp).ok());
  // Restarted: its reports count examples and phase time from 0 again, and
  // steps from the pushes the servers had applied (33, a few past the report).
  RegisterWorkerResponse again;
  REQUIRE(chief.RegisterWorker(req, &again).ok());
  CHECK(again.rejoin());
  CHECK(again.incarnation() == 9);
  CHECK(again.session() == 1);
  CHECK(again.local_steps_before() == 30);
  r.set_local_steps(33 + 5);
  r.set_examples(160);
  r.set_push_seconds(0.5);
  // The earlier process's report (session 0) is refused, changing nothing.
  CHECK(absl::IsFailedPrecondition(chief.ReportProgress(r, &presp)));
  r.set_session(1);
  REQUIRE(chief.ReportProgress(r, &presp).ok());
  ChiefStatusResponse status;
  chief.GetStatus(&status);
  CHECK(status.local_steps() == 38);
  CHECK(status.push_seconds() == Approx(2.5));
  CHECK(status.workers_registered() == 1);
}

TEST_CASE("progress moves the global step; workers are stopped at max_steps", "[chief]") {
  Chief chief(2, 100, 9, 5, 0);
  chief.MarkInitialized();
  ProgressReport r = Report(0, 50);
  r.set_local_steps(50);
  r.set_loss(0.5f);
  r.set_examples(1600);
  ProgressResponse resp;
  REQUIRE(chief.ReportProgress(r, &resp).ok());
  CHECK_FALSE(resp.stop());
  CHECK(chief.global_step() == 0);  // a claim, not yet confirmed by the servers
  CHECK(chief.WaitForStep(40, absl::Milliseconds(10)) == 50);
  CHECK(chief.ConfirmStep(50) == 50);
  CHECK(chief.global_step() == 50);
  r.set_global_step(100);
  REQUIRE(chief.ReportProgress(r, &resp).ok());
  CHECK_FALSE(resp.stop());  // claimed, the servers are at 60
  CHECK(chief.ConfirmStep(60) == 60);
  CHECK(chief.ConfirmStep(100) == 100);
  REQUIRE(chief.ReportProgress(r, &resp).ok());
  CHECK(resp.stop());
  r.set_incarnation(10);
  CHECK(absl::IsFailedPrecondition(chief.ReportProgress(r, &resp)));
}

TEST_CASE("a forged step cannot end the run or spin the driver", "[chief]") {
  Chief chief(2, 100, 9, 5, 0);
  chief.MarkInitialized();
  const ProgressReport r = Report(1, 1000000);
  ProgressResponse resp;
  REQUIRE(chief.ReportProgress(r, &resp).ok());
  CHECK_FALSE(resp.stop());
  CHECK(chief.WaitForStep(10, absl::Milliseconds(10)) == 1000000);
  CHECK(chief.ConfirmStep(12) == 12);  // what the servers really reached
  // The same claim does not wake the driver again: it waits its timeout.
  const absl::Time start = absl::Now();
  chief.WaitForStep(20, absl::Milliseconds(200));
  CHECK(absl::Now() - start >= absl::Milliseconds(150));
  CHECK(chief.ConfirmStep(11) == 12);  // never goes back
  REQUIRE(chief.ReportProgress(r, &resp).ok());
  CHECK_FALSE(resp.stop());
}

TEST_CASE("all workers done ends the wait", "[chief]") {
  Chief chief(2, 100, 9, 5, 0);
  chief.MarkInitialized();
  CHECK_FALSE(chief.WaitForWorkersDone(absl::Milliseconds(5)));
  for (int w = 0; w < 2; ++w) {
    ProgressReport r = Report(w, 0);
    r.set_done(true);
    ProgressResponse resp;
    REQUIRE(chief.ReportProgress(r, &resp).ok());
  }
  CHECK(chief.WaitForWorkersDone(absl::Milliseconds(5)));
  CHECK(chief.AllWorkersDone());
}

TEST_CASE("a worker's evaluation becomes the run's; a bad one refuses the report and changes "
          "nothing", "[chief]") {
  Chief chief(2, 100, 9, 5, 0);
  chief.MarkInitialized();
  ProgressResponse resp;
  ChiefStatusResponse s;
  chief.GetStatus(&s);
  CHECK(s.eval_step() == -1);
  CHECK(s.eval_metrics_size() == 0);
  CHECK(s.eval_worker() == -1);

  ProgressReport r = Report(1, 40);
  r.set_local_steps(40);
  r.set_eval_step(40);
  r.set_eval_examples(360);
  auto add = [](ProgressReport* p, const std::string& name, double value) {
    EvalMetric* m = p->add_eval();
    m->set_name(name);
    m->set_value(value);
  };
  add(&r, "accuracy", 0.93);
  add(&r, "loss", 0.25);
  add(&r, "top_3", 0.99);
  REQUIRE(chief.ReportProgress(r, &resp).ok());
  chief.GetStatus(&s);
  CHECK(s.eval_step() == 40);
  CHECK(s.eval_accuracy() == Approx(0.93));
  CHECK(s.eval_loss() == Approx(0.25));
  CHECK(s.eval_worker() == 1);
  CHECK(s.eval_examples() == 360);
  REQUIRE(s.eval_metrics_size() == 3);
  CHECK(s.eval_metrics(2).name() == "top_3");

  // Refused whole, naming the metric: neither the evaluation nor the
  // report's progress is taken.
  ProgressReport bad = Report(0, 60);
  bad.set_local_steps(60);
  bad.set_eval_step(60);
  add(&bad, "accuracy", std::nan(""));
  absl::Status st = chief.ReportProgress(bad, &resp);
  CHECK(absl::IsInvalidArgument(st));
  CHECK(std::string(st.message()).find("accuracy: nan is not finite") != std::string::npos);
  chief.GetStatus(&s);
  CHECK(s.eval_step() == 40);
  CHECK(s.local_steps() == 40);
  CHECK(chief.WaitForStep(50, absl::Milliseconds(1)) == 40);

  // The driver takes each evaluation once, oldest first; the latest stays.
  r.set_eval_step(50);
  r.mutable_eval(0)->set_value(0.95);
  REQUIRE(chief.ReportProgress(r, &resp).ok());
  int64_t dropped = -1;
  std::vector<Chief::WorkerEval> taken = chief.TakeWorkerEvals(&dropped);
  CHECK(dropped == 0);
  REQUIRE(taken.size() == 2);
  CHECK(taken[0].step == 40);
  CHECK(taken[1].step == 50);
  CHECK(taken[1].Get("accuracy") == Approx(0.95));
  CHECK_FALSE(taken[1].Get("recall").has_value());
  CHECK(chief.TakeWorkerEvals(&dropped).empty());
  REQUIRE(chief.latest_worker_eval().has_value());
  CHECK(chief.latest_worker_eval()->step == 50);
  for (int i = 0; i < Chief::kMaxPendingEvals + 3; ++i) {
    REQUIRE(chief.ReportProgress(r, &resp).ok());
  }
  CHECK(chief.TakeWorkerEvals(&dropped).size() == Chief::kMaxPendingEvals);
  CHECK(dropped == 3);

  // The chief's own evaluation takes over.
  chief.SetEval(70, 0.5f, 1.0f);
  chief.GetStatus(&s);
  CHECK(s.eval_worker() == -1);
  CHECK(s.eval_metrics_size() == 0);
}

TEST_CASE("the chief sums the workers' step-time split; a bad split is ignored, the report "
          "taken", "[chief]") {
  Chief chief(2, 100, 9, 5, 0);
  chief.MarkInitialized();
  ProgressResponse resp;
  ProgressReport a = Report(0, 3);
  a.set_local_steps(10);
  a.set_pull_seconds(1.0);
  a.set_data_seconds(0.25);
  a.set_compute_seconds(2.0);
  a.set_push_seconds(0.5);
  REQUIRE(chief.ReportProgress(a, &resp).ok());
  ProgressReport b = Report(1, 3);
  b.set_local_steps(30);
  b.set_pull_seconds(3.0);
  b.set_compute_seconds(4.0);
  REQUIRE(chief.ReportProgress(b, &resp).ok());
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity(), 1e9}) {
    ProgressReport r = Report(1, 4);
    r.set_local_steps(30);
    r.set_push_seconds(bad);
    INFO(bad);
    CHECK(chief.ReportProgress(r, &resp).ok());  // progress counts; the split is not touched
  }
  ChiefStatusResponse s;
  chief.GetStatus(&s);
  CHECK(s.local_steps() == 40);
  CHECK(s.pull_seconds() == 4.0);
  CHECK(s.data_seconds() == 0.25);
  CHECK(s.compute_seconds() == 6.0);
  CHECK(s.push_seconds() == 0.5);
}

// Worker `w` registering again after its servers moved on from incarnation
// `previous` (config fingerprint 5, as the cases' chiefs have).
RegisterWorkerRequest AfterRollback(int w, uint64_t previous, int64_t timeout_ms) {
  RegisterWorkerRequest req;
  req.set_worker(w);
  req.set_config_fingerprint(5);
  req.set_previous_incarnation(previous);
  req.set_timeout_ms(timeout_ms);
  return req;
}

TEST_CASE("a worker whose servers moved on waits for the rollback and goes on from its step "
          "and cursor; an earlier incarnation's reports are refused",
          "[chief][rollback]") {
  Chief chief(2, 1000, 9, 5, 0);
  chief.MarkInitialized();
  ProgressResponse pr;
  ProgressReport r = Report(0, 300);
  REQUIRE(chief.ReportProgress(r, &pr).ok());
  REQUIRE(chief.ConfirmStep(300) == 300);

  RegisterWorkerRequest req = AfterRollback(1, 9, 200);
  RegisterWorkerResponse resp;
  // No rollback under way and every server answering: refused after the
  // grace, so the worker's own error stands.
  const absl::Time t0 = absl::Now();
  CHECK(absl::IsFailedPrecondition(chief.RegisterWorker(req, &resp)));
  CHECK(absl::Now() - t0 >= absl::Milliseconds(150));
  // An incarnation this chief never ran.
  req.set_previous_incarnation(77);
  CHECK(absl::IsFailedPrecondition(chief.RegisterWorker(req, &resp)));

  // A rollback: the worker waits until it is done.
  req.set_previous_incarnation(9);
  req.set_timeout_ms(10000);
  chief.BeginRollback();
  absl::Status registered;
  std::thread worker([&] { registered = chief.RegisterWorker(req, &resp); });
  absl::SleepFor(absl::Milliseconds(50));
  WorkerCursor c;
  c.set_worker(1);
  c.set_epoch(2);
  c.set_position(64);
  chief.FinishRollback(/*incarnation=*/11, /*step=*/200, {c});
  worker.join();
  REQUIRE(registered.ok());
  CHECK(resp.rolled_back());
  CHECK_FALSE(resp.rejoin());
  CHECK(resp.incarnation() == 11);
  CHECK(resp.start_step() == 200);
  CHECK(resp.has_cursor());
  CHECK(resp.cursor_epoch() == 2);
  CHECK(resp.cursor_position() == 64);
  CHECK(resp.session() == 0);
  // The one way the global step goes back.
  CHECK(chief.global_step() == 200);
  CHECK(chief.incarnation() == 11);
  ChiefStatusResponse st;
  chief.GetStatus(&st);
  CHECK(st.rollbacks() == 1);
  CHECK(st.rolled_back_to() == 200);
  CHECK(st.state() == "training");
  // A report of the old incarnation is refused; the new one's counts.
  CHECK(absl::IsFailedPrecondition(chief.ReportProgress(Report(0, 400), &pr)));
  CHECK(chief.ConfirmStep(1000) == 200);
  ProgressReport now = Report(0, 210);
  now.set_incarnation(11);
  REQUIRE(chief.ReportProgress(now, &pr).ok());
  CHECK(chief.ConfirmStep(1000) == 210);
  // A worker that registers again later, naming the old one, gets the new.
  RegisterWorkerResponse late;
  REQUIRE(chief.RegisterWorker(req, &late).ok());
  CHECK(late.incarnation() == 11);
}

TEST_CASE("a worker that lost a server waits while it is down; a failed rollback refuses it",
          "[chief][rollback]") {
  Chief chief(1, 1000, 9, 5, 0);
  chief.MarkInitialized();
  const RegisterWorkerRequest req = AfterRollback(0, 9, 10000);
  RegisterWorkerResponse resp;
  chief.SetServersDown(1);
  absl::Status registered;
  std::thread worker([&] { registered = chief.RegisterWorker(req, &resp); });
  absl::SleepFor(absl::Milliseconds(50));
  chief.BeginRollback();
  chief.FailRollback(absl::NotFoundError("no complete, intact checkpoint"));
  worker.join();
  CHECK(absl::IsNotFound(registered));
  ChiefStatusResponse st;
  chief.GetStatus(&st);
  CHECK(st.state() == "failed");

  // A server that comes back without having restarted (a blip): no rollback.
  Chief other(1, 1000, 9, 5, 0);
  other.MarkInitialized();
  other.SetServersDown(1);
  std::thread w2([&] { registered = other.RegisterWorker(req, &resp); });
  absl::SleepFor(absl::Milliseconds(50));
  other.SetServersDown(0);
  w2.join();
  CHECK(absl::IsFailedPrecondition(registered));
}

TEST_CASE("an operator's restore is handed to the driver and answered with its step",
          "[chief][rollback]") {
  Chief chief(1, 1000, 9, 5, 0);
  int64_t step = 0;
  // Not while the chief is starting.
  CHECK(absl::IsUnavailable(chief.RequestRestore("/x/ckpt-100", absl::Seconds(1), &step)));
  chief.MarkInitialized();
  std::string taken;
  CHECK_FALSE(chief.TakeRestoreRequest(&taken));
  // Nobody takes it: withdrawn at the deadline.
  CHECK(absl::IsDeadlineExceeded(chief.RequestRestore("/x/ckpt-100", absl::Milliseconds(50),
                                                      &step)));
  CHECK_FALSE(chief.TakeRestoreRequest(&taken));
  absl::Status answered;
  std::thread op([&] { answered = chief.RequestRestore("/x/ckpt-100", absl::Seconds(10), &step); });
  // The driver's wait wakes for it.
  const absl::Time t0 = absl::Now();
  chief.WaitForStep(1000, absl::Seconds(5));
  CHECK(absl::Now() - t0 < absl::Seconds(4));
  REQUIRE(chief.TakeRestoreRequest(&taken));
  CHECK(taken == "/x/ckpt-100");
  CHECK_FALSE(chief.TakeRestoreRequest(&taken));
  chief.FinishRestoreRequest(absl::OkStatus(), 100);
  op.join();
  CHECK(answered.ok());
  CHECK(step == 100);
  // A refused one carries the driver's reason.
  std::thread op2([&] { answered = chief.RequestRestore("/x/bad", absl::Seconds(10), &step); });
  while (!chief.TakeRestoreRequest(&taken)) absl::SleepFor(absl::Milliseconds(5));
  chief.FinishRestoreRequest(absl::FailedPreconditionError("another model?"), 0);
  op2.join();
  CHECK(absl::IsFailedPrecondition(answered));
  // A run that stops answers a restore still waiting, taken or not.
  std::thread op3([&] { answered = chief.RequestRestore("/x/ckpt-100", absl::Seconds(30), &step); });
  while (!chief.TakeRestoreRequest(&taken)) absl::SleepFor(absl::Milliseconds(5));
  chief.RequestStop();
  op3.join();
  CHECK(absl::IsUnavailable(answered));
  CHECK(absl::IsUnavailable(chief.RequestRestore("/x/ckpt-100", absl::Seconds(1), &step)));
}

TEST_CASE("an earlier process of a restarted worker cannot follow a rollback; a restarted "
          "server seen by the heartbeat makes workers wait",
          "[chief][rollback]") {
  Chief chief(1, 1000, 9, 5, 0);
  chief.MarkInitialized();
  RegisterWorkerRequest req = AfterRollback(0, 0, 10000);  // a first registration
  RegisterWorkerResponse resp;
  REQUIRE(chief.RegisterWorker(req, &resp).ok());
  REQUIRE(chief.RegisterWorker(req, &resp).ok());  // restarted: session 1
  REQUIRE(resp.session() == 1);
  req.set_previous_incarnation(9);
  req.set_session(0);
  CHECK(absl::IsFailedPrecondition(chief.RegisterWorker(req, &resp)));
  // The heartbeat's probe from before a rollback is ignored after it.
  const int64_t generation = chief.health_generation();
  REQUIRE(generation == 0);
  req.set_session(1);
  absl::Status registered;
  std::thread worker([&] { registered = chief.RegisterWorker(req, &resp); });
  chief.SetServerHealth(generation, 0, /*restarted=*/true);
  CHECK(chief.server_restarted());
  CHECK(chief.WaitForStep(1000, absl::Seconds(5)) == 0);  // woken at once
  chief.BeginRollback();
  CHECK(chief.health_generation() == -1);
  chief.FinishRollback(12, 0, {});
  worker.join();
  REQUIRE(registered.ok());
  CHECK(resp.incarnation() == 12);
  CHECK(resp.session() == 1);
  CHECK_FALSE(chief.server_restarted());
  chief.SetServerHealth(generation, 0, true);  // straddled the rollback
  CHECK_FALSE(chief.server_restarted());
}

TEST_CASE("a restarted chief takes its run over: the workers of the incarnation its servers "
          "served wait for it to start, keep their sessions, and go on from its checkpoint",
          "[chief][rollback]") {
  // The earlier process ran incarnation 9; this one, 21, is still starting.
  Chief chief(2, 1000, 21, 5, 0);
  RegisterWorkerRequest req = AfterRollback(1, 9, 10000);
  req.set_session(2);  // the worker had been restarted twice before
  RegisterWorkerResponse resp;
  absl::Status registered;
  std::thread worker([&] { registered = chief.RegisterWorker(req, &resp); });
  absl::SleepFor(absl::Milliseconds(50));
  chief.TakeOver({9, 9});
  ChiefStatusResponse st;
  chief.GetStatus(&st);
  CHECK(st.state() == "taking over");
  WorkerCursor c;
  c.set_worker(1);
  c.set_epoch(1);
  c.set_position(128);
  chief.MarkInitialized(300, {c});
  worker.join();
  REQUIRE(registered.ok());
  CHECK(resp.rolled_back());
  CHECK(resp.incarnation() == 21);
  CHECK(resp.start_step() == 300);
  CHECK(resp.cursor_epoch() == 1);
  CHECK(resp.cursor_position() == 128);
  CHECK(resp.session() == 2);
  // An earlier process of that worker (session 1) cannot follow now.
  req.set_session(1);
  CHECK(absl::IsFailedPrecondition(chief.RegisterWorker(req, &resp)));
  // Nor can a worker of an incarnation none of the servers served.
  RegisterWorkerRequest other = AfterRollback(0, 77, 1000);
  CHECK(absl::IsFailedPrecondition(chief.RegisterWorker(other, &resp)));
  // A chief that never takes over (a fresh run) refuses such workers once
  // it has started, and a start that never comes ends their wait.
  Chief fresh(1, 1000, 22, 5, 0);
  fresh.MarkInitialized();
  CHECK(absl::IsFailedPrecondition(fresh.RegisterWorker(AfterRollback(0, 9, 1000), &resp)));
  // A restarted chief stopped before its takeover reached the servers:
  // nothing to follow, and no answer that there is.
  Chief stopped(1, 1000, 24, 5, 0);
  stopped.TakeOver({9});
  stopped.RequestStop();
  CHECK(absl::IsFailedPrecondition(stopped.RegisterWorker(AfterRollback(0, 9, 1000), &resp)));
  Chief stuck(1, 1000, 23, 5, 0);
  const absl::Time t0 = absl::Now();
  CHECK(absl::IsDeadlineExceeded(stuck.RegisterWorker(AfterRollback(0, 9, 100), &resp)));
  CHECK(absl::Now() - t0 >= absl::Milliseconds(90));
}

}  // namespace
}  // namespace pstrain
