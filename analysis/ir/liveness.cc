#include "analysis/ir/liveness.h"

#include <algorithm>

namespace fxdp::ir {

Liveness ComputeLiveness(const LivenessProblem& p) {
  const int32_t nsteps = static_cast<int32_t>(p.reads.size());
  constexpr int32_t kBeforeFirst = -1;
  Liveness out;
  out.last_read.assign(p.num_slots, Liveness::kNotRead);
  out.free_after.resize(nsteps);
  out.last_sole_read.resize(nsteps);
  std::vector<int32_t> producer(p.num_slots, kBeforeFirst);
  for (int32_t i = 0; i < nsteps && i < static_cast<int32_t>(p.writes.size()); ++i)
    for (int32_t slot : p.writes[i]) producer[slot] = i;
  for (int32_t i = 0; i < nsteps; ++i)
    for (int32_t slot : p.reads[i]) out.last_read[slot] = i;
  for (int32_t slot : p.returned) out.last_read[slot] = nsteps;
  for (int32_t slot = 0; slot < p.num_slots; ++slot) {
    const int32_t last = out.last_read[slot];
    if (last == nsteps) continue;  // returned: released after the outputs are taken
    const int32_t when = last == Liveness::kNotRead ? producer[slot] : last;
    if (when == kBeforeFirst) {
      out.free_at_start.push_back(slot);
    } else {
      out.free_after[when].push_back(slot);
    }
  }
  for (int32_t i = 0; i < nsteps; ++i) {
    std::vector<int32_t> reads = p.reads[i];
    std::sort(reads.begin(), reads.end());
    for (size_t k = 0; k < reads.size(); ++k) {
      const bool once = (k == 0 || reads[k - 1] != reads[k]) &&
                        (k + 1 == reads.size() || reads[k + 1] != reads[k]);
      if (once && out.last_read[reads[k]] == i) out.last_sole_read[i].push_back(reads[k]);
    }
  }
  return out;
}

}  // namespace fxdp::ir
