#pragma once
// Shim (see gloo/README.md). Virtual interface as used by c10d::ProcessGroupGloo::GlooStore
// (gloo "store v2" API, which torch 2.13's bundled gloo has). The extra pure virtual makes
// GlooStore abstract in *our* TUs so its (layout-sensitive) vtable can never be emitted here.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>
#include "gloo/common/error.h"
#define GLOO_STORE_HAS_STORE_V2 1
namespace gloo {
namespace rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) = 0;
  virtual bool has_v2_support() = 0;
  virtual std::vector<std::vector<char>> multi_get(const std::vector<std::string>& keys) = 0;
  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::vector<char>>& values) = 0;
  virtual void append(const std::string& key, const std::vector<char>& value) = 0;
  virtual int64_t add(const std::string& key, int64_t value) = 0;
  // Poison: do not construct gloo stores (incl. c10d::ProcessGroupGloo::GlooStore) in fxdp code.
  virtual void fxdp_shim_do_not_instantiate_gloo_store_outside_libtorch() = 0;
};
} // namespace rendezvous
} // namespace gloo
