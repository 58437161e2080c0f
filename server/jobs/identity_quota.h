// IdentityQuota: calls of one kind held at once (Submit streams, FetchState
// calls), bounded for the whole server and for each identity, so that one
// tenant cannot take every slot (issue 25). An unauthenticated server has
// one tenant: its calls count against the server's limit only. Thread-safe.
// No gRPC here.
#ifndef FXDP_SERVER_JOBS_IDENTITY_QUOTA_H_
#define FXDP_SERVER_JOBS_IDENTITY_QUOTA_H_

#include <cstddef>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"

namespace fxdp::server {

class IdentityQuota {
 public:
  struct Limits {
    const char* what;           // "Submit streams"
    size_t max_total;           // for the server
    const char* total_flag;     // "--max-submit-streams"
    size_t max_per_identity;    // for one authenticated identity
    const char* identity_flag;  // "--max-submit-streams-per-identity"
  };

  // A slot held; given back when destroyed.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& o) noexcept;
    Slot& operator=(Slot&& o) noexcept;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() { Release(); }
    void Release();

   private:
    friend class IdentityQuota;
    Slot(IdentityQuota* quota, std::string identity)
        : quota_(quota), identity_(std::move(identity)) {}
    IdentityQuota* quota_ = nullptr;
    std::string identity_;
  };

  explicit IdentityQuota(Limits limits) : limits_(limits) {}

  // A slot for `identity` ("" without authentication), or RESOURCE_EXHAUSTED
  // naming the count, the limit and its flag.
  absl::StatusOr<Slot> Acquire(const std::string& identity);
  size_t held() const;
  size_t held(const std::string& identity) const;

 private:
  void Give(const std::string& identity);

  const Limits limits_;
  mutable std::mutex mu_;
  size_t total_ = 0;
  std::map<std::string, size_t> by_identity_;  // authenticated identities holding slots
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_IDENTITY_QUOTA_H_
