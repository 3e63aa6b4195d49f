// An HTTPS client for tests of the monitoring endpoint (common/observability/monitoring.h):
// one GET over TLS to 127.0.0.1, verifying the server's certificate against a
// CA and a name, optionally showing a client certificate. Bounded: the
// connection, the handshake and the response have 10 s.
#ifndef PSTRAIN_COMMON_TESTING_HTTPS_GET_H_
#define PSTRAIN_COMMON_TESTING_HTTPS_GET_H_

#include <string>

#include "common/security/tls.h"

namespace pstrain::testing {

// GET https://127.0.0.1:port/path. `files.ca_file` is the CA the server's
// certificate must verify against, for `server_name` (a DNS name);
// `files.cert_file` and `.key_file`, when set, the client's certificate.
// The whole response, or "" with `*error` saying what failed (the
// connection, the handshake, the server's certificate). `server_cert`, when
// given, receives the PEM of the certificate the server showed.
std::string HttpsGet(int port, const std::string& path, const TlsFiles& files,
                     const std::string& server_name, std::string* error,
                     std::string* server_cert = nullptr);

}  // namespace pstrain::testing

#endif  // PSTRAIN_COMMON_TESTING_HTTPS_GET_H_
