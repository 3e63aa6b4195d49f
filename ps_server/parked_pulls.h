// Pulls that wait, parked: a pull whose version (or, async, whose worker's
// own push or the staleness bound) is not there yet waits here with its
// callback, holding no thread, until the server finds it ready, its
// deadline passes, it is cancelled, or the run ends. Each waiter has an id
// (for CancelPull); the server decides readiness and takes what is ready.
//
// What it owns: the waiters and their ids. Who calls it: ParameterServer
// only, under its lock (the member is guarded by ParameterServer::mu_);
// thread-compatible. Callbacks are never run here: the Take* methods move
// them out, with their outcome, as Completions the server runs after it
// lets go of its lock.
#ifndef PSTRAIN_PS_SERVER_PARKED_PULLS_H_
#define PSTRAIN_PS_SERVER_PARKED_PULLS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/ps_service.pb.h"

namespace pstrain {

// A pulled partition: `values` is the version buffer itself, kept alive by
// the reference until the caller (the RPC that sends it) drops it. When the
// pull asked for DT_BFLOAT16, `bfloat16` holds that version rounded
// (converted once per version and shared by every such pull).
struct PulledTensor {
  std::string variable;
  int partition = 0;
  std::vector<int64_t> shape;
  std::shared_ptr<const std::vector<float>> values;
  std::shared_ptr<const std::vector<uint16_t>> bfloat16;
  void* source = nullptr;  // server-internal: the partition
};

struct PullReply {
  int64_t version = 0;
  bool finished = false;
  bool bfloat16 = false;  // the pull asked for DT_BFLOAT16
  std::vector<PulledTensor> tensors;
};

using PullCallback = std::function<void(absl::Status, PullReply)>;

// A pull's callback with its outcome, to run outside the server's lock.
struct PullCompletion {
  PullCallback done;
  absl::Status status;
  PullReply reply;
};

class ParkedPulls {
 public:
  struct Waiter {
    PullRequest request;
    absl::Time deadline;
    // A row pull waiting for its version: its reply carries the version,
    // not the partitions (its rows are looked up once it is ready).
    bool rows = false;
  };

  // Parks `done` until `deadline`; returns its id (never 0).
  uint64_t Park(PullRequest request, absl::Time deadline, bool rows, PullCallback done);

  // Ends waiter `id` with `why`; false when it is not parked (it ended).
  bool Cancel(uint64_t id, absl::Status why, std::vector<PullCompletion>* out);

  // Asks `serve` about each waiter, in the order they were parked: a waiter
  // it answers (true, filling the status and reply) ends with that answer;
  // one it leaves (false) stays parked.
  using ServeFn = std::function<bool(const Waiter&, absl::Status*, PullReply*)>;
  void TakeReady(const ServeFn& serve, std::vector<PullCompletion>* out);

  // Ends every waiter whose deadline is at or before `now`, with the error
  // `why` gives it.
  void TakeExpired(absl::Time now, const std::function<absl::Status(const Waiter&)>& why,
                   std::vector<PullCompletion>* out);

  // Ends every waiter with `why` (a new run, or a shutdown).
  void TakeAll(const absl::Status& why, std::vector<PullCompletion>* out);

  // The earliest deadline of a parked waiter (InfiniteFuture: none).
  absl::Time EarliestDeadline() const;
  size_t size() const { return waiters_.size(); }

 private:
  struct Parked {
    Waiter waiter;
    PullCallback done;
  };
  uint64_t next_id_ = 1;
  std::map<uint64_t, Parked> waiters_;  // by id: the order they were parked
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_PARKED_PULLS_H_
