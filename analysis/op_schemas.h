// The op schemas fxdp knows: every aten and _c10d_functional operator that
// LibTorch 2.13 (the torch fxdp-worker runs) registers in C++, compiled in from
// analysis/op_schemas.inc, which scripts/gen_op_schemas.py generates from the
// installed torch (tests/python/test_op_schemas.py checks it is current). The
// server and CLI stay free of LibTorch and still refuse, at compile time, a
// graph the workers could not run.
//
//   FXDP_RETURN_IF_ERROR(CheckOpSchemas(graph));  // INVALID_ARGUMENT naming node and op
#ifndef FXDP_ANALYSIS_OP_SCHEMAS_H_
#define FXDP_ANALYSIS_OP_SCHEMAS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "analysis/ir/graph.h"

namespace fxdp {

struct OpSchemaArg {
  absl::string_view name;
  bool kwarg_only = false;
  bool has_default = false;
};

struct OpSchema {
  absl::string_view name;      // "aten::add"
  absl::string_view overload;  // "Tensor", "" for the default
  std::vector<OpSchemaArg> args;
  int num_positional = 0;  // arguments before the keyword-only ones
  uint64_t required = 0;   // bit i: argument i has no default (schemas have < 64 arguments)
  // "aten::add.out(self, other, *, alpha=, out)"
  std::string ToString() const;
};

// The torch version the table was generated from ("2.13.0").
absl::string_view OpSchemaTorchVersion();
// Number of schemas in the table.
int NumOpSchemas();
// The schema of `name`.`overload`, or nullptr.
const OpSchema* FindOpSchema(absl::string_view name, absl::string_view overload);

// Checks every call node (operator.getitem aside) against the table: the op
// exists (namespace, name, overload), no more positional arguments than the
// schema has, every keyword names one of its arguments and is not also given
// positionally, every argument without a default is given. INVALID_ARGUMENT
// naming the node, the op and what does not fit (with the graph's torch
// version when the op is unknown).
absl::Status CheckOpSchemas(const ir::Graph& graph);

}  // namespace fxdp

#endif  // FXDP_ANALYSIS_OP_SCHEMAS_H_
