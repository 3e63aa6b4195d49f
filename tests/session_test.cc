// A worker session (worker/session.h) through its C API (worker/c_api.h),
// in this test's own process against a real chief and parameter servers:
// what the Python package does over ctypes, here in C++ so that the
// sanitizer builds run it (CPython cannot load their instrumented library:
// tests/torch_worker_test skips there).
#include <signal.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "catch2/catch.hpp"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"
#include "common/storage/tensor_file.h"
#include "nlohmann/json.hpp"
#include "tests/cluster_testlib.h"
#include "tools/subprocess.h"
#include "common/storage/tensor_export.h"
#include "worker/c_api.h"

namespace pstrain {
namespace {

using testing::Binary;

// The error a call returned, taken (freed, and the pointer cleared).
std::string Take(char*& error) {
  std::string s = error != nullptr ? error : "";
  pstrain_free(error);
  error = nullptr;
  return s;
}

struct Cluster {
  std::string dir, spec, config;
  std::vector<std::unique_ptr<Subprocess>> tasks;
};

// Starts parameter server `task` of `c`'s spec (again, after it was lost).
std::unique_ptr<Subprocess> StartServer(const Cluster& c, int task) {
  SpawnOptions so;
  so.argv = {Binary("ps_server/ps_server"), "--cluster_spec=" + c.spec,
             absl::StrCat("--task=", task)};
  so.output_file = absl::StrCat(c.dir, "/ps", task, "-", c.tasks.size(), ".log");
  auto p = Subprocess::Spawn(so);
  REQUIRE(p.ok());
  return std::move(*p);
}

// A chief and `ps` servers (started by hand: no secret) for an external
// model of w [4, 3] and b [3], `steps` sync steps of 1 worker; `extra`:
// more of the config (with "DIR" for its directory); `optimizer` and
// `rpc`: the fields of those sections (SGD at learning rate 0.5).
Cluster StartCluster(const std::string& name, int ps, int steps, const std::string& extra = "",
                     const std::string& optimizer = "learning_rate: 0.5 sgd {}",
                     const std::string& rpc = "") {
  Cluster c;
  c.dir = testing::FreshTempDir(name);
  std::vector<float> w(12), b(3);
  for (int i = 0; i < 12; ++i) w[i] = 0.25f * static_cast<float>(i) - 1.0f;
  for (int i = 0; i < 3; ++i) b[i] = static_cast<float>(i);
  const std::string variables = c.dir + "/vars.safetensors";
  REQUIRE(WriteSafetensors(Env::Default(), variables,
                           {{"w", {4, 3}, w.data()}, {"b", {3}, b.data()}}, {})
              .ok());
  c.config = testing::WriteFile(
      c.dir + "/train.pbtxt",
      absl::StrCat("model { external { variables: \"", variables, "\" } }\n",
                   "data { batch_size: 4 }\nmax_steps: ", steps, "\n",
                   "optimizer { ", optimizer, " }\n", "output_dir: \"", c.dir,
                   "/out\"\nrpc { startup_timeout_ms: 60000 ", rpc, " }\n",
                   absl::StrReplaceAll(extra, {{"DIR", c.dir}})));
  c.spec = testing::WriteClusterSpec(c.dir, ps, /*workers=*/1);
  for (int i = 0; i < ps; ++i) c.tasks.push_back(StartServer(c, i));
  SpawnOptions so;
  so.argv = {Binary("chief/chief"), "--cluster_spec=" + c.spec, "--config=" + c.config};
  so.output_file = c.dir + "/chief.log";
  auto chief = Subprocess::Spawn(so);
  REQUIRE(chief.ok());
  c.tasks.push_back(std::move(*chief));
  return c;
}

// The chief ends the run once its worker closed the session: it exits 0
// within a minute.
void ExpectChiefDone(const Cluster& c) {
  std::optional<int> code = c.tasks.back()->Wait(absl::Seconds(60));
  INFO(Env::Default()->ReadFile(c.dir + "/chief.log").value_or(""));
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}

// The final model the chief wrote.
TensorMap FinalModel(const Cluster& c) {
  auto model = ReadTensorFile(Env::Default(), c.dir + "/out/model_final.pst");
  REQUIRE(model.ok());
  return *std::move(model);
}

pstrain_session* Open(const Cluster& c, std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"--cluster_spec=" + c.spec, "--task=0", "--config=" + c.config};
  args.insert(args.end(), more.begin(), more.end());
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  int code = -1;
  char* error = nullptr;
  pstrain_session* s = pstrain_open(static_cast<int>(argv.size()), argv.data(), &code, &error);
  INFO(Take(error));
  CHECK(code == (s != nullptr ? 0 : code));
  return s;
}

TEST_CASE("a session trains an external model through the C API: pulls, pushes, an "
          "evaluation, the final report; bad calls are refused by name and change nothing") {
  const int steps = 12;
  Cluster c = StartCluster("session_sgd", /*ps=*/2, steps);

  // A flag the worker does not have: refused before anything is sent.
  {
    const char* argv[] = {"--no_such_flag=1"};
    int code = 0;
    char* error = nullptr;
    CHECK(pstrain_open(1, argv, &code, &error) == nullptr);
    CHECK(code == 3);
    CHECK(Take(error).find("--no_such_flag: not a worker flag") != std::string::npos);
  }

  {
    char* error = nullptr;
    int end = 0;
    CHECK(pstrain_push(nullptr, nullptr, 0, 0, 0, 0, 0, 0, &end, &error) == 3);
    CHECK(Take(error) == "no session (NULL)");
    CHECK(pstrain_table_dim(nullptr, "t", &error) == -1);
    CHECK(Take(error) == "no session (NULL)");
    CHECK(pstrain_close(nullptr, &error) == 0);  // as free(NULL)
    pstrain_abandon(nullptr);
  }

  pstrain_session* s = Open(c);
  REQUIRE(s != nullptr);
  REQUIRE(pstrain_num_variables(s) == 2);
  CHECK(std::string(pstrain_variable_name(s, 0)) == "w");
  CHECK(pstrain_variable_rank(s, 0) == 2);
  CHECK(pstrain_variable_dim(s, 0, 1) == 3);
  CHECK(pstrain_variable_name(s, 2) == nullptr);
  CHECK(pstrain_variable_dim(s, 1, 1) == -1);
  CHECK(pstrain_sync(s) == 1);
  CHECK(pstrain_max_steps(s) == steps);
  CHECK(pstrain_batch_size(s) == 4);

  std::vector<float> w(12), b(3), gw(12), gb(3);
  float* dst[] = {w.data(), b.data()};
  const float* src[] = {gw.data(), gb.data()};
  int finished = 0, end = 0;
  int64_t step = -1;
  char* error = nullptr;

  // Out of order, or the wrong count: refused, nothing sent.
  CHECK(pstrain_push(s, src, 2, 0, 4, 0, 0, 0, &end, &error) == 9);
  CHECK(Take(error).find("a push without a pull before it") != std::string::npos);
  CHECK(pstrain_pull(s, dst, 1, &finished, &step, &error) == 3);
  CHECK(Take(error).find("a pull into 1 buffers; the model has 2 variables") != std::string::npos);

  // The expected values, as the servers apply SGD: v -= 0.5 * g.
  std::vector<float> want_w(12), want_b(3);
  for (int i = 0; i < 12; ++i) want_w[i] = 0.25f * static_cast<float>(i) - 1.0f;
  for (int i = 0; i < 3; ++i) want_b[i] = static_cast<float>(i);
  int trained = 0;
  while (true) {
    REQUIRE(pstrain_pull(s, dst, 2, &finished, &step, &error) == 0);
    if (finished) break;
    CHECK(step == trained);
    CHECK(w == want_w);
    CHECK(b == want_b);
    // A gradient that depends on the values: 0.1 * v + the step.
    for (int i = 0; i < 12; ++i) gw[i] = 0.1f * w[i] + static_cast<float>(step);
    for (int i = 0; i < 3; ++i) gb[i] = 0.1f * b[i] - 1.0f;
    if (trained == 5) {
      // A bad report: refused before anything leaves, the step still open.
      CHECK(pstrain_push(s, src, 2, 0.5f, -1, 0, 0, 0, &end, &error) == 3);
      CHECK(Take(error).find("examples and data cursor must be >= 0") != std::string::npos);
      const char* names[] = {"accuracy", "loss"};
      const double bad[] = {0.5, std::nan("")};
      CHECK(pstrain_report_eval(s, names, bad, 2, -1, 10, &error) == 3);
      CHECK(Take(error).find("evaluation metric loss: nan is not finite") != std::string::npos);
      const char* bad_name[] = {"eval/accuracy"};
      CHECK(pstrain_report_eval(s, bad_name, bad, 1, -1, 10, &error) == 3);
      CHECK(Take(error).find("\"eval/accuracy\"") != std::string::npos);
      const double good[] = {0.75, 0.125};
      CHECK(pstrain_report_eval(s, names, good, 2, -1, 40, &error) == 0);
    }
    REQUIRE(pstrain_push(s, src, 2, 1.0f / static_cast<float>(step + 1), 4, 0, 4 * (step + 1),
                         0.001, &end, &error) == 0);
    for (int i = 0; i < 12; ++i) want_w[i] -= 0.5f * gw[i];
    for (int i = 0; i < 3; ++i) want_b[i] -= 0.5f * gb[i];
    ++trained;
    if (end) break;
  }
  CHECK(trained == steps);
  CHECK(pstrain_local_steps(s) == steps);
  const char* names[] = {"accuracy", "loss"};
  const double final_eval[] = {0.875, 0.0625};
  CHECK(pstrain_report_eval(s, names, final_eval, 2, -1, 40, &error) == 0);
  CHECK(pstrain_close(s, &error) == 0);
  CHECK(error == nullptr);

  ExpectChiefDone(c);
  const std::string chief_log = Env::Default()->ReadFile(c.dir + "/chief.log").value_or("");
  INFO(chief_log);
  CHECK(chief_log.find("step 5/12: worker 0's evaluation (40 examples): accuracy 0.7500, loss "
                       "0.1250") != std::string::npos);
  const TensorMap model = FinalModel(c);
  CHECK(model.at("w").values() == want_w);
  CHECK(model.at("b").values() == want_b);
  auto summary = nlohmann::json::parse(
      Env::Default()->ReadFile(c.dir + "/out/summary.json").value_or("{}"), nullptr, false);
  INFO(summary.dump());
  CHECK(summary["global_step"] == steps);
  CHECK(summary["eval_step"] == steps - 1);  // the last pull that read values
  CHECK(summary["eval_accuracy"] == 0.875);
  CHECK(summary["eval_metrics"]["loss"] == 0.0625);
  CHECK(summary["worker_steps"] == steps);
}

TEST_CASE("a session abandoned is not counted as done: a new process of the worker rejoins and "
          "finishes the run") {
  const int steps = 6;
  Cluster c = StartCluster("session_abandon", /*ps=*/1, steps);
  std::vector<float> w(12), b(3), gw(12, 1.0f), gb(3, 1.0f);
  float* dst[] = {w.data(), b.data()};
  const float* src[] = {gw.data(), gb.data()};
  int finished = 0, end = 0;
  int64_t step = 0;
  char* error = nullptr;

  pstrain_session* s = Open(c);
  REQUIRE(s != nullptr);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(pstrain_pull(s, dst, 2, &finished, &step, &error) == 0);
    REQUIRE(pstrain_push(s, src, 2, 1.0f, 4, 0, i + 1, 0, &end, &error) == 0);
  }
  pstrain_abandon(s);  // as an exception out of Python's `with` block
  // Not done: the chief is still running, waiting for the worker.
  CHECK_FALSE(c.tasks.back()->Wait(absl::Seconds(2)).has_value());

  // The worker's next process (the launcher's restart) rejoins where it
  // stood and trains to the end.
  pstrain_session* again = Open(c);
  REQUIRE(again != nullptr);
  int64_t epoch = -1, position = -1;
  CHECK(pstrain_start_cursor(again, &epoch, &position) == 1);
  CHECK(position == 3);  // (its steps count on from its reports: none in 3 steps)
  int trained = 0;
  while (pstrain_pull(again, dst, 2, &finished, &step, &error) == 0 && !finished) {
    CHECK(step == 3 + trained);
    REQUIRE(pstrain_push(again, src, 2, 1.0f, 4, 0, step + 1, 0, &end, &error) == 0);
    ++trained;
    if (end) break;
  }
  CHECK(trained == 3);
  CHECK(pstrain_close(again, &error) == 0);
  ExpectChiefDone(c);
  const TensorMap model = FinalModel(c);
  // Six steps of gradient 1 at learning rate 0.5 from b = [0, 1, 2].
  CHECK(model.at("b").values() == std::vector<float>{-3.0f, -2.0f, -1.0f});
}

// A server lost and started again under a step's rows: the session follows
// the job's rollback to the latest checkpoint (as for a pull or push of the
// variables), and the call says the step is dropped (ABORTED); the next
// pull reads the step rolled back to. Once under a pull of rows, once under
// a push of their gradients.
TEST_CASE("a rollback under a pull or push of embedding rows is followed: the step is dropped, "
          "the next pull reads the step rolled back to") {
  const int steps = 30;
  Cluster c = StartCluster("session_rows_rollback", /*ps=*/2, steps,
                           "embedding_tables { name: \"t\" dim: 2 }\n"
                           "checkpoint { dir: \"DIR/ckpt\" every_steps: 5 }\n");
  pstrain_session* s = Open(c);
  REQUIRE(s != nullptr);
  std::vector<float> w(12), b(3), gw(12, 0.0f), gb(3, 1.0f);
  float* dst[] = {w.data(), b.data()};
  const float* src[] = {gw.data(), gb.data()};
  // 64 ids: rows on both servers.
  std::vector<uint64_t> ids(64);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1000 + 7 * i;
  std::vector<float> rows(2 * ids.size()), row_grads(rows.size(), 0.25f);
  int finished = 0, end = 0;
  int64_t step = -1;
  char* error = nullptr;
  // One whole step: pull, rows, their gradients, push.
  auto train_step = [&]() {
    REQUIRE(pstrain_pull(s, dst, 2, &finished, &step, &error) == 0);
    REQUIRE_FALSE(finished);
    REQUIRE(pstrain_pull_rows(s, "t", ids.data(), 64, rows.data(), &error) == 0);
    REQUIRE(pstrain_push_rows(s, "t", ids.data(), 64, row_grads.data(), &error) == 0);
    REQUIRE(pstrain_push(s, src, 2, 1.0f, 4, 0, step + 1, 0, &end, &error) == 0);
  };
  // ps:1 killed and started again once the checkpoint of step `at` is
  // committed (the chief commits up to the step the worker's reports, every
  // 10 steps, confirm).
  auto lose_server = [&](int64_t at) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (ReadPointer(Env::Default(), c.dir + "/ckpt").value_or(0) < at &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    REQUIRE(ReadPointer(Env::Default(), c.dir + "/ckpt").value_or(0) == at);
    c.tasks[1]->Signal(SIGKILL);
    REQUIRE(c.tasks[1]->Wait(absl::Seconds(10)).has_value());
    c.tasks[1] = StartServer(c, 1);
  };

  for (int i = 0; i < 10; ++i) train_step();
  // Under a pull of rows: step 10 pulled, then the server lost.
  REQUIRE(pstrain_pull(s, dst, 2, &finished, &step, &error) == 0);
  CHECK(step == 10);
  lose_server(5);
  CHECK(pstrain_pull_rows(s, "t", ids.data(), 64, rows.data(), &error) == 10);
  std::string why = Take(error);
  CHECK(why.find("step dropped: the job was rolled back to step 5 while this step's rows were "
                 "pulled or pushed") != std::string::npos);
  CHECK(pstrain_rollbacks(s) == 1);
  // The step went with it: its push is refused, nothing of it sent.
  CHECK(pstrain_push(s, src, 2, 1.0f, 4, 0, 11, 0, &end, &error) == 9);
  CHECK(Take(error).find("a push without a pull before it") != std::string::npos);
  for (int i = 0; i < 10; ++i) {
    train_step();
    CHECK(step == 5 + i);  // from the step rolled back to
  }

  // Under a push of row gradients: step 15 pulled, its rows read, then the
  // server lost.
  REQUIRE(pstrain_pull(s, dst, 2, &finished, &step, &error) == 0);
  CHECK(step == 15);
  REQUIRE(pstrain_pull_rows(s, "t", ids.data(), 64, rows.data(), &error) == 0);
  lose_server(10);
  CHECK(pstrain_push_rows(s, "t", ids.data(), 64, row_grads.data(), &error) == 10);
  why = Take(error);
  CHECK(why.find("step dropped: the job was rolled back to step 10") != std::string::npos);
  CHECK(pstrain_rollbacks(s) == 2);
  // Steps 10 to 29 from the step rolled back to; then the servers are done.
  for (int i = 0; i < 20; ++i) train_step();
  REQUIRE(pstrain_pull(s, dst, 2, &finished, &step, &error) == 0);
  CHECK(finished == 1);
  CHECK(pstrain_close(s, &error) == 0);
  ExpectChiefDone(c);
  for (int i = 0; i < 2; ++i) c.tasks[i]->Wait(absl::Seconds(30));
  const TensorMap model = FinalModel(c);
  // Thirty steps of gradient 1 at learning rate 0.5 from b = [0, 1, 2]:
  // the steps rolled back and the dropped ones counted none.
  CHECK(model.at("b").values() == std::vector<float>{-15.0f, -14.0f, -13.0f});
}

// optimizer.clip_global_norm, as the C++ worker applies it (on the worker,
// before the push): the step's whole gradient, dense and rows together,
// scaled by min(1, c / its L2 norm).
TEST_CASE("clip_global_norm: a session scales a step's dense and row gradients together by "
          "their global norm") {
  const int steps = 2;
  Cluster c = StartCluster("session_clip", /*ps=*/2, steps,
                           "embedding_tables { name: \"t\" dim: 2 }\n",
                           "learning_rate: 0.5 sgd {} clip_global_norm: 1");
  pstrain_session* s = Open(c);
  REQUIRE(s != nullptr);
  std::vector<float> w(12), b(3), gw(12, 1.0f), gb(3, 1.0f);
  float* dst[] = {w.data(), b.data()};
  const float* src[] = {gw.data(), gb.data()};
  std::vector<uint64_t> ids = {11, 12};
  std::vector<float> rows(4), after(4), row_grads(4, 1.0f);
  int finished = 0, end = 0;
  int64_t step = -1;
  char* error = nullptr;
  // Step 0: 12 + 3 + 4 gradients of 1, a norm of sqrt(19): scaled to 1.
  REQUIRE(pstrain_pull(s, dst, 2, &finished, &step, &error) == 0);
  const std::vector<float> b0 = b;
  REQUIRE(pstrain_pull_rows(s, "t", ids.data(), 2, rows.data(), &error) == 0);
  REQUIRE(pstrain_push_rows(s, "t", ids.data(), 2, row_grads.data(), &error) == 0);
  REQUIRE(pstrain_push(s, src, 2, 1.0f, 4, 0, 1, 0, &end, &error) == 0);
  const double scale = 1.0 / std::sqrt(19.0);
  REQUIRE(pstrain_pull(s, dst, 2, &finished, &step, &error) == 0);
  REQUIRE(pstrain_pull_rows(s, "t", ids.data(), 2, after.data(), &error) == 0);
  for (int i = 0; i < 3; ++i) CHECK(b0[i] - b[i] == Approx(0.5 * scale).epsilon(1e-5));
  for (int i = 0; i < 4; ++i) CHECK(rows[i] - after[i] == Approx(0.5 * scale).epsilon(1e-4));
  // Step 1: a norm under 1 is left as it is.
  for (float& g : gw) g = 0.01f;
  for (float& g : gb) g = 0.01f;
  for (float& g : row_grads) g = 0.01f;
  const std::vector<float> b1 = b;
  REQUIRE(pstrain_push_rows(s, "t", ids.data(), 2, row_grads.data(), &error) == 0);
  REQUIRE(pstrain_push(s, src, 2, 1.0f, 4, 0, 2, 0, &end, &error) == 0);
  CHECK(pstrain_close(s, &error) == 0);
  ExpectChiefDone(c);
  const TensorMap model = FinalModel(c);
  for (int i = 0; i < 3; ++i) {
    CHECK(b1[i] - model.at("b").values()[i] == Approx(0.005).epsilon(1e-4));
  }
}

// Async, as the C++ worker: a pull sees the worker's own last push (the
// next step's pull leaves with the push, answered once the server applied
// it), so one worker trains as sequential SGD, value for value; with
// rpc.async_prefetch the pull leaves a step ahead, and pushes are one
// update stale.
TEST_CASE("async: a session's pull sees its own last push; with rpc.async_prefetch every push "
          "but the first is one update stale") {
  const int steps = 12;
  for (const bool prefetch : {false, true}) {
    INFO("async_prefetch " << prefetch);
    Cluster c = StartCluster(prefetch ? "session_async_prefetch" : "session_async", /*ps=*/2,
                             steps, "async {}\n", "learning_rate: 0.5 sgd {}",
                             prefetch ? "async_prefetch: true" : "");
    pstrain_session* s = Open(c);
    REQUIRE(s != nullptr);
    CHECK(pstrain_sync(s) == 0);
    std::vector<float> w(12), b(3), gw(12), gb(3);
    float* dst[] = {w.data(), b.data()};
    const float* src[] = {gw.data(), gb.data()};
    int finished = 0, end = 0;
    int64_t step = -1;
    char* error = nullptr;
    std::vector<float> want_w(12), want_b(3);
    for (int i = 0; i < 12; ++i) want_w[i] = 0.25f * static_cast<float>(i) - 1.0f;
    for (int i = 0; i < 3; ++i) want_b[i] = static_cast<float>(i);
    int trained = 0;
    while (trained < steps) {
      REQUIRE(pstrain_pull(s, dst, 2, &finished, &step, &error) == 0);
      if (finished) break;
      if (!prefetch) {
        CHECK(w == want_w);
        CHECK(b == want_b);
      }
      for (int i = 0; i < 12; ++i) gw[i] = 0.1f * w[i] + 1.0f;
      for (int i = 0; i < 3; ++i) gb[i] = 0.1f * b[i] - 1.0f;
      REQUIRE(pstrain_push(s, src, 2, 1.0f, 4, 0, 4 * (trained + 1), 0, &end, &error) == 0);
      for (int i = 0; i < 12; ++i) want_w[i] -= 0.5f * gw[i];
      for (int i = 0; i < 3; ++i) want_b[i] -= 0.5f * gb[i];
      ++trained;
      if (end) break;
    }
    CHECK(trained == steps);
    CHECK(pstrain_close(s, &error) == 0);
    ExpectChiefDone(c);
    auto summary = nlohmann::json::parse(
        Env::Default()->ReadFile(c.dir + "/out/summary.json").value_or("{}"), nullptr, false);
    INFO(summary.dump());
    REQUIRE(summary["async_staleness_mean"].is_number());
    const double staleness = summary["async_staleness_mean"].get<double>();
    if (prefetch) {
      // Every push but the first is one update stale, unless its pull and
      // the push before it crossed on their connections (slow builds).
      CHECK(staleness > 0.5);
      CHECK(staleness <= 11.0 / 12.0 + 1e-9);
    } else {
      CHECK(staleness == 0);
      const TensorMap model = FinalModel(c);
      CHECK(model.at("w").values() == want_w);
      CHECK(model.at("b").values() == want_b);
    }
  }
}

// Gradients that leave before the push (pstrain_push_ready: the backward
// pass is past them), as the C++ worker pushes layer by layer: the step
// ends as a whole push would, and what would break it is refused.
TEST_CASE("pstrain_push_ready sends a step's final gradients before its push; the step ends as "
          "one whole push") {
  const int steps = 4;
  Cluster c = StartCluster("session_push_ready", /*ps=*/2, steps,
                           "embedding_tables { name: \"t\" dim: 2 }\n");
  pstrain_session* s = Open(c);
  REQUIRE(s != nullptr);
  CHECK(pstrain_push_streams(s) == 1);
  std::vector<float> w(12), b(3), gw(12), gb(3);
  float* dst[] = {w.data(), b.data()};
  const float* src[] = {gw.data(), gb.data()};
  std::vector<uint64_t> ids = {5};
  std::vector<float> row_grads(2, 1.0f);
  int finished = 0, end = 0;
  int64_t step = -1;
  char* error = nullptr;
  const int first[] = {1};
  const float* first_src[] = {gb.data()};
  // Before a pull: refused.
  CHECK(pstrain_push_ready(s, first, first_src, 1, &error) == 9);
  CHECK(Take(error).find("gradients ready outside a step") != std::string::npos);
  std::vector<float> want_w(12), want_b(3);
  for (int i = 0; i < 12; ++i) want_w[i] = 0.25f * static_cast<float>(i) - 1.0f;
  for (int i = 0; i < 3; ++i) want_b[i] = static_cast<float>(i);
  for (int trained = 0; trained < steps; ++trained) {
    REQUIRE(pstrain_pull(s, dst, 2, &finished, &step, &error) == 0);
    REQUIRE_FALSE(finished);
    CHECK(w == want_w);
    CHECK(b == want_b);
    for (int i = 0; i < 12; ++i) gw[i] = 0.1f * w[i] + static_cast<float>(step);
    for (int i = 0; i < 3; ++i) gb[i] = 0.1f * b[i] - 1.0f;
    // b's gradient first (the last layer's, as a backward pass has it).
    REQUIRE(pstrain_push_ready(s, first, first_src, 1, &error) == 0);
    if (trained == 1) {
      const int bad[] = {2};
      CHECK(pstrain_push_ready(s, bad, first_src, 1, &error) == 3);
      CHECK(Take(error).find("variable 2 ready; the model has 2 variables") != std::string::npos);
      // What would break the step: rows after gradients left, a new pull.
      CHECK(pstrain_push_rows(s, "t", ids.data(), 1, row_grads.data(), &error) == 9);
      CHECK(Take(error).find("rows pushed after some of this step's gradients left") !=
            std::string::npos);
      CHECK(pstrain_pull(s, dst, 2, &finished, &step, &error) == 9);
      CHECK(Take(error).find("a pull after some of this step's gradients left") !=
            std::string::npos);
    }
    REQUIRE(pstrain_push(s, src, 2, 1.0f, 4, 0, step + 1, 0, &end, &error) == 0);
    for (int i = 0; i < 12; ++i) want_w[i] -= 0.5f * gw[i];
    for (int i = 0; i < 3; ++i) want_b[i] -= 0.5f * gb[i];
  }
  CHECK(pstrain_close(s, &error) == 0);
  ExpectChiefDone(c);
  const TensorMap model = FinalModel(c);
  CHECK(model.at("w").values() == want_w);
  CHECK(model.at("b").values() == want_b);

  // With clip_global_norm (the whole gradient first) nothing leaves early.
  Cluster clipped = StartCluster("session_push_ready_clip", /*ps=*/1, 1, "",
                                 "learning_rate: 0.5 sgd {} clip_global_norm: 10");
  pstrain_session* cs = Open(clipped);
  REQUIRE(cs != nullptr);
  CHECK(pstrain_push_streams(cs) == 0);
  REQUIRE(pstrain_pull(cs, dst, 2, &finished, &step, &error) == 0);
  CHECK(pstrain_push_ready(cs, first, first_src, 1, &error) == 0);  // (the push sends it)
  REQUIRE(pstrain_push(cs, src, 2, 1.0f, 4, 0, 1, 0, &end, &error) == 0);
  CHECK(pstrain_close(cs, &error) == 0);
}

}  // namespace
}  // namespace pstrain
