// CallAuth: the identity of one call, taken from that call alone (issue 25).
//
// gRPC 1.51 hands an AuthMetadataProcessor the CONNECTION's AuthContext: the
// server auth filter refs the channel's context into every call on it
// (src/core/lib/security/transport/server_auth_filter.cc). Adding the
// caller's identity to it from a call raced with the connection's other
// calls (an abort in security_context.cc, one caller's job shown to another)
// and grew it by two properties per call. So nothing here writes to an
// AuthContext; the identity is computed per call, where the call is:
//   - the processor (MakeAuthProcessor) only screens, before any handler and
//     without a thread: a call with neither a bearer token nor a verified
//     client certificate is UNAUTHENTICATED (health checks excepted: they
//     pass whatever they carry), so is one with more than one authorization
//     header; a token sent to a method outside fxdp.v1 (server reflection) is
//     PERMISSION_DENIED, right or wrong alike (it is never checked there, so
//     it cannot be guessed there). It consumes nothing.
//   - every fxdp.v1 handler calls CallPrincipal first. It reads the call's own
//     "authorization: Bearer TOKEN" (ServerContext::client_metadata()),
//     matched in constant time among the client tokens and the workers' join
//     token, else the connection's verified peer certificate (read only):
//     identity = its subject's CN, role from its O, as Kubernetes does
//     ("fxdp:workers" a worker, "fxdp:admins" an admin client, anything else
//     a client). A wrong token is UNAUTHENTICATED even with a certificate.
//     Then the role against the method: WorkerService.Attach takes workers
//     only, every other fxdp method clients only (PERMISSION_DENIED).
//   - wrong tokens count against the call's TCP connection (ServerContext::
//     peer(), "ipv4:10.0.0.7:51234", never reused while that connection is
//     open; AuthLimiter: a blocked connection's calls with a token are
//     RESOURCE_EXHAUSTED, a right one included) and its host (FailureTally:
//     one audit line per host per window with the count).
#ifndef FXDP_SECURITY_CALL_AUTH_H_
#define FXDP_SECURITY_CALL_AUTH_H_

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "security/auth_limiter.h"
#include "security/tokens.h"

namespace fxdp::security {

inline constexpr char kAttachMethod[] = "/fxdp.v1.WorkerService/Attach";

class CallAuth {
 public:
  // `certificates`: the server verifies client certificates (--tls-ca).
  CallAuth(TokenTable tokens, bool certificates, AuthLimiterOptions limits);

  // The processor's screen of a call to `path` with `authorization_headers`
  // authorization values, on a connection with (`certificate`) or without
  // a verified client certificate: OK or the status refusing it.
  grpc::Status Screen(absl::string_view path, size_t authorization_headers, bool certificate) const;

  // The principal of a call to `method` ("/fxdp.v1.JobService/GetJob"), or
  // UNAUTHENTICATED / PERMISSION_DENIED / RESOURCE_EXHAUSTED saying why not.
  absl::StatusOr<Principal> Authenticate(const grpc::ServerContextBase& ctx,
                                         absl::string_view method);

 private:
  absl::StatusOr<Principal> ByToken(const std::string& peer, absl::string_view value);
  absl::StatusOr<Principal> ByCertificate(const grpc::ServerContextBase& ctx);

  const TokenTable tokens_;
  const bool certificates_;
  AuthLimiter limiter_;
  FailureTally failures_;
  std::mutex mu_;
  std::map<std::string, Principal> by_cert_;  // mu_: PrincipalOfCertificate, remembered
};

// The principal of a call to `method`: nullopt when `auth` is null (the
// server does not authenticate: every caller may do everything).
absl::StatusOr<std::optional<Principal>> CallPrincipal(CallAuth* auth,
                                                       const grpc::ServerContextBase& ctx,
                                                       absl::string_view method);

// The AuthMetadataProcessor of a server that authenticates (CallAuth::Screen).
std::shared_ptr<grpc::AuthMetadataProcessor> MakeAuthProcessor(
    std::shared_ptr<const CallAuth> auth);

// "ipv4:10.0.0.7:51234" -> "ipv4:10.0.0.7", "ipv6:[::1]:5" -> "ipv6:[::1]";
// anything without a numeric port as it is.
std::string PeerHostOf(absl::string_view peer);

}  // namespace fxdp::security

#endif  // FXDP_SECURITY_CALL_AUTH_H_
