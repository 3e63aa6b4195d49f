#include "common/security/tls.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/cluster/cluster_spec.h"
#include "common/storage/env.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "openssl/bio.h"
#include "openssl/bn.h"
#include "openssl/crypto.h"
#include "openssl/err.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "openssl/rand.h"
#include "openssl/ssl.h"
#include "openssl/x509.h"
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

// OpenSSL objects owned by unique_ptr, each freed by its own function.
template <auto free_fn>
struct OpensslFree {
  template <typename T>
  void operator()(T* p) const {
    free_fn(p);
  }
};
using Bio = std::unique_ptr<BIO, OpensslFree<BIO_free>>;
using Cert = std::unique_ptr<X509, OpensslFree<X509_free>>;
using Key = std::unique_ptr<EVP_PKEY, OpensslFree<EVP_PKEY_free>>;
using Store = std::unique_ptr<X509_STORE, OpensslFree<X509_STORE_free>>;
using StoreCtx = std::unique_ptr<X509_STORE_CTX, OpensslFree<X509_STORE_CTX_free>>;
using Bignum = std::unique_ptr<BIGNUM, OpensslFree<BN_free>>;

constexpr size_t kMaxPemBytes = 1 << 20;

// OpenSSL's queued errors as one line (and the queue emptied).
std::string OpensslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out.empty() ? "no detail from OpenSSL" : out;
}

// Revocation lists are checked where there are some: a CA without one
// (none revoked yet) is not an error.
int AllowMissingCrl(int ok, X509_STORE_CTX* ctx) {
  if (ok == 0 && X509_STORE_CTX_get_error(ctx) == X509_V_ERR_UNABLE_TO_GET_CRL) {
    X509_STORE_CTX_set_error(ctx, X509_V_OK);
    return 1;
  }
  return ok;
}

// Has `store` check leaf certificates against the lists in `crl_dir`, read
// through OpenSSL's hashed-directory lookup at each verification.
bool CheckRevocations(X509_STORE* store, const std::string& crl_dir) {
  if (X509_STORE_load_locations(store, nullptr, crl_dir.c_str()) != 1) return false;
  X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
  X509_STORE_set_verify_cb(store, AllowMissingCrl);
  return true;
}

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Refuses encrypted keys rather than prompting on a terminal.
int NoPassword(char*, int, int, void*) { return 0; }

std::vector<Cert> ParseCerts(const std::string& pem) {
  std::vector<Cert> certs;
  Bio bio = MemoryBio(pem);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, NoPassword, nullptr)) {
    certs.emplace_back(x);
  }
  ERR_clear_error();  // the end of the input reads as an error
  return certs;
}

std::string CommonName(X509* cert) {
  X509_NAME* name = X509_get_subject_name(cert);
  const int at = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
  if (at < 0) return "";
  unsigned char* utf8 = nullptr;
  const int n = ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, at)));
  if (n < 0) return "";
  std::string cn(reinterpret_cast<char*>(utf8), n);
  OPENSSL_free(utf8);
  return cn;
}

absl::Time NotAfter(const X509* cert) {
  struct tm tm = {};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm) != 1) return absl::InfinitePast();
  return absl::FromTimeT(timegm(&tm));
}

absl::StatusOr<std::string> ReadPem(const std::string& path) {
  ASSIGN_OR_RETURN(int64_t size, Env::Default()->FileSize(path));
  if (size > static_cast<int64_t>(kMaxPemBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", size, " bytes; a PEM file here "
                                                   "has at most ", kMaxPemBytes));
  }
  return Env::Default()->ReadFile(path);
}

// The CA's revocation lists as OpenSSL's directory lookup names them,
// crl/<hash of the CA's name>.r0, .r1, ...
std::string CrlHash(X509* ca) {
  int ok = 0;
  const unsigned long h = X509_NAME_hash_ex(X509_get_subject_name(ca), nullptr, nullptr, &ok);
  return ok == 1 ? absl::StrFormat("%08lx", h) : "";
}

using Crl = std::unique_ptr<X509_CRL, OpensslFree<X509_CRL_free>>;

// The CA's lists in `crl_dir`, oldest first (the next one is .r<size>),
// each checked: a list that does not parse or is not the CA's would be
// skipped by every handshake without a word (a missing list is no error).
absl::StatusOr<std::vector<Crl>> ReadRevocationLists(const std::string& crl_dir, X509* ca) {
  const std::string hash = CrlHash(ca);
  if (hash.empty()) return absl::InternalError(absl::StrCat("the CA's name hash: ", OpensslErrors()));
  std::vector<Crl> lists;
  for (;;) {
    const std::string path = JoinPath(crl_dir, absl::StrCat(hash, ".r", lists.size()));
    if (!Env::Default()->FileExists(path)) return lists;
    ASSIGN_OR_RETURN(std::string pem, ReadPem(path));
    Bio bio = MemoryBio(pem);
    Crl crl(PEM_read_bio_X509_CRL(bio.get(), nullptr, NoPassword, nullptr));
    if (!crl || X509_CRL_verify(crl.get(), X509_get0_pubkey(ca)) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": not a PEM revocation list signed by the CA (handshakes would skip it)"));
    }
    lists.push_back(std::move(crl));
  }
}

// Refused as well: a path OpenSSL would split (it takes ':' as a list
// separator).
absl::Status CheckRevocationLists(const std::string& crl_dir, X509* ca) {
  if (crl_dir.find(':') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        crl_dir, ": OpenSSL reads ':' as a separator of directories; move the TLS files"));
  }
  return ReadRevocationLists(crl_dir, ca).status();
}

// --- writing ---

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) {
    return absl::InternalError(absl::StrCat("certificate extension ", OBJ_nid2sn(nid), "=", value,
                                            ": ", OpensslErrors()));
  }
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (ok != 1) return absl::InternalError(absl::StrCat("X509_add_ext: ", OpensslErrors()));
  return absl::OkStatus();
}

// A certificate for `cn` and `key`, signed by `issuer`/`issuer_key` (or by
// itself when `issuer` is null, as the CA is).
// A certificate that serves (`serves`: a task's) gets serverAuth and `san`,
// its subject alternative names; the operator's and the scraper's only
// clientAuth, so they cannot pose as a server.
absl::StatusOr<Cert> MakeCertificate(const std::string& cn, EVP_PKEY* key, X509* issuer,
                                     EVP_PKEY* issuer_key, bool is_ca, bool serves,
                                     const std::string& san, absl::Duration validity) {
  Cert cert(X509_new());
  Bignum serial(BN_new());
  X509_NAME* name = X509_get_subject_name(cert.get());
  const long seconds = static_cast<long>(absl::ToInt64Seconds(validity));
  const bool ok =
      cert && serial && X509_set_version(cert.get(), X509_VERSION_3) == 1 &&
      BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) == 1 &&
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) != nullptr &&
      // An hour back, for clocks a little behind the one that wrote it.
      X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) != nullptr &&
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), seconds) != nullptr &&
      X509_set_pubkey(cert.get(), key) == 1 &&
      X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>("pstrain"), -1, -1,
                                 0) == 1 &&
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                                 0) == 1 &&
      X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name) == 1;
  if (!ok) return absl::InternalError(absl::StrCat("certificate for ", cn, ": ", OpensslErrors()));
  X509* signer = issuer ? issuer : cert.get();
  RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_subject_key_identifier, "hash"));
  RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_authority_key_identifier, "keyid:always"));
  if (is_ca) {
    RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0"));
    RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign"));
  } else {
    RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE"));
    RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_key_usage, "critical,digitalSignature"));
    RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_ext_key_usage,
                                 serves ? "serverAuth,clientAuth" : "clientAuth"));
    if (serves && !san.empty()) {
      RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_subject_alt_name, san));
    }
  }
  if (X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()) <= 0) {
    return absl::InternalError(absl::StrCat("signing the certificate for ", cn, ": ",
                                            OpensslErrors()));
  }
  return cert;
}

std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::string(data, n);
}

absl::StatusOr<std::string> CertPem(X509* cert) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) {
    return absl::InternalError(absl::StrCat("PEM of a certificate: ", OpensslErrors()));
  }
  return BioText(bio.get());
}

absl::StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!bio ||
      PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return absl::InternalError(absl::StrCat("PEM of a key: ", OpensslErrors()));
  }
  return BioText(bio.get());
}

absl::StatusOr<Key> NewKey() {
  Key key(EVP_EC_gen("P-256"));
  if (!key) return absl::InternalError(absl::StrCat("a P-256 key: ", OpensslErrors()));
  return key;
}

// The subjectAltName value naming `host`.
std::string AltName(const std::string& host) {
  in_addr v4;
  in6_addr v6;
  const bool ip = ::inet_pton(AF_INET, host.c_str(), &v4) == 1 ||
                  ::inet_pton(AF_INET6, host.c_str(), &v6) == 1;
  return absl::StrCat(ip ? "IP:" : "DNS:", host);
}

}  // namespace

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

namespace {

TlsWatcher::Stamp StampOf(const std::string& path) {
  TlsWatcher::Stamp stamp;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    stamp.size = st.st_size;
    stamp.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    stamp.inode = static_cast<int64_t>(st.st_ino);
    stamp.device = static_cast<int64_t>(st.st_dev);
  }
  return stamp;
}

std::string Expiry(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d %H:%M UTC", t, absl::UTCTimeZone());
}

// Removes a staging directory without following links: `current` and
// `current.tmp` are links into it, the generations hold plain files.
void RemoveStaging(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = JoinPath(dir, name);
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      RemoveStaging(path);
    } else {
      ::unlink(path.c_str());
    }
  }
  ::closedir(d);
  ::rmdir(dir.c_str());
}

// Staging directories whose process is gone (killed before it could remove
// its own): pstrain-tls-* in `base` whose `lock` file no process holds. A
// lock, not a process id: processes in other PID namespaces (containers
// sharing /dev/shm) cannot see each other's ids, but the kernel's locks
// are the same for all. A directory without a lock file (one being made:
// its lock is named only once it is held) is left alone.
void RemoveStaleStaging(const std::string& base) {
  DIR* d = ::opendir(base.c_str());
  if (d == nullptr) return;
  std::vector<std::string> stale;
  while (dirent* e = ::readdir(d)) {
    if (!absl::StartsWith(e->d_name, "pstrain-tls-")) continue;
    const std::string path = JoinPath(base, e->d_name);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid()) {
      continue;
    }
    const int fd = ::open(JoinPath(path, "lock").c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) stale.push_back(path);
    ::close(fd);  // (and with it the lock just taken)
  }
  ::closedir(d);
  for (const std::string& path : stale) RemoveStaging(path);
}

}  // namespace

absl::StatusOr<std::shared_ptr<TlsWatcher>> TlsWatcher::Start(const TlsFiles& files,
                                                              const std::string& identity,
                                                              absl::Duration interval,
                                                              bool background) {
  if (interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError("certificates are looked at once a second at most");
  }
  // In memory where the machine has it: the key copy never reaches a disk.
  const char* tmp = std::getenv("TMPDIR");
  const std::string base = ::access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm"
                           : tmp != nullptr && *tmp != '\0'    ? tmp
                                                                : "/tmp";
  RemoveStaleStaging(base);
  std::shared_ptr<TlsWatcher> w(new TlsWatcher());
  w->files_ = files;
  w->identity_ = identity;
  w->interval_ = interval;
  // Stamped before it is read: a change in between is seen at the first look.
  std::vector<Stamp> stamps = w->Stamps();
  ASSIGN_OR_RETURN(TlsConfig tls, LoadTls(files));
  if (tls.identity != identity) {
    return absl::InvalidArgumentError(absl::StrCat(files.cert_file, " is the certificate of \"",
                                                   tls.identity, "\", not of ", identity));
  }
  std::string dir = JoinPath(base, absl::StrCat("pstrain-tls-", ::getpid(), "-XXXXXX"));
  if (::mkdtemp(dir.data()) == nullptr) {  // mode 0700
    return absl::FailedPreconditionError(
        absl::StrCat("TLS: cannot make a staging directory in ", base, ": ", std::strerror(errno)));
  }
  w->staging_ = dir;
  // Held while this process lives: the sign that the directory is in use.
  // Locked under another name and then renamed, so that `lock` is never
  // seen unlocked: another process starting now would take the directory
  // for a dead one's and remove it (RemoveStaleStaging).
  const std::string unnamed = JoinPath(dir, "lock.new");
  w->lock_fd_ = ::open(unnamed.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (w->lock_fd_ < 0 || ::flock(w->lock_fd_, LOCK_EX | LOCK_NB) != 0 ||
      ::rename(unnamed.c_str(), JoinPath(dir, "lock").c_str()) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("TLS: cannot lock ", dir, "/lock: ", std::strerror(errno)));
  }
  {
    absl::MutexLock lock(&w->mu_);
    w->stamps_ = std::move(stamps);
    RETURN_IF_ERROR(w->Stage(tls));
    w->current_ = std::make_shared<const TlsConfig>(std::move(tls));
  }
  const std::string current = JoinPath(dir, "current");
  w->provider_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      JoinPath(current, "key.pem"), JoinPath(current, "cert.pem"), JoinPath(current, "ca.crt"),
      static_cast<unsigned int>(absl::ToInt64Seconds(interval)));
  if (background) {
    w->thread_ = std::thread([raw = w.get()] {
      for (;;) {
        {
          absl::MutexLock lock(&raw->mu_);
          if (raw->mu_.AwaitWithTimeout(absl::Condition(&raw->stopping_), raw->interval_)) return;
        }
        raw->CheckNow();
      }
    });
  }
  return w;
}

void TlsWatcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

TlsWatcher::~TlsWatcher() {
  Stop();
  provider_.reset();
  if (!staging_.empty()) RemoveStaging(staging_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::shared_ptr<const TlsConfig> TlsWatcher::current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

std::vector<TlsWatcher::Stamp> TlsWatcher::Stamps() const {
  return {StampOf(files_.ca_file), StampOf(files_.cert_file), StampOf(files_.key_file)};
}

absl::Status TlsWatcher::Stage(const TlsConfig& tls) {
  // A new generation directory, then the `current` link swapped onto it in
  // one rename: gRPC reads a whole generation or the one before. The one
  // before stays until the next swap, for a read still under way.
  const int gen = ++generation_;
  const std::string name = absl::StrCat("g", gen);
  const std::string dir = JoinPath(staging_, name);
  if (::mkdir(dir.c_str(), 0700) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("TLS: cannot make ", dir, ": ", std::strerror(errno)));
  }
  const std::string link = JoinPath(staging_, "current.tmp");
  absl::Status st = WritePrivateFile(JoinPath(dir, "ca.crt"), tls.ca_pem);
  if (st.ok()) st = WritePrivateFile(JoinPath(dir, "cert.pem"), tls.cert_pem);
  if (st.ok()) st = WritePrivateFile(JoinPath(dir, "key.pem"), tls.key_pem);
  ::unlink(link.c_str());
  if (st.ok() && (::symlink(name.c_str(), link.c_str()) != 0 ||
                  ::rename(link.c_str(), JoinPath(staging_, "current").c_str()) != 0)) {
    st = absl::FailedPreconditionError(
        absl::StrCat("TLS: cannot switch ", staging_, " to ", name, ": ", std::strerror(errno)));
  }
  if (!st.ok()) {
    ::unlink(link.c_str());
    RemoveStaging(dir);
    return st;
  }
  if (previous_generation_ > 0) {
    RemoveStaging(JoinPath(staging_, absl::StrCat("g", previous_generation_)));
  }
  previous_generation_ = current_generation_;
  current_generation_ = gen;
  return absl::OkStatus();
}

bool TlsWatcher::CheckNow() {
  const std::vector<Stamp> stamps = Stamps();
  {
    absl::MutexLock lock(&mu_);
    if (stamps == stamps_) return false;
    stamps_ = stamps;  // refused material is not read again until it changes
  }
  absl::StatusOr<TlsConfig> tls = LoadTls(files_);
  if (tls.ok() && tls->identity != identity_) {
    tls = absl::InvalidArgumentError(absl::StrCat(files_.cert_file, " is now the certificate of \"",
                                                  tls->identity, "\", not of ", identity_));
  }
  absl::Status st = tls.status();
  if (st.ok()) {
    absl::MutexLock lock(&mu_);
    st = Stage(*tls);
    if (st.ok()) current_ = std::make_shared<const TlsConfig>(*tls);
  }
  if (!st.ok()) {
    refusals_.fetch_add(1, std::memory_order_relaxed);
    LOG_WARN("TLS: the changed certificate files are refused, the current ones stay in use: {}",
             st.message());
    return false;
  }
  reloads_.fetch_add(1, std::memory_order_relaxed);
  LOG_INFO("TLS: took the renewed certificate of {} from {}, valid until {}", identity_,
           files_.cert_file, Expiry(tls->not_after));
  if (tls->not_after - absl::Now() < absl::Hours(24 * 7)) {
    LOG_WARN("the renewed certificate or its CA expires within a week, {}",
             Expiry(tls->not_after));
  }
  return true;
}

std::string PeerCommonName(const grpc::ServerContextBase& ctx) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  std::vector<grpc::string_ref> cn = auth->FindPropertyValues("x509_common_name");
  if (cn.empty()) return "";
  return std::string(cn.front().data(), cn.front().size());
}

absl::Status WriteClusterCertificates(const ClusterSpec* cluster, const std::string& dir,
                                      absl::Duration validity, std::vector<std::string>* written,
                                      absl::Time* expires, const UnplacedTasks& unplaced) {
  if (cluster != nullptr && (unplaced.num_ps > 0 || unplaced.num_workers > 0)) {
    return absl::InvalidArgumentError("tasks come from the cluster spec or from counts, not both");
  }
  if (unplaced.num_ps < 0 || unplaced.num_workers < 0 || unplaced.num_ps > 4096 ||
      unplaced.num_workers > 65536 || ((unplaced.num_ps > 0) != (unplaced.num_workers > 0))) {
    return absl::InvalidArgumentError(
        "certificates for unplaced tasks need 1..4096 parameter servers and 1..65536 workers");
  }
  if (validity < absl::Hours(1)) {
    return absl::InvalidArgumentError("certificates valid for less than an hour");
  }
  Env* env = Env::Default();
  const std::string ca_crt = JoinPath(dir, "ca.crt"), ca_key_path = JoinPath(dir, "ca.key");
  Cert ca;
  Key ca_key;
  if (env->FileExists(ca_crt) || env->FileExists(ca_key_path)) {
    // Reuse the CA, so certificates added later (a new task) join the same cluster.
    ASSIGN_OR_RETURN(std::string crt_pem, ReadPem(ca_crt));
    ASSIGN_OR_RETURN(std::string key_pem, ReadPrivateFile(ca_key_path, kMaxPemBytes));
    std::vector<Cert> certs = ParseCerts(crt_pem);
    Bio bio = MemoryBio(key_pem);
    ca_key.reset(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassword, nullptr));
    if (certs.empty() || !ca_key || X509_check_private_key(certs.front().get(), ca_key.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat(
          ca_crt, " and ", ca_key_path, " are not a CA certificate and its key; move them away "
          "to start a new CA"));
    }
    ca = std::move(certs.front());
  } else {
    ASSIGN_OR_RETURN(ca_key, NewKey());
    // The CA outlives the certificates written with it by a day; once
    // reused, it caps the new ones at its own expiry (below).
    // A name of its own: revocation lists are filed by the CA's name hash,
    // so a new CA must not read an earlier CA's lists as its own.
    unsigned char tag[6];
    if (RAND_bytes(tag, sizeof(tag)) != 1) {
      return absl::InternalError(absl::StrCat("random bytes: ", OpensslErrors()));
    }
    const std::string ca_name =
        absl::StrCat("pstrain cluster CA ", absl::BytesToHexString(absl::string_view(
                                                reinterpret_cast<const char*>(tag), sizeof(tag))));
    // The earlier CA's lists, if any, are set aside with it.
    const std::string crl_dir = JoinPath(dir, "crl");
    if (env->IsDirectory(crl_dir)) {
      const std::string aside = absl::StrCat(crl_dir, "-of-an-earlier-ca-", ::time(nullptr));
      if (::rename(crl_dir.c_str(), aside.c_str()) != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot move the earlier CA's revocation lists ", crl_dir, " aside: ",
            std::strerror(errno)));
      }
    }
    ASSIGN_OR_RETURN(ca, MakeCertificate(ca_name, ca_key.get(), nullptr, nullptr,
                                         /*is_ca=*/true, /*serves=*/false, "",
                                         validity + absl::Hours(24)));
    ASSIGN_OR_RETURN(std::string key_pem, KeyPem(ca_key.get()));
    RETURN_IF_ERROR(WritePrivateFile(ca_key_path, key_pem));
    ASSIGN_OR_RETURN(std::string crt_pem, CertPem(ca.get()));
    RETURN_IF_ERROR(WriteFileAtomically(env, ca_crt, crt_pem));
    written->push_back(ca_key_path);
    written->push_back(ca_crt);
  }
  // A reused CA may expire first: no certificate outlives its CA.
  const absl::Time ca_expires = NotAfter(ca.get());
  if (ca_expires < absl::Now() + absl::Hours(1)) {
    return absl::FailedPreconditionError(absl::StrCat(
        ca_crt, " expires ", absl::FormatTime("%Y-%m-%d %H:%M UTC", ca_expires, absl::UTCTimeZone()),
        ": move ca.crt and ca.key away to start a new CA (every task then needs the new ca.crt)"));
  }
  const absl::Duration leaf_validity = std::min(validity, ca_expires - absl::Now());
  if (expires != nullptr) *expires = absl::Now() + leaf_validity;
  // Identity and subject alternative names; none: a client's certificate.
  // Every task may serve its monitoring endpoint, known there by the one
  // name kMetricsAltName; the tasks that serve RPCs are also known by their
  // host and by their own name (TaskAltName). So a worker's certificate
  // passes for no RPC server, and the operator's and the scraper's for no
  // server at all.
  std::vector<std::pair<std::string, std::string>> subjects;
  const std::string metrics_name = absl::StrCat("DNS:", kMetricsAltName);
  if (cluster != nullptr) {
    for (const TaskId& t : cluster->AllTasks()) {
      ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(cluster->address(t.job, t.index)));
      const std::string id = t.ToString();
      subjects.emplace_back(id, t.job == kWorkerJob
                                    ? metrics_name
                                    : absl::StrCat(AltName(hp.host), ",DNS:", TaskAltName(id),
                                                   ",", metrics_name));
    }
  }
  if (unplaced.num_ps > 0) {
    std::vector<std::string> serving = {TaskId{kChiefJob, 0}.ToString()};
    for (int i = 0; i < unplaced.num_ps; ++i) serving.push_back(TaskId{kPsJob, i}.ToString());
    for (const std::string& id : serving) {
      subjects.emplace_back(id, absl::StrCat("DNS:", TaskAltName(id), ",", metrics_name));
    }
    for (int i = 0; i < unplaced.num_workers; ++i) {
      subjects.emplace_back(TaskId{kWorkerJob, i}.ToString(), metrics_name);
    }
  }
  subjects.emplace_back("operator", "");
  subjects.emplace_back(kMonitorIdentity, "");
  for (const auto& [identity, names] : subjects) {
    ASSIGN_OR_RETURN(Key key, NewKey());
    ASSIGN_OR_RETURN(Cert cert, MakeCertificate(identity, key.get(), ca.get(), ca_key.get(),
                                                /*is_ca=*/false, /*serves=*/!names.empty(),
                                                names, leaf_validity));
    const TlsFiles files = TlsFilesIn(dir, identity);
    ASSIGN_OR_RETURN(std::string key_pem, KeyPem(key.get()));
    RETURN_IF_ERROR(WritePrivateFile(files.key_file, key_pem));
    ASSIGN_OR_RETURN(std::string crt_pem, CertPem(cert.get()));
    RETURN_IF_ERROR(WriteFileAtomically(env, files.cert_file, crt_pem));
    written->push_back(files.cert_file);
    written->push_back(files.key_file);
  }
  return absl::OkStatus();
}

absl::Status RevokeCertificate(const std::string& dir, const std::string& identity,
                               std::string* crl_path, int* revoked) {
  const std::string ca_crt = JoinPath(dir, "ca.crt"), ca_key_path = JoinPath(dir, "ca.key");
  ASSIGN_OR_RETURN(std::string ca_pem, ReadPem(ca_crt));
  absl::StatusOr<std::string> ca_key_pem = ReadPrivateFile(ca_key_path, kMaxPemBytes);
  if (!ca_key_pem.ok()) {
    return absl::Status(ca_key_pem.status().code(),
                        absl::StrCat("revoking needs the CA's key: ", ca_key_pem.status().message()));
  }
  std::vector<Cert> cas = ParseCerts(ca_pem);
  Bio key_bio = MemoryBio(*ca_key_pem);
  Key ca_key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, NoPassword, nullptr));
  if (cas.empty() || !ca_key || X509_check_private_key(cas.front().get(), ca_key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(ca_crt, " and ", ca_key_path, " are not a CA certificate and its key"));
  }
  X509* ca = cas.front().get();
  // A certificate file (one renewed since, kept or leaked), or a task's
  // current one in `dir`.
  const bool is_file = identity.find('/') != std::string::npos ||
                       absl::EndsWith(identity, ".crt") || absl::EndsWith(identity, ".pem");
  const std::string cert_file = is_file ? identity : TlsFilesIn(dir, identity).cert_file;
  ASSIGN_OR_RETURN(std::string cert_pem, ReadPem(cert_file));
  std::vector<Cert> certs = ParseCerts(cert_pem);
  if (certs.empty() || X509_check_issued(ca, certs.front().get()) != X509_V_OK) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(cert_file, ": no certificate of the CA in ", ca_crt));
  }
  const ASN1_INTEGER* serial = X509_get0_serialNumber(certs.front().get());

  // The newest list so far: the highest N of crl/<hash>.rN.
  const std::string crl_dir = JoinPath(dir, "crl");
  if (::mkdir(crl_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make ", crl_dir, ": ", std::strerror(errno)));
  }
  ASSIGN_OR_RETURN(std::vector<Crl> lists, ReadRevocationLists(crl_dir, ca));
  X509_CRL* newest = lists.empty() ? nullptr : lists.back().get();
  Crl crl(X509_CRL_new());
  if (!crl) return absl::ResourceExhaustedError("OpenSSL: no memory for a revocation list");
  int count = 0;
  if (newest) {
    STACK_OF(X509_REVOKED)* old = X509_CRL_get_REVOKED(newest);
    for (int i = 0; i < sk_X509_REVOKED_num(old); ++i) {
      X509_REVOKED* r = sk_X509_REVOKED_value(old, i);
      if (ASN1_INTEGER_cmp(X509_REVOKED_get0_serialNumber(r), serial) == 0) {
        return absl::AlreadyExistsError(absl::StrCat(cert_file, " (", identity,
                                                     ") is revoked already"));
      }
      X509_REVOKED* copy = X509_REVOKED_dup(r);
      if (copy == nullptr || X509_CRL_add0_revoked(crl.get(), copy) != 1) {
        X509_REVOKED_free(copy);
        return absl::ResourceExhaustedError("OpenSSL: no memory for a revocation list");
      }
      ++count;
    }
  }
  // Dated after the list it replaces, to the second (OpenSSL picks the
  // newest of a CA's lists by that date), and not in the future, not even
  // on a task whose clock is a little behind (OpenSSL ranks a list dated
  // ahead below the ones in force): five minutes back, or a second after
  // the list before, whichever is later; should that be ahead of now, it
  // waits.
  time_t dated = ::time(nullptr) - 300;
  if (newest) {
    struct tm tm = {};
    if (ASN1_TIME_to_tm(X509_CRL_get0_lastUpdate(newest), &tm) == 1) {
      dated = std::max(dated, timegm(&tm) + 1);
    }
  }
  for (int i = 0; i < 30 && dated > ::time(nullptr); ++i) absl::SleepFor(absl::Milliseconds(100));
  if (dated > ::time(nullptr)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the newest revocation list in ", crl_dir, " is dated in the future: is the clock right?"));
  }
  std::unique_ptr<ASN1_TIME, OpensslFree<ASN1_TIME_free>> at(ASN1_TIME_set(nullptr, dated));
  std::unique_ptr<X509_REVOKED, OpensslFree<X509_REVOKED_free>> entry(X509_REVOKED_new());
  const bool made =
      at && entry &&
      // (copied: OpenSSL's declaration lacks the const)
      X509_REVOKED_set_serialNumber(entry.get(), const_cast<ASN1_INTEGER*>(serial)) == 1 &&
      X509_REVOKED_set_revocationDate(entry.get(), at.get()) == 1 &&
      X509_CRL_add0_revoked(crl.get(), entry.get()) == 1 && entry.release() != nullptr &&
      X509_CRL_set_version(crl.get(), X509_CRL_VERSION_2) == 1 &&
      X509_CRL_set_issuer_name(crl.get(), X509_get_subject_name(ca)) == 1 &&
      X509_CRL_set1_lastUpdate(crl.get(), at.get()) == 1 &&
      // Valid as long as the CA: an expired list would fail every handshake.
      X509_CRL_set1_nextUpdate(crl.get(), X509_get0_notAfter(ca)) == 1 &&
      X509_CRL_sort(crl.get()) == 1 && X509_CRL_sign(crl.get(), ca_key.get(), EVP_sha256()) > 0;
  if (!made) {
    return absl::InternalError(absl::StrCat("making the revocation list: ", OpensslErrors()));
  }
  Bio out(BIO_new(BIO_s_mem()));
  if (!out || PEM_write_bio_X509_CRL(out.get(), crl.get()) != 1) {
    return absl::InternalError(absl::StrCat("PEM of the revocation list: ", OpensslErrors()));
  }
  // Written whole under a temporary name, then linked to its own: a
  // revocation running beside this one cannot overwrite it (link fails).
  *crl_path = JoinPath(crl_dir, absl::StrCat(CrlHash(ca), ".r", lists.size()));
  const std::string tmp = absl::StrCat(*crl_path, ".tmp", ::getpid());
  RETURN_IF_ERROR(WriteFileAtomically(Env::Default(), tmp, BioText(out.get())));
  const int linked = ::link(tmp.c_str(), crl_path->c_str());
  const int link_errno = errno;
  ::unlink(tmp.c_str());
  if (linked != 0) {
    return absl::AbortedError(absl::StrCat(
        "cannot write ", *crl_path, ": ", std::strerror(link_errno),
        link_errno == EEXIST ? " (another revocation wrote it meanwhile: run again)" : ""));
  }
  if (revoked != nullptr) *revoked = count + 1;
  return absl::OkStatus();
}

}  // namespace pstrain
