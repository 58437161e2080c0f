// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11; the generator behind PyTorch's CUDA RNG) and fxdp's random stream
// built on it (docs/randomness.md). Header-only, no torch, no allocation: the
// same code runs in CPU kernels and, compiled by nvcc, in CUDA kernels.
//
// The stream: word w (a uint32) of random node `node` in step `step` of a job
// seeded `seed` is
//   Philox4x32_10(counter = {b lo, b hi, node, step}, key = {seed lo, seed hi})[w % 4],
//   b = w / 4.
// An op that draws k words per element gives element i of its GLOBAL tensor
// (row-major over the one-device shape) words k*i .. k*i+k-1, so a rank
// holding a slice of the tensor draws exactly the slice's values.
// client/python/fxdp/philox.py is the same stream in torch ops (run_local);
// tests/testdata/philox_vectors.txt holds both to Random123's known answers
// and to each other.
#ifndef FXDP_UTIL_PHILOX_H_
#define FXDP_UTIL_PHILOX_H_

#include <cstdint>

#if defined(__CUDACC__)
#define FXDP_HOST_DEVICE __host__ __device__
#else
#define FXDP_HOST_DEVICE
#endif

namespace fxdp::philox {

struct Words4 {
  uint32_t v[4];
};

constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;    // round multipliers
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule

// Philox4x32 with `rounds` rounds (10: Philox4x32-10).
FXDP_HOST_DEVICE inline Words4 Philox4x32(Words4 c, uint32_t k0, uint32_t k1, int rounds = 10) {
  for (int r = 0; r < rounds; ++r) {
    if (r > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c.v[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = Words4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
  }
  return c;
}

// Where one random op's draws come from: the job's seed, the 1-based step
// (below 2^32) and the node's id (NodeId of its name).
struct StreamKey {
  uint64_t seed = 0;
  uint32_t step = 0;
  uint32_t node = 0;
};

// Block b of the stream: words 4b .. 4b+3.
FXDP_HOST_DEVICE inline Words4 Block(const StreamKey& k, uint64_t b) {
  const Words4 c{{static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), k.node, k.step}};
  return Philox4x32(c, static_cast<uint32_t>(k.seed), static_cast<uint32_t>(k.seed >> 32));
}

// Blocks b0 .. b0+kLanes-1 into out[0 .. 4*kLanes), lanes innermost so that
// the compiler can run the lanes' rounds side by side (SIMD or not).
constexpr int kLanes = 8;
FXDP_HOST_DEVICE inline void Blocks(const StreamKey& k, uint64_t b0, uint32_t* out) {
  uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    const uint64_t b = b0 + static_cast<uint64_t>(l);
    c0[l] = static_cast<uint32_t>(b);
    c1[l] = static_cast<uint32_t>(b >> 32);
    c2[l] = k.node;
    c3[l] = k.step;
  }
  uint32_t k0 = static_cast<uint32_t>(k.seed), k1 = static_cast<uint32_t>(k.seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    for (int l = 0; l < kLanes; ++l) {
      const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0[l];
      const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2[l];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[l] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[l] ^ k1;
      c1[l] = static_cast<uint32_t>(p1);
      c3[l] = static_cast<uint32_t>(p0);
      c0[l] = n0;
      c2[l] = n2;
    }
  }
  for (int l = 0; l < kLanes; ++l) {
    out[4 * l] = c0[l];
    out[4 * l + 1] = c1[l];
    out[4 * l + 2] = c2[l];
    out[4 * l + 3] = c3[l];
  }
}

// Words first .. first+n-1 of the stream into out[0..n).
FXDP_HOST_DEVICE inline void Words(const StreamKey& k, uint64_t first, int64_t n, uint32_t* out) {
  int64_t j = 0;
  // Up to a block boundary, then kLanes blocks at a time, then the rest.
  while (j < n && (first + static_cast<uint64_t>(j)) % 4 != 0) {
    const uint64_t w = first + static_cast<uint64_t>(j);
    out[j++] = Block(k, w / 4).v[w % 4];
  }
  for (; j + 4 * kLanes <= n; j += 4 * kLanes)
    Blocks(k, (first + static_cast<uint64_t>(j)) / 4, out + j);
  for (; j < n;) {
    const uint64_t w = first + static_cast<uint64_t>(j);
    const Words4 x = Block(k, w / 4);
    for (int q = 0; q < 4 && j < n; ++q) out[j++] = x.v[q];
  }
}

// A random node's id: FNV-1a (32 bits) of its name, which the expansion keeps
// ("native_dropout_3"); fxdp.philox.node_id in Python.
FXDP_HOST_DEVICE inline uint32_t NodeId(const char* name, int64_t size) {
  uint32_t h = 2166136261u;
  for (int64_t i = 0; i < size; ++i) {
    h ^= static_cast<uint8_t>(name[i]);
    h *= 16777619u;
  }
  return h;
}

}  // namespace fxdp::philox

#endif  // FXDP_UTIL_PHILOX_H_
