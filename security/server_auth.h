// fxdp-server's transport security and authentication.
//
// TLS: gRPC's SslServerCredentials with --tls-cert/--tls-key. With --tls-ca
// the server asks every peer for a certificate and verifies the ones given
// against that CA (mutual TLS; a peer without one may still use a token).
//
// Authentication (on when any of --client-tokens, --worker-token-file,
// --tls-ca is given; it needs TLS, since gRPC clients send tokens only over
// TLS): an AuthMetadataProcessor runs before every call and
//   - takes "authorization: Bearer TOKEN" (consumed: handlers and logs never
//     see it) and looks it up in constant time among the client tokens
//     (identity, admin or not) and the worker join token (role worker);
//   - else takes the verified peer certificate: identity = its subject's CN,
//     role from its O (organization), as Kubernetes does for client
//     certificates: "fxdp:workers" a worker, "fxdp:admins" an admin client,
//     anything else a client;
//   - else fails the call with UNAUTHENTICATED (health checks excepted);
//   - a wrong token is UNAUTHENTICATED even when a certificate was given;
//     after AuthLimiterOptions::max_failures wrong tokens on one connection
//     within its window, that connection's calls with a token are
//     RESOURCE_EXHAUSTED for the block time (auth_limiter.h; audit-logged
//     once).
// Then it checks the role against the method: WorkerService.Attach takes
// workers only, every other fxdp method clients only (PERMISSION_DENIED
// otherwise). The principal is stored in the call's AuthContext
// (properties "fxdp.identity", "fxdp.role"); PrincipalOf reads it back.
#ifndef FXDP_SECURITY_SERVER_AUTH_H_
#define FXDP_SECURITY_SERVER_AUTH_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "security/auth_limiter.h"
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
};

// The credentials for `o` (insecure when it is empty): files read and
// checked, INVALID_ARGUMENT / NOT_FOUND naming the flag and file.
absl::StatusOr<ServerSecurity> MakeServerSecurity(const ServerSecurityOptions& o);

// The authenticated principal of a call; nullopt when the server does not
// authenticate (plain loopback: every caller may do everything).
std::optional<Principal> PrincipalOf(const grpc::ServerContextBase& ctx);

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
