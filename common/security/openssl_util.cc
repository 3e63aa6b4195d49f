#include "common/security/openssl_util.h"

#include <time.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/storage/env.h"
#include "openssl/err.h"
#include "openssl/pem.h"

namespace pstrain {
namespace ossl {

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

}  // namespace ossl
}  // namespace pstrain
