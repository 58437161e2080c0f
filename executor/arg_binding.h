// Argument binding: how the interpreter turns a call node's arguments into
// the values its op's schema takes. Positional arguments by position, kwargs
// by schema argument name, the rest from the schema's defaults; references
// become value slots read at run time, constants are converted to a
// c10::IValue once (numbers for Tensor arguments become wrapped-number
// tensors; device arguments of the traced device type become the program's
// device). Errors name the node, the argument, the expected type and what
// the graph gives.
#ifndef FXDP_EXECUTOR_ARG_BINDING_H_
#define FXDP_EXECUTOR_ARG_BINDING_H_

#include <ATen/core/function_schema.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/ir/graph.h"
#include "executor/program_impl.h"

namespace fxdp::executor {

// "a reference to %x (f32[2, 3])", "int 3", "None", "list [1, 2]": an
// argument as error messages name it.
std::string DescribeArgument(const ir::Graph& g, const ir::Argument& a);

class ArgBinder {
 public:
  // slot_of[node][k]: the value slot of output k of every node before the
  // ones bound. `device`: the program's device; every device argument of
  // the graph is replaced by it (MapDevice).
  ArgBinder(const ir::Graph& g, const std::vector<std::vector<int32_t>>& slot_of,
            c10::Device device)
      : g_(g), slot_of_(slot_of), device_(device) {}

  // One plan per schema argument of `n`'s op, in schema order.
  absl::StatusOr<std::vector<ArgPlan>> BindCall(const ir::Node& n,
                                                const c10::FunctionSchema& schema);

 private:
  // A bound value: a slot read at run time (slot >= 0), a constant (-1), or
  // a list holding slots (-2; its plan is in pending_list_).
  struct Bound {
    int32_t slot = -1;
    c10::IValue value;
  };

  int32_t Slot(const ir::ValueRef& r) const { return slot_of_[r.node.value][r.output]; }
  c10::Device MapDevice(const ir::Device& d) const;
  absl::Status Mismatch(const ir::Node& n, const std::string& where, const c10::TypePtr& type,
                        const ir::Argument& a) const;
  absl::StatusOr<ArgPlan> PlanArg(const ir::Node& n, const c10::Argument& sa,
                                  const ir::Argument& a);
  // `fake` is the type the boxed calling convention uses (int for
  // SymInt/ScalarType/...), `real` the declared one.
  absl::StatusOr<Bound> Bind(const ir::Node& n, const std::string& where, const ir::Argument& a,
                             const c10::TypePtr& fake, const c10::TypePtr& real,
                             std::optional<int32_t> list_n);
  absl::StatusOr<Bound> BoundList(const c10::TypePtr& elem_type, std::vector<Bound> elems);

  const ir::Graph& g_;
  const std::vector<std::vector<int32_t>>& slot_of_;
  c10::Device device_;
  ArgPlan pending_list_;
};

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_ARG_BINDING_H_
