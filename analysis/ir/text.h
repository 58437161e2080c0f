// The text form of a graph: one line per node with op, arguments and output
// types. PrintGraph(ParseGraphText(s), true) == s for every printed graph, so
// hand-written graphs in tests/testdata/ are real, verified graphs.
//
//   graph format=1 producer="fxdp-python 0.1.0" torch="2.13.0+cpu" {
//     meta "model" = "MLP"
//     %x: f32[12, 8] = placeholder() {role=INPUT, state="input.0", batch_dim=0}
//     %w: f32[16, 8] rg = placeholder() {role=PARAMETER, state="fc.weight"}
//     %t: f32[8, 16]{1, 8} = aten::t(%w)
//     %mm: f32[12, 16] = aten::mm(%x, %t)
//     %bn: (f32[12], f32[0], none) = aten::some_op(%mm, [0, 1], eps=1e-05)
//     %g: f32[12] = operator.getitem(%bn#0, 0)
//     %output = output([%w, %s]) {specs=[UPDATED_PARAMETER "fc.weight", LOSS]}
//   }
//
// Types: dtype[sizes], then {strides} when not contiguous, +offset when
// non-zero, @device when not plain cpu, " rg" when requires_grad; `none`,
// `int`, `float`, `bool` for non-tensor outputs; a tuple in parentheses for
// any count but one. Arguments: %name (output 0) or %name#k, ints, floats
// (always with '.', 'e', inf or nan), true/false, "strings", None,
// torch.float32 / torch.strided / torch.contiguous_format, device(cuda:0),
// scalar(...), complex(re, im) inside scalar, [lists], key=value kwargs.
#ifndef FXDP_ANALYSIS_IR_TEXT_H_
#define FXDP_ANALYSIS_IR_TEXT_H_

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "analysis/ir/graph.h"

namespace fxdp::ir {

// `with_source`: also each node's source line (source="..."), which traced
// graphs carry; left out by default so that printed graphs (the goldens) do
// not change with the user's line numbers. The parser reads it either way.
std::string PrintGraph(const Graph& g, bool with_source = false);
// One node's line, without indentation or newline.
std::string PrintNode(const Graph& g, NodeId id, bool with_source = false);
std::string PrintArgument(const Graph& g, const Argument& a);

// Parses the text form; errors name the line and column. The result is
// verified like any other graph.
absl::StatusOr<Graph> ParseGraphText(absl::string_view text);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_TEXT_H_
