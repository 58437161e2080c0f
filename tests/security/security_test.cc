// security/: the token table, listen-address policy, and the audit log's
// escaping (server/audit.h). TLS itself is tested end to end with real
// certificates in tests/python/test_security.py.
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "security/auth_limiter.h"
#include "security/server_auth.h"
#include "security/tokens.h"
#include "server/audit.h"

namespace fxdp::security {
namespace {

constexpr char kAlice[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
constexpr char kRoot[] = "rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr";

TEST(TokenTable, ParsesIdentitiesAndAdmins) {
  auto t = TokenTable::Parse(
      absl::StrCat("# comment\n\n", kAlice, " alice\n", kRoot, "\troot admin\n"), "tokens");
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
      {absl::StrCat(kAlice, " alice\n", kAlice, " bob\n"),
       "tokens:2: this token is already in use"},
      {"# nothing\n", "has no tokens"},
  };
  for (const Case& c : cases) {
    auto t = TokenTable::Parse(c.text, "tokens");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_TRUE(absl::StrContains(t.status().message(), c.want)) << t.status();
    EXPECT_FALSE(absl::StrContains(t.status().message(), kAlice)) << t.status();
  }
}

// Issue 17: wrong tokens are limited per connection: the N-th failure within
// the window blocks it (reported once), for block_s; other connections go on;
// failures older than the window do not count.
TEST(AuthLimiter, BlocksAPeerAfterTooManyFailuresWithinTheWindowAndReportsItOnce) {
  std::vector<std::pair<std::string, int>> reported;
  AuthLimiterOptions o;
  o.max_failures = 3;
  o.window_s = 10;
  o.block_s = 60;
  o.on_block = [&](const std::string& peer, int failures) {
    reported.emplace_back(peer, failures);
  };
  AuthLimiter limiter(o);
  const auto t0 = AuthLimiter::Clock::now();
  auto at = [&](double s) {
    return t0 + std::chrono::duration_cast<AuthLimiter::Clock::duration>(
                    std::chrono::duration<double>(s));
  };
  EXPECT_FALSE(limiter.Failed("a", at(0)));
  EXPECT_FALSE(limiter.Failed("a", at(1)));
  EXPECT_FALSE(limiter.Failed("a", at(11.5)));  // the first two left the window
  EXPECT_FALSE(limiter.Failed("a", at(12)));
  EXPECT_EQ(limiter.BlockedFor("a", at(12)), 0);
  EXPECT_TRUE(limiter.Failed("a", at(13)));  // three within 10 s
  EXPECT_DOUBLE_EQ(limiter.BlockedFor("a", at(13)), 60);
  EXPECT_NEAR(limiter.BlockedFor("a", at(43)), 30, 1e-6);
  EXPECT_FALSE(limiter.Failed("a", at(14)));        // blocked: counted once
  EXPECT_EQ(limiter.BlockedFor("b", at(14)), 0);    // another connection
  EXPECT_EQ(limiter.BlockedFor("a", at(73.5)), 0);  // the block is over
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(reported[0], std::make_pair(std::string("a"), 3));
  // 0: no limit.
  o.max_failures = 0;
  AuthLimiter off(o);
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(off.Failed("a", at(0)));
  EXPECT_EQ(off.BlockedFor("a", at(0)), 0);
}

TEST(AuthLimiter, TracksAtMostMaxPeers) {
  AuthLimiterOptions o;
  o.max_failures = 2;
  o.max_peers = 100;
  AuthLimiter limiter(o);
  const auto now = AuthLimiter::Clock::now();
  limiter.Failed("first", now);
  limiter.Failed("first", now);  // blocked
  for (int i = 0; i < 1000; ++i)
    limiter.Failed(absl::StrCat("peer", i), now + std::chrono::seconds(1));
  // Memory stays bounded; the oldest failures went first, the block stays.
  EXPECT_LE(limiter.peers(), 100u);
  EXPECT_GT(limiter.BlockedFor("first", now + std::chrono::seconds(2)), 0);
}

// Issue 25: wrong tokens reach the audit log, at most one line per host per
// window: the first at once, the rest counted and reported together with the
// first failure or Sweep after the window; a host quiet for a window starts
// over; the number of hosts is bounded.
TEST(FailureTally, ReportsAHostsFailuresOncePerWindowWithTheirCount) {
  std::vector<std::pair<std::string, int64_t>> lines;
  FailureTally tally(60, 3,
                     [&](const std::string& host, int64_t n) { lines.emplace_back(host, n); });
  const auto t0 = FailureTally::Clock::now();
  auto at = [&](double s) {
    return t0 + std::chrono::duration_cast<FailureTally::Clock::duration>(
                    std::chrono::duration<double>(s));
  };
  using Line = std::pair<std::string, int64_t>;
  for (int i = 0; i < 500; ++i) tally.Failed("h1", at(i * 0.1));  // 0 .. 49.9 s
  tally.Failed("h2", at(50));
  EXPECT_EQ(lines, (std::vector<Line>{{"h1", 1}, {"h2", 1}}));
  tally.Sweep(at(59));  // h1's window is not over
  EXPECT_EQ(lines.size(), 2u);
  tally.Sweep(at(61));
  EXPECT_EQ(lines.back(), Line("h1", 499));
  tally.Failed("h1", at(62));  // held: the last line was 1 s ago
  EXPECT_EQ(lines.size(), 3u);
  tally.Sweep(at(121.5));  // h1's one failure; h2 had nothing held: forgotten
  EXPECT_EQ(lines.back(), Line("h1", 1));
  EXPECT_EQ(lines.size(), 4u);
  tally.Failed("h2", at(122));  // h2 starts over: at once
  EXPECT_EQ(lines.back(), Line("h2", 1));
  tally.Failed("h3", at(123));
  tally.Failed("h3", at(123));  // held
  tally.Failed("h4", at(124));  // a fourth host: the held ones are reported, the table starts over
  EXPECT_EQ(lines, (std::vector<Line>{{"h1", 1},
                                      {"h2", 1},
                                      {"h1", 499},
                                      {"h1", 1},
                                      {"h2", 1},
                                      {"h3", 1},
                                      {"h3", 1},
                                      {"h4", 1}}));
}

TEST(Listen, LoopbackOnlyForLocalAddresses) {
  for (const char* a :
       {"127.0.0.1:50051", "127.1.2.3:0", "localhost:1", "[::1]:50051", "unix:/tmp/s"}) {
    EXPECT_TRUE(IsLoopbackListen(a)) << a;
  }
  for (const char* a :
       {"0.0.0.0:50051", "[::]:50051", ":50051", "10.0.0.1:50051", "127.0.0.1.evil:1",
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
      "worker_join",
      {{"identity", "w"}, {"hostname", "evil\nfxdp-server: audit event=\"cancel\""}});
  EXPECT_EQ(line,
            "event=\"worker_join\" identity=\"w\" "
            "hostname=\"evil\\nfxdp-server: audit event=\\\"cancel\\\"\"");
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(server::AuditLine("x", {{"k", "\x01\x7f\xc3\xa9\\"}}),
            "event=\"x\" k=\"\\x01\\x7f\\xc3\\xa9\\\\\"");
}

}  // namespace
}  // namespace fxdp::security
