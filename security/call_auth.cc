#include "security/call_auth.h"

#include <cmath>
#include <iterator>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "security/server_auth.h"

namespace fxdp::security {
namespace {

constexpr absl::string_view kHealthPrefix = "/grpc.health.v1.Health/";
constexpr absl::string_view kFxdpPrefix = "/fxdp.v1.";
constexpr size_t kMaxCachedCertificates = 4096;
constexpr char kNoCredentials[] =
    "fxdp-server requires credentials: a bearer token (--token-file) or a client certificate "
    "signed by the "
    "server's --tls-ca";

absl::Status CheckRole(const Principal& who, absl::string_view method) {
  const bool attach = method == kAttachMethod;
  if (attach && who.role != Role::kWorker) {
    return absl::PermissionDeniedError(
        absl::StrCat("'", who.identity, "' is a ", RoleName(who.role),
                     ", not a worker: attaching needs the join token or a "
                     "worker certificate"));
  }
  if (!attach && who.role == Role::kWorker) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker credentials may only attach (called ", method, ")"));
  }
  return absl::OkStatus();
}

class Processor final : public grpc::AuthMetadataProcessor {
 public:
  explicit Processor(std::shared_ptr<const CallAuth> auth) : auth_(std::move(auth)) {}

  bool IsBlocking() const override { return false; }  // no I/O: runs inline

  // Reads the call's metadata and the connection's context; writes nothing.
  grpc::Status Process(const InputMetadata& md, grpc::AuthContext* context,
                       OutputMetadata* /*consumed*/, OutputMetadata* /*response*/) override {
    absl::string_view path;
    if (auto it = md.find(":path"); it != md.end())
      path = absl::string_view(it->second.data(), it->second.size());
    const bool certificate = !context->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME).empty();
    return auth_->Screen(path, md.count("authorization"), certificate);
  }

 private:
  const std::shared_ptr<const CallAuth> auth_;
};

}  // namespace

CallAuth::CallAuth(TokenTable tokens, bool certificates, AuthLimiterOptions limits)
    : tokens_(std::move(tokens)),
      certificates_(certificates),
      limiter_(limits),
      failures_(limits.window_s, limits.max_peers, limits.on_failures) {}

grpc::Status CallAuth::Screen(absl::string_view path, size_t authorization_headers,
                              bool certificate) const {
  if (absl::StartsWith(path, kHealthPrefix)) return grpc::Status::OK;
  if (authorization_headers > 1) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat("the call carries ", authorization_headers,
                                     " authorization headers: give one 'Bearer TOKEN'"));
  }
  if (authorization_headers == 1) {
    if (absl::StartsWith(path, kFxdpPrefix)) return grpc::Status::OK;  // the handler checks it
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("tokens are taken by fxdp.v1 methods only; ", path,
                                     " needs a client certificate"));
  }
  if (certificate && certificates_)
    return grpc::Status::OK;  // TLS verified it; the handler reads it
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, kNoCredentials);
}

absl::StatusOr<Principal> CallAuth::Authenticate(const grpc::ServerContextBase& ctx,
                                                 absl::string_view method) {
  failures_.Sweep();
  const std::multimap<grpc::string_ref, grpc::string_ref>& md = ctx.client_metadata();
  const auto [first, end] = md.equal_range("authorization");
  absl::StatusOr<Principal> who;
  if (first == end) {
    who = ByCertificate(ctx);
  } else if (std::next(first) != end) {
    return absl::UnauthenticatedError("the call carries more than one authorization header");
  } else {
    who = ByToken(ctx.peer(), absl::string_view(first->second.data(), first->second.size()));
  }
  if (!who.ok()) return who.status();
  if (absl::Status s = CheckRole(*who, method); !s.ok()) return s;
  return who;
}

absl::StatusOr<Principal> CallAuth::ByToken(const std::string& peer, absl::string_view value) {
  if (const double left = limiter_.BlockedFor(peer); left > 0) {
    const AuthLimiterOptions& o = limiter_.options();
    return absl::ResourceExhaustedError(absl::StrFormat(
        "too many wrong tokens on this connection (%d within %.0f s): its calls with a token are "
        "refused for %.0f s more (fxdp-server --max-auth-failures)",
        o.max_failures, o.window_s, std::ceil(left)));
  }
  constexpr absl::string_view kBearer = "Bearer ";
  std::optional<Principal> who;
  if (absl::StartsWith(value, kBearer)) who = tokens_.Match(value.substr(kBearer.size()));
  if (who.has_value()) return *std::move(who);
  limiter_.Failed(peer);
  failures_.Failed(PeerHostOf(peer));
  return absl::UnauthenticatedError(absl::StartsWith(value, kBearer)
                                        ? "invalid token (fxdp-server does not know it)"
                                        : "the authorization metadata is not 'Bearer TOKEN'");
}

absl::StatusOr<Principal> CallAuth::ByCertificate(const grpc::ServerContextBase& ctx) {
  std::shared_ptr<const grpc::AuthContext> ac = ctx.auth_context();
  if (!certificates_ || ac == nullptr) return absl::UnauthenticatedError(kNoCredentials);
  for (const grpc::string_ref& ref : ac->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME)) {
    std::string pem(ref.data(), ref.size());
    {
      std::lock_guard<std::mutex> l(mu_);
      if (auto it = by_cert_.find(pem); it != by_cert_.end()) return it->second;
    }
    absl::StatusOr<Principal> p = PrincipalOfCertificate(pem);
    if (p.ok()) {
      std::lock_guard<std::mutex> l(mu_);
      if (by_cert_.size() >= kMaxCachedCertificates) by_cert_.clear();
      by_cert_.emplace(std::move(pem), *p);
    }
    return p;
  }
  return absl::UnauthenticatedError(kNoCredentials);
}

absl::StatusOr<std::optional<Principal>> CallPrincipal(CallAuth* auth,
                                                       const grpc::ServerContextBase& ctx,
                                                       absl::string_view method) {
  if (auth == nullptr) return std::optional<Principal>();
  absl::StatusOr<Principal> who = auth->Authenticate(ctx, method);
  if (!who.ok()) return who.status();
  return std::optional<Principal>(*std::move(who));
}

std::shared_ptr<grpc::AuthMetadataProcessor> MakeAuthProcessor(
    std::shared_ptr<const CallAuth> auth) {
  return std::make_shared<Processor>(std::move(auth));
}

std::string PeerHostOf(absl::string_view peer) {
  const size_t colon = peer.rfind(':');
  if (colon == absl::string_view::npos || colon + 1 == peer.size()) return std::string(peer);
  for (char c : peer.substr(colon + 1)) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::string(peer);
  }
  return std::string(peer.substr(0, colon));
}

}  // namespace fxdp::security
