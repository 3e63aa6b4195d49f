// Mutual TLS between a cluster's processes, from a certificate authority of
// the cluster's own (`pstrain certs` writes one, with a certificate per task).
//
// Each task holds the CA's certificate, its own certificate and its key. A
// certificate's subject common name is the task's identity ("worker:3",
// "chief:0", "operator"); a serving task's certificate also names its host
// (the cluster spec's address) as a subject alternative name, which clients
// check. Servers verify any client certificate offered against the cluster
// CA during the handshake; a call without one reaches the server and is
// refused as UNAUTHENTICATED (and counted) by the Authorizer (common/auth.h),
// which takes the caller's identity from the verified certificate.
//
// Files are PEM, as openssl writes and reads them: ca.crt, ca.key (the
// CA's key: keep it off the cluster), and <job>-<index>.crt/.key and
// operator.crt/.key, keys mode 0600.
#ifndef PSTRAIN_COMMON_TLS_H_
#define PSTRAIN_COMMON_TLS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace pstrain {

class ClusterSpec;

// Where a process finds its CA, certificate and key.
struct TlsFiles {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  bool any() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
};

// The files `pstrain certs` wrote in `dir` for `identity` ("ps:1" ->
// dir/ca.crt, dir/ps-1.crt, dir/ps-1.key).
TlsFiles TlsFilesIn(const std::string& dir, const std::string& identity);

// A process's loaded, checked TLS material.
struct TlsConfig {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  std::string identity;   // the certificate's common name
  absl::Time not_after;   // when the certificate, or the CA, expires: the sooner
};

// The DNS name a serving task's certificate carries besides its host
// ("ps:1" -> "ps-1.task.pstrain"): a client that dials ps:1 checks for it,
// so no other task's certificate passes for ps:1's.
std::string TaskAltName(const std::string& identity);

// Reads and checks the three files: PEM that parses, a certificate signed by
// the CA and valid now, a key that is the certificate's and is private (mode
// 0600). Each failure names the file and what is wrong with it.
absl::StatusOr<TlsConfig> LoadTls(const TlsFiles& files);

// gRPC credentials from `tls`. The server asks every client for a
// certificate and verifies one that is offered; the Authorizer refuses calls
// that came without.
std::shared_ptr<grpc::ServerCredentials> TlsServerCredentials(const TlsConfig& tls);
std::shared_ptr<grpc::ChannelCredentials> TlsChannelCredentials(const TlsConfig& tls);

// The verified common name of the client certificate of the call `ctx`
// serves; empty when the call came without one (or without TLS).
std::string PeerCommonName(const grpc::ServerContextBase& ctx);

// Writes a CA (unless `dir` already has ca.crt and ca.key, which are reused)
// and a certificate and key for every task of `cluster` (may be null: then
// only the operator's) and for the operator, valid for `validity` (at most
// until a reused CA expires). Serving tasks' certificates (ps, chief) name
// their host and may serve; workers' and the operator's are for clients
// only. `written` receives the paths written, `expires` (may be null) when
// the new certificates expire.
absl::Status WriteClusterCertificates(const ClusterSpec* cluster, const std::string& dir,
                                      absl::Duration validity, std::vector<std::string>* written,
                                      absl::Time* expires = nullptr);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_TLS_H_
