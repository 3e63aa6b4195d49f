// Authentication at the door: server credentials that check each call's
// signature from its headers, before its body is read or takes any of the
// server's in-flight memory.
//
// gRPC reads a unary call's whole message before the handler runs, and the
// memory it reads into is the server's in-flight quota (StartServer's
// ResourceQuota): checked in the handler, an unauthenticated 200 MiB push
// would have spent the quota, and gRPC, to stay within it, resets streams it
// picks, a legitimate worker's among them. A port with these credentials
// runs Authorizer::AuthenticateHeaders in gRPC's server auth filter, as the
// headers arrive: a call that fails it ends there (its status and message
// go back to the caller as the handler's would), its body never requested,
// and what arrived of it (at most the stream's flow-control window) freed.
// Roles are still checked in the handlers (Authorizer::Check), which skip
// the signature the door has verified (and whose nonce it has spent).
#ifndef PSTRAIN_COMMON_RPC_SERVER_GATE_H_
#define PSTRAIN_COMMON_RPC_SERVER_GATE_H_

#include <memory>

#include "common/security/auth.h"
#include "grpcpp/security/server_credentials.h"

namespace pstrain {

struct TlsConfig;

// Credentials for a listening port, TLS's (`tls`) or plaintext (null), that
// authenticate every call with `auth` as its headers arrive, and mark `auth`
// gated. `auth` must outlive the server. With authentication off, the
// port's credentials alone.
std::shared_ptr<grpc::ServerCredentials> GatedServerCredentials(const TlsConfig* tls,
                                                                Authorizer* auth);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_RPC_SERVER_GATE_H_
