// The random ops fxdp draws itself (docs/randomness.md): one table, read by
// the analysis (a random op outside it is refused), the executor (its kernels,
// executor/random_ops.h) and, through tests/testdata/random_ops.txt, by
// run_local's copy (client/python/fxdp/random_ops.py).
//
// Every random value comes from fxdp's Philox stream (util/philox.h) keyed by
// (seed, step, node id, GLOBAL element index), so rank r draws exactly its
// slice of what one device draws for the whole batch. The graph says where
// the batch lies in each random node's output: the expansion writes
// kRandomLayoutKey (RandomLayout lines) and kBatchSizeKey; a node it does not
// list is replicated (every rank draws the whole tensor, the same values).
#ifndef FXDP_ANALYSIS_IR_RANDOM_OPS_H_
#define FXDP_ANALYSIS_IR_RANDOM_OPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "analysis/ir/graph.h"

namespace fxdp::ir {

// What an op draws, per element (u: a uniform draw, k words of the stream).
enum class RandomKind : int8_t {
  kBernoulli,       // 1 with probability p (a float argument), else 0; 1 word.
  kBernoulliProbs,  // 1 with probability self[i]; 1 word.
  kDropout,         // native_dropout: (input * mask * 1/(1-p), mask), mask kept w.p. 1-p; 1 word.
  kUniform,         // u in [0, 1), or [from, to); 1 word (float64: 2).
  kNormal,          // Box-Muller from 2 words, times std plus mean.
  kRandint,         // low + word % (high - low), high - low <= 2^32; 1 word.
  kExponential,     // -log(u) / lambd, u in (0, 1]; 1 word.
};

struct RandomOp {
  absl::string_view name;      // "aten::bernoulli"
  absl::string_view overload;  // exact overload ("" the default)
  RandomKind kind;
  // Schema argument names the kind reads, in its order (space separated):
  // kBernoulli "p", kDropout "input p train", kUniform "" or "from to",
  // kNormal "" or "mean std", kRandint "high" or "low high", kExponential "lambd",
  // kBernoulliProbs "self".
  absl::string_view params;
};

// The table, sorted by (name, overload).
absl::Span<const RandomOp> RandomOps();
// nullptr for an op fxdp does not draw itself.
const RandomOp* FindRandomOp(const Target& target);
absl::string_view RandomKindName(RandomKind kind);
// Stream words per element of an output of `dtype`.
int WordsPerElement(RandomKind kind, DType dtype);
// One line per row: "aten::bernoulli.p bernoulli p" (tests/testdata/random_ops.txt).
std::string RandomOpsText();

// Graph metadata keys (decimal values).
inline constexpr absl::string_view kSeedKey = "fxdp.seed";
inline constexpr absl::string_view kRandomLayoutKey = "fxdp.random";
inline constexpr absl::string_view kBatchSizeKey = "fxdp.batch_size";
// The job steps done before a resumed job's first batch: its workers count
// steps from 1 again, so the key's step is this offset plus theirs (the
// server adds it to a resumed job's rank graphs; absent: 0).
inline constexpr absl::string_view kStepOffsetKey = "fxdp.step_offset";

// A random node whose output holds the batch along `dim`: the global extent
// of that dim is `global_extent` = outer * B * rows (analysis/batch_dim.h's
// ValueInfo::outer), and rank r holds, in each of the `outer` blocks, the
// rows of its samples [start_r, start_r + B_r).
struct RandomLayout {
  std::string node;
  int32_t dim = -1;
  int64_t outer = 1;
  int64_t global_extent = 0;
  bool operator==(const RandomLayout& o) const {
    return node == o.node && dim == o.dim && outer == o.outer && global_extent == o.global_extent;
  }
};

// "NODE DIM OUTER GLOBAL_EXTENT" lines.
std::string FormatRandomLayouts(const std::vector<RandomLayout>& layouts);
// INVALID_ARGUMENT naming the line that is not one.
absl::StatusOr<std::vector<RandomLayout>> ParseRandomLayouts(absl::string_view text);
// The metadata value `key` of `graph` as an unsigned decimal; nullopt-like
// `fallback` when absent; INVALID_ARGUMENT naming the key for anything else.
absl::StatusOr<uint64_t> MetadataNumber(const Graph& graph, absl::string_view key,
                                        uint64_t fallback);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_RANDOM_OPS_H_
