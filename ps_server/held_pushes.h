// Async pushes in parts: each worker's multi-part push being received (one
// at a time: a part of a later push drops it; a part of an earlier one, or
// of a push dropped, is refused). Its parts are applied as they come; this
// holds only their bookkeeping. A dropped push stays, marked, until the
// worker's next push, so that its late parts are refused. A push whose
// parts stop coming is overdue after the worker's push deadline (no part of
// it can still come) and is dropped, so that no checkpoint cut waits for it.
//
// What it owns: one Push per worker and the push ids. Who calls it:
// ParameterServer only, under its lock (the member is guarded by
// ParameterServer::mu_); thread-compatible. The server keeps the count of
// admitted pushes: Drop says when a push gives its admission back.
#ifndef PSTRAIN_PS_SERVER_HELD_PUSHES_H_
#define PSTRAIN_PS_SERVER_HELD_PUSHES_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/ps_service.pb.h"
#include "ps_server/optimizer.h"
#include "ps_server/server_model.h"

namespace pstrain {

class HeldPushes {
 public:
  struct Push {
    uint64_t id = 0;  // 0: none; else unique per push
    int32_t session = 0;
    int64_t step = 0;
    uint64_t seq = 0;    // PushRequest.push_seq
    absl::Time started;  // its first part's arrival
    int num_parts = 0;
    std::vector<char> got;  // per part
    std::set<const PartitionState*> partitions;
    bool finished = false;  // admitted past max_steps: each part answered FINISHED
    UpdateInfo update;      // its rate (count set per partition)
    int applied = 0;        // parts applied
    // Why it takes no more parts (complete, or dropped); empty while open.
    std::string closed;

    bool open() const { return id != 0 && closed.empty(); }
    int parts_in() const;
  };

  // A new run of `num_workers` workers: nothing held.
  void Reset(int num_workers);
  int num_workers() const { return static_cast<int>(pushes_.size()); }
  Push& of(int w) { return pushes_[w]; }
  const Push& of(int w) const { return pushes_[w]; }

  // Whether `header` is a part of worker `w`'s current push.
  bool IsPartOf(int w, const PushRequest& header) const;
  // Whether `header` belongs to a push that came before `w`'s current one
  // (an earlier session, step or push_seq): a late part.
  bool IsEarlier(int w, const PushRequest& header) const;
  // Starts worker `w`'s next push from the first of its parts to arrive
  // (the one before is closed or dropped); `finished`: admitted past
  // max_steps. Returns it.
  Push& Start(int w, const PushRequest& header, absl::Time now, bool finished, UpdateInfo update);
  // Closes `w`'s push as complete.
  void Complete(int w) { pushes_[w].closed = "it is complete"; }
  // Closes `w`'s open push as dropped, saying why (its parts applied so far
  // stay in the model: each partition's update is whole, the push's is
  // not). Returns whether it gave back an admission never to be counted (it
  // was open and not finished); false, changing nothing, when none is open.
  bool Drop(int w, std::string why);

  // When the next open push passes `ttl` (InfiniteFuture: none).
  absl::Time NextExpiry(absl::Duration ttl) const;
  // The workers whose open push is older than `ttl` at `now`. `throttled`
  // (from a part) looks at most once per min(ttl, 1 s), so a part costs no
  // walk over every worker; the server's timer also asks at NextExpiry.
  std::vector<int> Overdue(absl::Time now, absl::Duration ttl, bool throttled);

 private:
  std::vector<Push> pushes_;
  uint64_t next_id_ = 1;
  absl::Time checked_ = absl::InfinitePast();
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_HELD_PUSHES_H_
