// CompileCache: a thread-safe LRU cache of compile results (AnalyzeResponse,
// ExpandResponse) keyed by a content hash of the serialized request.
//
// Keys are SHA-256 digests (32 bytes) of "<method>\0" + the request's
// serialized bytes, so a key is stable across processes and collisions are
// not a practical concern. Entries are evicted least recently used first when
// either bound is exceeded: max_entries, or max_bytes (the sum of the cached
// messages' serialized sizes). An entry larger than max_bytes is not cached.
#ifndef FXDP_SERVER_COMPILE_CACHE_H_
#define FXDP_SERVER_COMPILE_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace fxdp::server {

struct CompileCacheOptions {
  int64_t max_entries = 256;
  int64_t max_bytes = int64_t{2} << 30;  // 2 GiB
};

struct CompileCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t entries = 0;
  int64_t bytes = 0;
  int64_t evictions = 0;
};

// The cache key of `request` for `method` (SHA-256, 32 raw bytes).
std::string CompileCacheKey(absl::string_view method, const google::protobuf::Message& request);

class CompileCache {
 public:
  explicit CompileCache(CompileCacheOptions options = {}) : options_(options) {}

  // The cached message for `key`, or null. Marks it most recently used.
  std::shared_ptr<const google::protobuf::Message> Lookup(const std::string& key);
  // Caches `value` under `key` (replacing any entry), then evicts to the bounds.
  void Insert(const std::string& key, std::shared_ptr<const google::protobuf::Message> value);
  CompileCacheStats stats() const;

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const google::protobuf::Message> value;
    int64_t bytes = 0;
  };
  void EvictLocked();

  const CompileCacheOptions options_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // front: most recently used
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_;
  CompileCacheStats stats_;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_COMPILE_CACHE_H_
