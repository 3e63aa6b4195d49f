#include "common/rpc/server_gate.h"

#include <string>

#include "absl/strings/string_view.h"
#include "common/security/tls.h"
#include "grpc/grpc.h"
#include "grpc/grpc_security.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace pstrain {
namespace {

// The last part of a gRPC path ("/pstrain.PsService/Push": "Push"), which
// is what calls are signed for.
absl::string_view MethodOf(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

// The headers a call is authenticated from.
struct Headers {
  absl::string_view identity, authorization, path;
  int identities = 0, authorizations = 0;

  void Take(absl::string_view key, absl::string_view value) {
    if (key == kIdentityHeader) {
      identity = value;
      ++identities;
    } else if (key == "authorization") {
      authorization = value;
      ++authorizations;
    } else if (key == ":path") {
      path = value;
    }
  }

  absl::Status Check(Authorizer* auth, absl::string_view cert_cn) const {
    // gRPC keeps a repeated header as several entries; the handler reads the
    // first, this the last. A call naming two callers is nobody's.
    return auth->AuthenticateHeaders(identity, authorization, cert_cn, MethodOf(path),
                                     /*repeated=*/identities > 1 || authorizations > 1);
  }
};

// The plaintext port's door: gRPC's C interface, as the C++ one refuses
// a processor on insecure credentials (grpc::InsecureServerCredentials
// asserts), though gRPC's server auth filter runs on such a port too.
void ProcessPlaintext(void* state, grpc_auth_context* /*context*/, const grpc_metadata* md,
                      size_t num_md, grpc_process_auth_metadata_done_cb done, void* user_data) {
  Headers h;
  for (size_t i = 0; i < num_md; ++i) {
    h.Take(absl::string_view(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].key)),
                             GRPC_SLICE_LENGTH(md[i].key)),
           absl::string_view(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].value)),
                             GRPC_SLICE_LENGTH(md[i].value)));
  }
  const absl::Status st = h.Check(static_cast<Authorizer*>(state), "");
  // gRPC copies the message before this returns.
  const std::string message(st.message());
  done(user_data, nullptr, 0, nullptr, 0, static_cast<grpc_status_code>(st.code()),
       st.ok() ? nullptr : message.c_str());
}

class GatedPlaintextCredentials final : public grpc::ServerCredentials {
 public:
  explicit GatedPlaintextCredentials(Authorizer* auth) : auth_(auth) {}

  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/) override {}

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    grpc_server_credentials* creds = grpc_insecure_server_credentials_create();
    grpc_server_credentials_set_auth_metadata_processor(creds, {&ProcessPlaintext, nullptr, auth_});
    const int port = grpc_server_add_http2_port(server, addr.c_str(), creds);
    grpc_server_credentials_release(creds);
    return port;
  }

  Authorizer* const auth_;
};

// The TLS port's door, through the C++ interface; the caller is the
// verified certificate's common name where there is one.
class TlsDoor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TlsDoor(Authorizer* auth) : auth_(auth) {}

  // Cheap (an HMAC and a hash lookup): run where the headers arrive.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& md, grpc::AuthContext* context,
                       OutputMetadata* /*consumed*/, OutputMetadata* /*response*/) override {
    Headers h;
    for (const auto& [key, value] : md) {
      h.Take(absl::string_view(key.data(), key.size()),
             absl::string_view(value.data(), value.size()));
    }
    std::string cn;
    if (context != nullptr && context->IsPeerAuthenticated()) {
      std::vector<grpc::string_ref> names = context->FindPropertyValues("x509_common_name");
      if (!names.empty()) cn.assign(names.front().data(), names.front().size());
    }
    const absl::Status st = h.Check(auth_, cn);
    return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
  }

 private:
  Authorizer* const auth_;
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> GatedServerCredentials(const TlsConfig* tls,
                                                                Authorizer* auth) {
  if (auth == nullptr || !auth->enabled()) {
    return tls != nullptr ? TlsServerCredentials(*tls) : grpc::InsecureServerCredentials();
  }
  auth->MarkGated();
  if (tls == nullptr) return std::make_shared<GatedPlaintextCredentials>(auth);
  std::shared_ptr<grpc::ServerCredentials> creds = TlsServerCredentials(*tls);
  creds->SetAuthMetadataProcessor(std::make_shared<TlsDoor>(auth));
  return creds;
}

}  // namespace pstrain
