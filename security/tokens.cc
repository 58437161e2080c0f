#include "security/tokens.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fxdp::security {
namespace {

constexpr size_t kMaxFileBytes = size_t{1} << 20;

std::array<unsigned char, 32> Digest(absl::string_view s) {
  std::array<unsigned char, 32> d{};
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
  return d;
}

bool IsTokenText(absl::string_view t) {
  for (char c : t) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

const char* RoleName(Role r) {
  switch (r) {
    case Role::kClient: return "client";
    case Role::kAdmin: return "admin";
    case Role::kWorker: return "worker";
  }
  return "?";
}

bool IsIdentity(absl::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    if (static_cast<unsigned char>(c) <= ' ' || c == '\x7f') return false;
  }
  return true;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string msg = absl::StrCat(what, " '", path, "': ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(msg) : absl::NotFoundError(msg);
  }
  std::string bytes;
  char buf[4096];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    bytes.append(buf, static_cast<size_t>(in.gcount()));
    if (bytes.size() > kMaxFileBytes) {
      return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' is larger than 1 MiB"));
    }
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(what, " '", path, "': read error"));
  return bytes;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(path, "token file");
  if (!text.ok()) return text.status();
  const std::string token(absl::StripAsciiWhitespace(*text));
  if (token.size() < kMinTokenLength || !IsTokenText(token)) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file '", path, "' must hold one token of at least ", kMinTokenLength,
                     " printable characters without spaces"));
  }
  return token;
}

absl::Status TokenTable::Add(absl::string_view token, Principal who, const std::string& source) {
  if (token.size() < kMinTokenLength || !IsTokenText(token)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": a token must have at least ",
                                                   kMinTokenLength,
                                                   " printable characters without spaces"));
  }
  if (Match(token).has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": this token is already in use"));
  }
  entries_.push_back({Digest(token), std::move(who)});
  return absl::OkStatus();
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text, const std::string& path) {
  TokenTable t;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = absl::StrCat(path, ":", line_no);
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (f.size() < 2 || f.size() > 3 || (f.size() == 3 && f[2] != "admin")) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected 'TOKEN IDENTITY [admin]', got ", f.size(), " fields"));
    }
    if (!IsIdentity(f[1])) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": bad identity"));
    }
    Principal who{std::string(f[1]), f.size() == 3 ? Role::kAdmin : Role::kClient};
    if (absl::Status s = t.Add(f[0], std::move(who), where); !s.ok()) return s;
  }
  if (t.size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("client token file '", path, "' has no tokens"));
  }
  return t;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(path, "client token file");
  if (!text.ok()) return text.status();
  return Parse(*text, path);
}

std::optional<Principal> TokenTable::Match(absl::string_view token) const {
  const std::array<unsigned char, 32> d = Digest(token);
  const Entry* found = nullptr;
  for (const Entry& e : entries_) {
    // No early exit: every entry is compared whatever matched before.
    const bool eq = CRYPTO_memcmp(d.data(), e.digest.data(), d.size()) == 0;
    if (eq) found = &e;
  }
  if (found == nullptr) return std::nullopt;
  return found->who;
}

}  // namespace fxdp::security
