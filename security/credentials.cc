#include "security/credentials.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "security/tokens.h"

namespace fxdp::security {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ChannelSecurity& s, grpc::ChannelArguments* args) {
  if (s.tls_ca.empty()) {
    if (!s.token_file.empty()) {
      return absl::InvalidArgumentError(
          "--token-file needs --tls-ca: gRPC sends a bearer token over TLS only (give the CA of "
          "the server's certificate)");
    }
    if (!s.tls_cert.empty() || !s.tls_key.empty()) {
      return absl::InvalidArgumentError("--tls-cert/--tls-key need --tls-ca");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (s.tls_cert.empty() != s.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  grpc::SslCredentialsOptions o;
  absl::StatusOr<std::string> ca = ReadSmallFile(s.tls_ca, "--tls-ca");
  if (!ca.ok()) return ca.status();
  o.pem_root_certs = *std::move(ca);
  if (!s.tls_cert.empty()) {
    absl::StatusOr<std::string> cert = ReadSmallFile(s.tls_cert, "--tls-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadSmallFile(s.tls_key, "--tls-key");
    if (!key.ok()) return key.status();
    o.pem_cert_chain = *std::move(cert);
    o.pem_private_key = *std::move(key);
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(o);
  if (creds == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot use the TLS files --tls-ca '", s.tls_ca, "'",
                     s.tls_cert.empty() ? "" : " --tls-cert '" + s.tls_cert + "'"));
  }
  if (!s.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(s.token_file);
    if (!token.ok()) return token.status();
    creds = grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(*token));
  }
  if (!s.server_name.empty() && args != nullptr) args->SetSslTargetNameOverride(s.server_name);
  return creds;
}

}  // namespace fxdp::security
