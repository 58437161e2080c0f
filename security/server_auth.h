// fxdp-server's transport security and authentication.
//
// TLS: gRPC's SslServerCredentials with --tls-cert/--tls-key. With --tls-ca
// the server asks every peer for a certificate and verifies the ones given
// against that CA (mutual TLS; a peer without one may still use a token).
//
// Authentication (on when any of --client-tokens, --worker-token-file,
// --tls-ca is given; it needs TLS, since gRPC clients send tokens only over
// TLS): by bearer token or verified client certificate, per call, in every
// handler (call_auth.h: CallPrincipal); an AuthMetadataProcessor refuses
// calls without credentials before any handler.
#ifndef FXDP_SECURITY_SERVER_AUTH_H_
#define FXDP_SECURITY_SERVER_AUTH_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "security/auth_limiter.h"
#include "security/call_auth.h"
#include "security/tokens.h"

namespace fxdp::security {

struct ServerSecurityOptions {
  std::string tls_cert, tls_key, tls_ca;  // PEM files
  std::string client_tokens;              // `TOKEN IDENTITY [admin]` lines
  std::string worker_token_file;          // the workers' join token
  AuthLimiterOptions auth_limits;         // wrong tokens per connection (auth_limiter.h)
};

struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  bool tls = false;
  bool authenticates = false;
  // One line for the startup log: "TLS, clients: 3 tokens, workers: join
  // token + certificates of CA".
  std::string summary;
  // Secret files (key, tokens) other users may read, one line each.
  std::vector<std::string> warnings;
  // Who a call is (call_auth.h); null when the server does not authenticate.
  std::shared_ptr<CallAuth> auth;
};

// The credentials for `o` (insecure when it is empty): files read and
// checked, INVALID_ARGUMENT / NOT_FOUND naming the flag and file.
absl::StatusOr<ServerSecurity> MakeServerSecurity(const ServerSecurityOptions& o);

// Whether `caller` may see or act on a job owned by `owner`: no
// authentication, an admin, or the owner.
bool MayAccess(const std::optional<Principal>& caller, const std::string& owner);

// "alice" / "alice (admin)" / "worker-1 (worker)", or "-" without authentication.
std::string Describe(const std::optional<Principal>& p);

// Whether a --listen address reaches only this machine: a loopback IP
// (127.0.0.0/8, ::1), "localhost", or a unix: socket. A wildcard (0.0.0.0,
// [::]) or any other host is not.
bool IsLoopbackListen(const std::string& listen);

// Exposed for tests: the principal of a PEM certificate (CN, role from O).
absl::StatusOr<Principal> PrincipalOfCertificate(const std::string& pem);

}  // namespace fxdp::security

#endif  // FXDP_SECURITY_SERVER_AUTH_H_
