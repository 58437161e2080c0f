// Bearer tokens: the clients' token file and the workers' join token.
//
// A client token file (`fxdp-server --client-tokens FILE`) holds one client a
// line, `TOKEN IDENTITY [admin]`; blank lines and lines starting with '#' are
// skipped. Tokens are at least 16 characters, printable ASCII, unique;
// identities are names without spaces or control characters. A token file of
// a client or worker (`--token-file`) holds the token alone (surrounding
// whitespace, a final newline, is ignored).
//
// TokenTable::Match compares a presented token with every known token in
// constant time (SHA-256 of both, CRYPTO_memcmp, no early exit), so neither
// the match nor its position leaks through timing. Error messages name the
// file and the line number, never a token.
#ifndef FXDP_SECURITY_TOKENS_H_
#define FXDP_SECURITY_TOKENS_H_

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fxdp::security {

inline constexpr size_t kMinTokenLength = 16;

// Who a call comes from once authenticated.
enum class Role { kClient, kAdmin, kWorker };
const char* RoleName(Role r);

struct Principal {
  std::string identity;
  Role role = Role::kClient;
};

class TokenTable {
 public:
  // Parses a client token file's text (`path` names it in errors).
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, const std::string& path);
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // Adds one token (the worker join token), INVALID_ARGUMENT for a short or
  // duplicate one.
  absl::Status Add(absl::string_view token, Principal who, const std::string& source);

  // The principal whose token equals `token`, in constant time over the table.
  std::optional<Principal> Match(absl::string_view token) const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::array<unsigned char, 32> digest;
    Principal who;
  };
  std::vector<Entry> entries_;
};

// The token of a `--token-file` (one token; whitespace around it ignored).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The whole file (certificates, keys, token files), NOT_FOUND /
// PERMISSION_DENIED naming `what` and the path; at most 1 MiB.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const std::string& what);

// A name usable as an identity: non-empty, at most 128 bytes, no spaces or
// control characters.
bool IsIdentity(absl::string_view s);

}  // namespace fxdp::security

#endif  // FXDP_SECURITY_TOKENS_H_
