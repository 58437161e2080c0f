// libFuzzer target: serialized GraphDef bytes through the compile pipeline
// the server runs on every Analyze/Expand/Submit (docs/robustness.md).
//
//  1. decode: the direct wire decoder (DecodeGraphWire) against the protobuf
//     path (DecodeGraphBytesViaMessage) as the oracle: both accept with
//     equal graphs or both refuse with the same status (the verifier runs
//     inside both);
//  2. an accepted graph re-encodes and decodes to the same graph;
//  3. analyze (world sizes 2 and 3) and expand (data-parallel rewrite, every
//     distinct rank graph shape-checked by the expansion) must return a
//     status, never crash; every expanded rank graph must encode and decode
//     again (it is what the workers receive).
// A disagreement or a broken invariant aborts (a libFuzzer crash with the
// input saved); ASan/UBSan catch memory errors and undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "analysis/batch_dim.h"
#include "analysis/ir/proto_codec.h"
#include "analysis/ir/wire_decoder.h"
#include "expansion/data_parallel.h"
#include "google/protobuf/stubs/logging.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "graph_fuzzer: %s: %s\n", what, detail.c_str());
  std::abort();
}

void AnalyzeAndExpand(const fxdp::ir::Graph& g, int32_t world) {
  absl::StatusOr<fxdp::BatchDimAnalysis> a =
      fxdp::AnalyzeBatchDims(g, fxdp::AnalyzeOptions{world, /*sync_batchnorm=*/false});
  if (!a.ok()) return;
  fxdp::ExpandOptions opts;
  opts.world_size = world;
  absl::StatusOr<fxdp::Expansion> e = fxdp::ExpandDataParallel(g, *a, opts);
  if (!e.ok()) return;
  if (e->distinct_graphs.empty()) Fail("expand", "no rank graph");
  for (const fxdp::ir::Graph& rank_graph : e->distinct_graphs) {
    const std::string bytes = fxdp::ir::EncodeGraphBytes(rank_graph);
    absl::StatusOr<fxdp::ir::Graph> again = fxdp::ir::DecodeGraphBytes(bytes);
    if (!again.ok()) Fail("expanded graph does not decode", again.status().ToString());
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Mutated inputs often hold invalid UTF-8, which protobuf logs for each.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<fxdp::ir::Graph> want = fxdp::ir::DecodeGraphBytesViaMessage(bytes);
  absl::StatusOr<fxdp::ir::Graph> fast;
  const bool decided = fxdp::ir::DecodeGraphWire(bytes, &fast);
  const absl::StatusOr<fxdp::ir::Graph> got = fxdp::ir::DecodeGraphBytes(bytes);
  if (want.ok()) {
    if (!decided) Fail("decoder mismatch", "valid input refused by the direct decoder");
    if (!fast.ok()) Fail("decoder mismatch", fast.status().ToString());
    if (!(*fast == *want)) Fail("decoder mismatch", "the direct decoder built another graph");
    if (!got.ok() || !(*got == *want)) Fail("decoder mismatch", "DecodeGraphBytes differs");
  } else {
    if (decided && fast.status() != want.status())
      Fail("decoder mismatch", fast.ok() ? "direct decoder accepted" : fast.status().ToString());
    if (got.status() != want.status())
      Fail("decoder mismatch", got.ok() ? "DecodeGraphBytes accepted" : got.status().ToString());
    return 0;
  }
  const std::string encoded = fxdp::ir::EncodeGraphBytes(*want);
  absl::StatusOr<fxdp::ir::Graph> round = fxdp::ir::DecodeGraphBytes(encoded);
  if (!round.ok()) Fail("re-encoded graph does not decode", round.status().ToString());
  if (!(*round == *want)) Fail("round trip", "re-encoded graph differs");
  AnalyzeAndExpand(*want, 2);
  AnalyzeAndExpand(*want, 3);
  return 0;
}
