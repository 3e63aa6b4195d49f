// Parked pulls on their own: ids, the order waiters are served in, and the
// four ways a parked pull ends (ready, cancelled, out of time, all at once).
#include "ps_server/parked_pulls.h"

#include <string>
#include <vector>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

PullRequest Wants(int64_t version, int worker = 0) {
  PullRequest r;
  r.set_min_version(version);
  r.set_worker(worker);
  return r;
}

// Parks a pull whose callback appends `name` (and its outcome) to `log`.
uint64_t Park(ParkedPulls* parked, std::vector<std::string>* log, const std::string& name,
              int64_t version, absl::Time deadline, bool rows = false) {
  return parked->Park(
      Wants(version), deadline, rows, [log, name](absl::Status st, PullReply reply) {
        log->push_back(name + ":" +
                       (st.ok() ? std::to_string(reply.version)
                                : std::string(absl::StatusCodeToString(st.code()))));
      });
}

void Run(std::vector<PullCompletion>* done) {
  for (PullCompletion& c : *done) c.done(std::move(c.status), std::move(c.reply));
  done->clear();
}

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST_CASE("parked pulls: ready ones are served in the order they came, the rest stay",
          "[ps][parked]") {
  ParkedPulls parked;
  std::vector<std::string> log;
  const uint64_t a = Park(&parked, &log, "a", 3, kT0);
  const uint64_t b = Park(&parked, &log, "b", 1, kT0);
  const uint64_t c = Park(&parked, &log, "c", 2, kT0);
  CHECK(a != 0);
  CHECK((a != b && b != c && a != c));
  CHECK(parked.size() == 3);
  // Version 2 is there: b and c, in the order they were parked.
  std::vector<PullCompletion> done;
  std::vector<int64_t> asked;
  parked.TakeReady(
      [&asked](const ParkedPulls::Waiter& w, absl::Status*, PullReply* reply) {
        asked.push_back(w.request.min_version());
        if (w.request.min_version() > 2) return false;
        reply->version = 2;
        return true;
      },
      &done);
  CHECK(asked == std::vector<int64_t>{3, 1, 2});
  CHECK(log.empty());  // nothing runs inside: the caller runs them
  Run(&done);
  CHECK(log == std::vector<std::string>{"b:2", "c:2"});
  CHECK(parked.size() == 1);
}

TEST_CASE("parked pulls: a cancelled pull ends once, with the reason given", "[ps][parked]") {
  ParkedPulls parked;
  std::vector<std::string> log;
  const uint64_t a = Park(&parked, &log, "a", 1, kT0);
  std::vector<PullCompletion> done;
  CHECK(parked.Cancel(a, absl::CancelledError("pull cancelled"), &done));
  CHECK_FALSE(parked.Cancel(a, absl::CancelledError("again"), &done));
  CHECK_FALSE(parked.Cancel(12345, absl::CancelledError("never parked"), &done));
  Run(&done);
  CHECK(log == std::vector<std::string>{"a:CANCELLED"});
  CHECK(parked.size() == 0);
}

TEST_CASE("parked pulls: a pull ends at its deadline with the error the server words",
          "[ps][parked]") {
  ParkedPulls parked;
  std::vector<std::string> log;
  CHECK(parked.EarliestDeadline() == absl::InfiniteFuture());
  Park(&parked, &log, "late", 1, kT0 + absl::Seconds(5));
  Park(&parked, &log, "soon", 1, kT0 + absl::Seconds(1), /*rows=*/true);
  CHECK(parked.EarliestDeadline() == kT0 + absl::Seconds(1));
  std::vector<PullCompletion> done;
  std::vector<bool> rows;
  auto why = [&rows](const ParkedPulls::Waiter& w) {
    rows.push_back(w.rows);
    return absl::DeadlineExceededError("waited");
  };
  parked.TakeExpired(kT0, why, &done);  // nothing due yet
  CHECK(done.empty());
  parked.TakeExpired(kT0 + absl::Seconds(1), why, &done);  // at the deadline: due
  Run(&done);
  CHECK(log == std::vector<std::string>{"soon:DEADLINE_EXCEEDED"});
  CHECK(rows == std::vector<bool>{true});
  CHECK(parked.EarliestDeadline() == kT0 + absl::Seconds(5));
}

TEST_CASE("parked pulls: a new run or a shutdown ends every waiter", "[ps][parked]") {
  ParkedPulls parked;
  std::vector<std::string> log;
  Park(&parked, &log, "a", 1, kT0);
  Park(&parked, &log, "b", 2, kT0);
  std::vector<PullCompletion> done;
  parked.TakeAll(absl::UnavailableError("shutting down"), &done);
  CHECK(parked.size() == 0);
  CHECK(parked.EarliestDeadline() == absl::InfiniteFuture());
  Run(&done);
  CHECK(log == std::vector<std::string>{"a:UNAVAILABLE", "b:UNAVAILABLE"});
}

}  // namespace
}  // namespace pstrain
