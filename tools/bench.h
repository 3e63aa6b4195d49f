// `pstrain bench`: the data path's figures beside the limits of the machine,
// measured in one run so that the ratios mean something on a shared, noisy
// host. Every figure is the median of `reps` interleaved repetitions, printed
// with its min and max; every comparison is a ratio of medians from the same
// run. With --out, the figures also go to bench.csv, and the wire and train
// suites' to bench.png.
//
//   wire:       dense pull + push through real ps_server processes, beside a
//               bare gRPC echo of the same bytes, one TCP stream and memcpy.
//   apply:      each server optimizer's update beside a plain a += b loop.
//   train:      examples/s through `pstrain launch` (1 + 1 and 2 + 2),
//               beside the worker's own forward and backward alone.
//   sparse:     embedding rows: the server's table lookup beside a hash map,
//               PullRows and PushRows beside the gRPC echo.
//   checkpoint: write and restore beside dd conv=fsync (not by default).
//
// The code lives in tools/bench/: harness.{h,cc} (RunBench, ServeEcho, the
// shared helpers, bench.csv and the plot), one file per suite, each opening
// with what it measures and against which baseline, and plot.py (bench.png),
// which the binary carries as a string.
#ifndef PSTRAIN_TOOLS_BENCH_H_
#define PSTRAIN_TOOLS_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/shutdown.h"

namespace pstrain {

struct BenchOptions {
  std::string bin_dir;                // where ps_server lives; "" = next to pstrain
  std::string out_dir;                // bench.csv goes here when set
  std::vector<int64_t> sizes;         // bytes per pull and per push
  int64_t call_bytes = 4 << 20;       // wire: partitions and calls of up to this (0: one)
  std::vector<int> connections = {1};  // wire: TCP connections per server, each a row
  int train_connections = 0;          // train: rpc.connections_per_server (0: its default)
  std::vector<std::string> suites;    // "wire", "apply", "train", "sparse", "checkpoint", "tables"
  int64_t sparse_rows = 1000000;      // sparse: rows in the table (width 64)
  int64_t checkpoint_mib = 1024;      // checkpoint: the model's size
  std::string checkpoint_dir;         // checkpoint, tables: where to write ("" = out_dir or /tmp)
  int64_t table_rows = 2000000;       // tables: rows in the table (width 16, Adam)
  double table_memory_fraction = 0.1;  // tables: the tiered table's rows in memory
  std::vector<std::string> models;    // train: hidden layer widths, "512-512"
  bool bfloat16 = false;              // wire and train: bfloat16 on the wire
  bool async_training = false;        // train: async instead of sync
  bool async_prefetch = false;        // train: async with rpc.async_prefetch (pulls a step ahead)
  std::string device = "cpu";         // train: the workers' device, "cpu", "cuda:N" or "auto"
  int reps = 5;
  double rep_seconds = 0.15;          // each repetition runs at least this long
  double train_seconds = 2.0;         // train: steps per run, in seconds at the compute-only rate
};

// Runs the suites; returns the process exit code.
int RunBench(const BenchOptions& options, StopSignal* stop);

// The echo server's own process (`pstrain bench --serve_echo=ADDR`): serves
// until SIGTERM. Returns the exit code.
int ServeEcho(const std::string& address, StopSignal* stop);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_BENCH_H_
