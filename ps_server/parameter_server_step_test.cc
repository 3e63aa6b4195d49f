// ParameterServer: a step's life beyond aggregation: Initialize in parts,
// version buffers and bfloat16 pulls, early and parked pulls, step
// deadlines, the schedule and clipping, server-side Adam, who a step waits on.
#include "ps_server/parameter_server.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

#include "catch2/catch.hpp"
#include "common/base/bfloat16.h"
#include "common/storage/checkpoint.h"
#include "common/cluster/config.h"
#include "common/storage/env.h"
#include "ps_server/parameter_server_testing.h"

namespace pstrain {
namespace {

TEST_CASE("sync: a server holding no partition completes each step on the quorum",
          "[ps][sync]") {
  ParameterServer ps;
  InitializeRequest req = InitRequest(BaseConfig(true), 2);
  req.clear_variables();
  REQUIRE(ps.Initialize(req).ok());
  PushRequest empty = EmptyPush(0, 0);
  PushResponse r;
  REQUIRE(ps.Push(empty, &r).ok());
  CHECK(r.outcome() == ACCUMULATED);
  CHECK(absl::IsInvalidArgument(ps.Push(empty, &r)));
  empty.set_worker(1);
  REQUIRE(ps.Push(empty, &r).ok());
  CHECK(r.outcome() == APPLIED);
  CHECK(r.version() == 1);
}

TEST_CASE("Initialize in parts installs the model when the last part is in", "[ps]") {
  ParameterServer ps;
  InitializeRequest whole = InitRequest(BaseConfig(true), 1);
  NamedTensor* b = whole.add_variables();
  b->mutable_ref()->set_variable("b");
  ToProto({2}, {7, 8}, b->mutable_tensor());
  InitializeRequest part0 = whole, part1 = whole;
  part0.mutable_variables()->DeleteSubrange(1, 1);  // w
  part1.mutable_variables()->DeleteSubrange(0, 1);  // b
  part0.set_num_parts(2);
  part1.set_num_parts(2);
  part1.set_part(1);
  REQUIRE(ps.Initialize(part1).ok());
  PushResponse r;
  CHECK(absl::IsUnavailable(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r)));  // not installed yet
  REQUIRE(ps.Initialize(part1).ok());  // a retried part is harmless
  InitializeRequest clash = part0;
  clash.set_part(0);
  *clash.add_variables() = part1.variables(0);  // b again, in another part
  CHECK(absl::IsInvalidArgument(ps.Initialize(clash)));
  InitializeRequest bad_part = part0;
  bad_part.set_part(2);
  CHECK(absl::IsInvalidArgument(ps.Initialize(bad_part)));
  REQUIRE(ps.Initialize(part0).ok());
  CHECK(absl::IsAlreadyExists(ps.Initialize(part0)));
  CHECK(PullW(ps) == std::vector<float>{7, 8});  // b sorts first
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == ACCUMULATED);  // w applied; b still open (no gradient for it)
}

TEST_CASE("bfloat16: rounding to nearest even, saturation, NaN and Inf", "[bfloat16]") {
  CHECK(FloatToBfloat16(1.0f) == 0x3f80);
  CHECK(Bfloat16ToFloat(0x3f80) == 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to even (1).
  CHECK(FloatToBfloat16(1.0f + 1.0f / 256) == 0x3f80);
  CHECK(FloatToBfloat16(1.0f + 3.0f / 256) == 0x3f82);
  CHECK(FloatToBfloat16(-2.5f) == 0xc020);
  CHECK(FloatToBfloat16(std::numeric_limits<float>::max()) == 0x7f7f);  // saturates, stays finite
  CHECK(FloatToBfloat16(-std::numeric_limits<float>::max()) == 0xff7f);
  CHECK(FloatToBfloat16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(std::isnan(Bfloat16ToFloat(FloatToBfloat16(std::nanf("")))));
  const uint16_t values[3] = {0x3f80, 0x7f80, 0x0000};
  CHECK_FALSE(AllFiniteBfloat16(reinterpret_cast<const char*>(values), 3));
  CHECK(AllFiniteBfloat16(reinterpret_cast<const char*>(values), 1));
}

TEST_CASE("a bfloat16 push applies its rounded values; a NaN one is refused", "[ps][bfloat16]") {
  for (bool sync : {true, false}) {
    ParameterServer ps;
    REQUIRE(ps.Initialize(InitRequest(BaseConfig(sync, 1, 0, 1.0f), 1, {0, 0, 0, 0})).ok());
    const std::vector<float> g = {1.0f + 1.0f / 256, 0.3f, -7.0f, 1e-3f};
    PushRequest req = Grad(0, 0, {});
    TensorProto* t = req.mutable_gradients(0)->mutable_tensor();
    t->set_dtype(DT_BFLOAT16);
    t->clear_content();
    for (float v : g) {
      const uint16_t b = FloatToBfloat16(v);
      t->mutable_content()->append(reinterpret_cast<const char*>(&b), 2);
    }
    t->clear_shape();
    t->add_shape(2);
    t->add_shape(2);
    Framed f = Frame(req, 5);
    PushResponse r;
    REQUIRE(ps.Push(f.header, f.payload, &r).ok());
    std::vector<float> w = PullW(ps);
    for (size_t i = 0; i < g.size(); ++i) CHECK(w[i] == -Bfloat16ToFloat(FloatToBfloat16(g[i])));
    const uint16_t nan = 0x7fc0;
    t->mutable_content()->replace(2, 2, reinterpret_cast<const char*>(&nan), 2);
    req.set_step(sync ? 1 : 0);
    CHECK(absl::IsInvalidArgument(ps.Push(req, &r)));
    CHECK(PullW(ps) == w);
  }
}

TEST_CASE("a pull's buffers never change under it; spare buffers are reused", "[ps][snapshot]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(false, 0, 0, 1.0f), 1, {0, 0, 0, 0})).ok());
  PullRequest req;
  req.set_incarnation(kIncarnation);
  req.set_worker(-1);
  ParameterServer::PullReply held;
  ps.StartPull(req, [&held](absl::Status st, ParameterServer::PullReply r) {
    REQUIRE(st.ok());
    held = std::move(r);
  });
  REQUIRE(held.tensors.size() == 1);
  const float* first = held.tensors[0].values->data();
  PushResponse r;
  for (int i = 0; i < 5; ++i) REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  // The held reply still reads version 0; the server moved on beside it.
  CHECK(*held.tensors[0].values == std::vector<float>{0, 0, 0, 0});
  CHECK(PullW(ps) == std::vector<float>{-5, -5, -5, -5});
  // Released, its buffer goes back into rotation: no buffer is allocated
  // per update, two alternate.
  held = ParameterServer::PullReply();
  std::set<const float*> seen;
  for (int i = 0; i < 6; ++i) {
    REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
    ps.StartPull(req, [&seen](absl::Status st, ParameterServer::PullReply r) {
      REQUIRE(st.ok());
      seen.insert(r.tensors[0].values->data());
    });
  }
  CHECK(seen.size() <= 3);
  CHECK(first != nullptr);
}

TEST_CASE("bfloat16 pulls never get the rounding of a recycled buffer's earlier contents",
          "[ps][bfloat16]") {
  // Async, two workers' worth of pushes between this caller's pulls: the
  // buffer pulled at version 0 is current again at version 2, rewritten.
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(false, 0, 0, 1.0f), 2, {0, 0, 0, 0})).ok());
  PullRequest req;
  req.set_incarnation(kIncarnation);
  req.set_worker(-1);
  req.set_wire_dtype(DT_BFLOAT16);
  auto pull_bf16 = [&ps, &req]() {
    std::vector<float> out;
    ps.StartPull(req, [&out](absl::Status st, ParameterServer::PullReply r) {
      REQUIRE(st.ok());
      REQUIRE(r.tensors.size() == 1);
      REQUIRE(r.tensors[0].bfloat16 != nullptr);
      for (uint16_t b : *r.tensors[0].bfloat16) out.push_back(Bfloat16ToFloat(b));
    });
    return out;
  };
  CHECK(pull_bf16() == std::vector<float>{0, 0, 0, 0});
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  REQUIRE(ps.Push(Grad(1, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(PullW(ps) == std::vector<float>{-2, -2, -2, -2});
  CHECK(pull_bf16() == std::vector<float>{-2, -2, -2, -2});
  for (int i = 0; i < 3; ++i) REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(pull_bf16() == std::vector<float>{-5, -5, -5, -5});
}

TEST_CASE("sync: a pull of the next version gets its partitions as soon as they are applied",
          "[ps][sync][pull]") {
  // Two partitions ("w" and "v"), one worker: "w"'s gradient closes "w"
  // while "v" still waits for its own.
  auto init = [](int64_t max_steps) {
    TrainingConfig config = BaseConfig(true, 1, 0, 1.0f);
    config.set_max_steps(max_steps);
    InitializeRequest req = InitRequest(config, 1, {0, 0, 0, 0});
    NamedTensor* v = req.add_variables();
    v->mutable_ref()->set_variable("v");
    ToProto({2}, std::vector<float>{10, 10}, v->mutable_tensor());
    return req;
  };
  auto pull = [](const std::string& variable, int64_t min_version) {
    PullRequest req;
    req.set_incarnation(kIncarnation);
    req.set_worker(0);
    req.set_min_version(min_version);
    req.set_timeout_ms(60000);
    if (!variable.empty()) req.add_refs()->set_variable(variable);
    return req;
  };
  struct Got {
    bool done = false;
    absl::Status status;
    ParameterServer::PullReply reply;
  };
  auto start = [](ParameterServer& ps, const PullRequest& req, Got* got) {
    ps.StartPull(req, [got](absl::Status st, ParameterServer::PullReply r) {
      got->done = true;
      got->status = std::move(st);
      got->reply = std::move(r);
    });
  };
  ParameterServer ps;
  REQUIRE(ps.Initialize(init(1000)).ok());
  Got w_next, v_next, all_next, w_now;
  start(ps, pull("w", 1), &w_next);  // parked before the gradient comes
  start(ps, pull("v", 1), &v_next);
  start(ps, pull("", 1), &all_next);
  CHECK(!w_next.done);
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}, "w"), &r).ok());
  CHECK(r.outcome() == ACCUMULATED);  // the step waits for "v"
  // "w" is final for version 1: its parked pull is answered now.
  REQUIRE(w_next.done);
  REQUIRE(w_next.status.ok());
  CHECK(w_next.reply.version == 1);
  CHECK(!w_next.reply.finished);
  REQUIRE(w_next.reply.tensors.size() == 1);
  CHECK(*w_next.reply.tensors[0].values == std::vector<float>{-1, -1, -1, -1});
  CHECK(!v_next.done);
  CHECK(!all_next.done);  // names "v" too
  // A pull arriving now gets it at once; one of the current version still
  // reads version 0.
  Got w_again;
  start(ps, pull("w", 1), &w_again);
  CHECK(w_again.done);
  CHECK(w_again.reply.version == 1);
  start(ps, pull("w", 0), &w_now);
  REQUIRE(w_now.done);
  CHECK(w_now.reply.version == 0);
  CHECK(*w_now.reply.tensors[0].values == std::vector<float>{0, 0, 0, 0});
  REQUIRE(ps.Push(Grad(0, 0, {1, 1}, "v", {2}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  REQUIRE(v_next.done);
  CHECK(v_next.reply.version == 1);
  CHECK(*v_next.reply.tensors[0].values == std::vector<float>{9, 9});
  REQUIRE(all_next.done);
  CHECK(all_next.reply.tensors.size() == 2);
  // The buffer served early is the one published.
  Got w_after;
  start(ps, pull("w", 1), &w_after);
  REQUIRE(w_after.done);
  CHECK(w_after.reply.tensors[0].values == w_next.reply.tensors[0].values);

  // The run's last step is never served early: its pulls say it finished.
  ParameterServer last;
  REQUIRE(last.Initialize(init(1)).ok());
  Got w_last;
  start(last, pull("w", 1), &w_last);
  REQUIRE(last.Push(Grad(0, 0, {1, 1, 1, 1}, "w"), &r).ok());
  CHECK(!w_last.done);
  REQUIRE(last.Push(Grad(0, 0, {1, 1}, "v", {2}), &r).ok());
  REQUIRE(w_last.done);
  CHECK(w_last.reply.finished);
  CHECK(w_last.reply.version == 1);
}

TEST_CASE("a parked pull ends at once on cancel, at its deadline, or on shutdown", "[ps][pull]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(true), 2)).ok());
  PullRequest req;
  req.set_incarnation(kIncarnation);
  req.set_worker(0);
  req.set_min_version(5);
  req.set_timeout_ms(60000);
  absl::Status got = absl::UnknownError("not yet");
  const uint64_t id = ps.StartPull(req, [&got](absl::Status st, ParameterServer::PullReply) {
    got = st;
  });
  REQUIRE(id != 0);
  CHECK(got.code() == absl::StatusCode::kUnknown);  // parked
  ps.CancelPull(id);
  CHECK(absl::IsCancelled(got));
  ps.CancelPull(id);  // a second cancel is a no-op

  absl::Notification timed_out;
  req.set_timeout_ms(20);
  ps.StartPull(req, [&](absl::Status st, ParameterServer::PullReply) {
    CHECK(absl::IsDeadlineExceeded(st));
    timed_out.Notify();
  });
  CHECK(timed_out.WaitForNotificationWithTimeout(absl::Seconds(10)));

  req.set_timeout_ms(60000);
  ps.StartPull(req, [&got](absl::Status st, ParameterServer::PullReply) { got = st; });
  ps.Shutdown();
  CHECK(absl::IsUnavailable(got));
}


TEST_CASE("sync deadline: with min_replicas a step goes on short at its deadline",
          "[ps][sync][deadline]") {
  // 3 workers, a quorum of all 3, at least 2 after 150 ms.
  TrainingConfig config = BaseConfig(true, 0, 0, 1.0f);
  config.mutable_sync()->set_step_deadline_ms(150);
  config.mutable_sync()->set_min_replicas(2);
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(config, 3, {0, 0, 0, 0})).ok());
  PushResponse r;
  const absl::Time start = absl::Now();
  REQUIRE(ps.Push(Grad(0, 0, {1, 2, 3, 4}), &r).ok());
  REQUIRE(ps.Push(Grad(2, 0, {3, 2, 1, 0}), &r).ok());
  CHECK(r.outcome() == ACCUMULATED);
  std::vector<float> w;
  REQUIRE(PullAt(ps, 1, 10000, &w).ok());
  const absl::Duration waited = absl::Now() - start;
  CHECK(waited >= absl::Milliseconds(140));
  CHECK(waited < absl::Seconds(5));
  CHECK(w == std::vector<float>{-2, -2, -2, -2});  // the mean of the two that came
  // The straggler's gradient for the passed step is dropped, not applied.
  REQUIRE(ps.Push(Grad(1, 0, {100, 100, 100, 100}), &r).ok());
  CHECK(r.outcome() == DROPPED_STALE);
  // The next step's clock starts with its own first gradient: a full quorum
  // completes it at once.
  for (int wk : {0, 1, 2}) REQUIRE(ps.Push(Grad(wk, 1, {3, 3, 3, 3}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  REQUIRE(PullAt(ps, 2, 1000, &w).ok());
  CHECK(w == std::vector<float>{-5, -5, -5, -5});
  auto c = ps.counters();
  CHECK(c.pushes_applied == 2 + 3);
}

TEST_CASE("sync deadline: without enough gradients the step fails, naming the missing workers",
          "[ps][sync][deadline]") {
  for (int min_replicas : {0, 2}) {  // 0: the full quorum of 2
    INFO("min_replicas " << min_replicas);
    TrainingConfig config = BaseConfig(true, 0, 0, 1.0f);
    config.mutable_sync()->set_step_deadline_ms(100);
    config.mutable_sync()->set_min_replicas(min_replicas);
    ParameterServer ps;
    REQUIRE(ps.Initialize(InitRequest(config, 2, {0, 0, 0, 0})).ok());
    PushResponse r;
    REQUIRE(ps.Push(Grad(0, 0, {1, 2, 3, 4}), &r).ok());
    const absl::Time start = absl::Now();
    absl::Status st = PullAt(ps, 1, 20000);
    CHECK(absl::Now() - start < absl::Seconds(5));  // at the deadline, not the pull's timeout
    CHECK(absl::IsDeadlineExceeded(st));
    CHECK(st.message().find("sync step 0 failed") != std::string::npos);
    CHECK(st.message().find("1 of the 2 gradients") != std::string::npos);
    CHECK(st.message().find("waiting on worker(s) 1") != std::string::npos);
    // The model is unchanged and readable at its version; the run is over:
    // later pushes and pulls of the failed step get the same error.
    std::vector<float> w;
    REQUIRE(PullAt(ps, 0, 100, &w).ok());
    CHECK(w == std::vector<float>{0, 0, 0, 0});
    CHECK(absl::IsDeadlineExceeded(ps.Push(Grad(1, 0, {1, 1, 1, 1}), &r)));
    CHECK(absl::IsDeadlineExceeded(PullAt(ps, 1, 100)));
  }
}

TEST_CASE("sync deadline on a server holding no partition", "[ps][sync][deadline]") {
  TrainingConfig config = BaseConfig(true, 0, 0, 1.0f);
  config.mutable_sync()->set_step_deadline_ms(100);
  config.mutable_sync()->set_min_replicas(1);
  ParameterServer ps;
  InitializeRequest req = InitRequest(config, 2);
  req.clear_variables();
  REQUIRE(ps.Initialize(req).ok());
  PushRequest empty = EmptyPush(0, 0);
  PushResponse r;
  REQUIRE(ps.Push(empty, &r).ok());
  CHECK(r.outcome() == ACCUMULATED);
  PullRequest pull;
  pull.set_incarnation(kIncarnation);
  pull.set_worker(0);
  pull.set_min_version(1);
  pull.set_timeout_ms(5000);
  PullResponse resp;
  REQUIRE(ps.Pull(pull, &resp).ok());
  CHECK(resp.version() == 1);
}

TEST_CASE("the server clips by value and schedules the learning rate", "[ps][optimizer]") {
  // Sync, one worker: lr 1 warmed up over 2 steps (0.5, then 1), each
  // element of the gradient clipped into [-1, 1].
  TrainingConfig config = BaseConfig(true, 0, 0, 1.0f);
  config.mutable_optimizer()->set_clip_value(1.0f);
  config.mutable_optimizer()->mutable_schedule()->set_warmup_steps(2);
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(config, 1, {0, 0, 0, 0})).ok());
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {10, -10, 0.5f, 0}), &r).ok());
  CHECK(PullW(ps) == std::vector<float>{-0.5f, 0.5f, -0.25f, 0});
  REQUIRE(ps.Push(Grad(0, 1, {10, -10, 0.5f, 0}), &r).ok());
  CHECK(PullW(ps) == std::vector<float>{-1.5f, 1.5f, -0.75f, 0});

  // Two workers: the mean is clipped, not each gradient.
  TrainingConfig two = BaseConfig(true, 0, 0, 1.0f);
  two.mutable_optimizer()->set_clip_value(1.0f);
  ParameterServer ps2;
  REQUIRE(ps2.Initialize(InitRequest(two, 2, {0, 0, 0, 0})).ok());
  REQUIRE(ps2.Push(Grad(0, 0, {3, -3, 0.5f, 1}), &r).ok());
  REQUIRE(ps2.Push(Grad(1, 0, {-2, 1, 0.5f, 0}), &r).ok());
  CHECK(PullW(ps2) == std::vector<float>{-0.5f, 1, -0.5f, -0.5f});
}

TEST_CASE("async: staleness-aware learning rate divides by the staleness", "[ps][async]") {
  TrainingConfig config = BaseConfig(false, 0, 0, 1.0f);
  config.mutable_async()->set_staleness_scaled_learning_rate(true);
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(config, 2, {0, 0, 0, 0})).ok());
  PushResponse r;
  // All computed from version 0: staleness 0, 1, 2, 4 (update 1, 2, 3, 5).
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());  // lr 1
  CHECK(PullW(ps) == std::vector<float>{-1, -1, -1, -1});
  REQUIRE(ps.Push(Grad(1, 0, {1, 1, 1, 1}), &r).ok());  // staleness 1: lr 1
  CHECK(PullW(ps) == std::vector<float>{-2, -2, -2, -2});
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());  // staleness 2: lr 1/2
  CHECK(PullW(ps) == std::vector<float>{-2.5f, -2.5f, -2.5f, -2.5f});
  REQUIRE(ps.Push(Grad(1, 3, {1, 1, 1, 1}), &r).ok());  // fresh: lr 1
  CHECK(PullW(ps) == std::vector<float>{-3.5f, -3.5f, -3.5f, -3.5f});
  REQUIRE(ps.Push(Grad(0, 0, {4, 4, 4, 4}), &r).ok());  // staleness 4: lr 1/4
  CHECK(PullW(ps) == std::vector<float>{-4.5f, -4.5f, -4.5f, -4.5f});
  // The staleness histogram saw 0, 1, 2, 0, 4 (buckets le 0, 1, 2, 3, 4, ...).
  const Histogram::Snapshot h = ps.staleness().Read();
  REQUIRE(h.cumulative.size() >= 5);
  CHECK(std::vector<uint64_t>(h.cumulative.begin(), h.cumulative.begin() + 5) ==
        std::vector<uint64_t>{2, 3, 4, 4, 5});
  CHECK(h.cumulative.back() == 5);
  CHECK(h.sum == 7);
  PsStatusResponse status;
  ps.GetStatus(&status);  // what the chief's TensorBoard points are made of
  CHECK(status.staleness_count() == 5);
  CHECK(status.staleness_sum() == 7);
  CHECK(status.learning_rate() == 1.0f);
  // Per partition: 5 pushes and 5 pulls of 16 bytes each, and some apply time.
  const std::vector<ParameterServer::PartitionStats> parts = ps.partition_stats();
  REQUIRE(parts.size() == 1);
  CHECK(parts[0].variable == "w");
  CHECK(parts[0].pushes == 5);
  CHECK(parts[0].pulls == 5);
  CHECK(parts[0].push_bytes == 80);
  CHECK(parts[0].pull_bytes == 80);
  CHECK(parts[0].apply_seconds > 0);
  CHECK(ps.apply_seconds().Read().cumulative.back() == 5);
}

TEST_CASE("sync: the quorum wait runs from a step's first gradient to its completion",
          "[ps][sync][metrics]") {
  ParameterServer ps;
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(true, 2), 2)).ok());
  PushResponse r;
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  absl::SleepFor(absl::Milliseconds(60));
  REQUIRE(ps.Push(Grad(1, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  REQUIRE(ps.Push(Grad(0, 1, {1, 1, 1, 1}), &r).ok());
  REQUIRE(ps.Push(Grad(1, 1, {1, 1, 1, 1}), &r).ok());
  const Histogram::Snapshot h = ps.quorum_wait_seconds().Read();
  CHECK(h.cumulative.back() == 2);
  CHECK(h.sum >= 0.06);
  CHECK(h.sum < 30);
  // One apply per step (one partition), and the step's gradients counted once each.
  CHECK(ps.apply_seconds().Read().cumulative.back() == 2);
  CHECK(ps.partition_stats().at(0).pushes == 4);
}

TEST_CASE("server-side Adam keeps its slots per partition across steps", "[ps][optimizer]") {
  // The server's three updates equal the optimizer's own on the averaged
  // gradient with counts 1, 2, 3; a second partition pushed only at step 2
  // counts its own updates (its first gets Adam's full first step).
  TrainingConfig config = BaseConfig(false, 0, 0, 0.01f);
  config.mutable_optimizer()->mutable_adam();
  REQUIRE(ValidateAndFillDefaults(&config, "test").ok());
  InitializeRequest req = InitRequest(config, 1, {1, 2, 3, 4});
  NamedTensor* b = req.add_variables();
  b->mutable_ref()->set_variable("b");
  ToProto({2}, {0, 0}, b->mutable_tensor());
  ParameterServer ps;
  absl::Status init = ps.Initialize(req);
  INFO(init.ToString());
  REQUIRE(init.ok());
  auto opt = CreateOptimizer(config.optimizer());
  REQUIRE(opt.ok());
  std::vector<float> want = {1, 2, 3, 4};
  OptimizerSlots slots;
  (*opt)->InitSlots(4, &slots);
  PushResponse r;
  for (int t = 0; t < 3; ++t) {
    const std::vector<float> g = {0.5f * t + 0.1f, -1, 2, 0.25f};
    REQUIRE(ps.Push(Grad(0, t, g), &r).ok());
    UpdateInfo u;
    u.learning_rate = 0.01f;
    u.count = t + 1;
    (*opt)->Apply(absl::MakeSpan(want), g, &slots, u);
  }
  PushRequest only_b = Grad(0, 3, {5, -5}, "b", {2});
  REQUIRE(ps.Push(only_b, &r).ok());
  PullRequest pull;
  pull.set_incarnation(kIncarnation);
  pull.set_worker(-1);
  PullResponse resp;
  REQUIRE(ps.Pull(pull, &resp).ok());
  std::map<std::string, std::vector<float>> got;
  for (const NamedTensor& nt : resp.tensors()) {
    got[nt.ref().variable()] = FromProto(nt.tensor())->values();
  }
  CHECK(got["w"] == want);
  REQUIRE(got["b"].size() == 2);
  CHECK(got["b"][0] == Approx(-0.01f).epsilon(1e-4));
  CHECK(got["b"][1] == Approx(0.01f).epsilon(1e-4));
}

TEST_CASE("Initialize refuses min_replicas above the quorum", "[ps][sync][deadline]") {
  TrainingConfig config = BaseConfig(true, 2, 0, 1.0f);
  config.mutable_sync()->set_step_deadline_ms(100);
  config.mutable_sync()->set_min_replicas(3);
  ParameterServer ps;
  CHECK(absl::IsInvalidArgument(ps.Initialize(InitRequest(config, 4))));
}


TEST_CASE("sync: the server says which workers the open step waits for", "[ps][sync][metrics]") {
  ParameterServer ps;
  CHECK(ps.SyncWaitingOn().empty());  // not initialised
  REQUIRE(ps.Initialize(InitRequest(BaseConfig(true, 0, 0, 1.0f), 2, {0, 0, 0, 0})).ok());
  CHECK(ps.SyncWaitingOn() == std::vector<bool>{true, true});
  PushResponse r;
  REQUIRE(ps.Push(Grad(1, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == ACCUMULATED);
  CHECK(ps.SyncWaitingOn() == std::vector<bool>{true, false});
  REQUIRE(ps.Push(Grad(0, 0, {1, 1, 1, 1}), &r).ok());
  CHECK(r.outcome() == APPLIED);
  CHECK(ps.SyncWaitingOn() == std::vector<bool>{true, true});  // the next step

  ParameterServer async;
  REQUIRE(async.Initialize(InitRequest(BaseConfig(false), 2)).ok());
  CHECK(async.SyncWaitingOn().empty());
}

}  // namespace
}  // namespace pstrain
