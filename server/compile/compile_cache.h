// CompileCache: a thread-safe LRU cache of compile results (AnalyzeResponse,
// ExpandResponse) keyed by a content hash of the serialized request.
//
// Keys are SHA-256 digests (32 bytes) of "<method>\0" + the request's
// serialized bytes, so a key is stable across processes and collisions are
// not a practical concern. The service hashes the bytes it received as they
// are (no parse); they equal the canonical serialization whenever the client
// serialized canonically (C++, Python), else it falls back to the key of the
// parsed and re-serialized request (CompileCacheKey(method, message)).
//
// Values are the responses serialized once, with `cached = true`, shared and
// immutable: a hit is sent as these bytes without copying them. Entries are
// evicted least recently used first when either bound is exceeded:
// max_entries, or max_bytes (the sum of the cached values' sizes plus keys).
// An entry larger than max_bytes is not cached.
#ifndef FXDP_SERVER_COMPILE_COMPILE_CACHE_H_
#define FXDP_SERVER_COMPILE_COMPILE_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
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
// The cache key of a request already serialized, as the concatenation of `chunks`.
std::string CompileCacheKeyOfBytes(absl::string_view method,
                                   absl::Span<const absl::string_view> chunks);

// A cached value: a serialized response, immutable once cached.
using CachedBytes = std::shared_ptr<const std::string>;

class CompileCache {
 public:
  explicit CompileCache(CompileCacheOptions options = {}) : options_(options) {}

  // The cached value for `key`, or null. Marks it most recently used. Counts a
  // hit, and a miss unless `count_miss` is false (a first probe that a
  // second, counted, Lookup follows).
  CachedBytes Lookup(const std::string& key, bool count_miss = true);
  // Caches `value` under `key` (replacing any entry), then evicts to the bounds.
  void Insert(const std::string& key, CachedBytes value);
  // Whether Insert can keep anything (max_entries >= 1).
  bool enabled() const { return options_.max_entries >= 1; }
  CompileCacheStats stats() const;

 private:
  struct Entry {
    std::string key;
    CachedBytes value;
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

#endif  // FXDP_SERVER_COMPILE_COMPILE_CACHE_H_
