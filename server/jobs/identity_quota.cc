#include "server/jobs/identity_quota.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fxdp::server {

IdentityQuota::Slot::Slot(Slot&& o) noexcept
    : quota_(std::exchange(o.quota_, nullptr)), identity_(std::move(o.identity_)) {}

IdentityQuota::Slot& IdentityQuota::Slot::operator=(Slot&& o) noexcept {
  if (this != &o) {
    Release();
    quota_ = std::exchange(o.quota_, nullptr);
    identity_ = std::move(o.identity_);
  }
  return *this;
}

void IdentityQuota::Slot::Release() {
  if (quota_ != nullptr) std::exchange(quota_, nullptr)->Give(identity_);
}

absl::StatusOr<IdentityQuota::Slot> IdentityQuota::Acquire(const std::string& identity) {
  std::lock_guard<std::mutex> l(mu_);
  if (total_ >= limits_.max_total) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this server takes at most ", limits_.max_total, " ", limits_.what,
                     " at once (fxdp-server ", limits_.total_flag, ")"));
  }
  if (!identity.empty()) {
    size_t& mine = by_identity_[identity];
    if (mine >= limits_.max_per_identity) {
      return absl::ResourceExhaustedError(
          absl::StrCat("identity '", identity, "' has ", mine, " ", limits_.what,
                       " open, the most one identity may hold at once (fxdp-server ",
                       limits_.identity_flag, ")"));
    }
    ++mine;
  }
  ++total_;
  return Slot(this, identity);
}

void IdentityQuota::Give(const std::string& identity) {
  std::lock_guard<std::mutex> l(mu_);
  --total_;
  if (identity.empty()) return;
  auto it = by_identity_.find(identity);
  if (it != by_identity_.end() && --it->second == 0) by_identity_.erase(it);
}

size_t IdentityQuota::held() const {
  std::lock_guard<std::mutex> l(mu_);
  return total_;
}

size_t IdentityQuota::held(const std::string& identity) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = by_identity_.find(identity);
  return it == by_identity_.end() ? 0 : it->second;
}

}  // namespace fxdp::server
