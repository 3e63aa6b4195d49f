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
// `pstrain certs` issues and revokes them (tools/certificate_authority.h);
// renewed files are taken without a restart (common/security/tls_watcher.h).
#ifndef PSTRAIN_COMMON_SECURITY_TLS_H_
#define PSTRAIN_COMMON_SECURITY_TLS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

class TlsWatcher;  // common/security/tls_watcher.h

// A process's loaded, checked TLS material.
struct TlsConfig {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  std::string identity;   // the certificate's common name
  absl::Time not_after;   // when the certificate, or the CA, expires: the sooner
  // Revocation lists (tools/certificate_authority.h writes them): TlsFiles.crl_dir, by
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

// The verified common name of the client certificate of the call `ctx`
// serves; empty when the call came without one (or without TLS).
std::string PeerCommonName(const grpc::ServerContextBase& ctx);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_SECURITY_TLS_H_
