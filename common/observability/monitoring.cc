#include "common/observability/monitoring.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/security/tls_watcher.h"
#include "openssl/err.h"
#include "openssl/ssl.h"
#include "prometheus/text_serializer.h"

namespace pstrain {
namespace {

constexpr size_t kMaxRequest = 8192;

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

// What an SSL call that returned `result` leaves: waiting for the socket
// (`*events` set to what it waits for; true), or failed (false).
bool WaitsForSocket(SSL* ssl, int result, short* events) {
  switch (SSL_get_error(ssl, result)) {
    case SSL_ERROR_WANT_READ: *events = POLLIN; return true;
    case SSL_ERROR_WANT_WRITE: *events = POLLOUT; return true;
    default: ERR_clear_error(); return false;  // closed, or a TLS error
  }
}

class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    const long ticks = ::sysconf(_SC_CLK_TCK);
    const long page = ::sysconf(_SC_PAGESIZE);
    // /proc/self/stat: fields after the command's closing parenthesis.
    std::string stat;
    {
      std::ifstream stat_file("/proc/self/stat");  // closed before the fds are counted
      stat.assign(std::istreambuf_iterator<char>(stat_file), std::istreambuf_iterator<char>());
    }
    const size_t close = stat.rfind(')');
    if (close != std::string::npos && ticks > 0) {
      std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
      // f[0] is field 3 (state): utime 14, stime 15, threads 20, starttime 22, rss 24.
      int64_t utime = 0, stime = 0, threads = 0, start = 0, rss = 0;
      if (f.size() > 21 && absl::SimpleAtoi(f[11], &utime) && absl::SimpleAtoi(f[12], &stime) &&
          absl::SimpleAtoi(f[17], &threads) && absl::SimpleAtoi(f[19], &start) &&
          absl::SimpleAtoi(f[21], &rss)) {
        AddSingle(&out, "process_cpu_seconds_total", "User and system CPU time spent, seconds.",
                  prometheus::MetricType::Counter, static_cast<double>(utime + stime) / ticks);
        AddSingle(&out, "process_resident_memory_bytes", "Resident memory size, bytes.",
                  prometheus::MetricType::Gauge, static_cast<double>(rss) * page);
        AddSingle(&out, "process_threads", "Threads in the process.",
                  prometheus::MetricType::Gauge, static_cast<double>(threads));
        // Boot time from /proc/stat's btime, plus the start in clock ticks
        // (the file is closed again at the end of this block).
        std::ifstream proc_stat("/proc/stat");
        std::string line;
        while (std::getline(proc_stat, line)) {
          int64_t btime = 0;
          if (line.rfind("btime ", 0) == 0 && absl::SimpleAtoi(line.substr(6), &btime)) {
            AddSingle(&out, "process_start_time_seconds",
                      "Start time of the process since the Unix epoch, seconds.",
                      prometheus::MetricType::Gauge,
                      static_cast<double>(btime) + static_cast<double>(start) / ticks);
            break;
          }
        }
      }
    }
    int fds = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
      while (dirent* e = ::readdir(d)) {
        if (e->d_name[0] != '.') ++fds;
      }
      ::closedir(d);
      AddSingle(&out, "process_open_fds", "Open file descriptors.", prometheus::MetricType::Gauge,
                static_cast<double>(fds - 1));  // not the one reading the directory
    }
    return out;
  }
};

}  // namespace

prometheus::MetricFamily Family(const std::string& name, const std::string& help,
                                prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void AddMetric(prometheus::MetricFamily* family,
               std::vector<std::pair<std::string, std::string>> labels, double value) {
  prometheus::ClientMetric m;
  for (auto& [k, v] : labels) m.label.push_back({std::move(k), std::move(v)});
  switch (family->type) {
    case prometheus::MetricType::Counter: m.counter.value = value; break;
    case prometheus::MetricType::Gauge: m.gauge.value = value; break;
    default: m.untyped.value = value; break;
  }
  family->metric.push_back(std::move(m));
}

void AddHistogram(prometheus::MetricFamily* family,
                  std::vector<std::pair<std::string, std::string>> labels,
                  const Histogram::Snapshot& histogram) {
  prometheus::ClientMetric m;
  for (auto& [k, v] : labels) m.label.push_back({std::move(k), std::move(v)});
  m.histogram.sample_count = histogram.cumulative.back();
  m.histogram.sample_sum = histogram.sum;
  for (size_t i = 0; i < histogram.cumulative.size(); ++i) {
    prometheus::ClientMetric::Bucket b;
    b.cumulative_count = histogram.cumulative[i];
    b.upper_bound = i < histogram.bounds.size() ? histogram.bounds[i]
                                                : std::numeric_limits<double>::infinity();
    m.histogram.bucket.push_back(b);
  }
  family->metric.push_back(std::move(m));
}

void AddSingle(std::vector<prometheus::MetricFamily>* out, const std::string& name,
               const std::string& help, prometheus::MetricType type, double value) {
  prometheus::MetricFamily f = Family(name, help, type);
  AddMetric(&f, {}, value);
  out->push_back(std::move(f));
}

std::shared_ptr<prometheus::Collectable> ProcessMetrics() {
  return std::make_shared<ProcessCollector>();
}

namespace {

class RefusalCollector : public prometheus::Collectable {
 public:
  explicit RefusalCollector(const Authorizer* auth) : auth_(auth) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    prometheus::MetricFamily f =
        Family("pstrain_rpc_refused_total",
               "Calls refused before they reached the service: no valid signature or "
               "certificate (unauthenticated), signed before this server started (its caller "
               "signs it again: signed_before_start), or a role that may not make the call "
               "(permission_denied).",
               prometheus::MetricType::Counter);
    AddMetric(&f, {{"reason", "unauthenticated"}}, static_cast<double>(auth_->unauthenticated()));
    AddMetric(&f, {{"reason", "signed_before_start"}},
              static_cast<double>(auth_->signed_before_start()));
    AddMetric(&f, {{"reason", "permission_denied"}}, static_cast<double>(auth_->denied()));
    return {std::move(f)};
  }

 private:
  const Authorizer* const auth_;
};

}  // namespace

namespace {

class RpcCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    const std::vector<const RpcStats::Method*> methods = ServerRpcStats().Methods();
    if (methods.empty()) return out;  // a worker serves no RPCs
    const std::string prefix = "pstrain_rpc_server_";
    const std::string verb = "served";
    prometheus::MetricFamily handled =
        Family(prefix + "handled_total",
               "RPCs " + verb + " by this process that completed, by gRPC status code.",
               prometheus::MetricType::Counter);
    prometheus::MetricFamily seconds = Family(
        prefix + "handling_seconds",
        "Latency of RPCs " + verb + " by this process, from the call's start to its status.",
        prometheus::MetricType::Histogram);
    prometheus::MetricFamily received =
        Family(prefix + "received_bytes_total",
               "Message bytes received in RPCs " + verb + " by this process.",
               prometheus::MetricType::Counter);
    prometheus::MetricFamily sent = Family(
        prefix + "sent_bytes_total", "Message bytes sent in RPCs " + verb + " by this process.",
        prometheus::MetricType::Counter);
    for (const RpcStats::Method* m : methods) {
      for (size_t code = 0; code < m->by_code.size(); ++code) {
        const uint64_t n = m->by_code[code].load(std::memory_order_relaxed);
        if (n == 0 && code != 0) continue;  // OK always; other codes once seen
        AddMetric(&handled,
                  {{"service", m->service}, {"method", m->name},
                   {"code", StatusCodeName(static_cast<int>(code))}},
                  static_cast<double>(n));
      }
      AddHistogram(&seconds, {{"service", m->service}, {"method", m->name}}, m->seconds.Read());
      AddMetric(&received, {{"service", m->service}, {"method", m->name}},
                static_cast<double>(m->received_bytes.load(std::memory_order_relaxed)));
      AddMetric(&sent, {{"service", m->service}, {"method", m->name}},
                static_cast<double>(m->sent_bytes.load(std::memory_order_relaxed)));
    }
    out.push_back(std::move(handled));
    out.push_back(std::move(seconds));
    out.push_back(std::move(received));
    out.push_back(std::move(sent));
    return out;
  }
};

}  // namespace

std::shared_ptr<prometheus::Collectable> RpcMetrics() { return std::make_shared<RpcCollector>(); }

std::shared_ptr<prometheus::Collectable> RefusalMetrics(const Authorizer* auth) {
  return std::make_shared<RefusalCollector>(auth);
}

absl::StatusOr<std::unique_ptr<MonitoringServer>> MonitoringServer::Start(
    const std::string& address, std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
    ReadyFn ready, Labels labels, std::shared_ptr<const TlsConfig> tls) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", address, "\": expected host:port (port 0: any free)"));
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  std::string host = address.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address ", address, ": expected an IPv4 address and a port"));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("metrics endpoint on ", address, ": ", std::strerror(err)));
  }
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  std::unique_ptr<MonitoringServer> s(new MonitoringServer());
  if (tls != nullptr) {
    // What the watcher holds now, which may be newer than `tls`.
    s->https_source_ = tls->watcher ? tls->watcher->current() : tls;
    absl::StatusOr<std::shared_ptr<ssl_ctx_st>> https = HttpsServerContext(*s->https_source_);
    if (!https.ok()) {
      ::close(fd);
      return https.status();
    }
    s->https_ = *std::move(https);
    s->tls_ = tls;
    // OpenSSL writes with write(2), not send(MSG_NOSIGNAL): a client that
    // resets the connection before the answer would end the process with
    // SIGPIPE. EPIPE is then an error like any other.
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
    if (!CertificateNames(*tls, kMetricsAltName)) {
      LOG_WARN("the certificate of {} does not name {}: a scraper that checks it (pstrain "
               "prometheus-config's) refuses this endpoint; write the certificates again with "
               "pstrain certs",
               tls->identity, kMetricsAltName);
    }
  }
  s->host_ = host;
  s->collectables_ = std::move(collectables);
  s->ready_ = std::move(ready);
  s->labels_ = std::move(labels);
  s->listen_fd_ = fd;
  s->port_ = ntohs(sa.sin_port);
  s->thread_ = std::thread([server = s.get()] { server->Serve(); });
  return s;
}

MonitoringServer::~MonitoringServer() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

// One connection in progress. Each moves through its TLS handshake, its
// request, its response and a brief drain without blocking, so the serving
// thread takes every connection a step at a time as its socket is ready:
// a slow client holds only its own connection.
struct MonitoringServer::Client {
  enum class Phase { kHandshake, kRequest, kResponse, kDrain, kDone };
  explicit Client(int fd) : fd(fd) {}
  ~Client() { ::close(fd); }
  const int fd;
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl{nullptr, SSL_free};
  Phase phase = Phase::kRequest;
  short events = POLLIN;  // what it waits for
  absl::Time deadline;    // for its current phase
  bool certified = true;  // showed a certificate of the CA (always, over HTTP)
  std::string request;
  std::string response;
  size_t sent = 0;
};

void MonitoringServer::Serve() {
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<pollfd> fds;
  while (!stopping_) {
    absl::Time now = absl::Now();
    absl::Time wake = now + absl::Milliseconds(200);  // to notice stopping_
    fds.assign(1, pollfd{listen_fd_, POLLIN, 0});
    for (const auto& c : clients) {
      fds.push_back(pollfd{c->fd, c->events, 0});
      wake = std::min(wake, c->deadline);
    }
    const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(wake - now)) + 1;
    if (::poll(fds.data(), fds.size(), static_cast<int>(ms)) < 0 && errno != EINTR) {
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    now = absl::Now();
    for (size_t i = 0; i < clients.size(); ++i) {
      Client* c = clients[i].get();
      // The deadline first: a client that trickles bytes keeps its socket
      // ready, and must not keep its connection past it.
      if (now >= c->deadline) {
        Expire(c);
      } else if (fds[i + 1].revents != 0) {
        Advance(c);
      }
    }
    clients.erase(std::remove_if(clients.begin(), clients.end(),
                                 [](const auto& c) { return c->phase == Client::Phase::kDone; }),
                  clients.end());
    if (fds[0].revents & POLLIN) Accept(&clients);
  }
}

void MonitoringServer::Accept(std::vector<std::unique_ptr<Client>>* clients) {
  for (int accepted = 0; accepted < 64; ++accepted) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // Out of descriptors, say: back off rather than spin on the ready socket.
      if (errno != EINTR && errno != EAGAIN) absl::SleepFor(absl::Milliseconds(50));
      return;
    }
    auto c = std::make_unique<Client>(fd);
    // A client gets 2 s in all for the handshake and its request, and 2 s
    // more to take the response: a slow or silent one costs the server no
    // more than that, and holds no other client up meanwhile.
    c->deadline = absl::Now() + absl::Seconds(2);
    if (https_ != nullptr && !StartTls(c.get())) continue;  // c closes
    Advance(c.get());  // a request already in is answered at once
    if (c->phase == Client::Phase::kDone) continue;
    if (clients->size() >= kMaxClients) {
      // Full: the connection nearest its deadline (the one that has waited
      // longest) is closed, so that clients holding connections open cannot
      // starve a probe.
      auto oldest = std::min_element(
          clients->begin(), clients->end(),
          [](const auto& a, const auto& b) { return a->deadline < b->deadline; });
      shed_.fetch_add(1, std::memory_order_relaxed);
      clients->erase(oldest);
    }
    clients->push_back(std::move(c));
  }
}

bool MonitoringServer::StartTls(Client* c) {
  if (tls_->watcher != nullptr) {
    // A renewed certificate, taken by the watcher: used from this connection on.
    std::shared_ptr<const TlsConfig> now = tls_->watcher->current();
    if (now != https_source_) {
      absl::StatusOr<std::shared_ptr<ssl_ctx_st>> https = HttpsServerContext(*now);
      if (https.ok()) https_ = *std::move(https);
      https_source_ = std::move(now);  // a failure is not tried again for each connection
    }
  }
  c->ssl.reset(SSL_new(https_.get()));
  if (!c->ssl || SSL_set_fd(c->ssl.get(), c->fd) != 1) {
    ERR_clear_error();
    return false;
  }
  c->phase = Client::Phase::kHandshake;
  return true;
}

void MonitoringServer::Advance(Client* c) {
  using Phase = Client::Phase;
  if (c->phase == Phase::kHandshake) {
    const int r = SSL_accept(c->ssl.get());
    if (r != 1) {
      if (!WaitsForSocket(c->ssl.get(), r, &c->events)) {
        failed_handshakes_.fetch_add(1, std::memory_order_relaxed);
        c->phase = Phase::kDone;
      }
      return;
    }
    // Verified in the handshake when offered (a failed check ends it above).
    X509* peer = SSL_get0_peer_certificate(c->ssl.get());
    c->certified = peer != nullptr && SSL_get_verify_result(c->ssl.get()) == X509_V_OK;
    c->phase = Phase::kRequest;
    c->events = POLLIN;
  }
  if (c->phase == Phase::kRequest) {
    char buf[2048];
    while (c->request.find("\r\n\r\n") == std::string::npos &&
           c->request.find("\n\n") == std::string::npos && c->request.size() < kMaxRequest) {
      const size_t want = std::min(sizeof(buf), kMaxRequest - c->request.size());
      if (c->ssl) {
        const int n = SSL_read(c->ssl.get(), buf, static_cast<int>(want));
        if (n > 0) {
          c->request.append(buf, static_cast<size_t>(n));
          continue;
        }
        if (WaitsForSocket(c->ssl.get(), n, &c->events)) return;
        break;  // the client closed: answer what it sent
      }
      const ssize_t n = ::recv(c->fd, buf, want, MSG_DONTWAIT);
      if (n > 0) {
        c->request.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) {
        c->events = POLLIN;
        return;
      }
      break;  // the client half-closed, or an error: answer what it sent
    }
    Respond(c);
  }
  if (c->phase == Phase::kResponse) {
    while (c->sent < c->response.size()) {
      const char* data = c->response.data() + c->sent;
      const size_t left = c->response.size() - c->sent;
      if (c->ssl) {
        const int n = SSL_write(c->ssl.get(), data, static_cast<int>(left));
        if (n > 0) {
          c->sent += static_cast<size_t>(n);
          continue;
        }
        if (WaitsForSocket(c->ssl.get(), n, &c->events)) return;
        c->phase = Phase::kDone;
        return;
      }
      const ssize_t n = ::send(c->fd, data, left, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c->sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) {
        c->events = POLLOUT;
        return;
      }
      c->phase = Phase::kDone;  // the client went away
      return;
    }
    if (c->ssl) SSL_shutdown(c->ssl.get());  // one try: the close_notify, not waiting for the client's
    ERR_clear_error();
    // Half-close and drain what the client still sends (briefly), so the
    // close does not reset the connection before it read the response.
    ::shutdown(c->fd, SHUT_WR);
    c->phase = Phase::kDrain;
    c->events = POLLIN;
    c->deadline = absl::Now() + absl::Milliseconds(100);
  }
  if (c->phase == Phase::kDrain) {
    char sink[4096];
    for (int i = 0; i < 16; ++i) {
      const ssize_t n = ::recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      if (n <= 0) break;
    }
    c->phase = Phase::kDone;
  }
}

void MonitoringServer::Expire(Client* c) {
  switch (c->phase) {
    case Client::Phase::kHandshake:
      failed_handshakes_.fetch_add(1, std::memory_order_relaxed);  // too slow
      c->phase = Client::Phase::kDone;
      return;
    case Client::Phase::kRequest:
      Respond(c);  // what it sent in time: a 400, as a cut-short request
      Advance(c);
      return;
    default:
      c->phase = Client::Phase::kDone;  // a response not taken in time, or the drain over
  }
}

void MonitoringServer::Respond(Client* c) {
  Response r;
  const std::string& request = c->request;
  const size_t eol = request.find_first_of("\r\n");
  std::vector<std::string> parts = absl::StrSplit(request.substr(0, eol), ' ');
  if (eol == std::string::npos || parts.size() != 3 || parts[2].rfind("HTTP/1.", 0) != 0) {
    r = {400, "text/plain", "bad request\n"};
  } else if (parts[0] != "GET" && parts[0] != "HEAD") {
    r = {405, "text/plain", "only GET\n"};
  } else {
    r = Handle(parts[1], c->certified);
  }
  const bool head = parts.size() == 3 && parts[0] == "HEAD";
  c->response = absl::StrCat("HTTP/1.0 ", r.status, " ", Reason(r.status), "\r\nContent-Type: ",
                             r.content_type, "\r\nContent-Length: ", r.body.size(),
                             "\r\nConnection: close\r\n\r\n", head ? "" : r.body);
  c->sent = 0;
  c->phase = Client::Phase::kResponse;
  c->events = POLLOUT;
  c->deadline = absl::Now() + absl::Seconds(2);
}

std::string MonitoringServer::url() const {
  return absl::StrCat(tls_ ? "https" : "http", "://", host_, ":", port_, "/metrics");
}

MonitoringServer::Response MonitoringServer::Handle(const std::string& target,
                                                    bool certified) const {
  const std::string path = target.substr(0, target.find('?'));
  if (path == "/healthz") return {200, "text/plain", "ok\n"};
  if (path == "/readyz") {
    const std::string why = ready_ ? ready_() : "";
    if (why.empty()) return {200, "text/plain", "ready\n"};
    return {503, "text/plain", why + "\n"};
  }
  if (path == "/metrics") {
    if (!certified) {
      uncertified_.fetch_add(1, std::memory_order_relaxed);
      return {403, "text/plain",
              "/metrics needs a client certificate of the cluster's CA (monitor.crt from "
              "pstrain certs)\n"};
    }
    std::vector<prometheus::MetricFamily> families;
    for (const auto& c : collectables_) {
      std::vector<prometheus::MetricFamily> f = c->Collect();
      for (auto& m : f) families.push_back(std::move(m));
    }
    if (tls_ != nullptr) {
      const std::shared_ptr<const TlsConfig> now =
          tls_->watcher ? tls_->watcher->current() : tls_;
      prometheus::MetricFamily expiry = Family(
          "pstrain_tls_certificate_expiry_timestamp_seconds",
          "When this task's certificate, or the CA, expires (the sooner), since the Unix epoch.",
          prometheus::MetricType::Gauge);
      AddMetric(&expiry, {}, absl::ToDoubleSeconds(now->not_after - absl::UnixEpoch()));
      families.push_back(std::move(expiry));
      if (tls_->watcher != nullptr) {
        prometheus::MetricFamily reloads = Family(
            "pstrain_tls_reloads_total",
            "Changed certificate files this task took (ok) or refused, keeping the ones in use "
            "(refused: they failed the start's checks).",
            prometheus::MetricType::Counter);
        AddMetric(&reloads, {{"outcome", "ok"}}, static_cast<double>(tls_->watcher->reloads()));
        AddMetric(&reloads, {{"outcome", "refused"}},
                  static_cast<double>(tls_->watcher->refusals()));
        families.push_back(std::move(reloads));
      }
    }
    prometheus::MetricFamily refused =
        Family("pstrain_monitoring_refused_total",
               "Connections and requests this endpoint refused: connections closed to make room "
               "when too many were open at once (shed), and over HTTPS, failed TLS handshakes "
               "(plaintext, a certificate of another CA, too slow) and /metrics without a client "
               "certificate.",
               prometheus::MetricType::Counter);
    AddMetric(&refused, {{"reason", "shed"}},
              static_cast<double>(shed_.load(std::memory_order_relaxed)));
    if (tls_ != nullptr) {
      AddMetric(&refused, {{"reason", "tls_handshake"}},
                static_cast<double>(failed_handshakes_.load(std::memory_order_relaxed)));
      AddMetric(&refused, {{"reason", "no_client_certificate"}},
                static_cast<double>(uncertified_.load(std::memory_order_relaxed)));
    }
    families.push_back(std::move(refused));
    for (prometheus::MetricFamily& f : families) {
      for (prometheus::ClientMetric& m : f.metric) {
        for (const auto& [name, value] : labels_) m.label.push_back({name, value});
      }
    }
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, families);
    return {200, "text/plain; version=0.0.4; charset=utf-8", out.str()};
  }
  return {404, "text/plain", "not found: /metrics, /healthz, /readyz\n"};
}

}  // namespace pstrain
