#include "common/security/tls.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/base/status_macros.h"
#include "common/security/openssl_util.h"
#include "common/security/tls_watcher.h"
#include "common/storage/env.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "openssl/crypto.h"
#include "openssl/err.h"
#include "openssl/pem.h"
#include "openssl/ssl.h"
#include "openssl/x509v3.h"

namespace pstrain {
namespace {


// OpenSSL frees its global state in an atexit handler, which can run while
// gRPC's threads still use it: a crash at exit (seen here as the launcher's
// exit code 139 after a TLS run; upstream grpc/grpc#38539, fixed there with
// this same flag). Set during static initialisation, before anything else
// initialises OpenSSL; the process's exit frees the memory anyway.
const bool openssl_without_atexit = [] {
  return OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;
}();

}  // namespace

using ossl::Bio;
using ossl::Cert;
using ossl::CheckRevocationLists;
using ossl::CheckRevocations;
using ossl::CommonName;
using ossl::Key;
using ossl::kMaxPemBytes;
using ossl::MemoryBio;
using ossl::NoPassword;
using ossl::NotAfter;
using ossl::OpensslErrors;
using ossl::ParseCerts;
using ossl::ReadPem;
using ossl::Store;
using ossl::StoreCtx;
using ossl::AllowMissingCrl;

std::string TaskAltName(const std::string& identity) {
  return absl::StrCat(absl::StrReplaceAll(identity, {{":", "-"}}), ".task.pstrain");
}

TlsFiles TlsFilesIn(const std::string& dir, const std::string& identity) {
  const std::string base = JoinPath(dir, absl::StrReplaceAll(identity, {{":", "-"}}));
  return TlsFiles{JoinPath(dir, "ca.crt"), base + ".crt", base + ".key"};
}

absl::StatusOr<TlsConfig> LoadTls(const TlsFiles& files) {
  if (files.ca_file.empty() || files.cert_file.empty() || files.key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs all three of the CA certificate, the certificate and its key");
  }
  TlsConfig tls;
  ASSIGN_OR_RETURN(tls.ca_pem, ReadPem(files.ca_file));
  ASSIGN_OR_RETURN(tls.cert_pem, ReadPem(files.cert_file));
  ASSIGN_OR_RETURN(tls.key_pem, ReadPrivateFile(files.key_file, kMaxPemBytes));
  std::vector<Cert> cas = ParseCerts(tls.ca_pem);
  if (cas.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(files.ca_file, ": no PEM certificate (-----BEGIN CERTIFICATE-----) in it"));
  }
  std::vector<Cert> own = ParseCerts(tls.cert_pem);
  if (own.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(files.cert_file, ": no PEM certificate (-----BEGIN CERTIFICATE-----) in it"));
  }
  X509* cert = own.front().get();
  Bio key_bio = MemoryBio(tls.key_pem);
  Key key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, NoPassword, nullptr));
  if (!key) {
    return absl::InvalidArgumentError(absl::StrCat(
        files.key_file, ": not an unencrypted PEM private key (", OpensslErrors(), ")"));
  }
  if (X509_check_private_key(cert, key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(files.key_file, " is not the key of ",
                                                   files.cert_file));
  }
  Store store(X509_STORE_new());
  StoreCtx ctx(X509_STORE_CTX_new());
  if (!store || !ctx) return absl::ResourceExhaustedError("OpenSSL: no memory for a store");
  for (const Cert& ca : cas) X509_STORE_add_cert(store.get(), ca.get());
  // Revocation lists (beside the CA's certificate unless named), from the
  // first one made (the directory need not be there yet): a revoked
  // certificate is refused here too, naming why.
  tls.crl_dir = files.crl_dir.empty() ? JoinPath(Dirname(files.ca_file), "crl") : files.crl_dir;
  RETURN_IF_ERROR(CheckRevocationLists(tls.crl_dir, cas.front().get()));
  if (!CheckRevocations(store.get(), tls.crl_dir)) {
    return absl::InvalidArgumentError(absl::StrCat(
        tls.crl_dir, ": revocation lists that do not load (", OpensslErrors(), ")"));
  }
  STACK_OF(X509)* chain = sk_X509_new_null();
  for (size_t i = 1; i < own.size(); ++i) sk_X509_push(chain, own[i].get());
  const bool inited = X509_STORE_CTX_init(ctx.get(), store.get(), cert, chain) == 1;
  const bool verified = inited && X509_verify_cert(ctx.get()) == 1;
  const int err = inited ? X509_STORE_CTX_get_error(ctx.get()) : X509_V_ERR_UNSPECIFIED;
  sk_X509_free(chain);
  ERR_clear_error();
  if (!verified) {
    return absl::InvalidArgumentError(absl::StrCat(files.cert_file, " does not verify against ",
                                                   files.ca_file, ": ",
                                                   X509_verify_cert_error_string(err)));
  }
  tls.identity = CommonName(cert);
  if (tls.identity.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(files.cert_file, ": no subject common name (the task's identity)"));
  }
  // The chain stops working when its first certificate expires.
  tls.not_after = NotAfter(cert);
  for (const Cert& ca : cas) tls.not_after = std::min(tls.not_after, NotAfter(ca.get()));
  return tls;
}

namespace {

// gRPC's TLS credentials (not its SSL ones, which cannot): they follow a
// watcher's renewed material and check revocation lists. Without a watcher
// the material is static.
std::shared_ptr<grpc::experimental::CertificateProviderInterface> ProviderOf(
    const TlsConfig& tls) {
  if (tls.watcher != nullptr) return tls.watcher->provider();
  std::vector<grpc::experimental::IdentityKeyCertPair> identity;
  if (!tls.cert_pem.empty()) identity.push_back({tls.key_pem, tls.cert_pem});
  return std::make_shared<grpc::experimental::StaticDataCertificateProvider>(tls.ca_pem,
                                                                             identity);
}

template <typename Options>
void SetUpTlsOptions(const TlsConfig& tls, Options* options) {
  options->watch_root_certs();
  if (tls.watcher != nullptr || !tls.cert_pem.empty()) options->watch_identity_key_cert_pairs();
  if (!tls.crl_dir.empty()) options->set_crl_directory(tls.crl_dir);
}

}  // namespace

std::shared_ptr<grpc::ServerCredentials> TlsServerCredentials(const TlsConfig& tls) {
  // Asked for and verified when offered, not required in the handshake: a
  // call without a certificate then reaches the Authorizer, which refuses
  // it with UNAUTHENTICATED and counts it.
  grpc::experimental::TlsServerCredentialsOptions options(ProviderOf(tls));
  SetUpTlsOptions(tls, &options);
  options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> TlsChannelCredentials(const TlsConfig& tls) {
  // The server's certificate is verified against the CA and checked for the
  // channel's target name, or its SslTargetNameOverride (gRPC's host name
  // verifier, the default).
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(ProviderOf(tls));
  SetUpTlsOptions(tls, &options);
  options.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(options);
}

absl::StatusOr<std::shared_ptr<ssl_ctx_st>> HttpsServerContext(const TlsConfig& tls) {
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_server_method()), SSL_CTX_free);
  if (!ctx) return absl::InternalError(absl::StrCat("SSL_CTX_new: ", OpensslErrors()));
  std::vector<Cert> chain = ParseCerts(tls.cert_pem);
  std::vector<Cert> cas = ParseCerts(tls.ca_pem);
  Bio key_bio = MemoryBio(tls.key_pem);
  Key key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, NoPassword, nullptr));
  if (chain.empty() || cas.empty() || !key) {
    ERR_clear_error();
    return absl::InvalidArgumentError("HTTPS: the TLS material does not parse");
  }
  bool ok = SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION) == 1 &&
            SSL_CTX_use_certificate(ctx.get(), chain.front().get()) == 1 &&
            SSL_CTX_use_PrivateKey(ctx.get(), key.get()) == 1 &&
            SSL_CTX_check_private_key(ctx.get()) == 1;
  for (size_t i = 1; ok && i < chain.size(); ++i) {
    ok = SSL_CTX_add1_chain_cert(ctx.get(), chain[i].get()) == 1;
  }
  X509_STORE* store = SSL_CTX_get_cert_store(ctx.get());
  for (const Cert& ca : cas) {
    // The store verifies client certificates; the list tells clients which
    // CA's certificate to offer.
    ok = ok && X509_STORE_add_cert(store, ca.get()) == 1 &&
         SSL_CTX_add_client_CA(ctx.get(), ca.get()) == 1;
  }
  ok = ok && (tls.crl_dir.empty() || CheckRevocations(store, tls.crl_dir));
  if (!ok) return absl::InternalError(absl::StrCat("HTTPS context: ", OpensslErrors()));
  // One request per connection: nothing to resume, and no session cache or
  // tickets for clients to fill; no renegotiation to hold the thread with.
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_num_tickets(ctx.get(), 0);  // TLS 1.3's, sent after the handshake
  // Asked for, and verified when offered; not required (probes come without).
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, AllowMissingCrl);
  return ctx;
}

bool CertificateNames(const TlsConfig& tls, const std::string& dns_name) {
  std::vector<Cert> chain = ParseCerts(tls.cert_pem);
  return !chain.empty() && X509_check_host(chain.front().get(), dns_name.data(), dns_name.size(),
                                           X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS, nullptr) == 1;
}

std::string PeerCommonName(const grpc::ServerContextBase& ctx) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  std::vector<grpc::string_ref> cn = auth->FindPropertyValues("x509_common_name");
  if (cn.empty()) return "";
  return std::string(cn.front().data(), cn.front().size());
}

}  // namespace pstrain
