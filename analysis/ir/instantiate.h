// Instantiation (docs/shapes.md, build plan step 3): a graph traced once with
// symbolic batch and sequence sizes (size_exprs.h), at one batch's input
// shapes, becomes the static graph that the verifier, the analysis, the
// expansion and the executor take as they are.
//
// For a symbolic graph (HasSymbolicSizes):
//   1. CheckSizeExprs, and every size expression index of every node checked
//      (a TensorMeta's shape_expr/stride_expr as long as its shape/stride or
//      empty, an Argument's size_expr on an int only); a placeholder other than
//      an INPUT may not have one: the state never changes shape;
//   2. each symbol takes its dim of its input's shape, within its [min, max];
//   3. every INPUT's shape is checked: its rank, its static dims, and every
//      symbolic dim against its expression (an INPUT whose dims are all static
//      may be left out of `shapes`; one with a symbolic dim may not);
//   4. every guard must hold;
//   5. shapes, strides, storage offsets and size arguments take their values,
//      and the symbolic fields go; the verifier then checks the graph.
// A static graph passes through unchanged (what DecodeGraph gives); `shapes`
// may still name its inputs, and each must then be the graph's shape.
// Errors are INVALID_ARGUMENT naming the input and the shapes, the guard and
// the user's line it came from, and what to do (pad, drop_last, re-trace).
// Cost: one pass over the graph and one over the expression table.
#ifndef FXDP_ANALYSIS_IR_INSTANTIATE_H_
#define FXDP_ANALYSIS_IR_INSTANTIATE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "analysis/ir/graph.h"
#include "proto/fxdp/v1/graph.pb.h"

namespace fxdp::ir {

// Each batch input's shape by state name: {"input_ids", {8, 60}}.
using InputShapes = std::map<std::string, std::vector<int64_t>>;

// Adds "NAME=8x60" to *shapes ("NAME=" for a 0-d input); INVALID_ARGUMENT
// naming the text when it is malformed or names an input twice.
absl::Status ParseInputShape(absl::string_view text, InputShapes* shapes);
// "input_ids=8x60, labels=8x60" ("" when empty); `sep` between inputs (a
// job's JobEvent.shape: "input_ids=8x60 labels=8x60").
std::string InputShapesText(const InputShapes& shapes, absl::string_view sep = ", ");
// The shapes of a static graph's INPUT tensor placeholders.
InputShapes InputShapesOf(const Graph& graph);

// A rank graph's metadata key for the global batch's input shapes it was
// expanded for (InputShapesText of the single-device graph's INPUTs; the
// expansion writes it): `fxdp-worker run` picks, for each step's data, the
// graph expanded for that data's shapes.
inline constexpr absl::string_view kInputShapesKey = "fxdp.input_shapes";

absl::StatusOr<v1::GraphDef> InstantiateDef(const v1::GraphDef& def, const InputShapes& shapes);
absl::StatusOr<Graph> Instantiate(const v1::GraphDef& def, const InputShapes& shapes);
// From serialized bytes (a file, a request): a static graph takes the direct
// decoder (DecodeGraphBytes), a symbolic one is parsed and instantiated.
absl::StatusOr<Graph> InstantiateBytes(absl::string_view bytes, const InputShapes& shapes);
// ReadFileBytes + InstantiateBytes; errors prefixed with the path.
absl::StatusOr<Graph> ReadGraphFileAt(const std::string& path, const InputShapes& shapes);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_INSTANTIATE_H_
