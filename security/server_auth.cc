#include "security/server_auth.h"

#include <openssl/bio.h>
#include <openssl/objects.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "grpc/grpc_security_constants.h"
#include "security/call_auth.h"

namespace fxdp::security {
namespace {

constexpr char kWorkerGroup[] = "fxdp:workers";
constexpr char kAdminGroup[] = "fxdp:admins";

std::string NameEntry(X509_NAME* name, int nid) {
  const int i = X509_NAME_get_index_by_NID(name, nid, -1);
  if (i < 0) return "";
  ASN1_STRING* s = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
  unsigned char* utf8 = nullptr;
  const int n = ASN1_STRING_to_UTF8(&utf8, s);
  if (n < 0) return "";
  std::string out(reinterpret_cast<char*>(utf8), static_cast<size_t>(n));
  OPENSSL_free(utf8);
  return out;
}

bool HasOrganization(X509_NAME* name, const char* org) {
  for (int i = X509_NAME_get_index_by_NID(name, NID_organizationName, -1); i >= 0;
       i = X509_NAME_get_index_by_NID(name, NID_organizationName, i)) {
    unsigned char* utf8 = nullptr;
    const int n =
        ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i)));
    if (n < 0) continue;
    const bool eq = std::string(reinterpret_cast<char*>(utf8), static_cast<size_t>(n)) == org;
    OPENSSL_free(utf8);
    if (eq) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<Principal> PrincipalOfCertificate(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = bio != nullptr ? PEM_read_bio_X509(bio, nullptr, nullptr, nullptr) : nullptr;
  BIO_free(bio);
  if (cert == nullptr) return absl::UnauthenticatedError("the peer certificate cannot be parsed");
  X509_NAME* subject = X509_get_subject_name(cert);
  Principal p;
  p.identity = NameEntry(subject, NID_commonName);
  p.role = HasOrganization(subject, kWorkerGroup)  ? Role::kWorker
           : HasOrganization(subject, kAdminGroup) ? Role::kAdmin
                                                   : Role::kClient;
  X509_free(cert);
  if (!IsIdentity(p.identity)) {
    return absl::UnauthenticatedError(
        "the peer certificate's subject has no usable CN (a name without spaces or control "
        "characters)");
  }
  return p;
}

namespace {

// "warning: FLAG 'PATH' is readable or writable by every user" for each secret file that is.
std::vector<std::string> PermissionWarnings(const ServerSecurityOptions& o) {
  std::vector<std::string> warnings;
  for (const auto& [flag, path] :
       {std::pair<const char*, const std::string&>{"--tls-key", o.tls_key},
        {"--client-tokens", o.client_tokens},
        {"--worker-token-file", o.worker_token_file}}) {
    struct stat st {};
    if (!path.empty() && stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IROTH | S_IWOTH)) != 0) {
      warnings.push_back(absl::StrCat("warning: ", flag, " '", path,
                                      "' is readable or writable by every user (chmod o-rwx it)"));
    }
  }
  return warnings;
}

// The server's TLS credentials from --tls-cert, --tls-key and (client certificates verified
// against it) --tls-ca.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsCredentials(
    const ServerSecurityOptions& o) {
  grpc::SslServerCredentialsOptions ssl(o.tls_ca.empty()
                                            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                            : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  absl::StatusOr<std::string> cert = ReadSmallFile(o.tls_cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadSmallFile(o.tls_key, "--tls-key");
  if (!key.ok()) return key.status();
  ssl.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  if (!o.tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadSmallFile(o.tls_ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(ssl);
  if (creds == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot use the TLS files --tls-cert '",
                                                   o.tls_cert, "' --tls-key '", o.tls_key, "'"));
  }
  return creds;
}

}  // namespace

absl::StatusOr<ServerSecurity> MakeServerSecurity(const ServerSecurityOptions& o) {
  ServerSecurity out;
  out.warnings = PermissionWarnings(o);
  const bool tls = !o.tls_cert.empty() || !o.tls_key.empty();
  const bool auth = !o.client_tokens.empty() || !o.worker_token_file.empty() || !o.tls_ca.empty();
  if (!tls) {
    if (auth) {
      return absl::InvalidArgumentError(
          "--client-tokens, --worker-token-file and --tls-ca need TLS (--tls-cert and --tls-key): "
          "tokens sent in the clear could be read by anyone on the path, and gRPC clients send "
          "them over TLS only");
    }
    out.credentials = grpc::InsecureServerCredentials();
    out.summary = "no TLS, no authentication";
    return out;
  }
  if (o.tls_cert.empty() || o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = TlsCredentials(o);
  if (!creds.ok()) return creds.status();
  out.credentials = *std::move(creds);
  out.tls = true;
  out.summary = "TLS";
  if (!auth) {
    out.summary += ", no authentication (give --client-tokens and --worker-token-file or --tls-ca)";
    return out;
  }
  TokenTable tokens;
  std::string clients = "client certificates", workers = "worker certificates";
  if (!o.client_tokens.empty()) {
    absl::StatusOr<TokenTable> t = TokenTable::Load(o.client_tokens);
    if (!t.ok()) return t.status();
    tokens = *std::move(t);
    clients =
        absl::StrCat(tokens.size(), " client token(s)", o.tls_ca.empty() ? "" : " or certificates");
  } else if (o.tls_ca.empty()) {
    return absl::InvalidArgumentError(
        "--worker-token-file without --client-tokens or --tls-ca: no client could authenticate");
  }
  if (!o.worker_token_file.empty()) {
    absl::StatusOr<std::string> join = ReadTokenFile(o.worker_token_file);
    if (!join.ok()) return join.status();
    if (absl::Status s = tokens.Add(*join, {"worker", Role::kWorker},
                                    "--worker-token-file '" + o.worker_token_file + "'");
        !s.ok()) {
      return s;
    }
    workers = o.tls_ca.empty() ? "the join token" : "the join token or worker certificates";
  } else if (o.tls_ca.empty()) {
    return absl::InvalidArgumentError(
        "--client-tokens without --worker-token-file or --tls-ca: no worker could attach");
  }
  out.auth = std::make_shared<CallAuth>(std::move(tokens), !o.tls_ca.empty(), o.auth_limits);
  out.credentials->SetAuthMetadataProcessor(MakeAuthProcessor(out.auth));
  out.authenticates = true;
  out.summary = absl::StrCat("TLS", o.tls_ca.empty() ? "" : " (mutual: --tls-ca)",
                             ", clients: ", clients, ", workers: ", workers);
  return out;
}

bool IsLoopbackListen(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:")) return true;
  std::string host = listen;
  if (absl::StartsWith(host, "ipv4:") || absl::StartsWith(host, "ipv6:")) host = host.substr(5);
  const size_t colon = host.rfind(':');
  if (colon == std::string::npos) return false;
  host = host.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8: four dotted decimal numbers, the first 127.
  std::vector<std::string> parts = absl::StrSplit(host, '.');
  if (parts.size() != 4 || parts[0] != "127") return false;
  for (const std::string& p : parts) {
    int v = 0;
    if (p.empty() || p.size() > 3 || !absl::SimpleAtoi(p, &v) || v < 0 || v > 255) return false;
  }
  return true;
}

bool MayAccess(const std::optional<Principal>& caller, const std::string& owner) {
  return !caller.has_value() || caller->role == Role::kAdmin || caller->identity == owner;
}

std::string Describe(const std::optional<Principal>& p) {
  if (!p.has_value()) return "-";
  if (p->role == Role::kClient) return p->identity;
  return absl::StrCat(p->identity, " (", RoleName(p->role), ")");
}

}  // namespace fxdp::security
