#include "tools/bench/row_policies.h"

#include <iterator>
#include <list>
#include <set>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace pstrain::bench {
namespace {

// A memory of rows under a policy: Touch(id) says whether id was in it,
// and brings it in when not.
class Clock {
 public:
  explicit Clock(int64_t capacity) : ids_(static_cast<size_t>(capacity)), used_(ids_.size()) {}
  bool Touch(uint64_t id) {
    auto it = slot_.find(id);
    if (it != slot_.end()) {
      used_[it->second] = 1;
      return true;
    }
    size_t s;
    if (slot_.size() < ids_.size()) {
      s = slot_.size();
    } else {
      while (used_[hand_]) {  // spared once
        used_[hand_] = 0;
        hand_ = (hand_ + 1) % ids_.size();
      }
      s = hand_;
      slot_.erase(ids_[s]);
      hand_ = (hand_ + 1) % ids_.size();
    }
    ids_[s] = id;
    used_[s] = 1;  // as the table marks a row read back used
    slot_[id] = s;
    return false;
  }

 private:
  std::vector<uint64_t> ids_;
  std::vector<uint8_t> used_;
  absl::flat_hash_map<uint64_t, size_t> slot_;
  size_t hand_ = 0;
};

class Lru {
 public:
  explicit Lru(int64_t capacity) : capacity_(static_cast<size_t>(capacity)) {}
  bool Touch(uint64_t id) {
    auto it = at_.find(id);
    if (it != at_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return true;
    }
    if (at_.size() == capacity_) {
      at_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(id);
    at_[id] = order_.begin();
    return false;
  }

 private:
  const size_t capacity_;
  std::list<uint64_t> order_;  // most recent first
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> at_;
};

class Lfu {
 public:
  explicit Lfu(int64_t capacity) : capacity_(static_cast<size_t>(capacity)) {}
  bool Touch(uint64_t id) {
    if (++touches_ % (8 * capacity_) == 0) Age();
    Count& c = counts_[id];
    const bool hit = c.resident;
    if (hit) order_.erase({c.count, c.seq, id});
    ++c.count;
    c.seq = ++seq_;
    if (!hit && resident_ == capacity_) {
      auto victim = order_.begin();
      counts_[std::get<2>(*victim)].resident = false;
      order_.erase(victim);
      --resident_;
    }
    if (!hit) ++resident_;
    c.resident = true;
    order_.insert({c.count, c.seq, id});
    return hit;
  }

 private:
  struct Count {
    uint64_t count = 0, seq = 0;
    bool resident = false;
  };
  // Every count halved (rounded up), the residents' order rebuilt.
  void Age() {
    std::set<std::tuple<uint64_t, uint64_t, uint64_t>> aged;
    for (auto& [id, c] : counts_) {
      c.count = (c.count + 1) / 2;
      if (c.resident) aged.insert({c.count, c.seq, id});
    }
    order_ = std::move(aged);
  }

  const size_t capacity_;
  uint64_t touches_ = 0, seq_ = 0;
  size_t resident_ = 0;
  // Every id seen, in memory or not (a table keeps a row's count beside
  // it, on disk too).
  absl::flat_hash_map<uint64_t, Count> counts_;
  std::set<std::tuple<uint64_t, uint64_t, uint64_t>> order_;  // residents (count, seq, id)
};

template <typename Memory>
double Run(Memory memory, const std::vector<uint64_t>& stream, int64_t warmup) {
  int64_t hits = 0, counted = 0;
  for (size_t i = 0; i < stream.size(); ++i) {
    const bool hit = memory.Touch(stream[i]);
    if (static_cast<int64_t>(i) >= warmup) {
      hits += hit;
      ++counted;
    }
  }
  return counted > 0 ? static_cast<double>(hits) / static_cast<double>(counted) : 0;
}

}  // namespace

std::string RowPolicyName(RowPolicy policy) {
  switch (policy) {
    case RowPolicy::kClock:
      return "CLOCK";
    case RowPolicy::kLru:
      return "LRU";
    case RowPolicy::kLfu:
      return "LFU";
  }
  return "?";
}

double SimulateHitRate(RowPolicy policy, const std::vector<uint64_t>& stream, int64_t capacity,
                       int64_t warmup) {
  if (capacity < 1) return 0;
  switch (policy) {
    case RowPolicy::kClock:
      return Run(Clock(capacity), stream, warmup);
    case RowPolicy::kLru:
      return Run(Lru(capacity), stream, warmup);
    case RowPolicy::kLfu:
      return Run(Lfu(capacity), stream, warmup);
  }
  return 0;
}

}  // namespace pstrain::bench
