#include "ps_server/apply.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/bfloat16.h"
#include "common/base/tensor.h"

namespace pstrain {
namespace {

// Times one partition's apply into its total and the server's histogram.
class ApplyTimer {
 public:
  ApplyTimer(std::atomic<int64_t>* nanos, Histogram* seconds)
      : nanos_(nanos), seconds_(seconds), start_(std::chrono::steady_clock::now()) {}
  ~ApplyTimer() {
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - start_)
                           .count();
    nanos_->fetch_add(ns, std::memory_order_relaxed);
    seconds_->Observe(static_cast<double>(ns) * 1e-9);
  }
  ApplyTimer(const ApplyTimer&) = delete;
  ApplyTimer& operator=(const ApplyTimer&) = delete;

 private:
  std::atomic<int64_t>* const nanos_;
  Histogram* const seconds_;
  const std::chrono::steady_clock::time_point start_;
};

// Elements per apply chunk: the summed or copied gradient of one chunk stays
// in L1 while the optimizer consumes it.
constexpr int64_t kChunk = 2048;

// The version a partition's update reads (`in`) and a spare buffer it
// writes the next one into (`out`); `apply_mu` held by the caller.
struct UpdateBuffers {
  PartitionState::Buffer in, out;
};
UpdateBuffers TakeUpdateBuffers(PartitionState* p) {
  absl::MutexLock lock(&p->mu);
  return {p->current, p->TakeSpareLocked()};
}

// Walks gradient `g`'s elements a chunk at a time: each run of the
// received bytes is moved (bfloat16 widened) into `chunk`, aligned and in
// L1, and `apply(at, n, chunk)` takes elements [at, at + n).
template <typename F>
void ForEachChunk(const GradientRef& g, std::array<float, kChunk>* chunk, F apply) {
  int64_t at = 0;  // element of the partition
  g.bytes->ForEachRun(g.offset, g.partition->size, g.bfloat16 ? 2 : 4,
                      [&](const char* src, int64_t n) {
                        for (int64_t i = 0; i < n;) {
                          const int64_t m = std::min(kChunk, n - i);
                          if (g.bfloat16) {
                            Bfloat16ToFloats(src + 2 * i, m, chunk->data());
                          } else {
                            std::memcpy(chunk->data(), src + 4 * i, 4 * m);
                          }
                          apply(at, m, chunk->data());
                          at += m;
                          i += m;
                        }
                      });
}

}  // namespace

absl::Status LocateGradients(const ServerModel& model, const PushRequest& header,
                             const SegmentedBytes* frame,
                             const std::vector<SegmentedBytes>* contents,
                             std::vector<GradientRef>* grads) {
  grads->clear();
  grads->reserve(header.gradients_size());
  int64_t offset = 0;
  for (int i = 0; i < header.gradients_size(); ++i) {
    const NamedTensor& nt = header.gradients(i);
    const PartitionKey key{nt.ref().variable(), nt.ref().partition()};
    auto it = model.partitions.find(key);
    if (it == model.partitions.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown variable partition ", PartitionKeyString(key)));
    }
    PartitionState* p = it->second.get();
    const TensorProto& t = nt.tensor();
    if ((t.dtype() != DT_FLOAT && t.dtype() != DT_BFLOAT16) || t.row_ids_size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat("gradient for ", PartitionKeyString(key),
                                                     ": expected dense DT_FLOAT or DT_BFLOAT16"));
    }
    const bool bf16 = t.dtype() == DT_BFLOAT16;
    if (!std::equal(t.shape().begin(), t.shape().end(), p->shape.begin(), p->shape.end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient for ", PartitionKeyString(key), " has shape [", absl::StrJoin(t.shape(), ","),
          "], variable has [", absl::StrJoin(p->shape, ","), "]"));
    }
    const int64_t bytes = p->size * (bf16 ? 2 : 4);
    if (frame != nullptr) {
      if (!t.content().empty()) {
        return absl::InvalidArgumentError(absl::StrCat("gradient for ", PartitionKeyString(key),
                                                       ": content inside a frame header"));
      }
      if (frame->size() - offset < bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("gradient for ", PartitionKeyString(key), ": payload ends ",
                         bytes - (frame->size() - offset), " bytes short"));
      }
      grads->push_back({p, frame, offset, bf16});
      offset += bytes;
    } else {
      if (static_cast<int64_t>(t.content().size()) != bytes) {
        return absl::InvalidArgumentError(absl::StrCat("gradient for ", PartitionKeyString(key),
                                                       ": content is ", t.content().size(),
                                                       " bytes; shape needs ", bytes));
      }
      grads->push_back({p, &(*contents)[i], 0, bf16});
    }
    for (size_t j = 0; j + 1 < grads->size(); ++j) {
      if ((*grads)[j].partition == p) {
        return absl::InvalidArgumentError(
            absl::StrCat("duplicate gradient for ", PartitionKeyString(key)));
      }
    }
  }
  if (frame != nullptr && offset != frame->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("push payload has ", frame->size() - offset, " bytes beyond its gradients"));
  }
  return absl::OkStatus();
}

bool AllFinite(const GradientRef& g) {
  bool finite = true;
  g.bytes->ForEachRun(
      g.offset, g.partition->size, g.bfloat16 ? 2 : 4, [&finite, &g](const char* p, int64_t n) {
        finite = finite && (g.bfloat16 ? AllFiniteBfloat16(p, n) : AllFiniteUnaligned(p, n));
      });
  return finite;
}

const GradientRef* FirstNonFinite(const std::vector<GradientRef>& grads) {
  for (const GradientRef& g : grads) {
    if (!AllFinite(g)) return &g;
  }
  return nullptr;
}

namespace {

// The L2 norm of `g`, summed in double.
double GradientNorm(const GradientRef& g) {
  double sum = 0;
  g.bytes->ForEachRun(g.offset, g.partition->size, g.bfloat16 ? 2 : 4,
                      [&sum, &g](const char* p, int64_t n) {
                        for (int64_t i = 0; i < n; ++i) {
                          uint16_t b;
                          const double v =
                              g.bfloat16 ? (std::memcpy(&b, p + 2 * i, 2), Bfloat16ToFloat(b))
                                         : LoadFloat(p, i);
                          sum += v * v;
                        }
                      });
  return std::sqrt(sum);
}

// The L2 norm of the partition's current values (a version buffer, which
// no update writes while it is referenced).
double ValuesNorm(PartitionState* p) {
  PartitionState::Buffer values;
  {
    absl::MutexLock lock(&p->mu);
    values = p->current;
  }
  double sum = 0;
  if (values != nullptr) {
    for (float v : *values) sum += static_cast<double>(v) * v;
  }
  return std::sqrt(sum);
}

}  // namespace

OverBound FirstOverBound(const ServerModel& model, const std::vector<GradientRef>& grads) {
  if (model.max_gradient_norm <= 0 && model.max_relative_gradient_norm <= 0) return {};
  for (const GradientRef& g : grads) {
    double bound = model.max_gradient_norm;
    if (model.max_relative_gradient_norm > 0) {
      bound += model.max_relative_gradient_norm * ValuesNorm(g.partition);
    }
    const double norm = GradientNorm(g);
    if (norm > bound) return {g.partition, norm, bound};
  }
  return {};
}

std::string OverBoundMessage(const OverBound& over) {
  return absl::StrCat("gradient for ", PartitionKeyString(over.partition->key), " has L2 norm ",
                      absl::SixDigits(over.norm), ", above the bound ", absl::SixDigits(over.bound),
                      " (optimizer.max_gradient_norm + max_relative_gradient_norm x its values' "
                      "norm)");
}

PartitionState::Buffer ApplyMean(const ServerModel& model, PartitionState* p,
                                 const std::vector<int>& workers, int64_t step,
                                 Histogram* apply_seconds, const GradientRef* direct,
                                 int direct_worker) {
  // Sum in worker-index order, average, and apply into a spare buffer, a
  // chunk at a time (bitwise the same as summing whole tensors first: each
  // element's sum is taken in the same order whatever the chunks).
  std::array<float, kChunk> sum;
  std::array<float, kChunk> received;  // a chunk of `direct`, converted
  std::vector<const float*> parts;     // by worker index; nullptr: `direct`
  parts.reserve(workers.size());
  for (int w : workers) {
    parts.push_back(direct != nullptr && w == direct_worker ? nullptr : p->staging[w].data());
  }
  const float count = static_cast<float>(parts.size());
  absl::MutexLock apply_lock(&p->apply_mu);
  ApplyTimer timer(&p->apply_nanos, apply_seconds);
  UpdateBuffers b = TakeUpdateBuffers(p);
  UpdateInfo update;
  update.learning_rate = model.learning_rate.At(step);
  update.count = ++p->updates;
  if (parts.size() == 1 && parts[0] != nullptr) {
    // One staged gradient: its average is itself (x / 1 is exact), applied
    // in place from the staging buffer (clipped there: it is this server's
    // own copy).
    float* g = p->staging[workers[0]].data();
    if (model.clip_value > 0) ClipByValue(g, p->size, model.clip_value);
    model.optimizer->ApplyRange(b.in->data(), b.out->data(), g, p->size, &p->slots, 0, update);
    return std::move(b.out);
  }
  // Elements [at, at + n): `got` holds the direct gradient's.
  auto apply = [&](int64_t at, int64_t n, float* got) {
    float* g = got;
    if (parts.size() > 1) {
      g = sum.data();
      const float* first = parts[0] != nullptr ? parts[0] + at : got;
      std::copy(first, first + n, g);
      for (size_t k = 1; k < parts.size(); ++k) {
        const float* part = parts[k] != nullptr ? parts[k] + at : got;
        for (int64_t i = 0; i < n; ++i) g[i] += part[i];
      }
      for (int64_t i = 0; i < n; ++i) g[i] /= count;
    }
    if (model.clip_value > 0) ClipByValue(g, n, model.clip_value);
    model.optimizer->ApplyRange(b.in->data() + at, b.out->data() + at, g, n, &p->slots, at, update);
  };
  if (direct == nullptr) {
    for (int64_t c = 0; c < p->size; c += kChunk) apply(c, std::min(kChunk, p->size - c), nullptr);
    return std::move(b.out);
  }
  ForEachChunk(*direct, &received, apply);
  return std::move(b.out);
}

int64_t ApplyEach(const ServerModel& model, const std::vector<GradientRef>& grads,
                  UpdateInfo update, Histogram* apply_seconds) {
  // Each run of the received bytes is moved into an aligned chunk in L1
  // (the one copy) and applied into the partition's next buffer.
  int64_t bytes = 0;
  std::array<float, kChunk> chunk;
  for (const GradientRef& g : grads) {
    PartitionState* p = g.partition;
    absl::MutexLock apply_lock(&p->apply_mu);
    ApplyTimer timer(&p->apply_nanos, apply_seconds);
    UpdateBuffers b = TakeUpdateBuffers(p);
    update.count = ++p->updates;
    ForEachChunk(g, &chunk, [&](int64_t at, int64_t m, float* grad) {
      if (model.clip_value > 0) ClipByValue(grad, m, model.clip_value);
      model.optimizer->ApplyRange(b.in->data() + at, b.out->data() + at, grad, m, &p->slots, at,
                                  update);
    });
    {
      absl::MutexLock lock(&p->mu);
      p->PublishLocked(std::move(b.out));
    }
    bytes += g.byte_size();
    p->pushes.fetch_add(1, std::memory_order_relaxed);
    p->push_bytes.fetch_add(g.byte_size(), std::memory_order_relaxed);
  }
  return bytes;
}

}  // namespace pstrain
