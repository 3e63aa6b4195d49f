#include "tools/local_ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pstrain {

namespace {

// Where the kernel's ephemeral range (net.ipv4.ip_local_port_range) starts:
// from it the kernel hands out ports to bind(:0) and outgoing connections.
int EphemeralLow() {
  int low = 32768;  // Linux's default
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int a = 0, b = 0;
    if (std::fscanf(f, "%d %d", &a, &b) == 2 && a > 0 && a <= b) low = a;
    std::fclose(f);
  }
  return low;
}

// A socket bound to `port` on loopback (0: the kernel chooses), and the port
// it got; {-1, 0} when it could not be bound.
std::pair<int, int> BindLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return {-1, 0};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return {-1, 0};
  }
  return {fd, ntohs(addr.sin_port)};
}

}  // namespace

std::vector<int> PickFreePorts(int n) {
  // The ports come from below the ephemeral range where it leaves room: a
  // port the kernel can hand out is free only until the daemons bind it, and
  // in that gap a daemon's own ":0" port or an outgoing connection could get
  // it. Random candidates, so that tests running beside each other rarely
  // try the same ones; each is bound to prove it free, and every socket
  // stays bound until all are chosen, so no port is handed out twice. Where
  // the range leaves no room, the kernel chooses. A port that could not be
  // had is 0.
  const int low = EphemeralLow();
  constexpr int kFloor = 10000;
  std::mt19937 rng(std::random_device{}());
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    std::pair<int, int> bound{-1, 0};
    if (low - kFloor >= 1000) {
      std::uniform_int_distribution<int> pick(kFloor, low - 1);
      for (int attempt = 0; attempt < 200 && bound.first < 0; ++attempt) {
        bound = BindLoopback(pick(rng));
      }
    }
    if (bound.first < 0) bound = BindLoopback(0);
    fds.push_back(bound.first);
    ports.push_back(bound.second);
  }
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
  return ports;
}

std::string LocalClusterSpecJson(int ps, int workers, bool metrics) {
  const std::vector<int> ports = PickFreePorts((metrics ? 2 : 1) * (1 + ps + workers));
  size_t next = 0;
  auto list = [&ports, &next](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) {
      absl::StrAppend(&s, i ? ", " : "", "\"127.0.0.1:", ports[next++], "\"");
    }
    return s;
  };
  const std::string chief = list(1);
  const std::string servers = list(ps);
  const std::string worker_list = list(workers);
  std::string extras;
  if (metrics) {
    const std::string chief_m = list(1), ps_m = list(ps);
    extras = absl::StrCat(",\n \"pstrain\": {\"metrics\": {\"chief\": [", chief_m, "], \"ps\": [",
                          ps_m, "], \"worker\": [", list(workers), "]}}");
  }
  return absl::StrCat("{\"chief\": [", chief, "], \"ps\": [", servers, "], \"worker\": [",
                      worker_list, "]", extras, "}\n");
}

}  // namespace pstrain
