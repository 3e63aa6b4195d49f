#include "tools/operator.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/security/auth.h"
#include "common/rpc/rpc.h"
#include "common/security/tls.h"

namespace pstrain {

absl::Status ActAsOperator(const ClusterSpec& cluster, const std::string& secret_file) {
  const std::string path = secret_file.empty() ? cluster.auth_secret_file() : secret_file;
  if (!path.empty()) {
    absl::StatusOr<std::string> secret = ReadSecretFile(path);
    if (!secret.ok()) {
      return absl::Status(secret.status().code(),
                          absl::StrCat("cluster secret: ", secret.status().message()));
    }
    SetCallCredentials(kOperatorIdentity, DeriveToken(*secret, kOperatorIdentity));
  }
  if (!cluster.tls_dir().empty()) {
    absl::StatusOr<TlsConfig> tls = LoadTls(TlsFilesIn(cluster.tls_dir(), kOperatorIdentity));
    if (!tls.ok()) {
      return absl::Status(tls.status().code(), absl::StrCat("TLS: ", tls.status().message()));
    }
    SetTransportSecurity(std::make_shared<const TlsConfig>(*std::move(tls)));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
