// Which rows a table with a memory budget keeps in memory, simulated: the
// hit rates of CLOCK (what EmbeddingTable does), LRU and LFU (with aging)
// over the same stream of ids, for the tables suite of `pstrain bench`
// (tools/bench/tables.cc) to set side by side. A simulation holds ids only:
// it measures the policies' choices, not their cost per lookup.
// Thread-compatible.
#ifndef PSTRAIN_TOOLS_BENCH_ROW_POLICIES_H_
#define PSTRAIN_TOOLS_BENCH_ROW_POLICIES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace pstrain::bench {

enum class RowPolicy {
  kClock,  // a hand over the rows: one used since it last passed is spared once
  kLru,    // the least recently used row leaves
  kLfu,    // the least often used row leaves (a count kept for every row, in
           // memory or not), every count halved each 8 x capacity lookups
           // (aging), the least recent first among equal counts
};

std::string RowPolicyName(RowPolicy policy);

// The share of `stream`'s lookups after its first `warmup` that found their
// id in memory, for a memory of `capacity` rows under `policy`; a missed id
// comes in (another leaving when full).
double SimulateHitRate(RowPolicy policy, const std::vector<uint64_t>& stream, int64_t capacity,
                       int64_t warmup);

}  // namespace pstrain::bench

#endif  // PSTRAIN_TOOLS_BENCH_ROW_POLICIES_H_
