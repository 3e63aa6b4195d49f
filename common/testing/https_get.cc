#include "common/testing/https_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "openssl/bio.h"
#include "openssl/err.h"
#include "openssl/pem.h"
#include "openssl/ssl.h"
#include "openssl/x509v3.h"

namespace pstrain::testing {
namespace {

std::string Errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out;
}

}  // namespace

std::string HttpsGet(int port, const std::string& path, const TlsFiles& files,
                     const std::string& server_name, std::string* error,
                     std::string* server_cert) {
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()),
                                                          SSL_CTX_free);
  if (!ctx || SSL_CTX_load_verify_locations(ctx.get(), files.ca_file.c_str(), nullptr) != 1) {
    *error = absl::StrCat("CA ", files.ca_file, ": ", Errors());
    return "";
  }
  if (!files.cert_file.empty() &&
      (SSL_CTX_use_certificate_chain_file(ctx.get(), files.cert_file.c_str()) != 1 ||
       SSL_CTX_use_PrivateKey_file(ctx.get(), files.key_file.c_str(), SSL_FILETYPE_PEM) != 1)) {
    *error = absl::StrCat("client certificate ", files.cert_file, ": ", Errors());
    return "";
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = "socket";
    return "";
  }
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  std::string out;
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()), SSL_free);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    *error = "connect";
  } else if (!ssl || SSL_set_fd(ssl.get(), fd) != 1 ||
             SSL_set_tlsext_host_name(ssl.get(), server_name.c_str()) != 1 ||
             SSL_set1_host(ssl.get(), server_name.c_str()) != 1) {
    *error = absl::StrCat("SSL setup: ", Errors());
  } else if (SSL_connect(ssl.get()) != 1) {
    const long verify = SSL_get_verify_result(ssl.get());
    *error = absl::StrCat("handshake: ", Errors(),
                          verify == X509_V_OK ? "" : X509_verify_cert_error_string(verify));
  } else {
    if (server_cert != nullptr) {
      std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
      X509* peer = SSL_get0_peer_certificate(ssl.get());
      char* data = nullptr;
      if (bio && peer != nullptr && PEM_write_bio_X509(bio.get(), peer) == 1) {
        const long n = BIO_get_mem_data(bio.get(), &data);
        server_cert->assign(data, static_cast<size_t>(n));
      }
    }
    const std::string req =
        absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: ", server_name, "\r\nConnection: close\r\n\r\n");
    if (SSL_write(ssl.get(), req.data(), static_cast<int>(req.size())) <= 0) {
      *error = absl::StrCat("write: ", Errors());
    } else {
      char buf[8192];
      for (int n; (n = SSL_read(ssl.get(), buf, sizeof(buf))) > 0;) out.append(buf, n);
      // With TLS 1.3 a server that refuses the client's certificate says so
      // after the client's handshake has ended: on the first read.
      if (out.empty()) *error = absl::StrCat("no response: ", Errors());
    }
  }
  ERR_clear_error();
  ::close(fd);
  return out;
}

}  // namespace pstrain::testing
