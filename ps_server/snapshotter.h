// One parameter server's checkpoint shards: the cuts it takes (CutShard,
// while no apply runs), a thread of its own that writes them into
// ckpt-<step>/shard-<i>-of-<n> (shard_writer.h) while training goes on, and
// the outcome of each write, which GetShard waits for. In sync mode it also
// keeps the steps the chief asked a cut at (checkpoint.every_seconds).
//
// What it owns: the queue of cuts, the writer thread, the outcomes (the
// latest 16 steps), the scheduled steps and the write statistics, all under
// its own lock `mu_`. Who calls it: ParameterServer, which may hold its own
// lock while it calls (lock order: the server's, then this one's); the
// writer takes only `mu_`, and never while it writes, so a slow disk stalls
// no pull or push. A cut keeps its partitions' version buffers alive by
// reference until written; the server reuses a buffer only when nothing
// else references it.
#ifndef PSTRAIN_PS_SERVER_SNAPSHOTTER_H_
#define PSTRAIN_PS_SERVER_SNAPSHOTTER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/ps_service.pb.h"
#include "ps_server/server_model.h"
#include "ps_server/shard_writer.h"

namespace pstrain {

// How a cut saves the embedding rows: in full, or as a delta on the cut
// before (Snapshotter::PlanRows).
struct RowsPlan {
  int64_t base_step = -1;  // -1: in full
  std::map<std::string, uint32_t> base_generations;  // per table: what its cut ended
};

// Takes `model`'s partitions and table rows as they stand, for checkpoint
// `step` of run `incarnation`, with `cursors` (one per worker), the rows as
// `plan` says (in full when a table has no base generation). The caller
// sees to it that no apply runs meanwhile (sync: a step boundary; async:
// pushes held): the values are the current buffers themselves (never
// recycled while referenced) and the slots and rows are copied. The copy is
// the save's pause of the server, recorded in pause_seconds. Each table's
// generation ends here.
std::unique_ptr<ShardSnapshot> CutShard(const ServerModel& model, int64_t step,
                                        uint64_t incarnation,
                                        const std::vector<StepCursor>& cursors,
                                        const RowsPlan& plan = {});

class Snapshotter {
 public:
  // Shards written (or failed) so far, for the server's metrics.
  struct Stats {
    int64_t written = 0;
    int64_t failed = 0;
    int64_t bytes = 0;             // of the last shard written
    double seconds = 0;            // writing it
    double pause_seconds = 0;      // taking its snapshot
    double last_success_unix = 0;  // when it was written (0: never)
  };

  Snapshotter();
  // Stop()s, and joins the writer.
  ~Snapshotter();
  Snapshotter(const Snapshotter&) = delete;
  Snapshotter& operator=(const Snapshotter&) = delete;

  // A new run: cuts and outcomes from now on are `incarnation`'s; earlier
  // ones are dropped (a shard of the run before still being written is
  // dropped when done), and so are scheduled steps and a failure.
  void Reset(uint64_t incarnation);

  // Incremental rows (checkpoint.full_every = `full_every` > 1): a cut of
  // `step` is a delta on this run's cut before it, unless there is none,
  // a write since the last full cut failed, the chain has `full_every` links
  // already, or `step` is `last_step` (a run's last checkpoint stands
  // alone). Each server's chain is its own sequence of cuts: a delta's
  // writer fails it when the cut it rests on was not written.
  RowsPlan PlanRows(int64_t step, int full_every, int64_t last_step) const;

  // Queues a cut for the writer.
  void Enqueue(std::unique_ptr<ShardSnapshot> snap);
  // Whether `step` was cut already (queued or written).
  bool Taken(int64_t step) const;

  // Sync: asks for a cut at the boundary of `step` (at most 64 pending).
  absl::Status Schedule(int64_t step);
  // Sync: whether a cut was scheduled at `version` (just reached); forgets
  // it and any scheduled before it.
  bool TakeScheduled(int64_t version);

  // Steps after `version` will never be cut (a sync step failed at its
  // deadline): GetShard for them ends with `why` at once. Called again
  // when the version still moves (a step that was applying completes).
  void FailAfter(int64_t version, absl::Status why);
  // The server shut down: every wait ends with UNAVAILABLE.
  void Close();
  // Close()s, and stops the writer: a shard being written is finished,
  // queued ones are not (the server is going away).
  void Stop();

  // Waits until the shard of `step` (of run `incarnation`) is written or
  // failed, at most `timeout`, and returns its description or why there is
  // none: DEADLINE_EXCEEDED when the time ran out, FAILED_PRECONDITION when
  // another run replaced `incarnation`, UNAVAILABLE once closed, the
  // failure of FailAfter, the write's own error, or, at once, NOT_FOUND for
  // a step at or before the oldest outcome forgotten (only the newest
  // kKeepOutcomes are kept: a chief that fell further behind than that would
  // otherwise wait out its timeout for each, for a shard that cannot come). `*timed_out` (when
  // given) says whether it was the wait's own deadline.
  absl::StatusOr<GetShardResponse> Await(uint64_t incarnation, int64_t step, absl::Duration timeout,
                                         bool* timed_out = nullptr);

  Stats stats() const;

  // How many written shards' outcomes are kept for GetShard.
  static constexpr size_t kKeepOutcomes = 16;

 private:
  static constexpr size_t kMaxScheduled = 64;

  void WriterLoop();

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  // FailAfter's: steps after `failed_after_` end with `failure_`.
  int64_t failed_after_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> scheduled_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<ShardSnapshot>> queue_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, absl::StatusOr<GetShardResponse>> written_ ABSL_GUARDED_BY(mu_);
  // The step of this run the writer is writing (-1: none): taken, though
  // neither queued nor written.
  int64_t writing_ ABSL_GUARDED_BY(mu_) = -1;
  // The newest step whose outcome was dropped from written_ (-1: none).
  // Cuts are written in step order, so no step up to it is still to come.
  int64_t forgotten_through_ ABSL_GUARDED_BY(mu_) = -1;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // The rows' chain, on the cutting side: the last cut of this run (its
  // step, each table's generation, its links counting the full one), and
  // the step of the last full cut; `chain_broken_`: a write since failed.
  struct LastCut {
    int64_t step = -1;
    std::map<std::string, uint32_t> generations;
    int links = 0;
  };
  std::optional<LastCut> last_cut_ ABSL_GUARDED_BY(mu_);
  int64_t last_full_cut_ ABSL_GUARDED_BY(mu_) = -1;
  bool chain_broken_ ABSL_GUARDED_BY(mu_) = false;
  // On the writing side: the last cut written, with every link of its chain
  // (its own included) as the manifest lists them.
  struct WrittenChain {
    int64_t step = -1;
    std::vector<CheckpointRows> links;
  };
  std::optional<WrittenChain> written_chain_ ABSL_GUARDED_BY(mu_);
  std::thread writer_;
};

}  // namespace pstrain

#endif  // PSTRAIN_PS_SERVER_SNAPSHOTTER_H_
