// The wire suite of `pstrain bench` (WireSuite, run by the harness,
// tools/bench/harness.cc): GB/s of dense pull + push through the real
// ps_server binaries (1 and 2 servers, 1 and 2 worker threads, each with its
// own PsClient; a row per --connections count), beside a bare protobuf gRPC
// echo of the same bytes (a child process, sync API), one plain TCP stream
// over loopback and memcpy. Every message size of --sizes; the baselines and
// the configurations take turns within each repetition, so that a noisy
// neighbour weighs on all of them alike.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/client/grpc_ps_client.h"
#include "common/cluster/placement.h"
#include "common/rpc/rpc.h"
#include "common/storage/env.h"
#include "tools/bench/harness.h"

namespace pstrain::bench {
namespace {

std::string SizeName(int64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return absl::StrCat(bytes >> 20, " MiB");
  if (bytes >= (1 << 10) && bytes % (1 << 10) == 0) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}

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

// One (servers, workers, size, connections) configuration of the
// parameter server's path: each worker thread pulls every partition and
// pushes a gradient of the same size, async (no waiting on quorum), so the
// figure is the data path. As a worker does (placement.partition_max_bytes
// and rpc.call_bytes), the variable is cut into partitions of up to
// --call_bytes, each server's share travelling in calls of that size in
// flight together (0: one partition and one call per server).
absl::Status PsConfig(const BenchOptions& o, const ClusterSpec& cluster, int workers, int64_t bytes,
                      int connections, std::vector<double>* gbps) {
  const int servers = cluster.num_ps();
  std::vector<VariableSpec> vars = {{"bench", {std::max<int64_t>(bytes / 64, 1), 16}}};
  ASSIGN_OR_RETURN(Placement placement,
                   Placement::Compute(vars, servers, 1, /*partition_max_bytes=*/o.call_bytes));
  ASSIGN_OR_RETURN(TrainingConfig config, AsyncBenchConfig(""));
  const absl::Duration timeout = absl::Seconds(60);
  GrpcPsClient chief(cluster, &placement, -1, timeout);
  chief.set_incarnation(std::random_device()() | 1ULL << 40);
  const int64_t n = vars[0].num_elements();
  RETURN_IF_ERROR(chief.InitializeAll(
      config, 1, workers, 0, {Tensor(vars[0].shape, std::vector<float>(n, 0.5f))}, timeout));
  std::vector<std::unique_ptr<GrpcPsClient>> clients;
  std::vector<std::vector<float>> params(workers, std::vector<float>(n)),
      grads(workers, std::vector<float>(n, 1e-3f));
  for (int w = 0; w < workers; ++w) {
    clients.push_back(std::make_unique<GrpcPsClient>(cluster, &placement, w, timeout));
    clients.back()->set_incarnation(chief.incarnation());
    if (o.bfloat16) clients.back()->set_wire_dtype(DT_BFLOAT16);
    clients.back()->set_chunk_bytes(o.call_bytes);
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
  std::optional<double> r = RunTimed(workers, o.rep_seconds, 2 * n * 4, round, &err);
  if (!r) return err;
  gbps->push_back(*r);
  return absl::OkStatus();
}

}  // namespace

absl::Status WireSuite(BenchContext* ctx) {
  const BenchOptions& o = ctx->options();
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
  RETURN_IF_ERROR(StartServers(o.bin_dir, 1, dir, &procs1, &cluster1));
  RETURN_IF_ERROR(StartServers(o.bin_dir, 2, dir, &procs2, &cluster2));

  std::cout << "\n== wire: dense pull + push payload"
            << (o.bfloat16 ? " (bfloat16 on the wire: GB/s of float32 delivered)" : "")
            << ", GB/s (median [min-max] of " << o.reps << "), interleaved ==\n";
  std::cout << absl::StrFormat("%-8s %-12s %-12s %-22s %-22s %-22s %-22s %8s %8s\n", "size",
                               "ps x workers", "connections", "pstrain", "gRPC echo", "TCP stream",
                               "memcpy", "vs TCP", "vs echo");
  for (int64_t bytes : o.sizes) {
    for (int workers : {1, 2}) {
      // Per connection count: the 1-server and 2-server figures.
      const size_t nc = o.connections.size();
      std::vector<std::vector<double>> ps1(nc), ps2(nc);
      std::vector<double> eg, tcp, mem;
      std::vector<std::string> payload(workers, std::string(bytes, 'x'));
      auto echo_round = [&](int t) { return EchoRound(echo[t].get(), payload[t]); };
      for (int t = 0; t < workers; ++t) RETURN_IF_ERROR(echo_round(t));
      for (int rep = 0; rep < o.reps; ++rep) {
        RETURN_IF_ERROR(ctx->CheckStop());
        for (size_t c = 0; c < nc; ++c) {
          RETURN_IF_ERROR(PsConfig(o, *cluster1, workers, bytes, o.connections[c], &ps1[c]));
          RETURN_IF_ERROR(PsConfig(o, *cluster2, workers, bytes, o.connections[c], &ps2[c]));
        }
        absl::Status err;
        std::optional<double> e = RunTimed(workers, o.rep_seconds, 2 * bytes, echo_round, &err);
        if (!e) return err;
        eg.push_back(*e);
        ASSIGN_OR_RETURN(double t, TcpStream(bytes, o.rep_seconds));
        tcp.push_back(t);
        mem.push_back(MemcpyRate(bytes, o.rep_seconds / 2));
      }
      const Stats se = Summarize(eg), st = Summarize(tcp), sm = Summarize(mem);
      for (int servers : {1, 2}) {
        for (size_t c = 0; c < nc; ++c) {
          const Stats s = Summarize(servers == 1 ? ps1[c] : ps2[c]);
          std::cout << absl::StrFormat("%-8s %-12s %-12d %-22s %-22s %-22s %-22s %7.2fx %7.2fx\n",
                                       SizeName(bytes), absl::StrCat(servers, " x ", workers),
                                       o.connections[c], Fmt(s), Fmt(se), Fmt(st), Fmt(sm),
                                       s.median / st.median, s.median / se.median)
                    << std::flush;
          ctx->Add("wire", "pstrain", bytes, servers, workers, s, o.connections[c]);
        }
      }
      ctx->Add("wire", "grpc_echo", bytes, 1, workers, se);
      ctx->Add("wire", "tcp_stream", bytes, 0, 1, st);
      ctx->Add("wire", "memcpy", bytes, 0, 1, sm);
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

}  // namespace pstrain::bench
