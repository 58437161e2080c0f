#include "executor/memory_limit.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "util/bytes.h"

namespace fxdp::executor {
namespace {

std::atomic<int64_t> g_limit{0};
std::atomic<int64_t> g_in_use{0};
std::atomic<int64_t> g_peak{0};

// Wraps the CPU allocator in place when installed: every tensor allocated
// afterwards is counted until its storage is freed.
class LimitedCpuAllocator final : public c10::Allocator {
 public:
  explicit LimitedCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    const int64_t bytes = static_cast<int64_t>(n);
    const int64_t limit = g_limit.load();
    const int64_t now = g_in_use.fetch_add(bytes) + bytes;
    if (limit > 0 && now > limit) {
      g_in_use.fetch_sub(bytes);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "fxdp-worker --memory-limit ", util::MiB(limit),
                       " (", limit, " bytes): cannot allocate ", bytes, " bytes with ", now - bytes,
                       " bytes of tensors held (", util::MiB(now - bytes), ")");
    }
    for (int64_t peak = g_peak.load(); now > peak && !g_peak.compare_exchange_weak(peak, now);) {
    }
    c10::DataPtr inner;
    try {
      inner = base_->allocate(n);
    } catch (...) {
      g_in_use.fetch_sub(bytes);
      throw;
    }
    void* data = inner.get();
    const c10::Device device = inner.device();
    auto* held = new Held{std::move(inner), bytes};
    return c10::DataPtr(data, held, &Free, device);
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  struct Held {
    c10::DataPtr inner;
    int64_t bytes;
  };
  static void Free(void* ctx) {
    auto* held = static_cast<Held*>(ctx);
    g_in_use.fetch_sub(held->bytes);
    delete held;  // frees the storage through the wrapped allocator
  }

  c10::Allocator* const base_;
};

// The first line of `path` as a number of bytes; 0 when absent or "max".
int64_t ReadLimitFile(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return 0;
  int64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &v) || v <= 0) return 0;
  // cgroup v1 spells "no limit" as a page-rounded INT64_MAX.
  return v >= (int64_t{1} << 62) ? 0 : v;
}

// The memory limit of this process' cgroup (v2 or v1), 0 when none.
int64_t CgroupMemoryLimit() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  int64_t best = 0;
  auto take = [&best](int64_t v) {
    if (v > 0 && (best == 0 || v < best)) best = v;
  };
  while (std::getline(in, line)) {
    // "0::/path" (v2) or "4:memory:/path" (v1).
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty()) {
      take(ReadLimitFile("/sys/fs/cgroup" + path + "/memory.max"));
    } else if (controllers == "memory" || controllers.find("memory,") == 0 ||
               controllers.find(",memory") != std::string::npos) {
      take(ReadLimitFile("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes"));
    }
  }
  return best;
}

}  // namespace

void InstallCpuMemoryLimit(int64_t bytes) {
  static LimitedCpuAllocator* const installed = [] {
    auto* a = new LimitedCpuAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  (void)installed;
  g_limit.store(bytes);
}

int64_t CpuMemoryLimit() { return g_limit.load(); }
int64_t CpuTensorBytesInUse() { return g_in_use.load(); }
int64_t PeakCpuTensorBytes() { return g_peak.load(); }
void ResetPeakCpuTensorBytes() { g_peak.store(g_in_use.load()); }

MemoryFigure CpuMemoryFigure(int64_t memory_limit) {
  MemoryFigure f;
  auto take = [&f](int64_t bytes, const char* source) {
    if (bytes > 0 && (f.bytes == 0 || bytes < f.bytes)) f = {bytes, source};
  };
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) take(static_cast<int64_t>(pages) * page, "physical memory");
  take(CgroupMemoryLimit(), "cgroup memory limit");
  take(memory_limit, "--memory-limit");
  return f;
}

}  // namespace fxdp::executor
