// The harness of `pstrain bench` (tools/bench.h): what the suites share.
// It owns the measurement helpers (a figure's median, min and max over its
// repetitions; a timed loop over threads), the rows of bench.csv that every
// suite adds to, the local processes the wire and sparse suites start (the
// ps_server tasks of a cluster on free loopback ports, and the bare gRPC echo
// server they are compared with), and the suites' common context. It
// declares the suites, each defined in a file of its own in tools/bench/;
// harness.cc runs the ones named in --suites, in order, then writes bench.csv
// and bench.png. A private header of //tools:bench: only the suites include it.
#ifndef PSTRAIN_TOOLS_BENCH_HARNESS_H_
#define PSTRAIN_TOOLS_BENCH_HARNESS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/shutdown.h"
#include "common/cluster/cluster_spec.h"
#include "proto/bench.grpc.pb.h"
#include "proto/config.pb.h"
#include "tools/bench.h"
#include "tools/subprocess.h"

namespace pstrain::bench {

// A figure over its repetitions. Every figure the bench prints is a median,
// with its min and max beside it.
struct Stats {
  double median = 0, min = 0, max = 0;
};

Stats Summarize(std::vector<double> v);

// "median [min-max]", three decimals.
std::string Fmt(const Stats& s);

// Runs `threads` copies of `round(thread)` until `seconds` have passed (each
// thread at least one round after the start barrier) and returns GB/s, given
// that one round of one thread moves `bytes_per_round`. nullopt on failure.
std::optional<double> RunTimed(int threads, double seconds, int64_t bytes_per_round,
                               const std::function<absl::Status(int)>& round,
                               absl::Status* error);

// One bare echo of `payload` (the gRPC baseline of the wire suites).
absl::Status EchoRound(BenchEcho::Stub* echo, const std::string& payload);

// The servers' config for the wire suites: async (nothing waits on a
// quorum), a learning rate that leaves the values as they are, no end;
// `extra`: more config lines.
absl::StatusOr<TrainingConfig> AsyncBenchConfig(const std::string& extra);

// The echo server in a child process (`pstrain bench --serve_echo`, on a
// free port), once it accepts connections; `address` is where it listens.
absl::Status StartEcho(std::unique_ptr<Subprocess>* proc, std::string* address);

// A local cluster of `n` ps_server tasks (ps_server from `bin_dir`, or next
// to pstrain when empty) on free ports: its spec and the servers' logs go to
// `dir`, the processes to `procs`, the parsed spec to `cluster`.
absl::Status StartServers(const std::string& bin_dir, int n, const std::string& dir,
                          std::vector<std::unique_ptr<Subprocess>>* procs,
                          std::optional<ClusterSpec>* cluster);

// The sparse and tables suites' baseline for a table lookup: rows
// MixId(0) .. MixId(n - 1) of `dim` floats in one buffer, found by a
// flat_hash_map and copied out with memcpy.
class PlainRows {
 public:
  PlainRows(int64_t n, int dim);
  // The rows of `ids` into out[i * dim, ...); INTERNAL for an id not held.
  absl::Status Lookup(const std::vector<uint64_t>& ids, float* out) const;

 private:
  const int dim_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;
  std::vector<float> rows_;
};

// Where the checkpoint and tables suites write: --checkpoint_dir, else
// --out, else /tmp (in `base`), in a folder of this process's own
// ("pstrain-bench-<suite>-<pid>"), created.
absl::StatusOr<std::string> ScratchDir(const BenchOptions& o, const std::string& suite,
                                       std::string* base);

// One row of bench.csv. `gbps` holds the figure whatever its unit (the
// sparse suite's Mrows/s, the train suite's examples/s).
struct CsvRow {
  std::string suite, what;
  int64_t bytes = 0;
  int servers = 0, workers = 0;
  Stats gbps;
  int connections = 0;  // wire suite, pstrain rows: TCP connections per server
};

// What every suite works from and adds to: the options, the process's stop
// signal and the rows of bench.csv. One for the whole run, used from the
// thread that runs the suites.
class BenchContext {
 public:
  BenchContext(const BenchOptions& options, StopSignal* stop) : options_(options), stop_(stop) {}

  const BenchOptions& options() const { return options_; }

  // Cancelled once SIGINT or SIGTERM arrived, else ok: the suites ask
  // between repetitions.
  absl::Status CheckStop() const {
    if (stop_->stopped()) return absl::CancelledError(stop_->reason());
    return absl::OkStatus();
  }

  // A row of bench.csv, in the order the suites measured them.
  void Add(const std::string& suite, const std::string& what, int64_t bytes, int servers,
           int workers, const Stats& s, int connections = 0) {
    rows_.push_back({suite, what, bytes, servers, workers, s, connections});
  }

  const std::vector<CsvRow>& rows() const { return rows_; }

 private:
  const BenchOptions options_;
  StopSignal* const stop_;
  std::vector<CsvRow> rows_;
};

// The suites, one file each. Each prints its tables as it goes and adds its
// rows to `ctx`; an error ends the run (the processes the suite started are
// killed as their Subprocess goes; its temporary folder stays, for the logs).
absl::Status WireSuite(BenchContext* ctx);        // tools/bench/wire.cc
absl::Status ApplySuite(BenchContext* ctx);       // tools/bench/apply.cc
absl::Status TrainSuite(BenchContext* ctx);       // tools/bench/train.cc
absl::Status SparseSuite(BenchContext* ctx);      // tools/bench/sparse.cc
absl::Status CheckpointSuite(BenchContext* ctx);  // tools/bench/checkpoint.cc
absl::Status TablesSuite(BenchContext* ctx);      // tools/bench/tables.cc

}  // namespace pstrain::bench

#endif  // PSTRAIN_TOOLS_BENCH_HARNESS_H_
