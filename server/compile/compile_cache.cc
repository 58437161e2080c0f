#include "server/compile/compile_cache.h"

#include <openssl/evp.h>

#include <utility>

namespace fxdp::server {

std::string CompileCacheKey(absl::string_view method, const google::protobuf::Message& request) {
  std::string bytes;
  request.SerializeToString(&bytes);  // graph.proto has no maps: the encoding is canonical.
  const absl::string_view chunk(bytes);
  return CompileCacheKeyOfBytes(method, absl::MakeConstSpan(&chunk, 1));
}

std::string CompileCacheKeyOfBytes(absl::string_view method,
                                   absl::Span<const absl::string_view> chunks) {
  std::string digest(32, '\0');
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const char zero = 0;
  unsigned int len = 0;
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  EVP_DigestUpdate(ctx, method.data(), method.size());
  EVP_DigestUpdate(ctx, &zero, 1);
  for (absl::string_view c : chunks) EVP_DigestUpdate(ctx, c.data(), c.size());
  EVP_DigestFinal_ex(ctx, reinterpret_cast<unsigned char*>(digest.data()), &len);
  EVP_MD_CTX_free(ctx);
  return digest;
}

CachedBytes CompileCache::Lookup(const std::string& key, bool count_miss) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    if (count_miss) ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->value;
}

void CompileCache::Insert(const std::string& key, CachedBytes value) {
  const int64_t bytes = static_cast<int64_t>(value->size() + key.size());
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    stats_.bytes -= it->second->bytes;
    lru_.erase(it->second);
    index_.erase(it);
  }
  if (bytes > options_.max_bytes || options_.max_entries < 1) return;
  lru_.push_front(Entry{key, std::move(value), bytes});
  index_[key] = lru_.begin();
  stats_.bytes += bytes;
  EvictLocked();
}

void CompileCache::EvictLocked() {
  while (!lru_.empty() && (static_cast<int64_t>(lru_.size()) > options_.max_entries ||
                           stats_.bytes > options_.max_bytes)) {
    Entry& e = lru_.back();
    stats_.bytes -= e.bytes;
    index_.erase(e.key);
    lru_.pop_back();
    ++stats_.evictions;
  }
  stats_.entries = static_cast<int64_t>(lru_.size());
}

CompileCacheStats CompileCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  CompileCacheStats s = stats_;
  s.entries = static_cast<int64_t>(lru_.size());
  return s;
}

}  // namespace fxdp::server
