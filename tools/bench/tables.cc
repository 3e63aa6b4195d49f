// The tables suite of `pstrain bench` (TablesSuite, run by the harness,
// tools/bench/harness.cc; not in the default --suites): an embedding table of
// rows of 16 floats with Adam's two slots on one server, in process.
//
// The disk tier: batches of 4,096 Zipf-skewed ids (s = 1.1), each looked up
// and updated (a worker's pull and push of a step), on a table held wholly
// in memory (at most 20M rows) and on a table of --table_rows rows with a
// memory budget of --table_memory_fraction of them (the rest in its disk
// tier), beside the sparse suite's baseline, a hash map + memcpy of each row
// looked up; and the tiered table's hit rate (the share of the rows used
// that were in memory).
//
// Saves, of both tables: each repetition saves every row (the cut, then the
// shard written as a server writes it: temp file, fsync, rename; the tiered
// table's rows on disk read as they are written), then updates 1% of the
// rows (distinct ids, Zipf-skewed s = 1.1, as a stream of lookups touches
// them) and saves the delta the same way. Writes in --checkpoint_dir, else
// --out, else /tmp; at most 3 repetitions.

#include <algorithm>
#include <cmath>
#include <functional>
#include <filesystem>
#include <iostream>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/embedding_ids.h"
#include "common/base/status_macros.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"
#include "ps_server/embedding_table.h"
#include "ps_server/optimizer.h"
#include "tools/bench/harness.h"
#include "tools/bench/row_policies.h"

namespace pstrain::bench {
namespace {

constexpr int kDim = 16;
// The most rows of the tables held in memory (20M: 3.8 GB with Adam's
// slots); the tiered table holds all of --table_rows.
constexpr int64_t kMaxInMemoryRows = 20'000'000;

// One save's figures: the cut (the rows copied out, the server's pause) and
// the write, in seconds, and the bytes written.
struct Save {
  double cut = 0, write = 0;
  int64_t bytes = 0, rows = 0;
};

// Cuts `table` (every row, or those changed since `after`) and writes the
// rows as shard 0 of checkpoint `ckpt`, as a server does (the rows on disk of
// a table with a memory budget read as they are written).
absl::StatusOr<Save> SaveRows(EmbeddingTable* table, bool delta, uint32_t after,
                              const std::string& ckpt) {
  Save s;
  absl::Time t0 = absl::Now();
  ASSIGN_OR_RETURN(EmbeddingTable::SavedRows cut, table->CutRows(delta ? after : 0));
  s.cut = absl::ToDoubleSeconds(absl::Now() - t0);
  const EmbeddingTable::Rows& rows = cut.rows;
  ShardRows r;
  r.table = "bench";
  r.dim = kDim;
  r.rows = static_cast<int64_t>(rows.ids.size());
  r.ids = rows.ids.data();
  r.values = rows.values.data();
  for (const std::vector<float>& slot : rows.slots) r.slots.push_back(slot.data());
  r.updates = rows.updates.data();
  r.touched = rows.touched.data();
  r.delta = delta;
  r.deleted = static_cast<int64_t>(rows.deleted.size());
  r.deleted_ids = rows.deleted.data();
  r.more = cut.on_disk.get();
  t0 = absl::Now();
  RETURN_IF_ERROR(WriteShard(Env::Default(), ckpt, 0, 1, {}, &s.bytes, {r}).status());
  s.write = absl::ToDoubleSeconds(absl::Now() - t0);
  s.rows = r.rows + (r.more != nullptr ? r.more->rows() : 0);
  return s;
}

// The figures of MeasureSaves.
struct Saves {
  std::vector<double> full, delta, full_cut, delta_cut;  // seconds, one per repetition
  int64_t rows = 0, full_bytes = 0, delta_bytes = 0, delta_rows = 0;
};

// `reps` times: saves every row of `table` (its first `n` ranks of `cdf`
// filled), updates 1% of them (distinct, Zipf-drawn from `seed`) and saves
// the delta, each in `dir`.
absl::StatusOr<Saves> MeasureSaves(BenchContext* ctx, EmbeddingTable* table, int64_t n,
                                   const std::vector<double>& cdf, int reps, uint64_t seed,
                                   const std::string& dir) {
  Env* env = Env::Default();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, cdf[n - 1]);
  const int64_t changed = std::max<int64_t>(1, n / 100);
  Saves out;
  out.rows = n;
  for (int rep = 0; rep < reps; ++rep) {
    RETURN_IF_ERROR(ctx->CheckStop());
    const uint32_t gen = table->EndGeneration();
    ASSIGN_OR_RETURN(Save full, SaveRows(table, false, 0, JoinPath(dir, "full")));
    absl::flat_hash_set<uint64_t> picked;
    while (static_cast<int64_t>(picked.size()) < changed) {
      const int64_t rank = std::lower_bound(cdf.begin(), cdf.begin() + n, u(rng)) - cdf.begin();
      picked.insert(MixId(static_cast<uint64_t>(std::min(rank, n - 1))));
    }
    const std::vector<uint64_t> ids(picked.begin(), picked.end());
    const std::vector<float> grads(ids.size() * kDim, 0.001f);
    RETURN_IF_ERROR(table->ApplyGradients(ids, grads.data(), 1, 0.01f, 0, rep + 1));
    (void)table->EndGeneration();
    ASSIGN_OR_RETURN(Save delta, SaveRows(table, true, gen, JoinPath(dir, "delta")));
    if (delta.rows != changed || full.rows != n) {
      return absl::InternalError(absl::StrCat("tables bench: ", full.rows, " rows saved of ", n,
                                              ", a delta of ", delta.rows, " rows after ",
                                              changed, " changed"));
    }
    out.full.push_back(full.cut + full.write);
    out.delta.push_back(delta.cut + delta.write);
    out.full_cut.push_back(full.cut);
    out.delta_cut.push_back(delta.cut);
    out.full_bytes = full.bytes;
    out.delta_bytes = delta.bytes;
    out.delta_rows = delta.rows;
    RETURN_IF_ERROR(DeleteRecursively(env, JoinPath(dir, "full")));
    RETURN_IF_ERROR(DeleteRecursively(env, JoinPath(dir, "delta")));
  }
  return out;
}

// MeasureSaves' two lines of the save table, `what` the table.
void PrintSaves(const std::string& what, const Saves& s) {
  const Stats f = Summarize(s.full), d = Summarize(s.delta);
  std::cout << absl::StrFormat("%-36s %12d %10.1f %-26s %-26s\n", what + ": full", s.rows,
                               s.full_bytes / 1e6, Fmt(Summarize(s.full_cut)), Fmt(f));
  std::cout << absl::StrFormat("%-36s %12d %10.1f %-26s %-26s %s\n",
                               what + ": delta (1% changed)", s.delta_rows, s.delta_bytes / 1e6,
                               Fmt(Summarize(s.delta_cut)), Fmt(d),
                               absl::StrFormat("%.1fx faster", f.median / d.median))
            << std::flush;
}

// Fills `table` with rows MixId(0 .. n-1) (one small update each).
absl::Status Fill(EmbeddingTable* table, int64_t n) {
  constexpr int64_t kBatch = 4096;
  std::vector<uint64_t> ids(kBatch);
  std::vector<float> grads(kBatch * kDim, 0.001f);
  for (int64_t at = 0; at < n; at += kBatch) {
    const int64_t k = std::min(kBatch, n - at);
    for (int64_t i = 0; i < k; ++i) ids[i] = MixId(static_cast<uint64_t>(at + i));
    RETURN_IF_ERROR(
        table->ApplyGradients(absl::MakeConstSpan(ids.data(), k), grads.data(), 1, 0.01f, 0, 0));
  }
  return absl::OkStatus();
}

// Zipf-skewed batches of `ids` ids over the first `n` ranks of `cdf`, drawn
// from `seed`.
std::vector<std::vector<uint64_t>> ZipfStream(const std::vector<double>& cdf, int64_t n,
                                              int batches, int ids, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, cdf[n - 1]);
  std::vector<std::vector<uint64_t>> stream(batches, std::vector<uint64_t>(ids));
  for (auto& batch : stream) {
    for (uint64_t& id : batch) {
      const int64_t rank = std::lower_bound(cdf.begin(), cdf.begin() + n, u(rng)) - cdf.begin();
      id = MixId(static_cast<uint64_t>(std::min(rank, n - 1)));
    }
  }
  return stream;
}

// The disk tier's part (the file comment): `whole` holds rows 0 .. m-1 in
// memory, the tiered table all of --table_rows; `cdf` is over the latter.
// Returns the tiered table, `whole` (and the hash map) freed.
absl::StatusOr<std::unique_ptr<EmbeddingTable>> TierPart(BenchContext* ctx,
                                                         const std::string& dir,
                                                         std::unique_ptr<EmbeddingTable> whole,
                                                         int64_t m, const Optimizer* adam,
                                                         const std::vector<double>& cdf) {
  const BenchOptions& o = ctx->options();
  const int64_t n = o.table_rows;
  EmbeddingTable::Options to = whole->options();
  to.memory_rows =
      std::max<int64_t>(16, static_cast<int64_t>(static_cast<double>(n) * o.table_memory_fraction));
  to.tier_prefix = JoinPath(dir, "tier/bench");
  ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingTable> tiered, EmbeddingTable::Create(to, adam));
  RETURN_IF_ERROR(Fill(tiered.get(), n));
  constexpr int kIds = 4096;
  const int batches = static_cast<int>(std::clamp<int64_t>(4 * n / kIds, 16, 256));
  const PlainRows plain_rows(m, kDim);
  std::vector<float> out(kIds * kDim), grads(kIds * kDim, 0.001f);
  int64_t step = 1;
  // Mrows/s of `op` over a stream.
  auto rate = [&](const std::function<absl::Status(const std::vector<uint64_t>&)>& op,
                  const std::vector<std::vector<uint64_t>>& stream) -> absl::StatusOr<double> {
    const absl::Time t0 = absl::Now();
    for (const auto& batch : stream) RETURN_IF_ERROR(op(batch));
    return static_cast<double>(batches) * kIds / absl::ToDoubleSeconds(absl::Now() - t0) / 1e6;
  };
  auto plain = [&](const std::vector<uint64_t>& ids) { return plain_rows.Lookup(ids, out.data()); };
  auto pull_push = [&](EmbeddingTable* t) {
    return [&, t](const std::vector<uint64_t>& ids) {
      RETURN_IF_ERROR(t->Lookup(ids, step, out.data()));
      return t->ApplyGradients(ids, grads.data(), 1, 0.01f, 0, step++);
    };
  };
  // Each pass draws afresh (a pass repeated would find its own rows in
  // memory); the first brings the hot rows into memory.
  RETURN_IF_ERROR(
      rate(pull_push(tiered.get()), ZipfStream(cdf, n, batches, kIds, 100)).status());
  std::vector<double> plain_r, whole_r, tiered_r, hits;
  for (int rep = 0; rep < o.reps; ++rep) {
    RETURN_IF_ERROR(ctx->CheckStop());
    const auto stream_m = ZipfStream(cdf, m, batches, kIds, 200 + rep);
    const auto stream_n = ZipfStream(cdf, n, batches, kIds, 300 + rep);
    ASSIGN_OR_RETURN(double p, rate(plain, stream_m));
    ASSIGN_OR_RETURN(double w, rate(pull_push(whole.get()), stream_m));
    const int64_t reads = tiered->stats().disk_reads;
    ASSIGN_OR_RETURN(double t, rate(pull_push(tiered.get()), stream_n));
    plain_r.push_back(p);
    whole_r.push_back(w);
    tiered_r.push_back(t);
    // The lookup of a batch reads back the rows on disk, and its update
    // finds them in memory: the hit rate is over the rows looked up.
    hits.push_back(100.0 * (1.0 - static_cast<double>(tiered->stats().disk_reads - reads) /
                                      (static_cast<double>(batches) * kIds)));
  }
  const EmbeddingTable::Stats st = tiered->stats();
  const Stats sp = Summarize(plain_r), sw = Summarize(whole_r), stt = Summarize(tiered_r);
  std::cout << "\n== tables: Zipf (s = 1.1) batches of " << kIds << " ids, each looked up and "
            << "updated (Adam), on one server's table of " << n << " rows x " << kDim
            << " floats (in memory: " << m << "), Mrows/s (median [min-max] of " << o.reps
            << ") ==\n";
  std::cout << absl::StrFormat("%-44s %-22s %s\n", "", "Mrows/s", "");
  std::cout << absl::StrFormat("%-44s %-22s %s\n",
                               absl::StrCat("hash map + memcpy, ", m, " rows (lookups)"), Fmt(sp),
                               "");
  std::cout << absl::StrFormat("%-44s %-22s %.2fx of the hash map\n",
                               absl::StrCat("table in memory, ", m, " rows"), Fmt(sw),
                               sw.median / sp.median);
  std::cout << absl::StrFormat(
                   "%-44s %-22s %.2fx of in memory; memory tier hit rate %.1f%%; %d rows, %.1f "
                   "MB on disk\n",
                   absl::StrFormat("table, %.0f%% of its %d rows in memory",
                                   100 * o.table_memory_fraction, n),
                   Fmt(stt), stt.median / sw.median, Summarize(hits).median, st.rows_on_disk,
                   st.disk_bytes / 1e6)
            << std::flush;
  ctx->Add("tables", "memory_pull_push_mrows", kIds * kDim * 4, 1, 0, sw);
  ctx->Add("tables", "tiered_pull_push_mrows", kIds * kDim * 4, 1, 0, stt);
  ctx->Add("tables", "tier_hit_percent", kIds * kDim * 4, 1, 0, Summarize(hits));
  return tiered;
}

// The policies' part: which rows stay in memory (row_policies.h), simulated
// over the same lookups of at most kMaxPolicyRows rows with
// --table_memory_fraction of them in memory: Zipf-drawn (s = 1.1, as the
// tier part's), and trending (the same, but the ids of the top 1% of ranks
// new every 1/8 of the lookups, as new items in a stream of logs).
constexpr int64_t kMaxPolicyRows = 2'000'000;

absl::Status PolicyPart(BenchContext* ctx, const std::vector<double>& cdf) {
  const BenchOptions& o = ctx->options();
  const int64_t n = std::min<int64_t>(o.table_rows, kMaxPolicyRows);
  const int64_t capacity =
      std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(n) * o.table_memory_fraction));
  const int64_t warmup = 4 * capacity, lookups = warmup + 16 * capacity;
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<double> u(0, cdf[n - 1]);
  std::vector<uint64_t> zipf(static_cast<size_t>(lookups)), trending(zipf.size());
  const int64_t top = std::max<int64_t>(1, n / 100), epoch = std::max<int64_t>(1, lookups / 8);
  for (int64_t i = 0; i < lookups; ++i) {
    const int64_t rank =
        std::min<int64_t>(std::lower_bound(cdf.begin(), cdf.begin() + n, u(rng)) - cdf.begin(),
                          n - 1);
    zipf[i] = MixId(static_cast<uint64_t>(rank));
    trending[i] = rank < top ? MixId(static_cast<uint64_t>(rank + (i / epoch + 1) * n)) : zipf[i];
  }
  std::cout << "\n== tables: which rows stay in memory, simulated over the same lookups: " << n
            << " rows, " << capacity << " in memory, " << lookups - warmup << " lookups after "
            << warmup << " to warm up; hit rates ==\n";
  std::cout << absl::StrFormat("%-44s %-16s %s\n", "policy", "Zipf (s = 1.1)",
                               "trending (the top 1% of ids new every 1/8 of the lookups)");
  for (RowPolicy p : {RowPolicy::kClock, RowPolicy::kLru, RowPolicy::kLfu}) {
    RETURN_IF_ERROR(ctx->CheckStop());
    const double a = SimulateHitRate(p, zipf, capacity, warmup);
    const double b = SimulateHitRate(p, trending, capacity, warmup);
    const std::string name =
        p == RowPolicy::kClock ? "CLOCK (the table's)"
        : p == RowPolicy::kLru ? "LRU"
                               : "LFU (all rows counted, aged)";
    std::cout << absl::StrFormat("%-44s %-16s %.1f%%\n", name,
                                 absl::StrFormat("%.1f%%", 100 * a), 100 * b)
              << std::flush;
    const std::string key = absl::AsciiStrToLower(RowPolicyName(p));
    Stats sa, sb;
    sa.median = sa.min = sa.max = 100 * a;
    sb.median = sb.min = sb.max = 100 * b;
    ctx->Add("tables", absl::StrCat("policy_hit_percent_zipf_", key), 0, 1, 0, sa);
    ctx->Add("tables", absl::StrCat("policy_hit_percent_trending_", key), 0, 1, 0, sb);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TablesSuite(BenchContext* ctx) {
  const BenchOptions& o = ctx->options();
  std::string base;
  ASSIGN_OR_RETURN(const std::string dir, ScratchDir(o, "tables", &base));
  OptimizerConfig oc;
  oc.set_learning_rate(0.01f);
  oc.mutable_adam();
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> adam, CreateOptimizer(oc));
  EmbeddingTable::Options to;
  to.name = "bench";
  to.dim = kDim;
  to.init_scale = 0.01f;
  auto table = std::make_unique<EmbeddingTable>(to, adam.get());
  // The table in memory, saved here and set beside the tiered one below.
  const int64_t n = std::min(o.table_rows, kMaxInMemoryRows);
  RETURN_IF_ERROR(Fill(table.get(), n));
  std::vector<double> cdf(o.table_rows);
  double sum = 0;
  for (int64_t r = 0; r < o.table_rows; ++r) cdf[r] = sum += std::pow(r + 1.0, -1.1);
  const int reps = std::min(o.reps, 3);
  ASSIGN_OR_RETURN(const Saves memory, MeasureSaves(ctx, table.get(), n, cdf, reps, 11, dir));
  ctx->Add("tables", "full_save_seconds", memory.full_bytes, 1, 0, Summarize(memory.full));
  ctx->Add("tables", "delta_save_seconds", memory.delta_bytes, 1, 0, Summarize(memory.delta));
  ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingTable> tiered,
                   TierPart(ctx, dir, std::move(table), n, adam.get(), cdf));
  ASSIGN_OR_RETURN(const Saves disk,
                   MeasureSaves(ctx, tiered.get(), o.table_rows, cdf, reps, 12, dir));
  ctx->Add("tables", "tiered_full_save_seconds", disk.full_bytes, 1, 0, Summarize(disk.full));
  ctx->Add("tables", "tiered_delta_save_seconds", disk.delta_bytes, 1, 0,
           Summarize(disk.delta));
  std::cout << "\n== tables: one server's save of a table of " << kDim
            << " floats a row with Adam's slots, in full and as a delta after 1% of the rows "
               "changed, seconds (median [min-max] of "
            << reps << "), in " << base << " ==\n";
  std::cout << absl::StrFormat("%-36s %12s %10s %-26s %-26s\n", "save", "rows", "MB",
                               "cut (the server's pause)", "cut + write (fsync)");
  PrintSaves("in memory", memory);
  PrintSaves(absl::StrFormat("%.0f%% in memory", 100 * o.table_memory_fraction), disk);
  RETURN_IF_ERROR(PolicyPart(ctx, cdf));
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return absl::OkStatus();
}

}  // namespace pstrain::bench
