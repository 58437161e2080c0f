// gRPC channel credentials from files, for the C++ callers of fxdp-server:
// the `fxdp` CLI and `fxdp-worker attach` (fxdp.Client does the same in
// Python).
//
//   tls_ca       PEM CA bundle the server's certificate must chain to; giving
//                it turns TLS on (gRPC's SslCredentials)
//   tls_cert/key PEM client certificate and key for mutual TLS (both or none)
//   token_file   a bearer token (security/tokens.h), sent as
//                "authorization: Bearer ..." on every call
//                (grpc::AccessTokenCredentials); gRPC sends call credentials
//                over TLS only, so a token needs tls_ca
//   server_name  the name the server's certificate is checked against, when
//                it differs from the host in the address
//                (grpc.ssl_target_name_override)
//
// Errors are INVALID_ARGUMENT / NOT_FOUND naming the flag and the file.
#ifndef FXDP_SECURITY_CREDENTIALS_H_
#define FXDP_SECURITY_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace fxdp::security {

struct ChannelSecurity {
  std::string tls_ca, tls_cert, tls_key, token_file, server_name;
  bool empty() const { return tls_ca.empty() && tls_cert.empty() && token_file.empty(); }
};

// Channel credentials for `s`: insecure when it is empty. `args` receives
// the target name override (when set).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ChannelSecurity& s, grpc::ChannelArguments* args);

}  // namespace fxdp::security

#endif  // FXDP_SECURITY_CREDENTIALS_H_
