// The size expressions of a symbolic graph (graph.proto: GraphDef.symbols,
// size_exprs, guards; docs/shapes.md): checked once, evaluated once per
// instantiation, printed in errors.
//
// The graph comes from the network, so every cost is bounded before anything
// is evaluated: at most kMaxSymbols symbols, kMaxSizeExprs entries and
// kMaxGuards guards; an entry's operands index EARLIER entries (no cycles) and
// its depth is at most kMaxSizeExprDepth, so evaluation is one pass over the
// table (O(entries + operands)) and printing an entry is bounded by its
// character budget. Arithmetic is checked: an overflow or a zero divisor is an
// error naming the entry and the symbols' values, never a wrapped value.
#ifndef FXDP_ANALYSIS_IR_SIZE_EXPRS_H_
#define FXDP_ANALYSIS_IR_SIZE_EXPRS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/fxdp/v1/graph.pb.h"

namespace fxdp::ir {

inline constexpr int kMaxSymbols = 4096;
inline constexpr int kMaxSizeExprs = 1 << 20;
inline constexpr int kMaxSizeExprDepth = 64;
inline constexpr int kMaxGuards = 1 << 16;
inline constexpr int kMaxSymbolNameBytes = 128;

// Whether the graph has any symbolic part (symbols, size_exprs or guards).
bool HasSymbolicSizes(const v1::GraphDef& def);

// Checks the tables: the limits above, every symbol's input (an INPUT
// placeholder with a tensor output, a dim it has, 0 <= min, max 0 or >= min),
// every entry's op, operand count (CONST and SYMBOL none, NEG one, FLOORDIV
// and MOD two, ADD, MUL, MIN and MAX two or more), operand indices (earlier
// entries), symbol index and depth, and every guard's kind and indices.
// INVALID_ARGUMENT naming the entry and the numbers.
absl::Status CheckSizeExprs(const v1::GraphDef& def);

// Every entry's value given each symbol's (indexed like def.symbols).
// Precondition: CheckSizeExprs(def) is OK. A zero divisor fails, naming the
// entry; with `undefined` given, it marks the entry (and every entry reading
// it) true there instead, so that instantiation checks the guards first.
absl::StatusOr<std::vector<int64_t>> EvaluateSizeExprs(const v1::GraphDef& def,
                                                       const std::vector<int64_t>& symbols,
                                                       std::vector<bool>* undefined = nullptr);

// Entry `index` as text with the symbols' names: "s15*s54", "(s41 + 1)//2",
// "min(s1, 4)"; cut with "..." past about `max_chars`. Precondition:
// CheckSizeExprs(def) is OK.
std::string SizeExprText(const v1::GraphDef& def, uint32_t index, size_t max_chars = 160);

// The symbols entry `index` depends on, ascending. Precondition as above.
std::vector<uint32_t> SizeExprSymbols(const v1::GraphDef& def, uint32_t index);

// "s15 == s41", "s22 + 1 <= 1024": a guard as text.
std::string GuardText(const v1::GraphDef& def, const v1::Guard& guard);
// Whether `lhs KIND rhs` holds.
bool GuardHolds(v1::GuardKind kind, int64_t lhs, int64_t rhs);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_SIZE_EXPRS_H_
