#include "security/auth_limiter.h"

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

namespace fxdp::security {
namespace {

AuthLimiter::Clock::duration Secs(double s) {
  return std::chrono::duration_cast<AuthLimiter::Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

double AuthLimiter::BlockedFor(absl::string_view peer, Clock::time_point now) {
  if (o_.max_failures <= 0) return 0;
  std::lock_guard<std::mutex> l(mu_);
  auto it = peers_.find(std::string(peer));
  if (it == peers_.end() || it->second.blocked_until <= now) return 0;
  return std::chrono::duration<double>(it->second.blocked_until - now).count();
}

bool AuthLimiter::Failed(absl::string_view peer, Clock::time_point now) {
  if (o_.max_failures <= 0) return false;
  const std::string host(peer);
  int failures = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (peers_.count(host) == 0 && peers_.size() >= o_.max_peers) Prune(now);
    Peer& p = peers_[host];
    if (p.blocked_until > now) return false;  // counted already
    p.failures.push_back(now);
    while (!p.failures.empty() && p.failures.front() <= now - Secs(o_.window_s))
      p.failures.pop_front();
    if (static_cast<int>(p.failures.size()) < o_.max_failures) return false;
    failures = static_cast<int>(p.failures.size());
    p.failures.clear();
    p.blocked_until = now + Secs(o_.block_s);
  }
  if (o_.on_block) o_.on_block(host, failures);
  return true;
}

void AuthLimiter::Prune(Clock::time_point now) {
  // Forget the peers with nothing in the window and no block; if that is not
  // enough, the half whose last failure is oldest.
  for (auto it = peers_.begin(); it != peers_.end();) {
    const Peer& p = it->second;
    const bool stale = p.blocked_until <= now &&
                       (p.failures.empty() || p.failures.back() <= now - Secs(o_.window_s));
    it = stale ? peers_.erase(it) : std::next(it);
  }
  if (peers_.size() < o_.max_peers) return;
  std::vector<std::pair<Clock::time_point, std::string>> by_age;
  for (const auto& [host, p] : peers_) {
    by_age.emplace_back(
        std::max(p.blocked_until, p.failures.empty() ? Clock::time_point{} : p.failures.back()),
        host);
  }
  std::sort(by_age.begin(), by_age.end());
  for (size_t i = 0; i < by_age.size() / 2 + 1 && i < by_age.size(); ++i)
    peers_.erase(by_age[i].second);
}

void FailureTally::Failed(absl::string_view host, Clock::time_point now) {
  Reports out;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (hosts_.size() >= max_hosts_ && hosts_.count(std::string(host)) == 0) {
      // Full: report everything held and start over (bounded memory; at
      // most one line per host per max_hosts new hosts).
      for (const auto& [h, e] : hosts_) {
        if (e.held > 0) out.emplace_back(h, e.held);
      }
      hosts_.clear();
    }
    Host& e = hosts_[std::string(host)];
    ++e.held;
    if (e.last_report == Clock::time_point{} || now - e.last_report >= Secs(window_s_)) {
      out.emplace_back(std::string(host), e.held);
      e.held = 0;
      e.last_report = now;
    }
  }
  Emit(out);
}

void FailureTally::Sweep(Clock::time_point now) {
  Reports out;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (now < next_sweep_) return;
    next_sweep_ = now + std::chrono::seconds(1);
    for (auto it = hosts_.begin(); it != hosts_.end();) {
      Host& e = it->second;
      if (now - e.last_report < Secs(window_s_)) {
        ++it;
        continue;
      }
      if (e.held == 0) {
        it = hosts_.erase(it);  // quiet for a window: its next failure is reported at once
        continue;
      }
      out.emplace_back(it->first, e.held);
      e.held = 0;
      e.last_report = now;
      ++it;
    }
  }
  Emit(out);
}

void FailureTally::Emit(const Reports& r) const {
  if (!report_) return;
  for (const auto& [host, n] : r) report_(host, n);
}

}  // namespace fxdp::security
