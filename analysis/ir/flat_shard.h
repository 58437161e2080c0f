// FULLY_SHARD's layout of one state tensor over N ranks: per-tensor flat
// shards (FSDP2's per-parameter sharding).
//
// A sharded tensor X with n elements: s = ceil(n / N); the padded flat tensor
// P = X.flatten() ++ zeros(N*s - n); rank r holds P[r*s : (r+1)*s], a 1-D
// tensor of shape [s] and X's dtype. The padding stays zero through every
// step (the rewrite's elementwise optimizer keeps 0 -> 0; expansion/
// fully_shard.h). The one copy of this arithmetic: the expansion, the server's
// split/reassembly, `fxdp-worker run` and the tests all use FlatShardOf.
//
// Torch-free and header-only, beside the IR so that every layer may include
// it (the executor depends on the IR only: docs/architecture.md, Layering).
#ifndef FXDP_ANALYSIS_IR_FLAT_SHARD_H_
#define FXDP_ANALYSIS_IR_FLAT_SHARD_H_

#include <algorithm>
#include <cstdint>

namespace fxdp::ir {

struct FlatShard {
  int64_t shard_numel = 0;  // s = ceil(n / N): every rank's shard has this many elements.
  int64_t begin = 0;        // the real elements of X.flatten() rank r holds: [begin, end);
  int64_t end = 0;          // shard positions [end - begin, s) are padding (zeros).
  int64_t real() const { return end - begin; }
};

// Rank `rank`'s shard of a tensor of `numel` elements over `world` ranks.
// Requires world >= 1, 0 <= rank < world, numel >= 0.
inline FlatShard FlatShardOf(int64_t numel, int32_t world, int32_t rank) {
  FlatShard f;
  f.shard_numel = world <= 0 ? numel : (numel + world - 1) / world;
  f.begin = std::min<int64_t>(numel, f.shard_numel * rank);
  f.end = std::min<int64_t>(numel, f.shard_numel * (rank + 1));
  return f;
}

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_FLAT_SHARD_H_
