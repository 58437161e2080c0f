// AuthLimiter: failed authentications per peer, for fxdp-server's
// AuthMetadataProcessor (server_auth.h). A peer that presents `max_failures`
// wrong bearer tokens (client tokens or the workers' join token) within
// `window_s` is blocked for `block_s`: every call of it that carries a token
// is refused with RESOURCE_EXHAUSTED, a right token included (else a blocked
// guesser would still learn when it guessed right). The block is reported
// once (`on_block`: the audit log). Calls authenticated by a certificate
// and calls without credentials are never blocked (no token is being
// guessed). A peer is whatever key the caller gives: the processor's is the
// TLS connection (gRPC 1.51 shows an AuthMetadataProcessor neither the
// peer's address nor anything else of the call; grpc/grpc#28807), so a
// guesser that reconnects pays a TLS handshake per `max_failures` guesses.
// At most `max_peers` peers are tracked; past that those without a recent
// failure or block are forgotten, then those whose last failure or block
// end is oldest (a block outlives a spray of new peers). Thread-safe.
#ifndef FXDP_SECURITY_AUTH_LIMITER_H_
#define FXDP_SECURITY_AUTH_LIMITER_H_

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>

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

}  // namespace fxdp::security

#endif  // FXDP_SECURITY_AUTH_LIMITER_H_
