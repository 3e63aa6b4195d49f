#include "ps_server/snapshotter.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"

namespace pstrain {

std::unique_ptr<ShardSnapshot> CutShard(const ServerModel& model, int64_t step,
                                        uint64_t incarnation,
                                        const std::vector<StepCursor>& cursors,
                                        const RowsPlan& plan) {
  const absl::Time start = absl::Now();
  auto snap = std::make_unique<ShardSnapshot>();
  snap->step = step;
  snap->incarnation = incarnation;
  snap->dir = JoinPath(model.checkpoint_dir, CheckpointDirName(step));
  snap->shard = model.shard;
  snap->num_shards = model.num_shards;
  snap->slot_names = model.optimizer->slot_names();
  for (const auto& [key, p] : model.partitions) {
    ShardSnapshot::Part part;
    part.variable = key.first;
    part.partition = key.second;
    part.shape = p->shape;
    {
      absl::MutexLock lock(&p->mu);
      part.values = p->current;
    }
    {
      absl::MutexLock lock(&p->apply_mu);
      part.slots = p->slots;
      part.updates = p->updates;
    }
    snap->parts.push_back(std::move(part));
  }
  // Rows are copied shard by shard of each table (no row update runs: sync
  // applies rows at the step's end, async row pushes are held too).
  bool delta = plan.base_step >= 0 && !model.tables.empty();
  for (const auto& [name, t] : model.tables) delta = delta && plan.base_generations.count(name);
  snap->rows_base_step = delta ? plan.base_step : -1;
  for (const auto& [name, t] : model.tables) {
    ShardSnapshot::TableRows rows;
    rows.table = name;
    rows.dim = t->rows->dim();
    rows.optimizer = t->optimizer_kind;
    rows.slot_names = t->optimizer->slot_names();
    rows.generation = t->rows->EndGeneration();
    // Ids dropped before the base are in no save to come: this one rests
    // on the base, later ones on this one (or are full).
    const uint32_t base = delta ? plan.base_generations.at(name) : rows.generation;
    absl::StatusOr<EmbeddingTable::SavedRows> cut = t->rows->CutRows(delta ? base : 0);
    if (!cut.ok()) {
      snap->rows_error = cut.status();
      continue;
    }
    rows.rows = std::move(cut->rows);
    rows.on_disk = std::move(cut->on_disk);
    t->rows->ForgetDeletedThrough(base);
    snap->tables.push_back(std::move(rows));
  }
  for (size_t w = 0; w < cursors.size(); ++w) {
    if (!cursors[w].set) continue;
    WorkerCursor c;
    c.set_worker(static_cast<int>(w));
    c.set_epoch(cursors[w].epoch);
    c.set_position(cursors[w].position);
    snap->cursors.push_back(std::move(c));
  }
  snap->pause_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return snap;
}

Snapshotter::Snapshotter() : writer_([this] { WriterLoop(); }) {}

Snapshotter::~Snapshotter() {
  Stop();
  writer_.join();
}

void Snapshotter::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  closed_ = true;
}

void Snapshotter::Reset(uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  incarnation_ = incarnation;
  failed_after_ = 0;
  failure_ = absl::OkStatus();
  scheduled_.clear();
  queue_.clear();
  written_.clear();
  writing_ = -1;
  forgotten_through_ = -1;
  last_cut_.reset();
  last_full_cut_ = -1;
  chain_broken_ = false;
  written_chain_.reset();
}

RowsPlan Snapshotter::PlanRows(int64_t step, int full_every, int64_t last_step) const {
  absl::MutexLock lock(&mu_);
  RowsPlan plan;
  if (full_every <= 1 || step == last_step || !last_cut_.has_value() || chain_broken_ ||
      last_cut_->links >= full_every || last_cut_->step >= step) {
    return plan;
  }
  plan.base_step = last_cut_->step;
  plan.base_generations = last_cut_->generations;
  return plan;
}

void Snapshotter::Enqueue(std::unique_ptr<ShardSnapshot> snap) {
  absl::MutexLock lock(&mu_);
  if (snap->incarnation == incarnation_) {
    LastCut cut;
    cut.step = snap->step;
    for (const ShardSnapshot::TableRows& t : snap->tables) cut.generations[t.table] = t.generation;
    const bool delta = snap->rows_base_step >= 0;
    cut.links = delta && last_cut_.has_value() ? last_cut_->links + 1 : 1;
    if (!delta) {
      last_full_cut_ = snap->step;
      chain_broken_ = false;
    }
    last_cut_ = std::move(cut);
  }
  queue_.push_back(std::move(snap));
}

bool Snapshotter::Taken(int64_t step) const {
  absl::MutexLock lock(&mu_);
  return written_.count(step) != 0 || writing_ == step ||
         std::any_of(queue_.begin(), queue_.end(),
                     [step](const auto& s) { return s->step == step; });
}

absl::Status Snapshotter::Schedule(int64_t step) {
  absl::MutexLock lock(&mu_);
  if (scheduled_.size() >= kMaxScheduled) {
    return absl::ResourceExhaustedError(
        absl::StrCat("Snapshot: ", kMaxScheduled, " cuts are scheduled already"));
  }
  scheduled_.insert(step);
  return absl::OkStatus();
}

bool Snapshotter::TakeScheduled(int64_t version) {
  absl::MutexLock lock(&mu_);
  const bool scheduled = scheduled_.erase(version) > 0;
  // Passed ones (cannot happen: steps complete one at a time).
  while (!scheduled_.empty() && *scheduled_.begin() < version) scheduled_.erase(scheduled_.begin());
  return scheduled;
}

void Snapshotter::FailAfter(int64_t version, absl::Status why) {
  absl::MutexLock lock(&mu_);
  failed_after_ = version;
  failure_ = std::move(why);
}

void Snapshotter::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

absl::StatusOr<GetShardResponse> Snapshotter::Await(uint64_t incarnation, int64_t step,
                                                    absl::Duration timeout, bool* timed_out) {
  if (timed_out != nullptr) *timed_out = false;
  absl::MutexLock lock(&mu_);
  auto ended = [this, incarnation, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || incarnation_ != incarnation || written_.count(step) != 0 ||
           step <= forgotten_through_ || (!failure_.ok() && step > failed_after_);
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ended), timeout)) {
    if (timed_out != nullptr) *timed_out = true;
    return absl::DeadlineExceededError(absl::StrCat("GetShard: no shard for step ", step, " after ",
                                                    absl::FormatDuration(timeout)));
  }
  if (closed_) return absl::UnavailableError("parameter server is shutting down");
  if (incarnation_ != incarnation) {
    return absl::FailedPreconditionError("parameter server re-initialized");
  }
  auto it = written_.find(step);
  if (it == written_.end() && step <= forgotten_through_) {
    return absl::NotFoundError(absl::StrCat(
        "GetShard: no outcome kept for step ", step, ": this server keeps its newest ",
        kKeepOutcomes, " shards' (through step ", written_.rbegin()->first,
        "), and step ", step, " is older than those or was never cut"));
  }
  if (it == written_.end()) return failure_;
  return it->second;
}

Snapshotter::Stats Snapshotter::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Snapshotter::WriterLoop() {
  auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(&work));
    if (stopping_) return;
    std::unique_ptr<ShardSnapshot> snap = std::move(queue_.front());
    queue_.erase(queue_.begin());
    // Still taken while written (its incarnation's: a Reset meanwhile
    // makes it another run's).
    writing_ = snap->incarnation == incarnation_ ? snap->step : -1;
    // A delta rests on the cut before it, written just before (cuts are
    // written in order): its links are that one's chain.
    absl::Status unwritten_base;
    if (snap->rows_base_step >= 0) {
      if (snap->incarnation == incarnation_ && written_chain_.has_value() &&
          written_chain_->step == snap->rows_base_step) {
        snap->rows_chain = written_chain_->links;
      } else {
        unwritten_base = absl::FailedPreconditionError(absl::StrCat(
            "checkpoint step ", snap->step, ": its embedding rows are a delta on step ",
            snap->rows_base_step, ", whose shard was not written; the next save writes them "
            "in full"));
        LOG_WARN("{}", unwritten_base.message());
      }
    }
    mu_.Unlock();
    const absl::Time start = absl::Now();
    absl::StatusOr<GetShardResponse> result =
        !snap->rows_error.ok()  ? absl::StatusOr<GetShardResponse>(snap->rows_error)
        : unwritten_base.ok() ? WriteShardSnapshot(*snap)
                              : unwritten_base;
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    const int64_t step = snap->step;
    const uint64_t incarnation = snap->incarnation;
    const double pause = snap->pause_seconds;
    snap.reset();  // drops the version buffers before retaking the lock
    mu_.Lock();
    writing_ = -1;
    if (incarnation == incarnation_) {
      if (result.ok()) {
        WrittenChain chain;
        chain.step = step;
        for (CheckpointRows r : result->rows()) {
          if (r.checkpoint().empty()) r.set_checkpoint(CheckpointDirName(step));
          chain.links.push_back(std::move(r));
        }
        written_chain_ = std::move(chain);
      } else {
        written_chain_.reset();
        // The chain being cut rests on this one: the next cut is full.
        if (step >= last_full_cut_) chain_broken_ = true;
      }
    }
    if (result.ok()) {
      ++stats_.written;
      stats_.bytes = result->bytes();
      stats_.seconds = seconds;
      stats_.pause_seconds = pause;
      stats_.last_success_unix = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    } else {
      ++stats_.failed;
    }
    // A shard of a run that was re-initialized meanwhile is not this run's.
    if (incarnation == incarnation_) written_.insert_or_assign(step, std::move(result));
    while (written_.size() > kKeepOutcomes) {
      forgotten_through_ = std::max(forgotten_through_, written_.begin()->first);
      written_.erase(written_.begin());
    }
  }
}

}  // namespace pstrain
