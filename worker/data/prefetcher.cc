#include "worker/data/prefetcher.h"

#include <new>

#include "absl/strings/str_cat.h"

namespace pstrain {

Prefetcher::Prefetcher(BatchSource* source, Allocator allocator)
    : source_(source), allocator_(std::move(allocator)) {}

absl::StatusOr<std::unique_ptr<Prefetcher>> Prefetcher::Create(BatchSource* source, int depth,
                                                               Allocator allocator) {
  if (depth < 1) return absl::InvalidArgumentError("prefetch depth must be at least 1");
  if (!allocator.alloc || !allocator.free) {
    allocator.alloc = [](size_t bytes) -> absl::StatusOr<void*> {
      void* p = ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(64), std::nothrow);
      if (p == nullptr)
        return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes));
      return p;
    };
    allocator.free = [](void* p) { ::operator delete(p, std::align_val_t(64)); };
  }
  std::unique_ptr<Prefetcher> p(new Prefetcher(source, std::move(allocator)));
  const size_t rows = static_cast<size_t>(source->batch_size());
  p->slots_.resize(depth);
  for (Slot& s : p->slots_) {
    absl::StatusOr<void*> x = p->allocator_.alloc(rows * source->dim() * sizeof(float));
    absl::StatusOr<void*> y = x.ok() ? p->allocator_.alloc(rows * sizeof(int32_t)) : x;
    if (!x.ok() || !y.ok()) {
      if (x.ok()) p->allocator_.free(*x);
      p->FreeSlots();
      const absl::Status& st = x.ok() ? y.status() : x.status();
      return absl::Status(st.code(), absl::StrCat("prefetch buffers: ", st.message()));
    }
    s.x = static_cast<float*>(*x);
    s.y = static_cast<int32_t*>(*y);
    s.ids.resize(rows * source->id_fields());
  }
  {
    absl::MutexLock lock(&p->mu_);
    p->consumed_ = source->cursor();
  }
  p->thread_ = std::thread([raw = p.get()] { raw->Produce(); });
  return p;
}

Prefetcher::~Prefetcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  source_->Cancel();  // a stream waiting for its next part
  if (thread_.joinable()) thread_.join();
  FreeSlots();
}

void Prefetcher::FreeSlots() {
  for (Slot& s : slots_) {
    if (s.x != nullptr) allocator_.free(s.x);
    if (s.y != nullptr) allocator_.free(s.y);
    s.x = nullptr;
    s.y = nullptr;
  }
}

void Prefetcher::Produce() {
  const int depth = static_cast<int>(slots_.size());
  for (;;) {
    int slot;
    {
      absl::MutexLock lock(&mu_);
      auto room = [this, depth]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || ready_ + (held_ ? 1 : 0) < depth;
      };
      mu_.Await(absl::Condition(&room));
      if (stop_) return;
      slot = next_in_;
    }
    // The slot is free: only this thread touches it until it is published.
    Slot& s = slots_[slot];
    s.start = source_->cursor();
    absl::Status st = source_->Next(s.x, s.y, s.ids.empty() ? nullptr : s.ids.data());
    s.end = source_->cursor();
    absl::MutexLock lock(&mu_);
    if (!st.ok()) {
      failed_ = std::move(st);
      return;
    }
    next_in_ = (next_in_ + 1) % depth;
    ++ready_;
  }
}

absl::Status Prefetcher::Next(absl::Duration timeout, Batch* batch) {
  absl::MutexLock lock(&mu_);
  if (held_) {
    return absl::FailedPreconditionError("Prefetcher::Next before the last batch was released");
  }
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return ready_ > 0 || !failed_.ok(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("no batch ready within ", absl::FormatDuration(timeout)));
  }
  if (ready_ == 0) return failed_;
  const Slot& s = slots_[next_out_];
  next_out_ = (next_out_ + 1) % static_cast<int>(slots_.size());
  --ready_;
  held_ = true;
  consumed_ = s.end;
  batch->x = s.x;
  batch->y = s.y;
  batch->rows = source_->batch_size();
  batch->dim = source_->dim();
  batch->ids = s.ids.empty() ? nullptr : s.ids.data();
  batch->id_fields = source_->id_fields();
  batch->start = s.start;
  batch->end = s.end;
  return absl::OkStatus();
}

void Prefetcher::Release() {
  absl::MutexLock lock(&mu_);
  held_ = false;
}

DataCursor Prefetcher::consumed_cursor() const {
  absl::MutexLock lock(&mu_);
  return consumed_;
}

}  // namespace pstrain
