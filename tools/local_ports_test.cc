#include "tools/local_ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <set>
#include <vector>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

int EphemeralLow() {
  int low = 32768, high = 0;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  return low;
}

bool CanBind(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  if (fd >= 0) ::close(fd);
  return ok;
}

TEST_CASE("free ports are distinct, bindable, and outside the kernel's ephemeral range") {
  const int low = EphemeralLow();
  INFO("ephemeral range starts at " << low);
  const std::vector<int> ports = PickFreePorts(24);
  REQUIRE(ports.size() == 24);
  std::set<int> distinct;
  for (int p : ports) {
    INFO("port " << p);
    CHECK(p > 0);
    // Where the range leaves room below it, no port is one the kernel could
    // hand to a daemon's ":0" or an outgoing connection in the meantime.
    if (low >= 11000) CHECK(p < low);
    CHECK(CanBind(p));  // (a test beside this one could take it first: rare)
    distinct.insert(p);
  }
  CHECK(distinct.size() == ports.size());
}

TEST_CASE("a port already bound is never picked") {
  std::vector<int> fds;
  std::set<int> held;
  for (int p : PickFreePorts(16)) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(p));
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    fds.push_back(fd);
    held.insert(p);
  }
  for (int round = 0; round < 20; ++round) {
    for (int p : PickFreePorts(16)) CHECK(held.count(p) == 0);
  }
  for (int fd : fds) ::close(fd);
}

}  // namespace
}  // namespace pstrain
