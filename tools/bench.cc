#include "tools/bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/cluster/cluster_spec.h"
#include "common/cluster/config.h"
#include "common/runtime/allocator.h"
#include "common/storage/checkpoint.h"
#include "common/base/embedding_ids.h"
#include "common/storage/env.h"
#include "tools/local_ports.h"
#include "common/cluster/placement.h"
#include "common/client/ps_client.h"
#include "common/rpc/rpc.h"
#include "common/base/status_macros.h"
#include "google/protobuf/text_format.h"
#include "tools/subprocess.h"
#include "nlohmann/json.hpp"
#include "proto/bench.grpc.pb.h"
#include "ps_server/embedding_table.h"
#include "ps_server/optimizer.h"
#include "tools/datagen.h"
#include "tools/launcher.h"
#include "worker/model/device.h"
#include "worker/model/model.h"

namespace pstrain {
namespace {

struct Stats {
  double median = 0, min = 0, max = 0;
};

Stats Summarize(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return s;
}

std::string Fmt(const Stats& s) {
  return absl::StrFormat("%.3f [%.3f-%.3f]", s.median, s.min, s.max);
}

std::string SizeName(int64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return absl::StrCat(bytes >> 20, " MiB");
  if (bytes >= (1 << 10) && bytes % (1 << 10) == 0) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}

// Runs `threads` copies of `round(thread)` until `seconds` have passed (each
// thread at least one round after the start barrier) and returns GB/s, given
// that one round of one thread moves `bytes_per_round`. nullopt on failure.
std::optional<double> RunTimed(int threads, double seconds, int64_t bytes_per_round,
                               const std::function<absl::Status(int)>& round,
                               absl::Status* error) {
  std::atomic<int64_t> rounds{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status first_error;
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(seconds);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      do {
        absl::Status st = round(t);
        if (!st.ok()) {
          absl::MutexLock lock(&mu);
          if (first_error.ok()) first_error = st;
          failed = true;
          return;
        }
        ++rounds;
      } while (absl::Now() < end && !failed);
    });
  }
  for (std::thread& th : pool) th.join();
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  if (failed) {
    *error = first_error;
    return std::nullopt;
  }
  return static_cast<double>(rounds.load()) * bytes_per_round / elapsed / 1e9;
}

class EchoService final : public BenchEcho::Service {
  grpc::Status Echo(grpc::ServerContext*, const EchoMessage* req, EchoMessage* resp) override {
    *resp->mutable_payload() = req->payload();
    return grpc::Status::OK;
  }
};

// One plain TCP stream over loopback: GB/s of `chunk`-byte writes, one way.
absl::StatusOr<double> TcpStream(int64_t chunk, double seconds) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (listener >= 0) ::close(listener);
    return absl::InternalError(absl::StrCat("tcp bench: listen: ", std::strerror(errno)));
  }
  int64_t received = 0;
  std::thread reader([listener, chunk, &received] {
    int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    std::vector<char> buf(std::max<int64_t>(chunk, 1 << 16));
    while (true) {
      ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n <= 0) break;
      received += n;
    }
    ::close(fd);
  });
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  absl::Status st;
  const absl::Time start = absl::Now();
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    st = absl::InternalError(absl::StrCat("tcp bench: connect: ", std::strerror(errno)));
  } else {
    std::vector<char> buf(chunk, 1);
    const absl::Time end = start + absl::Seconds(seconds);
    do {
      int64_t off = 0;
      while (off < chunk) {
        ssize_t n = ::write(fd, buf.data() + off, chunk - off);
        if (n <= 0) {
          st = absl::InternalError(absl::StrCat("tcp bench: write: ", std::strerror(errno)));
          break;
        }
        off += n;
      }
    } while (st.ok() && absl::Now() < end);
  }
  if (fd >= 0) ::shutdown(fd, SHUT_WR);
  if (fd < 0 || !st.ok()) ::shutdown(listener, SHUT_RDWR);
  reader.join();  // the reader has drained everything once it sees EOF
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  if (fd >= 0) ::close(fd);
  ::close(listener);
  if (!st.ok()) return st;
  return static_cast<double>(received) / elapsed / 1e9;
}

double MemcpyRate(int64_t bytes, double seconds) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  int64_t copies = 0;
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(seconds);
  do {
    for (int i = 0; i < 16; ++i) {
      std::memcpy(b.data(), a.data(), bytes);
      a[copies % bytes] ^= b[(copies * 7) % bytes];  // keep the copies observable
      ++copies;
    }
  } while (absl::Now() < end);
  return static_cast<double>(copies) * bytes / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
}

// Draws bench.csv into bench.png with matplotlib (Debian's python3-matplotlib):
// the wire suite's GB/s against message size, and the train suite's
// examples/s per model.
const char kPlotScript[] = R"PY(
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

rows = list(csv.DictReader(open(sys.argv[1])))
wire = [r for r in rows if r["suite"] == "wire"]
train = [r for r in rows if r["suite"] == "train"]
panels = (1 if wire else 0) + (1 if train else 0)
if panels == 0:
    sys.exit("nothing to plot")
fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5), squeeze=False)
axes = list(axes[0])
if wire:
    ax = axes.pop(0)
    series = {}
    for r in wire:
        if r["what"] == "pstrain":
            key = "pstrain %s ps x %s workers" % (r["servers"], r["workers"])
            if r["connections"] not in ("0", "1"):
                key += ", %s connections" % r["connections"]
        elif r["what"] == "grpc_echo":
            key = "bare gRPC echo, %s thread(s)" % r["workers"]
        else:
            key = {"tcp_stream": "one TCP stream", "memcpy": "memcpy"}[r["what"]]
        series.setdefault(key, {})[int(r["bytes"])] = float(r["gbps_median"])
    for key, points in sorted(series.items()):
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=key,
                linestyle="--" if not key.startswith("pstrain") else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per pull and per push")
    ax.set_ylabel("GB/s (median)")
    ax.set_title("dense pull + push")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
if train:
    ax = axes.pop(0)
    models, kinds, values = [], ["compute only", "1 ps + 1 worker", "2 ps + 2 workers"], {}
    for r in train:
        name = r["what"].replace(" compute_only", "")
        if name not in models:
            models.append(name)
        kind = kinds[0] if r["what"].endswith("compute_only") else kinds[int(r["servers"])]
        values[(name, kind)] = float(r["gbps_median"])
    width = 0.27
    for k, kind in enumerate(kinds):
        ax.bar([m + (k - 1) * width for m in range(len(models))],
               [values.get((name, kind), 0) for name in models], width, label=kind)
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("examples/s (median)")
    ax.set_title("training, batch 64 per worker")
    ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
)PY";

struct CsvRow {
  std::string suite, what;
  int64_t bytes = 0;
  int servers = 0, workers = 0;
  Stats gbps;
  int connections = 0;  // wire suite, pstrain rows: TCP connections per server
};

// One bare echo of `payload` (the gRPC baseline of the wire suites).
absl::Status EchoRound(BenchEcho::Stub* echo, const std::string& payload) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(60));
  EchoMessage req, resp;
  req.set_payload(payload);
  return FromGrpcStatus(echo->Echo(&ctx, req, &resp), "echo");
}

// The servers' config for the wire suites: async (nothing waits on a
// quorum), a learning rate that leaves the values as they are, no end;
// `extra`: more config lines.
absl::StatusOr<TrainingConfig> AsyncBenchConfig(const std::string& extra) {
  return ParseTrainingConfig(absl::StrCat(R"(
model { mlp { input_dim: 2 num_classes: 2 } }
data { train_images: "unused" train_labels: "unused" batch_size: 1 }
optimizer { learning_rate: 1e-12 }
async { }
max_steps: 1000000000000
)", extra), "bench");
}

class Bench {
 public:
  Bench(const BenchOptions& options, StopSignal* stop) : o_(options), stop_(stop) {}

  int Run() {
    for (const std::string& s : o_.suites) {
      absl::Status st = s == "wire"    ? Wire()
                        : s == "apply" ? Apply()
                        : s == "train" ? Train()
                        : s == "sparse" ? Sparse()
                        : s == "checkpoint" ? Checkpoint()
                        : absl::InvalidArgumentError(absl::StrCat("unknown suite \"", s, "\""));
      if (!st.ok()) {
        std::cerr << "pstrain bench: " << st.message() << "\n";
        return 1;
      }
    }
    if (!o_.out_dir.empty()) {
      const std::string path = JoinPath(o_.out_dir, "bench.csv");
      std::string csv =
          "suite,what,bytes,servers,workers,gbps_median,gbps_min,gbps_max,connections\n";
      for (const CsvRow& r : rows_) {
        absl::StrAppendFormat(&csv, "%s,%s,%d,%d,%d,%.4f,%.4f,%.4f,%d\n", r.suite, r.what,
                              r.bytes, r.servers, r.workers, r.gbps.median, r.gbps.min,
                              r.gbps.max, r.connections);
      }
      absl::Status st = Env::Default()->CreateDirs(o_.out_dir);
      if (st.ok()) st = WriteFileAtomically(Env::Default(), path, csv);
      if (!st.ok()) {
        std::cerr << "pstrain bench: " << st.message() << "\n";
        return 1;
      }
      std::cout << "wrote " << path << "\n";
      // The plot draws the wire and train suites; the others are tables only.
      if (std::any_of(rows_.begin(), rows_.end(), [](const CsvRow& r) {
            return r.suite == "wire" || r.suite == "train";
          })) {
        Plot(path, JoinPath(o_.out_dir, "bench.png"));
      }
    }
    return 0;
  }

 private:
  // bench.png from the CSV when Debian's python3 has matplotlib; says why not
  // otherwise (the CSV is the result; the picture is a convenience).
  void Plot(const std::string& csv, const std::string& png) {
    const std::string python = ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "";
    if (python.empty()) {
      std::cout << "no bench.png: /usr/bin/python3 not found\n";
      return;
    }
    const std::string script = JoinPath(o_.out_dir, "bench_plot.py");
    if (!WriteFileAtomically(Env::Default(), script, kPlotScript).ok()) {
      std::cout << "no bench.png: cannot write " << script << "\n";
      return;
    }
    SpawnOptions so;
    so.argv = {python, script, csv, png};
    so.output_file = JoinPath(o_.out_dir, "bench_plot.log");
    auto proc = Subprocess::Spawn(so);
    std::optional<int> code;
    if (proc.ok()) {
      code = (*proc)->Wait(absl::Seconds(120));
      if (!code) code = (*proc)->Stop(absl::Seconds(2));
    }
    auto log = Env::Default()->ReadFile(so.output_file);
    Env::Default()->DeleteFile(script).IgnoreError();
    Env::Default()->DeleteFile(so.output_file).IgnoreError();
    if (code == 0) {
      std::cout << "wrote " << png << "\n";
    } else if (log.ok() && log->find("No module named 'matplotlib'") != std::string::npos) {
      std::cout << "no bench.png: python3 lacks matplotlib (apt install python3-matplotlib)\n";
    } else {
      std::cout << "no bench.png: the plot failed" << (log.ok() ? ": " + *log : "") << "\n";
    }
  }

  void Add(const std::string& suite, const std::string& what, int64_t bytes, int servers,
           int workers, const Stats& s, int connections = 0) {
    rows_.push_back({suite, what, bytes, servers, workers, s, connections});
  }

  absl::Status StartEcho(std::unique_ptr<Subprocess>* proc, std::string* address) {
    const int port = PickFreePorts(1)[0];
    *address = absl::StrCat("127.0.0.1:", port);
    SpawnOptions so;
    so.argv = {"/proc/self/exe", "bench", absl::StrCat("--serve_echo=", *address)};
    ASSIGN_OR_RETURN(*proc, Subprocess::Spawn(so));
    auto channel = CreateChannel(*address);
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(20))) {
      return absl::UnavailableError(absl::StrCat("echo server on ", *address, " did not start"));
    }
    return absl::OkStatus();
  }

  absl::Status StartServers(int n, const std::string& dir,
                            std::vector<std::unique_ptr<Subprocess>>* procs,
                            std::optional<ClusterSpec>* cluster) {
    const std::string bin = FindBinary(o_.bin_dir, "ps_server", "ps_server");
    if (bin.empty()) {
      return absl::NotFoundError("no ps_server binary next to pstrain or in --bin_dir");
    }
    const std::string path = JoinPath(dir, absl::StrCat("cluster", n, ".json"));
    RETURN_IF_ERROR(WriteFileAtomically(Env::Default(), path, LocalClusterSpecJson(n, 2)));
    ASSIGN_OR_RETURN(ClusterSpec parsed, ClusterSpec::FromFile(path));
    *cluster = std::move(parsed);
    for (int s = 0; s < n; ++s) {
      SpawnOptions so;
      so.argv = {bin, absl::StrCat("--cluster_spec=", path), absl::StrCat("--task=", s),
                 "--log_level=warn"};
      so.output_file = JoinPath(dir, absl::StrCat("ps", n, "_", s, ".log"));
      ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> p, Subprocess::Spawn(so));
      procs->push_back(std::move(p));
    }
    return absl::OkStatus();
  }

  // One (servers, workers, size, connections) configuration of the
  // parameter server's path: each worker thread pulls every partition and
  // pushes a gradient of the same size, async (no waiting on quorum), so the
  // figure is the data path. As a worker does (placement.partition_max_bytes
  // and rpc.call_bytes), the variable is cut into partitions of up to
  // --call_bytes, each server's share travelling in calls of that size in
  // flight together (0: one partition and one call per server).
  absl::Status PsConfig(const ClusterSpec& cluster, int workers, int64_t bytes, int connections,
                        std::vector<double>* gbps) {
    const int servers = cluster.num_ps();
    std::vector<VariableSpec> vars = {{"bench", {std::max<int64_t>(bytes / 64, 1), 16}}};
    ASSIGN_OR_RETURN(Placement placement,
                     Placement::Compute(vars, servers, 1, /*partition_max_bytes=*/o_.call_bytes));
    ASSIGN_OR_RETURN(TrainingConfig config, AsyncBenchConfig(""));
    const absl::Duration timeout = absl::Seconds(60);
    PsClient chief(cluster, &placement, -1, timeout);
    chief.set_incarnation(std::random_device()() | 1ULL << 40);
    const int64_t n = vars[0].num_elements();
    RETURN_IF_ERROR(chief.InitializeAll(config, 1, workers, 0,
                                        {Tensor(vars[0].shape, std::vector<float>(n, 0.5f))},
                                        timeout));
    std::vector<std::unique_ptr<PsClient>> clients;
    std::vector<std::vector<float>> params(workers, std::vector<float>(n)),
        grads(workers, std::vector<float>(n, 1e-3f));
    for (int w = 0; w < workers; ++w) {
      clients.push_back(std::make_unique<PsClient>(cluster, &placement, w, timeout));
      clients.back()->set_incarnation(chief.incarnation());
      if (o_.bfloat16) clients.back()->set_wire_dtype(DT_BFLOAT16);
      clients.back()->set_chunk_bytes(o_.call_bytes);
      clients.back()->set_connections_per_server(connections);
    }
    auto round = [&](int w) -> absl::Status {
      PsClient::PullResult pulled;
      std::vector<PushOutcome> outcomes;
      RETURN_IF_ERROR(clients[w]->PullInto({}, timeout, {params[w].data()}, &pulled));
      return clients[w]->PushFrom(pulled.versions, {grads[w].data()}, &outcomes);
    };
    for (int w = 0; w < workers; ++w) RETURN_IF_ERROR(round(w));  // warm up the channels
    absl::Status err;
    std::optional<double> r = RunTimed(workers, o_.rep_seconds, 2 * n * 4, round, &err);
    if (!r) return err;
    gbps->push_back(*r);
    return absl::OkStatus();
  }

  absl::Status Wire() {
    // Server logs stay in `dir` when something fails, for diagnosis.
    const std::string dir = absl::StrCat("/tmp/pstrain-bench-", ::getpid());
    RETURN_IF_ERROR(Env::Default()->CreateDirs(dir));
    std::unique_ptr<Subprocess> echo_proc;
    std::string echo_address;
    RETURN_IF_ERROR(StartEcho(&echo_proc, &echo_address));
    std::vector<std::unique_ptr<BenchEcho::Stub>> echo;
    for (int t = 0; t < 2; ++t) echo.push_back(BenchEcho::NewStub(CreateChannel(echo_address)));
    std::vector<std::unique_ptr<Subprocess>> procs1, procs2;
    std::optional<ClusterSpec> cluster1, cluster2;
    RETURN_IF_ERROR(StartServers(1, dir, &procs1, &cluster1));
    RETURN_IF_ERROR(StartServers(2, dir, &procs2, &cluster2));

    std::cout << "\n== wire: dense pull + push payload"
              << (o_.bfloat16 ? " (bfloat16 on the wire: GB/s of float32 delivered)" : "")
              << ", GB/s (median [min-max] of " << o_.reps << "), interleaved ==\n";
    std::cout << absl::StrFormat("%-8s %-12s %-12s %-22s %-22s %-22s %-22s %8s %8s\n", "size",
                                 "ps x workers", "connections", "pstrain", "gRPC echo", "TCP stream",
                                 "memcpy", "vs TCP", "vs echo");
    for (int64_t bytes : o_.sizes) {
      for (int workers : {1, 2}) {
        // Per connection count: the 1-server and 2-server figures.
        const size_t nc = o_.connections.size();
        std::vector<std::vector<double>> ps1(nc), ps2(nc);
        std::vector<double> eg, tcp, mem;
        std::vector<std::string> payload(workers, std::string(bytes, 'x'));
        auto echo_round = [&](int t) { return EchoRound(echo[t].get(), payload[t]); };
        for (int t = 0; t < workers; ++t) RETURN_IF_ERROR(echo_round(t));
        for (int rep = 0; rep < o_.reps; ++rep) {
          if (stop_->stopped()) return absl::CancelledError(stop_->reason());
          for (size_t c = 0; c < nc; ++c) {
            RETURN_IF_ERROR(PsConfig(*cluster1, workers, bytes, o_.connections[c], &ps1[c]));
            RETURN_IF_ERROR(PsConfig(*cluster2, workers, bytes, o_.connections[c], &ps2[c]));
          }
          absl::Status err;
          std::optional<double> e = RunTimed(workers, o_.rep_seconds, 2 * bytes, echo_round, &err);
          if (!e) return err;
          eg.push_back(*e);
          ASSIGN_OR_RETURN(double t, TcpStream(bytes, o_.rep_seconds));
          tcp.push_back(t);
          mem.push_back(MemcpyRate(bytes, o_.rep_seconds / 2));
        }
        const Stats se = Summarize(eg), st = Summarize(tcp), sm = Summarize(mem);
        for (int servers : {1, 2}) {
          for (size_t c = 0; c < nc; ++c) {
            const Stats s = Summarize(servers == 1 ? ps1[c] : ps2[c]);
            std::cout << absl::StrFormat(
                             "%-8s %-12s %-12d %-22s %-22s %-22s %-22s %7.2fx %7.2fx\n",
                             SizeName(bytes), absl::StrCat(servers, " x ", workers),
                             o_.connections[c], Fmt(s), Fmt(se), Fmt(st), Fmt(sm),
                             s.median / st.median, s.median / se.median)
                      << std::flush;
            Add("wire", "pstrain", bytes, servers, workers, s, o_.connections[c]);
          }
        }
        Add("wire", "grpc_echo", bytes, 1, workers, se);
        Add("wire", "tcp_stream", bytes, 0, 1, st);
        Add("wire", "memcpy", bytes, 0, 1, sm);
      }
    }
    for (auto* procs : {&procs1, &procs2}) {
      for (auto& p : *procs) p->Stop(absl::Seconds(5));
    }
    echo_proc->Stop(absl::Seconds(5));
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    return absl::OkStatus();
  }

  // Embedding rows: batches of 4,096 ids of a table of width 64, uniform
  // and Zipf-skewed (s = 1.05), in Mrows/s. In process: the server's table
  // lookup beside a plain hash map + memcpy of the same rows (one thread).
  // Over the wire (1 worker thread, 1 and 2 servers): PullRows and PushRows
  // beside the bare gRPC echo of the same bytes (ids + rows).
  absl::Status Sparse() {
    constexpr int kDim = 64, kBatch = 4096;
    const int64_t table_rows = o_.sparse_rows;
    std::mt19937_64 rng(7);
    // Ids are ranks scattered by MixId, so a feature's ids look like hashes.
    auto make_batches = [&](bool zipf) {
      std::vector<std::vector<uint64_t>> batches(64, std::vector<uint64_t>(kBatch));
      std::vector<double> cdf;
      if (zipf) {
        cdf.resize(table_rows);
        double sum = 0;
        for (int64_t r = 0; r < table_rows; ++r) cdf[r] = sum += std::pow(r + 1.0, -1.05);
        for (double& c : cdf) c /= sum;
      }
      std::uniform_real_distribution<double> u(0, 1);
      for (auto& b : batches) {
        for (uint64_t& id : b) {
          const int64_t rank =
              zipf ? std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin()
                   : static_cast<int64_t>(rng() % static_cast<uint64_t>(table_rows));
          id = MixId(static_cast<uint64_t>(std::min(rank, table_rows - 1)));
        }
      }
      return batches;
    };
    const std::vector<std::vector<uint64_t>> uniform = make_batches(false),
                                             zipf = make_batches(true);
    std::vector<uint64_t> all(table_rows);
    for (int64_t r = 0; r < table_rows; ++r) all[r] = MixId(static_cast<uint64_t>(r));

    // In process.
    OptimizerConfig oc;
    oc.set_learning_rate(1e-6f);
    ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> sgd, CreateOptimizer(oc));
    EmbeddingTable::Options to;
    to.name = "bench";
    to.dim = kDim;
    to.init_scale = 0.01f;
    EmbeddingTable table(to, sgd.get());
    std::vector<float> out(static_cast<size_t>(kBatch) * kDim);
    for (int64_t at = 0; at < table_rows; at += kBatch) {
      const int64_t n = std::min<int64_t>(kBatch, table_rows - at);
      RETURN_IF_ERROR(table.Lookup(absl::MakeConstSpan(all.data() + at, n), 0, out.data()));
    }
    absl::flat_hash_map<uint64_t, uint32_t> plain_index;
    std::vector<float> plain_rows(static_cast<size_t>(table_rows) * kDim, 0.01f);
    for (int64_t r = 0; r < table_rows; ++r) plain_index[all[r]] = static_cast<uint32_t>(r);
    std::cout << "\n== sparse: rows of 64 floats in batches of 4096 ids, " << table_rows
              << "-row table, Mrows/s (median [min-max] of " << o_.reps << ") ==\n";
    std::cout << absl::StrFormat("%-30s %-22s %-22s %8s\n", "in process, 1 thread", "uniform",
                                 "zipf 1.05", "");
    struct Pair {
      std::vector<double> uni, zipf;
    };
    Pair lookup, plain;
    auto mrows = [&](const std::function<absl::Status(const std::vector<uint64_t>&)>& body,
                     const std::vector<std::vector<uint64_t>>& batches) -> absl::StatusOr<double> {
      size_t next = 0;
      absl::Status err;
      std::optional<double> r = RunTimed(
          1, o_.rep_seconds, kBatch,
          [&](int) { return body(batches[next++ % batches.size()]); }, &err);
      if (!r) return err;
      return *r * 1000;  // rows per ns -> Mrows/s
    };
    auto table_lookup = [&](const std::vector<uint64_t>& ids) {
      return table.Lookup(ids, 1, out.data());
    };
    auto plain_lookup = [&](const std::vector<uint64_t>& ids) {
      float* dst = out.data();
      for (uint64_t id : ids) {
        auto it = plain_index.find(id);
        if (it == plain_index.end()) return absl::InternalError("plain lookup: missing id");
        std::memcpy(dst, plain_rows.data() + static_cast<size_t>(it->second) * kDim,
                    kDim * sizeof(float));
        dst += kDim;
      }
      return absl::OkStatus();
    };
    for (int rep = 0; rep < o_.reps; ++rep) {
      ASSIGN_OR_RETURN(double a, mrows(table_lookup, uniform));
      ASSIGN_OR_RETURN(double b, mrows(table_lookup, zipf));
      ASSIGN_OR_RETURN(double c, mrows(plain_lookup, uniform));
      ASSIGN_OR_RETURN(double d, mrows(plain_lookup, zipf));
      lookup.uni.push_back(a);
      lookup.zipf.push_back(b);
      plain.uni.push_back(c);
      plain.zipf.push_back(d);
    }
    const int64_t batch_bytes = int64_t{kBatch} * (kDim * 4 + 8);
    auto print = [&](const std::string& what, const Pair& p, const Pair* base,
                     const std::string& base_name, const std::string& csv_name, int servers) {
      const Stats su = Summarize(p.uni), sz = Summarize(p.zipf);
      std::string ratio;
      if (base != nullptr) {
        ratio = absl::StrFormat("%.2fx / %.2fx of %s", su.median / Summarize(base->uni).median,
                                sz.median / Summarize(base->zipf).median, base_name);
      }
      std::cout << absl::StrFormat("%-30s %-22s %-22s %s\n", what, Fmt(su), Fmt(sz), ratio)
                << std::flush;
      Add("sparse", csv_name + "_uniform_mrows", batch_bytes, servers, 1, su);
      Add("sparse", csv_name + "_zipf_mrows", batch_bytes, servers, 1, sz);
    };
    print("hash map + memcpy", plain, nullptr, "", "plain_lookup", 0);
    print("server table lookup", lookup, &plain, "hash map", "table_lookup", 0);

    // Over the wire.
    const std::string dir = absl::StrCat("/tmp/pstrain-bench-sparse-", ::getpid());
    RETURN_IF_ERROR(Env::Default()->CreateDirs(dir));
    std::unique_ptr<Subprocess> echo_proc;
    std::string echo_address;
    RETURN_IF_ERROR(StartEcho(&echo_proc, &echo_address));
    auto echo = BenchEcho::NewStub(CreateChannel(echo_address));
    const std::string echo_payload(batch_bytes, 'x');
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
    std::vector<std::unique_ptr<PsClient>> clients;
    std::vector<std::unique_ptr<Placement>> placements;
    for (int k = 0; k < 2; ++k) {
      std::optional<ClusterSpec> cluster;
      RETURN_IF_ERROR(StartServers(k + 1, dir, &procs[k], &cluster));
      std::vector<VariableSpec> vars = {{"unused", {1}}};
      ASSIGN_OR_RETURN(Placement placement, Placement::Compute(vars, k + 1, 1));
      placements.push_back(std::make_unique<Placement>(std::move(placement)));
      PsClient chief(*cluster, placements.back().get(), -1, absl::Seconds(60));
      chief.set_incarnation(std::random_device()() | 1ULL << 40);
      RETURN_IF_ERROR(chief.InitializeAll(config, 1, 1, 0, {Tensor({1}, {0.0f})},
                                          absl::Seconds(60)));
      clients.push_back(
          std::make_unique<PsClient>(*cluster, placements.back().get(), 0, absl::Seconds(60)));
      clients.back()->set_incarnation(chief.incarnation());
      for (int64_t at = 0; at < table_rows; at += kBatch) {  // every row exists
        const int64_t n = std::min<int64_t>(kBatch, table_rows - at);
        RETURN_IF_ERROR(clients.back()->PullRows("bench", kDim,
                                                 absl::MakeConstSpan(all.data() + at, n), 0,
                                                 absl::Seconds(60), out.data()));
      }
    }
    const std::vector<float> grads(static_cast<size_t>(kBatch) * kDim, 1e-3f);
    std::vector<PushOutcome> outcomes;
    for (int rep = 0; rep < o_.reps; ++rep) {
      if (stop_->stopped()) return absl::CancelledError(stop_->reason());
      for (int k = 0; k < 2; ++k) {
        PsClient& c = *clients[k];
        auto pull = [&](const std::vector<uint64_t>& ids) {
          return c.PullRows("bench", kDim, ids, 0, absl::Seconds(60), out.data());
        };
        auto push = [&](const std::vector<uint64_t>& ids) {
          return c.PushRows("bench", kDim, ids, grads.data(),
                            std::vector<int64_t>(k + 1, 0), &outcomes);
        };
        for (auto [body, into] : {std::pair{std::function<absl::Status(
                                                const std::vector<uint64_t>&)>(pull),
                                            &pulls[k]},
                                  {std::function<absl::Status(const std::vector<uint64_t>&)>(
                                       push),
                                   &pushes[k]}}) {
          ASSIGN_OR_RETURN(double a, mrows(body, uniform));
          ASSIGN_OR_RETURN(double b, mrows(body, zipf));
          into->uni.push_back(a);
          into->zipf.push_back(b);
        }
      }
      ASSIGN_OR_RETURN(double e, mrows(echo_round, uniform));
      echo_rate.uni.push_back(e);
      echo_rate.zipf.push_back(e);
    }
    print("gRPC echo of the same bytes", echo_rate, nullptr, "", "grpc_echo", 1);
    for (int k = 0; k < 2; ++k) {
      print(absl::StrCat("PullRows, ", k + 1, " server(s)"), pulls[k], &echo_rate, "echo",
            "pull_rows", k + 1);
      print(absl::StrCat("PushRows, ", k + 1, " server(s)"), pushes[k], &echo_rate, "echo",
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

  // Every server-side optimizer's update over 16 MiB beside a += b, the
  // memory-bound floor of any update (reads two arrays, writes one).
  absl::Status Apply() {
    const int64_t n = int64_t{4} << 20;  // 16 MiB of float32, past the caches
    struct Kind {
      std::string name;
      std::unique_ptr<Optimizer> optimizer;
      OptimizerSlots slots;
      std::vector<double> rates;
    };
    std::vector<Kind> kinds;
    for (const char* text : {"sgd {}", "momentum {}", "momentum { nesterov: true }", "adagrad {}",
                             "adam {}", "adamw {}", "ftrl {}"}) {
      OptimizerConfig oc;
      if (!google::protobuf::TextFormat::ParseFromString(text, &oc)) {
        return absl::InternalError(absl::StrCat("apply bench: bad optimizer ", text));
      }
      oc.set_learning_rate(1e-6f);
      Kind k;
      ASSIGN_OR_RETURN(k.optimizer, CreateOptimizer(oc));
      k.name = k.optimizer->name();
      k.optimizer->InitSlots(n, &k.slots);
      kinds.push_back(std::move(k));
    }
    std::vector<float> a(n, 1.0f), b(n, 1e-3f);
    std::vector<double> plain;
    auto rate = [&](const std::function<void()>& body) {
      int64_t passes = 0;
      const absl::Time start = absl::Now();
      do {
        body();
        ++passes;
      } while (absl::Now() - start < absl::Seconds(o_.rep_seconds));
      return static_cast<double>(passes) * n * 4 / absl::ToDoubleSeconds(absl::Now() - start) /
             1e9;
    };
    UpdateInfo update;
    update.learning_rate = 1e-6f;
    for (int rep = 0; rep < o_.reps; ++rep) {
      plain.push_back(rate([&] {
        float* x = a.data();
        const float* y = b.data();
        for (int64_t i = 0; i < n; ++i) x[i] += y[i];
      }));
      for (Kind& k : kinds) {
        k.rates.push_back(rate([&] {
          k.optimizer->Apply(absl::MakeSpan(a), b, &k.slots, update);
          ++update.count;
        }));
      }
    }
    if (!AllFinite(a)) return absl::InternalError("apply bench: values went non-finite");
    const Stats sp = Summarize(plain);
    std::cout << "\n== apply: GB/s of gradient over 16 MiB (median [min-max] of " << o_.reps
              << ") ==\n";
    std::cout << absl::StrFormat("%-24s %s   slots\n", "a += b", Fmt(sp));
    Add("apply", "a_plus_b", n * 4, 0, 1, sp);
    for (const Kind& k : kinds) {
      const Stats st = Summarize(k.rates);
      std::cout << absl::StrFormat("%-24s %s   %zu   %.2fx of a += b\n", k.name + " (server)",
                                   Fmt(st), k.slots.size(), st.median / sp.median);
      Add("apply", k.name, n * 4, 1, 1, st);
    }
    return absl::OkStatus();
  }

  // Checkpoint write and restore speed for a model of checkpoint_mib on 2
  // servers (two shards written at once, as two servers do, then the
  // manifest), beside dd of the same bytes with conv=fsync to the same disk,
  // interleaved. Restore is LoadCheckpoint: reads, CRC32C, reassembly (from
  // the page cache when the machine has room for it; the table says so).
  absl::Status Checkpoint() {
    Env* env = Env::Default();
    const std::string base = !o_.checkpoint_dir.empty() ? o_.checkpoint_dir
                             : !o_.out_dir.empty()     ? o_.out_dir
                                                       : "/tmp";
    const std::string dir = JoinPath(base, absl::StrCat("pstrain-bench-ckpt-", ::getpid()));
    RETURN_IF_ERROR(env->CreateDirs(dir));
    const int64_t total = o_.checkpoint_mib << 20;
    const int shards = 2;
    // Partitions of up to 16 MiB, as the placement splits a large model.
    const int64_t part_elements = (int64_t{16} << 20) / 4;
    std::vector<std::vector<float>> data(shards);
    std::vector<std::vector<ShardTensor>> tensors(shards);
    CheckpointManifest manifest;
    manifest.set_num_shards(shards);
    for (int s = 0; s < shards; ++s) {
      const int64_t elements = total / 4 / shards;
      data[s].resize(elements);
      std::mt19937 rng(s + 1);
      std::uniform_real_distribution<float> u(-1, 1);
      for (float& x : data[s]) x = u(rng);
      const std::string var = absl::StrCat("var", s);
      CheckpointVariable* v = manifest.add_variables();
      v->set_name(var);
      v->add_shape(elements);
      for (int64_t at = 0, p = 0; at < elements; at += part_elements, ++p) {
        ShardTensor t;
        t.variable = var;
        t.partition = static_cast<int>(p);
        t.first_row = at;
        t.elements = std::min(part_elements, elements - at);
        t.shape = {t.elements};
        t.data = data[s].data() + at;
        tensors[s].push_back(t);
      }
    }
    const int reps = std::min(o_.reps, 3);
    std::vector<double> write, restore, dd;
    for (int rep = 0; rep < reps; ++rep) {
      if (stop_->stopped()) return absl::CancelledError(stop_->reason());
      // dd first, its file removed before the checkpoint is written.
      const std::string dd_file = JoinPath(dir, "dd.bin");
      SpawnOptions so;
      so.argv = {"/bin/dd", "if=/dev/zero", "of=" + dd_file, "bs=1M",
                 absl::StrCat("count=", o_.checkpoint_mib), "conv=fsync"};
      so.capture_output = true;
      absl::Time t0 = absl::Now();
      ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> proc, Subprocess::Spawn(so));
      std::optional<int> code = proc->Wait(absl::Seconds(600));
      if (!code.has_value() || *code != 0) return absl::InternalError("dd failed");
      dd.push_back(total / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
      RETURN_IF_ERROR(env->DeleteFile(dd_file));

      const std::string ckpt = JoinPath(dir, CheckpointDirName(rep + 1));
      manifest.set_step(rep + 1);
      manifest.clear_tensors();
      manifest.clear_shards();
      t0 = absl::Now();
      std::vector<absl::StatusOr<std::vector<CheckpointTensor>>> written(shards);
      std::vector<int64_t> bytes(shards);
      std::vector<std::thread> writers;
      for (int s = 0; s < shards; ++s) {
        writers.emplace_back([&, s] {
          written[s] = WriteShard(env, ckpt, s, shards, tensors[s], &bytes[s]);
        });
      }
      for (std::thread& t : writers) t.join();
      for (int s = 0; s < shards; ++s) {
        RETURN_IF_ERROR(written[s].status());
        for (const CheckpointTensor& e : *written[s]) *manifest.add_tensors() = e;
        ShardFile* f = manifest.add_shards();
        f->set_shard(s);
        f->set_file(ShardFileName(s, shards));
        f->set_bytes(bytes[s]);
      }
      RETURN_IF_ERROR(WriteManifest(env, ckpt, manifest));
      write.push_back(total / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);

      t0 = absl::Now();
      ASSIGN_OR_RETURN(RestoredCheckpoint back, LoadCheckpoint(env, ckpt));
      restore.push_back(total / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
      for (int s = 0; s < shards; ++s) {
        const std::vector<float>& got = back.variables.at(absl::StrCat("var", s)).values;
        if (got.size() != data[s].size() ||
            std::memcmp(got.data(), data[s].data(), got.size() * 4) != 0) {
          return absl::DataLossError("checkpoint bench: restored values differ");
        }
      }
      RETURN_IF_ERROR(DeleteRecursively(env, ckpt));
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    const Stats sw = Summarize(write), sr = Summarize(restore), sd = Summarize(dd);
    auto f = [](const Stats& s) {
      return absl::StrFormat("%.3f [%.3f-%.3f]", s.median, s.min, s.max);
    };
    std::cout << "\n== checkpoint: " << o_.checkpoint_mib << " MiB model, " << shards
              << " shards written at once, GB/s (median [min-max] of " << reps
              << "), in " << base << " ==\n";
    std::cout << absl::StrFormat("%-34s %-26s %s\n", "write (fsync, rename, manifest)", f(sw),
                                 absl::StrFormat("%.2fx of dd", sw.median / sd.median));
    std::cout << absl::StrFormat("%-34s %-26s\n", "dd conv=fsync, same bytes, same disk", f(sd));
    std::cout << absl::StrFormat("%-34s %-26s %s\n", "restore (read, CRC32C, reassemble)",
                                 f(sr), "page cache permitting")
              << std::flush;
    Add("checkpoint", "write", total, shards, 0, sw);
    Add("checkpoint", "dd_fsync", total, 1, 0, sd);
    Add("checkpoint", "restore", total, shards, 0, sr);
    return absl::OkStatus();
  }

  // Examples/s of forward + backward alone: the worker's own model on the
  // workers' device (on the CPU one BLAS thread, as the cluster's workers
  // run), batch 64, no network.
  absl::StatusOr<double> ComputeOnly(const TrainingConfig& config) {
    ASSIGN_OR_RETURN(DeviceSpec spec, ParseDeviceSpec(config.device()));
    ASSIGN_OR_RETURN(OpenedDevice device, OpenDevice(spec, config.compute_threads()));
    ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                     Model::Create(config.model(), device.backend.get()));
    RETURN_IF_ERROR(model->SetParameters(model->Initialize(config.seed())));
    const int batch = config.data().batch_size();
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> pixel(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(batch) * model->input_dim());
    std::vector<int32_t> y(batch);
    for (float& v : x) v = pixel(rng);
    for (int32_t& v : y) v = static_cast<int32_t>(rng() % model->num_labels());
    float loss = 0;
    RETURN_IF_ERROR(model->ComputeGradients(x.data(), y.data(), batch, 1, &loss));  // warm-up
    int64_t steps = 0;
    const absl::Time start = absl::Now();
    do {
      RETURN_IF_ERROR(model->UploadParameters());
      RETURN_IF_ERROR(model->ComputeGradients(x.data(), y.data(), batch, steps, &loss));
      ++steps;
    } while (steps < 5 || absl::Now() - start < absl::Seconds(4 * o_.rep_seconds));
    return static_cast<double>(steps) * batch / absl::ToDoubleSeconds(absl::Now() - start);
  }

  // What one training run measured: the chief's examples/s (first report to
  // the end, so start-up is not counted), and the workers' mean time per
  // step waiting on pulls and pushes (summary.json's step_time_ms).
  struct RunResult {
    double examples_per_sec = 0;
    double comm_wait_ms = 0;
  };

  // One run through `pstrain launch` on free ports; `sequential`:
  // rpc.sequential (pull, compute and push strictly in turn).
  absl::StatusOr<RunResult> ClusterRun(const std::string& dir, const std::string& hidden, int ps,
                                       int workers, int64_t steps, bool sequential = false) {
    const std::string spec = JoinPath(dir, "cluster.json");
    RETURN_IF_ERROR(
        WriteFileAtomically(Env::Default(), spec, LocalClusterSpecJson(ps, workers)));
    const std::string out = JoinPath(dir, "out");
    const std::string config = JoinPath(dir, "train.pbtxt");
    RETURN_IF_ERROR(WriteFileAtomically(Env::Default(), config,
                                        TrainConfigText(dir, hidden, steps, out, sequential)));
    SpawnOptions so;
    so.argv = {"/proc/self/exe", "launch", "--cluster_spec=" + spec, "--config=" + config,
               "--progress=false"};
    if (!o_.bin_dir.empty()) so.argv.push_back("--bin_dir=" + o_.bin_dir);
    so.output_file = JoinPath(dir, "launch.log");
    ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> launch, Subprocess::Spawn(so));
    std::optional<int> code = launch->Wait(absl::Seconds(300));
    if (!code.has_value()) {
      launch->Stop(absl::Seconds(5));
      return absl::DeadlineExceededError(absl::StrCat("training run did not end in 300 s; see ", so.output_file));
    }
    if (*code != 0) {
      return absl::InternalError(absl::StrCat("training run exited ", *code, "; see ", so.output_file));
    }
    ASSIGN_OR_RETURN(std::string summary, Env::Default()->ReadFile(JoinPath(out, "summary.json")));
    const nlohmann::json j = nlohmann::json::parse(summary, nullptr, /*allow_exceptions=*/false);
    auto number = [&j](const char* a, const char* b) -> const nlohmann::json* {
      if (!j.is_object() || !j.contains(a)) return nullptr;
      const nlohmann::json* v = &j[a];
      if (b != nullptr) v = v->is_object() && v->contains(b) ? &(*v)[b] : nullptr;
      return v != nullptr && v->is_number() ? v : nullptr;
    };
    const nlohmann::json* rate = number("examples_per_sec", nullptr);
    const nlohmann::json* pull = number("step_time_ms", "pull");
    const nlohmann::json* push = number("step_time_ms", "push");
    if (rate == nullptr || pull == nullptr || push == nullptr) {
      return absl::DataLossError(
          absl::StrCat("no examples_per_sec or step_time_ms in ", out, "/summary.json"));
    }
    return RunResult{rate->get<double>(), pull->get<double>() + push->get<double>()};
  }

  static std::string HiddenUnits(const std::string& hidden) {
    std::string units;
    for (absl::string_view h : absl::StrSplit(hidden, '-', absl::SkipEmpty())) {
      absl::StrAppend(&units, " hidden_units: ", h);
    }
    return units;
  }

  std::string TrainMode() const {
    return o_.async_prefetch ? "async (rpc.async_prefetch)" : o_.async_training ? "async" : "sync";
  }

  std::string TrainConfigText(const std::string& data_dir, const std::string& hidden,
                              int64_t steps, const std::string& out, bool sequential = false) {
    return absl::StrCat(
        "model { mlp { input_dim: 784", HiddenUnits(hidden), " num_classes: 10 } }\n",
        "data { train_images: \"", JoinPath(data_dir, "train-images-idx3-ubyte"),
        "\" train_labels: \"", JoinPath(data_dir, "train-labels-idx1-ubyte"),
        "\" batch_size: 64 shuffle: true normalize: true }\n",
        "optimizer { learning_rate: 0.05 sgd {} }\n", o_.async_training ? "async" : "sync",
        " {}\nmax_steps: ", steps,
        "\nseed: 1\neval_every_steps: 0\ncompute_threads: 1\ndevice: \"", o_.device,
        "\"\noutput_dir: \"", out, "\"\n",
        "rpc { wire_dtype: \"", o_.bfloat16 ? "bfloat16" : "float32", "\"",
        sequential ? " sequential: true" : "",
        // The overlap table's sequential run has no pull ahead either.
        o_.async_prefetch && !sequential ? " async_prefetch: true" : "", " connections_per_server: ",
        o_.train_connections, " }\n");
  }

  absl::Status Train() {
    const std::string dir = absl::StrCat("/tmp/pstrain-bench-train-", ::getpid());
    RETURN_IF_ERROR(Env::Default()->CreateDirs(dir));
    DigitsOptions digits;
    digits.train_examples = 8192;
    digits.test_examples = 64;
    RETURN_IF_ERROR(WriteDigitsDataset(Env::Default(), dir, digits));
    std::cout << "\n== train: " << TrainMode()
              << " examples/s, batch 64 per worker, workers on " << o_.device
              << (o_.device == "cpu" ? " (1 BLAS thread each)" : "") << " (median [min-max] of "
              << o_.reps << ") ==\n";
    std::cout << absl::StrFormat("%-18s %-24s %-24s %-24s %10s %10s\n", "model", "compute-only",
                                 "1 ps + 1 worker", "2 ps + 2 workers", "1+1/comp", "2+2/comp");
    // The same 1 + 1 run again with rpc.sequential, to show how much of the
    // communication the overlap hides (printed after this table).
    std::vector<std::string> overlap_lines;
    for (const std::string& hidden : o_.models) {
      ASSIGN_OR_RETURN(TrainingConfig config,
                       ParseTrainingConfig(TrainConfigText(dir, hidden, 1, dir), "bench"));
      std::vector<double> compute, one, two, seq, one_wait, seq_wait;
      for (int rep = 0; rep < o_.reps; ++rep) {
        if (stop_->stopped()) return absl::CancelledError(stop_->reason());
        ASSIGN_OR_RETURN(double c, ComputeOnly(config));
        compute.push_back(c);
        // About --train_seconds of training at the compute-only rate, at
        // least 20 steps.
        const int64_t steps =
            std::clamp<int64_t>(static_cast<int64_t>(o_.train_seconds * c / 64), 20, 3000);
        ASSIGN_OR_RETURN(RunResult r1, ClusterRun(dir, hidden, 1, 1, steps));
        one.push_back(r1.examples_per_sec);
        one_wait.push_back(r1.comm_wait_ms);
        ASSIGN_OR_RETURN(RunResult rs, ClusterRun(dir, hidden, 1, 1, steps, /*sequential=*/true));
        seq.push_back(rs.examples_per_sec);
        seq_wait.push_back(rs.comm_wait_ms);
        ASSIGN_OR_RETURN(RunResult r2, ClusterRun(dir, hidden, 2, 2, steps));
        two.push_back(r2.examples_per_sec);
      }
      const Stats sc = Summarize(compute), s1 = Summarize(one), s2 = Summarize(two);
      auto f = [](const Stats& s) {
        return absl::StrFormat("%.0f [%.0f-%.0f]", s.median, s.min, s.max);
      };
      const std::string name = absl::StrCat("784-", hidden, "-10");
      std::cout << absl::StrFormat("%-18s %-24s %-24s %-24s %9.2fx %9.2fx\n", name, f(sc), f(s1),
                                   f(s2), s1.median / sc.median, s2.median / sc.median)
                << std::flush;
      // Async rows say so in the CSV (and the plot's labels).
      const std::string what =
          o_.async_training
              ? absl::StrCat(name, o_.async_prefetch ? " async_prefetch" : " async")
              : name;
      Add("train", absl::StrCat(what, " compute_only"), 0, 0, 1, sc);
      Add("train", what, 0, 1, 1, s1);
      Add("train", what, 0, 2, 2, s2);
      // Hidden: the share of the sequential run's wait on the wire that the
      // overlapped run no longer waits for.
      const Stats ss = Summarize(seq), w1 = Summarize(one_wait), ws = Summarize(seq_wait);
      auto ms = [](const Stats& s) {
        return absl::StrFormat("%.2f [%.2f-%.2f]", s.median, s.min, s.max);
      };
      overlap_lines.push_back(absl::StrFormat(
          "%-18s %-24s %-24s %-22s %-22s %7.0f%% %9.2fx\n", name, f(s1), f(ss), ms(w1), ms(ws),
          ws.median > 0 ? 100.0 * (1.0 - w1.median / ws.median) : 0.0, s1.median / ss.median));
      Add("overlap", absl::StrCat(what, " sequential examples/s"), 0, 1, 1, ss);
      Add("overlap", absl::StrCat(what, " wait ms/step overlapped"), 0, 1, 1, w1);
      Add("overlap", absl::StrCat(what, " wait ms/step sequential"), 0, 1, 1, ws);
    }
    if (!overlap_lines.empty()) {
      std::cout << "\n== train: what the overlap hides, " << TrainMode()
                << " 1 ps + 1 worker: examples/s, and "
                   "the worker's wait on pulls + pushes per step (median [min-max]) ==\n"
                << absl::StrFormat("%-18s %-24s %-24s %-22s %-22s %8s %10s\n", "model",
                                   "overlapped ex/s", "rpc.sequential ex/s", "wait ms overlapped",
                                   "wait ms sequential", "hidden", "speed-up");
      for (const std::string& line : overlap_lines) std::cout << line;
      std::cout << std::flush;
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);  // kept when a run failed, for its logs
    return absl::OkStatus();
  }

  const BenchOptions o_;
  StopSignal* const stop_;
  std::vector<CsvRow> rows_;
};

}  // namespace

int RunBench(const BenchOptions& options, StopSignal* stop) {
  TuneAllocator();  // the client side measures as a worker process runs
  return Bench(options, stop).Run();
}

int ServeEcho(const std::string& address, StopSignal* stop) {
  TuneAllocator();  // as tuned as the servers it is compared with
  EchoService service;
  auto server = StartServer(address, &service);
  if (!server.ok()) {
    std::cerr << "pstrain bench: " << server.status().message() << "\n";
    return 1;
  }
  stop->Wait();
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  return 0;
}

}  // namespace pstrain
