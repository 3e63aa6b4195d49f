// The sparse suite of `pstrain bench` (SparseSuite, run by the harness,
// tools/bench/harness.cc): embedding rows in Mrows/s, in batches of 4,096
// ids of a table of --sparse_rows rows of width 64, the ids uniform and
// Zipf-skewed (s = 1.05). In process (one thread): the server's table lookup
// beside a plain hash map + memcpy of the same rows. Over the wire (1 worker
// thread, 1 and 2 real ps_server processes): PullRows and PushRows beside
// the bare gRPC echo of the same bytes (ids + rows).

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/embedding_ids.h"
#include "common/base/status_macros.h"
#include "common/client/grpc_ps_client.h"
#include "common/cluster/placement.h"
#include "common/rpc/rpc.h"
#include "common/storage/env.h"
#include "ps_server/embedding_table.h"
#include "ps_server/optimizer.h"
#include "tools/bench/harness.h"

namespace pstrain::bench {
namespace {

constexpr int kDim = 64, kBatch = 4096;
// The bytes of one batch's ids and rows: what the echo carries.
constexpr int64_t kBatchBytes = int64_t{kBatch} * (kDim * 4 + 8);

// One figure's repetitions for the uniform and the Zipf-skewed ids.
struct Pair {
  std::vector<double> uni, zipf;
};

// A batch of ids in, ok or an error out: the body of one timed round.
using BatchBody = std::function<absl::Status(const std::vector<uint64_t>&)>;

// The suite's state across its two halves: the ids (all of the table's, and
// 64 batches of each distribution) and the buffer the rows are read into.
class Sparse {
 public:
  explicit Sparse(BenchContext* ctx)
      : ctx_(ctx),
        o_(ctx->options()),
        table_rows_(o_.sparse_rows),
        rng_(7),
        uniform_(MakeBatches(false)),
        zipf_(MakeBatches(true)),
        all_(table_rows_),
        out_(static_cast<size_t>(kBatch) * kDim) {
    for (int64_t r = 0; r < table_rows_; ++r) all_[r] = MixId(static_cast<uint64_t>(r));
  }

  absl::Status Run() {
    RETURN_IF_ERROR(InProcess());
    return OverTheWire();
  }

 private:
  // Ids are ranks scattered by MixId, so a feature's ids look like hashes.
  std::vector<std::vector<uint64_t>> MakeBatches(bool zipf) {
    std::vector<std::vector<uint64_t>> batches(64, std::vector<uint64_t>(kBatch));
    std::vector<double> cdf;
    if (zipf) {
      cdf.resize(table_rows_);
      double sum = 0;
      for (int64_t r = 0; r < table_rows_; ++r) cdf[r] = sum += std::pow(r + 1.0, -1.05);
      for (double& c : cdf) c /= sum;
    }
    std::uniform_real_distribution<double> u(0, 1);
    for (auto& b : batches) {
      for (uint64_t& id : b) {
        const int64_t rank =
            zipf ? std::lower_bound(cdf.begin(), cdf.end(), u(rng_)) - cdf.begin()
                 : static_cast<int64_t>(rng_() % static_cast<uint64_t>(table_rows_));
        id = MixId(static_cast<uint64_t>(std::min(rank, table_rows_ - 1)));
      }
    }
    return batches;
  }

  // Mrows/s of `body` over `batches`, in turn, for one repetition.
  absl::StatusOr<double> MRows(const BatchBody& body,
                               const std::vector<std::vector<uint64_t>>& batches) {
    size_t next = 0;
    absl::Status err;
    std::optional<double> r = RunTimed(
        1, o_.rep_seconds, kBatch, [&](int) { return body(batches[next++ % batches.size()]); },
        &err);
    if (!r) return err;
    return *r * 1000;  // rows per ns -> Mrows/s
  }

  // One line of the table and its two CSV rows; with `base`, the ratios to it.
  void Print(const std::string& what, const Pair& p, const Pair* base, const std::string& base_name,
             const std::string& csv_name, int servers) {
    const Stats su = Summarize(p.uni), sz = Summarize(p.zipf);
    std::string ratio;
    if (base != nullptr) {
      ratio = absl::StrFormat("%.2fx / %.2fx of %s", su.median / Summarize(base->uni).median,
                              sz.median / Summarize(base->zipf).median, base_name);
    }
    std::cout << absl::StrFormat("%-30s %-22s %-22s %s\n", what, Fmt(su), Fmt(sz), ratio)
              << std::flush;
    ctx_->Add("sparse", csv_name + "_uniform_mrows", kBatchBytes, servers, 1, su);
    ctx_->Add("sparse", csv_name + "_zipf_mrows", kBatchBytes, servers, 1, sz);
  }

  // The server's EmbeddingTable::Lookup beside a flat_hash_map of the same
  // ids and a memcpy of each row, every row created beforehand.
  absl::Status InProcess() {
    OptimizerConfig oc;
    oc.set_learning_rate(1e-6f);
    ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> sgd, CreateOptimizer(oc));
    EmbeddingTable::Options to;
    to.name = "bench";
    to.dim = kDim;
    to.init_scale = 0.01f;
    EmbeddingTable table(to, sgd.get());
    for (int64_t at = 0; at < table_rows_; at += kBatch) {
      const int64_t n = std::min<int64_t>(kBatch, table_rows_ - at);
      RETURN_IF_ERROR(table.Lookup(absl::MakeConstSpan(all_.data() + at, n), 0, out_.data()));
    }
    const PlainRows plain_rows(table_rows_, kDim);  // the ids of all_
    std::cout << "\n== sparse: rows of 64 floats in batches of 4096 ids, " << table_rows_
              << "-row table, Mrows/s (median [min-max] of " << o_.reps << ") ==\n";
    std::cout << absl::StrFormat("%-30s %-22s %-22s %8s\n", "in process, 1 thread", "uniform",
                                 "zipf 1.05", "");
    Pair lookup, plain;
    auto table_lookup = [&](const std::vector<uint64_t>& ids) {
      return table.Lookup(ids, 1, out_.data());
    };
    auto plain_lookup = [&](const std::vector<uint64_t>& ids) {
      return plain_rows.Lookup(ids, out_.data());
    };
    for (int rep = 0; rep < o_.reps; ++rep) {
      ASSIGN_OR_RETURN(double a, MRows(table_lookup, uniform_));
      ASSIGN_OR_RETURN(double b, MRows(table_lookup, zipf_));
      ASSIGN_OR_RETURN(double c, MRows(plain_lookup, uniform_));
      ASSIGN_OR_RETURN(double d, MRows(plain_lookup, zipf_));
      lookup.uni.push_back(a);
      lookup.zipf.push_back(b);
      plain.uni.push_back(c);
      plain.zipf.push_back(d);
    }
    Print("hash map + memcpy", plain, nullptr, "", "plain_lookup", 0);
    Print("server table lookup", lookup, &plain, "hash map", "table_lookup", 0);
    return absl::OkStatus();
  }

  // PullRows and PushRows of one worker's PsClient against 1 and 2 servers
  // (every row pulled once beforehand, so that all exist), beside the echo.
  absl::Status OverTheWire() {
    const std::string dir = absl::StrCat("/tmp/pstrain-bench-sparse-", ::getpid());
    RETURN_IF_ERROR(Env::Default()->CreateDirs(dir));
    std::unique_ptr<Subprocess> echo_proc;
    std::string echo_address;
    RETURN_IF_ERROR(StartEcho(&echo_proc, &echo_address));
    auto echo = BenchEcho::NewStub(CreateChannel(echo_address));
    const std::string echo_payload(kBatchBytes, 'x');
    auto echo_round = [&](const std::vector<uint64_t>&) {
      return EchoRound(echo.get(), echo_payload);
    };
    ASSIGN_OR_RETURN(
        TrainingConfig config,
        AsyncBenchConfig("embedding_tables { name: \"bench\" dim: 64 init_scale: 0.01 }"));
    std::cout << absl::StrFormat("%-30s %-22s %-22s\n", "over the wire, 1 worker", "uniform",
                                 "zipf 1.05");
    Pair echo_rate;
    std::vector<Pair> pulls(2), pushes(2);
    std::vector<std::vector<std::unique_ptr<Subprocess>>> procs(2);
    std::vector<std::unique_ptr<GrpcPsClient>> clients;
    std::vector<std::unique_ptr<Placement>> placements;
    for (int k = 0; k < 2; ++k) {
      std::optional<ClusterSpec> cluster;
      RETURN_IF_ERROR(StartServers(o_.bin_dir, k + 1, dir, &procs[k], &cluster));
      std::vector<VariableSpec> vars = {{"unused", {1}}};
      ASSIGN_OR_RETURN(Placement placement, Placement::Compute(vars, k + 1, 1));
      placements.push_back(std::make_unique<Placement>(std::move(placement)));
      GrpcPsClient chief(*cluster, placements.back().get(), -1, absl::Seconds(60));
      chief.set_incarnation(std::random_device()() | 1ULL << 40);
      RETURN_IF_ERROR(
          chief.InitializeAll(config, 1, 1, 0, {Tensor({1}, {0.0f})}, absl::Seconds(60)));
      clients.push_back(
          std::make_unique<GrpcPsClient>(*cluster, placements.back().get(), 0, absl::Seconds(60)));
      clients.back()->set_incarnation(chief.incarnation());
      for (int64_t at = 0; at < table_rows_; at += kBatch) {  // every row exists
        const int64_t n = std::min<int64_t>(kBatch, table_rows_ - at);
        RETURN_IF_ERROR(clients.back()->PullRows("bench", kDim,
                                                 absl::MakeConstSpan(all_.data() + at, n), 0,
                                                 absl::Seconds(60), out_.data()));
      }
    }
    const std::vector<float> grads(static_cast<size_t>(kBatch) * kDim, 1e-3f);
    std::vector<PushOutcome> outcomes;
    for (int rep = 0; rep < o_.reps; ++rep) {
      RETURN_IF_ERROR(ctx_->CheckStop());
      for (int k = 0; k < 2; ++k) {
        GrpcPsClient& c = *clients[k];
        BatchBody pull = [&](const std::vector<uint64_t>& ids) {
          return c.PullRows("bench", kDim, ids, 0, absl::Seconds(60), out_.data());
        };
        BatchBody push = [&](const std::vector<uint64_t>& ids) {
          return c.PushRows("bench", kDim, ids, grads.data(), std::vector<int64_t>(k + 1, 0),
                            &outcomes);
        };
        for (auto [body, into] : {std::pair{&pull, &pulls[k]}, std::pair{&push, &pushes[k]}}) {
          ASSIGN_OR_RETURN(double a, MRows(*body, uniform_));
          ASSIGN_OR_RETURN(double b, MRows(*body, zipf_));
          into->uni.push_back(a);
          into->zipf.push_back(b);
        }
      }
      ASSIGN_OR_RETURN(double e, MRows(echo_round, uniform_));
      echo_rate.uni.push_back(e);
      echo_rate.zipf.push_back(e);
    }
    Print("gRPC echo of the same bytes", echo_rate, nullptr, "", "grpc_echo", 1);
    for (int k = 0; k < 2; ++k) {
      Print(absl::StrCat("PullRows, ", k + 1, " server(s)"), pulls[k], &echo_rate, "echo",
            "pull_rows", k + 1);
      Print(absl::StrCat("PushRows, ", k + 1, " server(s)"), pushes[k], &echo_rate, "echo",
            "push_rows", k + 1);
    }
    for (auto& group : procs) {
      for (auto& p : group) p->Stop(absl::Seconds(5));
    }
    echo_proc->Stop(absl::Seconds(5));
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    return absl::OkStatus();
  }

  BenchContext* const ctx_;
  const BenchOptions& o_;
  const int64_t table_rows_;
  std::mt19937_64 rng_;  // the batches' ids, uniform first, then Zipf
  const std::vector<std::vector<uint64_t>> uniform_, zipf_;
  std::vector<uint64_t> all_;  // every id of the table, by rank
  std::vector<float> out_;     // where pulls and lookups put the rows
};

}  // namespace

absl::Status SparseSuite(BenchContext* ctx) { return Sparse(ctx).Run(); }

}  // namespace pstrain::bench
