// The harness of `pstrain bench`: RunBench and ServeEcho (tools/bench.h),
// called by tools/main.cc, and the helpers every suite shares
// (tools/bench/harness.h). RunBench runs the suites named in --suites in
// order, one BenchContext for all of them; with --out it then writes their
// rows to bench.csv and, when a wire or train suite ran, draws bench.png
// with tools/bench/plot.py, which the binary carries as a string.

#include "tools/bench/harness.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/base/embedding_ids.h"
#include "common/base/status_macros.h"
#include "common/cluster/config.h"
#include "common/rpc/rpc.h"
#include "common/runtime/allocator.h"
#include "common/storage/env.h"
#include "tools/bench/plot_script.h"
#include "tools/launcher.h"
#include "tools/local_ports.h"
#include "tools/python_plot.h"

namespace pstrain {
namespace bench {

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

absl::Status EchoRound(BenchEcho::Stub* echo, const std::string& payload) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(60));
  EchoMessage req, resp;
  req.set_payload(payload);
  return FromGrpcStatus(echo->Echo(&ctx, req, &resp), "echo");
}

absl::StatusOr<TrainingConfig> AsyncBenchConfig(const std::string& extra) {
  return ParseTrainingConfig(absl::StrCat(R"(
model { mlp { input_dim: 2 num_classes: 2 } }
data { train_images: "unused" train_labels: "unused" batch_size: 1 }
optimizer { learning_rate: 1e-12 }
async { }
max_steps: 1000000000000
)", extra), "bench");
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

PlainRows::PlainRows(int64_t n, int dim)
    : dim_(dim), rows_(static_cast<size_t>(n) * dim, 0.01f) {
  index_.reserve(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    index_[MixId(static_cast<uint64_t>(r))] = static_cast<uint32_t>(r);
  }
}

absl::Status PlainRows::Lookup(const std::vector<uint64_t>& ids, float* out) const {
  for (uint64_t id : ids) {
    auto it = index_.find(id);
    if (it == index_.end()) return absl::InternalError("plain lookup: missing id");
    std::memcpy(out, rows_.data() + static_cast<size_t>(it->second) * dim_,
                static_cast<size_t>(dim_) * sizeof(float));
    out += dim_;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ScratchDir(const BenchOptions& o, const std::string& suite,
                                       std::string* base) {
  *base = !o.checkpoint_dir.empty() ? o.checkpoint_dir : !o.out_dir.empty() ? o.out_dir : "/tmp";
  const std::string dir = JoinPath(*base, absl::StrCat("pstrain-bench-", suite, "-", ::getpid()));
  RETURN_IF_ERROR(Env::Default()->CreateDirs(dir));
  return dir;
}

absl::Status StartServers(const std::string& bin_dir, int n, const std::string& dir,
                          std::vector<std::unique_ptr<Subprocess>>* procs,
                          std::optional<ClusterSpec>* cluster) {
  const std::string bin = FindBinary(bin_dir, "ps_server", "ps_server");
  if (bin.empty()) {
    return absl::NotFoundError("no ps_server binary next to pstrain or in --bin_dir");
  }
  const std::string path = JoinPath(dir, absl::StrCat("cluster", n, ".json"));
  RETURN_IF_ERROR(WriteFileAtomically(Env::Default(), path, LocalClusterSpecJson(n, 2)));
  ASSIGN_OR_RETURN(ClusterSpec parsed, ClusterSpec::FromFile(path));
  *cluster = std::move(parsed);
  for (int s = 0; s < n; ++s) {
    SpawnOptions so;
    // Unauthenticated on purpose: the bench's process plays chief and
    // workers at once (the train suite runs authenticated, through launch).
    so.argv = {bin, absl::StrCat("--cluster_spec=", path), absl::StrCat("--task=", s),
               "--log_level=warn", "--insecure", "--chief_timeout_s=0"};
    so.output_file = JoinPath(dir, absl::StrCat("ps", n, "_", s, ".log"));
    ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> p, Subprocess::Spawn(so));
    procs->push_back(std::move(p));
  }
  return absl::OkStatus();
}

namespace {

// The suites by their names in --suites.
struct Suite {
  const char* name;
  absl::Status (*run)(BenchContext* ctx);
};
constexpr Suite kSuites[] = {
    {"wire", WireSuite},     {"apply", ApplySuite},           {"train", TrainSuite},
    {"sparse", SparseSuite}, {"checkpoint", CheckpointSuite}, {"tables", TablesSuite},
};

absl::Status RunSuite(const std::string& name, BenchContext* ctx) {
  for (const Suite& suite : kSuites) {
    if (name == suite.name) return suite.run(ctx);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown suite \"", name, "\""));
}

// bench.csv at `path`, one line per row, in the order the suites added them.
absl::Status WriteCsv(const std::string& dir, const std::string& path,
                      const std::vector<CsvRow>& rows) {
  std::string csv = "suite,what,bytes,servers,workers,gbps_median,gbps_min,gbps_max,connections\n";
  for (const CsvRow& r : rows) {
    absl::StrAppendFormat(&csv, "%s,%s,%d,%d,%d,%.4f,%.4f,%.4f,%d\n", r.suite, r.what, r.bytes,
                          r.servers, r.workers, r.gbps.median, r.gbps.min, r.gbps.max,
                          r.connections);
  }
  RETURN_IF_ERROR(Env::Default()->CreateDirs(dir));
  return WriteFileAtomically(Env::Default(), path, csv);
}

// bench.png from the CSV (tools/python_plot.h).
void Plot(const std::string& out_dir, const std::string& csv, const std::string& png) {
  std::cout << DrawWithPython(out_dir, "bench_plot.py", kPlotScript, {csv, png}, png) << "\n";
}

class EchoService final : public BenchEcho::Service {
  grpc::Status Echo(grpc::ServerContext*, const EchoMessage* req, EchoMessage* resp) override {
    *resp->mutable_payload() = req->payload();
    return grpc::Status::OK;
  }
};

}  // namespace
}  // namespace bench

int RunBench(const BenchOptions& options, StopSignal* stop) {
  TuneAllocator();  // the client side measures as a worker process runs
  bench::BenchContext ctx(options, stop);
  for (const std::string& s : options.suites) {
    absl::Status st = bench::RunSuite(s, &ctx);
    if (!st.ok()) {
      std::cerr << "pstrain bench: " << st.message() << "\n";
      return 1;
    }
  }
  if (options.out_dir.empty()) return 0;
  const std::string path = JoinPath(options.out_dir, "bench.csv");
  absl::Status st = bench::WriteCsv(options.out_dir, path, ctx.rows());
  if (!st.ok()) {
    std::cerr << "pstrain bench: " << st.message() << "\n";
    return 1;
  }
  std::cout << "wrote " << path << "\n";
  // The plot draws the wire and train suites; the others are tables only.
  if (std::any_of(ctx.rows().begin(), ctx.rows().end(), [](const bench::CsvRow& r) {
        return r.suite == "wire" || r.suite == "train";
      })) {
    bench::Plot(options.out_dir, path, JoinPath(options.out_dir, "bench.png"));
  }
  return 0;
}

int ServeEcho(const std::string& address, StopSignal* stop) {
  TuneAllocator();  // as tuned as the servers it is compared with
  bench::EchoService service;
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
