// AuthLimiter: failed authentications per peer, for fxdp-server's call
// authentication (call_auth.h). A peer that presents `max_failures` wrong
// bearer tokens (client tokens or the workers' join token) within
// `window_s` is blocked for `block_s`: every call of it that carries a token
// is refused with RESOURCE_EXHAUSTED, a right token included (else a blocked
// guesser would still learn when it guessed right). The block is reported
// once (`on_block`: the audit log). Calls authenticated by a certificate
// and calls without credentials are never blocked (no token is being
// guessed). A peer is whatever key the caller gives: call_auth.cc's is the
// call's TCP connection as gRPC names it (ServerContext::peer(),
// "ipv4:10.0.0.7:51234"), so a guesser that reconnects pays a TCP and TLS
// handshake per `max_failures` guesses.
// At most `max_peers` peers are tracked; past that those without a recent
// failure or block are forgotten, then those whose last failure or block
// end is oldest (a block outlives a spray of new peers). Thread-safe.
//
// FailureTally: the wrong tokens per source host for the audit log, one
// line per host per window at most (so a guesser cannot flood the log): the
// first failure of a host is reported at once, later ones are counted and
// reported together with the first failure or Sweep() after the window.
#ifndef FXDP_SECURITY_AUTH_LIMITER_H_
#define FXDP_SECURITY_AUTH_LIMITER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace fxdp::security {

struct AuthLimiterOptions {
  int max_failures = 20;  // 0: no limit
  double window_s = 60;
  double block_s = 60;
  size_t max_peers = 10000;
  // Called once per block (outside the limiter's lock): the peer, its
  // failures in the window.
  std::function<void(const std::string& peer, int failures)> on_block;
  // FailureTally's report: a host, its wrong tokens since its last report
  // (at most one a window per host).
  std::function<void(const std::string& host, int64_t failures)> on_failures;
};

class AuthLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit AuthLimiter(AuthLimiterOptions o) : o_(std::move(o)) {}

  // Seconds `peer` stays blocked (0: it is not).
  double BlockedFor(absl::string_view peer, Clock::time_point now = Clock::now());
  // A wrong token from `peer`; true when this failure blocked it.
  bool Failed(absl::string_view peer, Clock::time_point now = Clock::now());
  const AuthLimiterOptions& options() const { return o_; }
  // Peers tracked now.
  size_t peers() {
    std::lock_guard<std::mutex> l(mu_);
    return peers_.size();
  }

 private:
  struct Peer {
    std::deque<Clock::time_point> failures;  // within the window, oldest first
    Clock::time_point blocked_until{};
  };
  void Prune(Clock::time_point now);  // mu_

  const AuthLimiterOptions o_;
  std::mutex mu_;
  std::map<std::string, Peer> peers_;  // mu_
};

class FailureTally {
 public:
  using Clock = AuthLimiter::Clock;
  // `report(host, failures)` is called outside the lock.
  FailureTally(double window_s, size_t max_hosts,
               std::function<void(const std::string&, int64_t)> report)
      : window_s_(window_s), max_hosts_(max_hosts), report_(std::move(report)) {}

  // A wrong token from `host`.
  void Failed(absl::string_view host, Clock::time_point now = Clock::now());
  // Reports the hosts whose failures were held back for a whole window;
  // cheap when called often (it looks at most once a second).
  void Sweep(Clock::time_point now = Clock::now());

 private:
  struct Host {
    int64_t held = 0;  // failures not reported yet
    Clock::time_point last_report{};
  };
  using Reports = std::vector<std::pair<std::string, int64_t>>;
  void Emit(const Reports& r) const;

  const double window_s_;
  const size_t max_hosts_;
  const std::function<void(const std::string&, int64_t)> report_;
  std::mutex mu_;
  std::map<std::string, Host> hosts_;  // mu_
  Clock::time_point next_sweep_{};     // mu_
};

}  // namespace fxdp::security

#endif  // FXDP_SECURITY_AUTH_LIMITER_H_
