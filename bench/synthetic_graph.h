// Synthetic training-step graphs for benchmarks and scale tests.
//
// BuildTransformerStep() writes, node for node, the graph the frontend traces
// for the zoo's TransformerLM (`python -m fxdp.zoo.export`, model
// "transformer", optimizer "sgd": token + positional embedding, pre-LN blocks
// of causal self-attention written with view/permute/bmm and a GELU MLP,
// final LayerNorm, vocab head, mean cross-entropy, its full backward, and
// SGD with momentum, single-tensor), with any number of blocks and any
// sizes. Same ops, same argument layouts, same strides and storage offsets,
// same roles, state names, gradient marks and output specs; only node names
// may differ. With the zoo's sizes and 2 layers it prints like the traced
// transformer_sgd.pb up to node names.
//
//   auto g = BuildSyntheticGraph(100'000);   // ~100k nodes, verified
//   std::string bytes = ir::EncodeGraphBytes(*g);
#ifndef FXDP_BENCH_SYNTHETIC_GRAPH_H_
#define FXDP_BENCH_SYNTHETIC_GRAPH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "analysis/ir/graph.h"

namespace fxdp::bench {

// Sizes of the synthetic TransformerLM. Defaults: GPT-2-small-like widths
// with a short sequence (sizes change no node count, only the numbers in
// shapes and view arguments).
struct TransformerShape {
  int64_t batch = 8;
  int64_t seq = 128;       // T: tokens per sample (input is [batch, seq]).
  int64_t max_seq = 1024;  // rows of the positional embedding, >= seq.
  int64_t d_model = 768;
  int64_t heads = 12;  // divides d_model.
  int64_t ff = 3072;
  int64_t vocab = 50257;

  // The zoo's TransformerLM with its example batch (fxdp/zoo/models.py).
  static TransformerShape Zoo() { return {6, 7, 9, 16, 2, 32, 23}; }
};

// Exact node count of BuildTransformerStep(shape, layers).
int64_t TransformerStepNodeCount(int32_t layers);
// The layer count whose graph is closest to `target_nodes` (at least 1).
int32_t LayersForNodeCount(int64_t target_nodes);

// The traced training step of a `layers`-block TransformerLM, verified.
// INVALID_ARGUMENT for layers < 1 or inconsistent sizes.
absl::StatusOr<ir::Graph> BuildTransformerStep(const TransformerShape& shape, int32_t layers);

// A graph of about `target_nodes` nodes (73 + 189 per layer, so within 95):
// BuildTransformerStep with LayersForNodeCount(target_nodes) layers.
absl::StatusOr<ir::Graph> BuildSyntheticGraph(int64_t target_nodes,
                                              const TransformerShape& shape = {});

// The same graph as serialized GraphDef bytes (ir::EncodeGraphBytes).
absl::StatusOr<std::string> BuildSyntheticGraphBytes(int64_t target_nodes,
                                                     const TransformerShape& shape = {});

}  // namespace fxdp::bench

#endif  // FXDP_BENCH_SYNTHETIC_GRAPH_H_
