// The tables suite of `pstrain bench` (TablesSuite, run by the harness,
// tools/bench/harness.cc; not in the default --suites): what one server's
// save of an embedding table costs, in full and as a delta
// (checkpoint.full_every), for a table of --table_rows rows of 16 floats
// with Adam's two slots. Each repetition saves every row (the cut's copy,
// then the shard written as a server writes it: temp file, fsync, rename),
// then updates 1% of the rows (distinct ids, Zipf-skewed s = 1.1, as a
// stream of lookups touches them) and saves the delta the same way. Writes
// in --checkpoint_dir, else --out, else /tmp; at most 3 repetitions.

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <random>

#include "absl/container/flat_hash_set.h"
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

namespace pstrain::bench {
namespace {

constexpr int kDim = 16;

// One save's figures: the cut (the rows copied out, the server's pause) and
// the write, in seconds, and the bytes written.
struct Save {
  double cut = 0, write = 0;
  int64_t bytes = 0, rows = 0;
};

// Cuts `table` (every row, or those changed since `after`) and writes the
// rows as shard 0 of checkpoint `ckpt`.
absl::StatusOr<Save> SaveRows(EmbeddingTable* table, bool delta, uint32_t after,
                              const std::string& ckpt) {
  Save s;
  absl::Time t0 = absl::Now();
  ASSIGN_OR_RETURN(const EmbeddingTable::Rows rows,
                   delta ? table->ExportChangedRows(after) : table->ExportRows());
  s.cut = absl::ToDoubleSeconds(absl::Now() - t0);
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
  t0 = absl::Now();
  RETURN_IF_ERROR(WriteShard(Env::Default(), ckpt, 0, 1, {}, &s.bytes, {r}).status());
  s.write = absl::ToDoubleSeconds(absl::Now() - t0);
  s.rows = r.rows;
  return s;
}

}  // namespace

absl::Status TablesSuite(BenchContext* ctx) {
  const BenchOptions& o = ctx->options();
  Env* env = Env::Default();
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
  EmbeddingTable table(to, adam.get());
  const int64_t n = o.table_rows;
  constexpr int64_t kBatch = 4096;
  {
    std::vector<uint64_t> ids(kBatch);
    std::vector<float> grads(kBatch * kDim, 0.001f);
    for (int64_t at = 0; at < n; at += kBatch) {
      const int64_t k = std::min(kBatch, n - at);
      for (int64_t i = 0; i < k; ++i) ids[i] = MixId(static_cast<uint64_t>(at + i));
      RETURN_IF_ERROR(table.ApplyGradients(absl::MakeConstSpan(ids.data(), k), grads.data(), 1,
                                           0.01f, 0, 0));
    }
  }
  // 1% of the rows, distinct, drawn Zipf-skewed over the ranks.
  std::mt19937_64 rng(11);
  std::vector<double> cdf(n);
  double sum = 0;
  for (int64_t r = 0; r < n; ++r) cdf[r] = sum += std::pow(r + 1.0, -1.1);
  std::uniform_real_distribution<double> u(0, sum);
  const int64_t changed = std::max<int64_t>(1, n / 100);
  const int reps = std::min(o.reps, 3);
  std::vector<double> full_s, delta_s, full_cut, delta_cut;
  int64_t full_bytes = 0, delta_bytes = 0, delta_rows = 0;
  for (int rep = 0; rep < reps; ++rep) {
    RETURN_IF_ERROR(ctx->CheckStop());
    const uint32_t gen = table.EndGeneration();
    ASSIGN_OR_RETURN(Save full, SaveRows(&table, false, 0, JoinPath(dir, "full")));
    absl::flat_hash_set<uint64_t> picked;
    while (static_cast<int64_t>(picked.size()) < changed) {
      const int64_t rank = std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin();
      picked.insert(MixId(static_cast<uint64_t>(std::min(rank, n - 1))));
    }
    const std::vector<uint64_t> ids(picked.begin(), picked.end());
    const std::vector<float> grads(ids.size() * kDim, 0.001f);
    RETURN_IF_ERROR(table.ApplyGradients(ids, grads.data(), 1, 0.01f, 0, rep + 1));
    (void)table.EndGeneration();
    ASSIGN_OR_RETURN(Save delta, SaveRows(&table, true, gen, JoinPath(dir, "delta")));
    if (delta.rows != changed) {
      return absl::InternalError(absl::StrCat("tables bench: the delta has ", delta.rows,
                                              " rows, ", changed, " were changed"));
    }
    full_s.push_back(full.cut + full.write);
    delta_s.push_back(delta.cut + delta.write);
    full_cut.push_back(full.cut);
    delta_cut.push_back(delta.cut);
    full_bytes = full.bytes;
    delta_bytes = delta.bytes;
    delta_rows = delta.rows;
    RETURN_IF_ERROR(DeleteRecursively(env, JoinPath(dir, "full")));
    RETURN_IF_ERROR(DeleteRecursively(env, JoinPath(dir, "delta")));
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  const Stats f = Summarize(full_s), d = Summarize(delta_s);
  std::cout << "\n== tables: one server's save of " << n << " rows x " << kDim
            << " floats with Adam's slots, in full and as a delta after 1% of the rows changed, "
               "seconds (median [min-max] of "
            << reps << "), in " << base << " ==\n";
  std::cout << absl::StrFormat("%-28s %12s %10s %-26s %-26s\n", "save", "rows", "MB",
                               "cut (the server's pause)", "cut + write (fsync)");
  std::cout << absl::StrFormat("%-28s %12d %10.1f %-26s %-26s\n", "full", n, full_bytes / 1e6,
                               Fmt(Summarize(full_cut)), Fmt(f));
  std::cout << absl::StrFormat("%-28s %12d %10.1f %-26s %-26s %s\n", "delta (1% changed)",
                               delta_rows, delta_bytes / 1e6, Fmt(Summarize(delta_cut)), Fmt(d),
                               absl::StrFormat("%.1fx faster", f.median / d.median))
            << std::flush;
  ctx->Add("tables", "full_save_seconds", full_bytes, 1, 0, f);
  ctx->Add("tables", "delta_save_seconds", delta_bytes, 1, 0, d);
  return absl::OkStatus();
}

}  // namespace pstrain::bench
