// security/: the token table, listen-address policy, and the audit log's
// escaping (server/audit.h). TLS itself is tested end to end with real
// certificates in tests/python/test_security.py.
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "security/server_auth.h"
#include "security/tokens.h"
#include "server/audit.h"

namespace fxdp::security {
namespace {

constexpr char kAlice[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
constexpr char kRoot[] = "rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr";

TEST(TokenTable, ParsesIdentitiesAndAdmins) {
  auto t = TokenTable::Parse(absl::StrCat("# comment\n\n", kAlice, " alice\n", kRoot, "\troot admin\n"),
                             "tokens");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 2u);
  auto a = t->Match(kAlice);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->identity, "alice");
  EXPECT_EQ(a->role, Role::kClient);
  auto r = t->Match(kRoot);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->identity, "root");
  EXPECT_EQ(r->role, Role::kAdmin);
  EXPECT_FALSE(t->Match("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab").has_value());
  EXPECT_FALSE(t->Match("").has_value());
  EXPECT_FALSE(t->Match(std::string(kAlice) + "a").has_value());
}

TEST(TokenTable, ErrorsNameTheLineNeverTheToken) {
  struct Case {
    std::string text, want;
  } cases[] = {
      {absl::StrCat(kAlice, "\n"), "tokens:1: expected 'TOKEN IDENTITY [admin]', got 1 fields"},
      {absl::StrCat("\n", kAlice, " alice root\n"), "tokens:2: expected"},
      {"short alice\n", "tokens:1: a token must have at least 16"},
      {absl::StrCat(kAlice, " alice\n", kAlice, " bob\n"), "tokens:2: this token is already in use"},
      {"# nothing\n", "has no tokens"},
  };
  for (const Case& c : cases) {
    auto t = TokenTable::Parse(c.text, "tokens");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_TRUE(absl::StrContains(t.status().message(), c.want)) << t.status();
    EXPECT_FALSE(absl::StrContains(t.status().message(), kAlice)) << t.status();
  }
}

TEST(Listen, LoopbackOnlyForLocalAddresses) {
  for (const char* a : {"127.0.0.1:50051", "127.1.2.3:0", "localhost:1", "[::1]:50051", "unix:/tmp/s"}) {
    EXPECT_TRUE(IsLoopbackListen(a)) << a;
  }
  for (const char* a : {"0.0.0.0:50051", "[::]:50051", ":50051", "10.0.0.1:50051", "127.0.0.1.evil:1",
                        "128.0.0.1:1", "example.com:50051", "127.0.0.256:1", "127.0.0.1"}) {
    EXPECT_FALSE(IsLoopbackListen(a)) << a;
  }
}

TEST(Access, OwnersAndAdmins) {
  EXPECT_TRUE(MayAccess(std::nullopt, "alice"));  // no authentication: as before
  EXPECT_TRUE(MayAccess(Principal{"alice", Role::kClient}, "alice"));
  EXPECT_FALSE(MayAccess(Principal{"bob", Role::kClient}, "alice"));
  EXPECT_TRUE(MayAccess(Principal{"root", Role::kAdmin}, "alice"));
  EXPECT_EQ(Describe(std::nullopt), "-");
  EXPECT_EQ(Describe(Principal{"root", Role::kAdmin}), "root (admin)");
}

TEST(Audit, EveryFieldEscaped) {
  const std::string line = server::AuditLine(
      "worker_join", {{"identity", "w"}, {"hostname", "evil\nfxdp-server: audit event=\"cancel\""}});
  EXPECT_EQ(line,
            "event=\"worker_join\" identity=\"w\" "
            "hostname=\"evil\\nfxdp-server: audit event=\\\"cancel\\\"\"");
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(server::AuditLine("x", {{"k", "\x01\x7f\xc3\xa9\\"}}), "event=\"x\" k=\"\\x01\\x7f\\xc3\\xa9\\\\\"");
}

}  // namespace
}  // namespace fxdp::security
