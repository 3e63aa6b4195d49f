#include "common/local_ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace pstrain {

std::vector<int> PickFreePorts(int n) {
  // Bind port 0 on loopback and read back what the kernel chose; the sockets
  // are closed only after all ports are known.
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    int port = 0;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
    fds.push_back(fd);
    ports.push_back(port);
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
