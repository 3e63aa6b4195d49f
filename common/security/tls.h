// Mutual TLS between a cluster's processes, from a certificate authority of
// the cluster's own (`pstrain certs` writes one, with a certificate per task).
//
// Each task holds the CA's certificate, its own certificate and its key. A
// certificate's subject common name is the task's identity ("worker:3",
// "chief:0", "operator"); a serving task's certificate also names its host
// (the cluster spec's address) as a subject alternative name, which clients
// check. Servers verify any client certificate offered against the cluster
// CA during the handshake; a call without one reaches the server and is
// refused as UNAUTHENTICATED (and counted) by the Authorizer (common/security/auth.h),
// which takes the caller's identity from the verified certificate.
//
// Files are PEM, as openssl writes and reads them: ca.crt, ca.key (the
// CA's key: keep it off the cluster), and <job>-<index>.crt/.key,
// operator.crt/.key and monitor.crt/.key (the scraper's), keys mode 0600.
#ifndef PSTRAIN_COMMON_SECURITY_TLS_H_
#define PSTRAIN_COMMON_SECURITY_TLS_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/tls_certificate_provider.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace pstrain {

class ClusterSpec;

// Where a process finds its CA, certificate and key.
struct TlsFiles {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // The revocation lists' directory; empty: `crl` beside ca_file (where
  // pstrain certs --revoke writes them). Set where the lists are delivered
  // apart from the certificates (a Kubernetes Secret of their own).
  std::string crl_dir;
  bool any() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
};

// The files `pstrain certs` wrote in `dir` for `identity` ("ps:1" ->
// dir/ca.crt, dir/ps-1.crt, dir/ps-1.key).
TlsFiles TlsFilesIn(const std::string& dir, const std::string& identity);

class TlsWatcher;

// A process's loaded, checked TLS material.
struct TlsConfig {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  std::string identity;   // the certificate's common name
  absl::Time not_after;   // when the certificate, or the CA, expires: the sooner
  // Revocation lists (RevokeCertificate writes them): TlsFiles.crl_dir, by
  // default the directory `crl` beside the CA's certificate, which need not
  // exist until the first is made; empty: none. Every handshake checks the
  // peer's certificate against the CA's newest list, read from the
  // directory as it stands then.
  std::string crl_dir;
  // Set where the files are watched for renewal: credentials made from this
  // config then follow the watcher's current material, not the PEMs above
  // (which are what was read at start).
  std::shared_ptr<TlsWatcher> watcher;
};

// The DNS name a serving task's certificate carries besides its host
// ("ps:1" -> "ps-1.task.pstrain"): a client that dials ps:1 checks for it,
// so no other task's certificate passes for ps:1's.
std::string TaskAltName(const std::string& identity);

// The DNS name every task's certificate carries for its monitoring endpoint
// (/metrics over HTTPS): a scraper checks it (Prometheus: tls_config's
// server_name). A worker's certificate carries only this name, so it passes
// for no RPC server.
inline constexpr char kMetricsAltName[] = "metrics.pstrain";

// The identity of the scraper's client certificate (`pstrain certs` writes
// monitor.crt and .key): it may read /metrics, and no RPC accepts it.
inline constexpr char kMonitorIdentity[] = "monitor";

// Reads and checks the three files: PEM that parses, a certificate signed by
// the CA, valid now and not revoked, a key that is the certificate's and is
// private (mode 0600). Each failure names the file and what is wrong with it.
absl::StatusOr<TlsConfig> LoadTls(const TlsFiles& files);

// gRPC credentials from `tls` (its watcher's current material where it has
// one). The server asks every client for a certificate and verifies one
// that is offered; the Authorizer refuses calls that came without. Both
// ends check the peer's certificate against the revocation lists.
std::shared_ptr<grpc::ServerCredentials> TlsServerCredentials(const TlsConfig& tls);
std::shared_ptr<grpc::ChannelCredentials> TlsChannelCredentials(const TlsConfig& tls);

// An OpenSSL server context for HTTPS (the monitoring endpoint) from `tls`:
// TLS 1.2 or later, the certificate chain and key, and the cluster CA, with
// which it verifies a client certificate when one is offered (it asks for
// one; a handshake without one succeeds: the caller looks for the peer's).
absl::StatusOr<std::shared_ptr<ssl_ctx_st>> HttpsServerContext(const TlsConfig& tls);

// Whether the certificate of `tls` names `dns_name` (a subject alternative name).
bool CertificateNames(const TlsConfig& tls, const std::string& dns_name);

// Certificates renewed in place, without restarting the task. Every
// `interval` (on a thread of its own, unless `background` is false: then
// only CheckNow does) it looks at the task's three files (size, time, inode: a
// Kubernetes secret's symlink swap counts); when one changed it reads them
// with LoadTls, and takes them only when they pass and are still the
// certificate of the same identity. Taken material goes to gRPC through a
// private staging directory (mode 0700, in /dev/shm where there is one, so
// the key stays off disk; should the process die without removing it, the
// next watcher on the machine does, once no process holds its lock file)
// whose `current` link is swapped atomically, the
// way gRPC's FileWatcherCertificateProvider asks for, so gRPC never reads
// a key and a certificate that do not match; and to the monitoring endpoint
// through current(). Refused material is logged once (its files' stamps
// are kept) and the current material stays. New connections use the new
// certificate within two intervals (gRPC rereads the staging directory on
// the same interval); connections already open keep theirs.
class TlsWatcher {
 public:
  // Reads `files` (LoadTls), which must be the certificate of `identity`.
  static absl::StatusOr<std::shared_ptr<TlsWatcher>> Start(const TlsFiles& files,
                                                           const std::string& identity,
                                                           absl::Duration interval,
                                                           bool background = true);
  ~TlsWatcher();  // stops watching and removes the staging directory

  // The material in use now (its `watcher` is null).
  std::shared_ptr<const TlsConfig> current() const ABSL_LOCKS_EXCLUDED(mu_);
  // What gRPC credentials read the material from.
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider() const {
    return provider_;
  }
  // Looks at the files now; true when it took new material.
  bool CheckNow() ABSL_LOCKS_EXCLUDED(mu_);
  int64_t reloads() const { return reloads_.load(std::memory_order_relaxed); }
  int64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }
  const std::string& staging_dir() const { return staging_; }

  // Stat results of a file: what tells that it changed.
  struct Stamp {
    int64_t size = -1, mtime_ns = -1, inode = -1, device = -1;
    bool operator==(const Stamp& o) const {
      return size == o.size && mtime_ns == o.mtime_ns && inode == o.inode && device == o.device;
    }
  };

 private:
  TlsWatcher() = default;
  absl::Status Stage(const TlsConfig& tls) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<Stamp> Stamps() const;

  TlsFiles files_;
  std::string identity_;
  std::string staging_;
  int lock_fd_ = -1;  // holds staging_/lock while this process lives
  absl::Duration interval_;
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TlsConfig> current_ ABSL_GUARDED_BY(mu_);
  std::vector<Stamp> stamps_ ABSL_GUARDED_BY(mu_);
  int generation_ ABSL_GUARDED_BY(mu_) = 0;  // the last one made
  int current_generation_ ABSL_GUARDED_BY(mu_) = 0;
  int previous_generation_ ABSL_GUARDED_BY(mu_) = 0;  // kept for a read under way
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> reloads_{0}, refusals_{0};
  std::thread thread_;
};

// The verified common name of the client certificate of the call `ctx`
// serves; empty when the call came without one (or without TLS).
std::string PeerCommonName(const grpc::ServerContextBase& ctx);

// Revokes the certificate `pstrain certs` wrote in `dir` for `identity`: a
// new revocation list signed by the CA (ca.key must be there), holding
// every serial the newest list in dir/crl held and this certificate's,
// written as the next dir/crl/<issuer hash>.rN, the name OpenSSL's
// directory lookup reads (openssl crl -in ... -noout -text shows it).
// `crl_path` receives its path, `revoked` (may be null) how many serials it
// holds. Renewed certificates of the task (pstrain certs again) have new
// serials and are not revoked.
absl::Status RevokeCertificate(const std::string& dir, const std::string& identity,
                               std::string* crl_path, int* revoked = nullptr);

// Writes a CA (unless `dir` already has ca.crt and ca.key, which are reused)
// and a certificate and key for every task of `cluster` (may be null: then
// only the operator's and the scraper's), for the operator and for the
// scraper (kMonitorIdentity), valid for `validity` (at most until a reused
// CA expires). Tasks that serve RPCs (ps, chief) name their host and
// themselves (TaskAltName); every task's certificate names kMetricsAltName;
// the operator's and the scraper's are for clients only. `written`
// receives the paths written, `expires` (may be null) when the new
// certificates expire.
//
// Without a cluster, `unplaced` may ask for the tasks of a cluster whose
// hosts are known only when it starts (Slurm, a Kubeflow TFJob): chief:0,
// ps:0..num_ps-1 and worker:0..num_workers-1, named by task only (no host):
// a client that dials a task checks its task name, one given only an address
// cannot check them.
struct UnplacedTasks {
  int num_ps = 0;
  int num_workers = 0;
};
absl::Status WriteClusterCertificates(const ClusterSpec* cluster, const std::string& dir,
                                      absl::Duration validity, std::vector<std::string>* written,
                                      absl::Time* expires = nullptr,
                                      const UnplacedTasks& unplaced = UnplacedTasks());

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_SECURITY_TLS_H_
