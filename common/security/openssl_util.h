// OpenSSL for the security layer and the CLI's certificate authority:
// owning pointers for its objects, PEM parsing, names and dates of
// certificates, and the CA's revocation lists as OpenSSL's hashed-directory
// lookup names them. Used by common/security/tls.cc (loading and checking a
// task's material), tls_watcher.cc and tools/certificate_authority.cc
// (issuing and revoking); nothing else needs OpenSSL's types. Stateless;
// each function is thread-safe as OpenSSL is (its error queue is per
// thread).
#ifndef PSTRAIN_COMMON_SECURITY_OPENSSL_UTIL_H_
#define PSTRAIN_COMMON_SECURITY_OPENSSL_UTIL_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "openssl/bio.h"
#include "openssl/bn.h"
#include "openssl/evp.h"
#include "openssl/x509.h"

namespace pstrain {
namespace ossl {

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
using Crl = std::unique_ptr<X509_CRL, OpensslFree<X509_CRL_free>>;

// The largest PEM file read (a certificate chain, a key, a list).
inline constexpr size_t kMaxPemBytes = 1 << 20;

// OpenSSL's queued errors as one line (and the queue emptied).
std::string OpensslErrors();

// A verify callback: revocation lists are checked where there are some; a
// CA without one (none revoked yet) is not an error.
int AllowMissingCrl(int ok, X509_STORE_CTX* ctx);

// Has `store` check leaf certificates against the lists in `crl_dir`, read
// through OpenSSL's hashed-directory lookup at each verification.
bool CheckRevocations(X509_STORE* store, const std::string& crl_dir);

// A read-only BIO over `pem` (which must outlive it).
Bio MemoryBio(const std::string& pem);

// A password callback that refuses encrypted keys rather than prompting on
// a terminal.
int NoPassword(char*, int, int, void*);

// Every certificate in `pem`, in order (none: not PEM certificates).
std::vector<Cert> ParseCerts(const std::string& pem);

// The subject's common name ("" without one).
std::string CommonName(X509* cert);

absl::Time NotAfter(const X509* cert);

// A PEM file of at most kMaxPemBytes.
absl::StatusOr<std::string> ReadPem(const std::string& path);

// The CA's revocation lists as OpenSSL's directory lookup names them,
// crl/<hash of the CA's name>.r0, .r1, ... ("" if the hash fails).
std::string CrlHash(X509* ca);

// The CA's lists in `crl_dir`, oldest first (the next one is .r<size>),
// each checked: a list that does not parse or is not the CA's would be
// skipped by every handshake without a word (a missing list is no error).
absl::StatusOr<std::vector<Crl>> ReadRevocationLists(const std::string& crl_dir, X509* ca);

// The same, refusing as well a path OpenSSL would split (it takes ':' as a
// list separator).
absl::Status CheckRevocationLists(const std::string& crl_dir, X509* ca);

}  // namespace ossl
}  // namespace pstrain

#endif  // PSTRAIN_COMMON_SECURITY_OPENSSL_UTIL_H_
