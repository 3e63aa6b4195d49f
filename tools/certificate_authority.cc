#include "tools/certificate_authority.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/security/openssl_util.h"
#include "common/security/tls.h"
#include "common/storage/env.h"
#include "openssl/bn.h"
#include "openssl/err.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "openssl/rand.h"
#include "openssl/x509.h"
#include "openssl/x509v3.h"

namespace pstrain {

using ossl::Bignum;
using ossl::Bio;
using ossl::Cert;
using ossl::Crl;
using ossl::CrlHash;
using ossl::Key;
using ossl::kMaxPemBytes;
using ossl::MemoryBio;
using ossl::NoPassword;
using ossl::NotAfter;
using ossl::OpensslErrors;
using ossl::OpensslFree;
using ossl::ParseCerts;
using ossl::ReadPem;
using ossl::ReadRevocationLists;

namespace {

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
