#include "analysis/ir/verifier.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "analysis/ir/node_error.h"
#include "util/status_macros.h"

namespace fxdp::ir {
namespace {

// A graph being verified may repeat names or lack targets: nodes are named
// by their position (the one node label format, node_error.h).
std::string Where(const std::vector<Node>& nodes, int i) {
  std::string s = NodeLabel(nodes[i].name, absl::StrCat("#", i));
  if (!nodes[i].source.empty()) absl::StrAppend(&s, " [", nodes[i].source, "]");
  return s;
}

absl::Status NodeError(const std::vector<Node>& nodes, int i, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(Where(nodes, i), ": ", msg));
}

// Checks every reference inside `arg` (argument `label` of node i).
absl::Status VerifyArgument(const std::vector<Node>& nodes, int i, const Argument& arg,
                            const std::string& label, int depth) {
  if (depth > kMaxListDepth)
    return NodeError(nodes, i, absl::StrCat(label, ": lists nested deeper than ", kMaxListDepth));
  if (const auto* r = arg.get_if<ValueRef>()) {
    const int src = r->node.value;
    if (src < 0 || src >= static_cast<int>(nodes.size()))
      return NodeError(nodes, i,
                       absl::StrCat(label, " references node #", src, ", which does not exist (",
                                    nodes.size(), " nodes)"));
    if (src >= i)
      return NodeError(nodes, i,
                       absl::StrCat(label, " references ", Where(nodes, src),
                                    ", which is not defined before it (nodes must be in "
                                    "topological order; a cycle or forward reference)"));
    if (r->output < 0 || r->output >= static_cast<int>(nodes[src].outputs.size()))
      return NodeError(
          nodes, i,
          absl::StrCat(label, " references output ", r->output, " of node '", nodes[src].name,
                       "', which has ", nodes[src].outputs.size(), " output(s)"));
  } else if (const auto* l = arg.get_if<Argument::List>()) {
    for (size_t k = 0; k < l->size(); ++k)
      FXDP_RETURN_IF_ERROR(
          VerifyArgument(nodes, i, (*l)[k], absl::StrCat(label, "[", k, "]"), depth + 1));
  }
  return absl::OkStatus();
}

// The same checks as VerifyArgument without building labels: the common
// case (a valid argument) costs no allocation.
bool ArgumentOk(const std::vector<Node>& nodes, int i, const Argument& arg, int depth) {
  if (depth > kMaxListDepth) return false;
  if (const auto* r = arg.get_if<ValueRef>()) {
    const int src = r->node.value;
    return src >= 0 && src < i && r->output >= 0 &&
           r->output < static_cast<int>(nodes[src].outputs.size());
  }
  if (const auto* l = arg.get_if<Argument::List>()) {
    for (const Argument& a : *l) {
      if (!ArgumentOk(nodes, i, a, depth + 1)) return false;
    }
  }
  return true;
}

absl::Status VerifyOutputs(const std::vector<Node>& nodes, int i) {
  const Node& n = nodes[i];
  for (size_t k = 0; k < n.outputs.size(); ++k) {
    const ValueType& v = n.outputs[k];
    if (!v.is_tensor()) continue;
    absl::Status s = ValidateTensorType(v.tensor);
    if (!s.ok()) return NodeError(nodes, i, absl::StrCat("output ", k, ": ", s.message()));
  }
  return absl::OkStatus();
}

// A placeholder: no arguments, one tensor, a state name; a batch dim only on
// an INPUT (and in range); a HYPERPARAMETER is a 0-d floating tensor.
absl::Status VerifyPlaceholder(const std::vector<Node>& nodes, int i) {
  const Node& n = nodes[i];
  if (!n.args.empty() || !n.kwargs.empty())
    return NodeError(nodes, i, "a placeholder takes no arguments");
  if (n.outputs.size() != 1 || !n.outputs[0].is_tensor())
    return NodeError(
        nodes, i,
        absl::StrCat("a placeholder must produce exactly one tensor, got ", n.outputs.size(),
                     " output(s)", n.outputs.size() == 1 ? " of kind " : "",
                     n.outputs.size() == 1 ? n.outputs[0].ToString() : ""));
  const PlaceholderSpec& p = n.placeholder;
  if (p.state_name.empty())
    return NodeError(
        nodes, i,
        absl::StrCat("placeholder with role ", PlaceholderRoleName(p.role), " has no state name"));
  const int64_t rank = n.outputs[0].tensor.rank();
  if (p.role == PlaceholderRole::kInput) {
    if (p.batch_dim < -1 || p.batch_dim >= rank)
      return NodeError(nodes, i,
                       absl::StrCat("batch_dim ", p.batch_dim, " is out of range for a rank-", rank,
                                    " input (expected -1 or 0..", rank - 1, ")"));
  } else if (p.batch_dim != 0) {
    return NodeError(
        nodes, i,
        absl::StrCat("batch_dim ", p.batch_dim, " set on a ", PlaceholderRoleName(p.role),
                     " placeholder; only INPUT placeholders have a batch dim"));
  }
  if (p.role == PlaceholderRole::kHyperparameter) {
    const TensorType& t = n.outputs[0].tensor;
    if (rank != 0)
      return NodeError(
          nodes, i,
          absl::StrCat("HYPERPARAMETER placeholder '", p.state_name,
                       "' must be a 0-d tensor (one value per step), got ", t.ToString()));
    if (!DTypeIsFloatingPoint(t.dtype))
      return NodeError(nodes, i,
                       absl::StrCat("HYPERPARAMETER placeholder '", p.state_name,
                                    "' must have a floating dtype, got ", t.ToString()));
  }
  return absl::OkStatus();
}

// A call: output metadata, a schema name ("aten::addmm") or an
// operator.getitem(ref, int) whose output is the element it extracts.
absl::Status VerifyCall(const std::vector<Node>& nodes, int i) {
  const Node& n = nodes[i];
  if (n.outputs.empty())
    return NodeError(nodes, i,
                     absl::StrCat("call to ", n.target.ToString(), " has no output metadata"));
  if (n.is_getitem()) {
    const ValueRef* src = n.args.size() == 2 ? n.args[0].get_if<ValueRef>() : nullptr;
    const int64_t* idx = n.args.size() == 2 ? n.args[1].get_if<int64_t>() : nullptr;
    if (src == nullptr || idx == nullptr || !n.kwargs.empty())
      return NodeError(nodes, i, "operator.getitem expects (ref, int) arguments");
    if (*idx != src->output)
      return NodeError(nodes, i,
                       absl::StrCat("operator.getitem index ", *idx,
                                    " does not match the referenced output ", src->output));
    if (n.outputs.size() != 1 || !(n.outputs[0] == nodes[src->node.value].outputs[src->output]))
      return NodeError(nodes, i,
                       absl::StrCat("operator.getitem output type ",
                                    n.outputs.empty() ? "<none>" : n.outputs[0].ToString(),
                                    " differs from the element it extracts (",
                                    nodes[src->node.value].outputs[src->output].ToString(), ")"));
  } else if (n.target.name.find("::") == std::string::npos) {
    return NodeError(nodes, i,
                     absl::StrCat("target '", n.target.name,
                                  "' is not a schema name (expected "
                                  "'namespace::op', e.g. 'aten::addmm')"));
  }
  return absl::OkStatus();
}

absl::Status VerifyNode(const std::vector<Node>& nodes, int i) {
  const Node& n = nodes[i];
  if (n.name.empty()) return absl::InvalidArgumentError(absl::StrCat("node #", i, " has no name"));
  if (n.args.size() + n.kwargs.size() > static_cast<size_t>(kMaxArgsPerNode))
    return NodeError(nodes, i,
                     absl::StrCat("has ", n.args.size() + n.kwargs.size(),
                                  " arguments, more than the limit ", kMaxArgsPerNode));
  if (n.target.name.empty()) return NodeError(nodes, i, "target name is empty");
  if (n.kind != NodeKind::kPlaceholder && !n.placeholder.state_name.empty())
    return NodeError(
        nodes, i, absl::StrCat("is a ", NodeKindName(n.kind), " but carries a placeholder spec"));
  if (n.kind != NodeKind::kOutput && !n.output_specs.empty())
    return NodeError(nodes, i,
                     absl::StrCat("is a ", NodeKindName(n.kind), " but carries output roles"));
  for (size_t k = 0; k < n.args.size(); ++k) {
    if (ArgumentOk(nodes, i, n.args[k], 0)) continue;
    FXDP_RETURN_IF_ERROR(VerifyArgument(nodes, i, n.args[k], absl::StrCat("argument ", k), 0));
  }
  for (const KeywordArgument& kw : n.kwargs) {
    if (kw.name.empty()) return NodeError(nodes, i, "keyword argument with an empty name");
    if (ArgumentOk(nodes, i, kw.value, 0)) continue;
    FXDP_RETURN_IF_ERROR(
        VerifyArgument(nodes, i, kw.value, absl::StrCat("keyword argument '", kw.name, "'"), 0));
  }
  FXDP_RETURN_IF_ERROR(VerifyOutputs(nodes, i));

  switch (n.kind) {
    case NodeKind::kPlaceholder: FXDP_RETURN_IF_ERROR(VerifyPlaceholder(nodes, i)); break;
    case NodeKind::kGetAttr:
      if (!n.args.empty() || !n.kwargs.empty())
        return NodeError(nodes, i, "get_attr takes no arguments");
      if (n.outputs.size() != 1 || !n.outputs[0].is_tensor())
        return NodeError(nodes, i, "get_attr must produce exactly one tensor");
      break;
    case NodeKind::kCallFunction: FXDP_RETURN_IF_ERROR(VerifyCall(nodes, i)); break;
    case NodeKind::kOutput:
      if (i != static_cast<int>(nodes.size()) - 1)
        return NodeError(nodes, i, "the output node must be the last node");
      if (!n.outputs.empty()) return NodeError(nodes, i, "the output node produces no values");
      break;
  }
  if (!n.grad_of.empty() &&
      !(n.kind == NodeKind::kCallFunction && !n.outputs.empty() && n.outputs[0].is_tensor()))
    return NodeError(nodes, i, "grad_of is set but the node does not produce a tensor");
  return absl::OkStatus();
}

// Graph-level role checks: state names, output specs, gradient marks.
using StateNodes = absl::flat_hash_map<std::string, int>;  // state_name -> node index

// Every placeholder's state name once.
absl::Status CollectStateNames(const std::vector<Node>& nodes, StateNodes* state_out) {
  StateNodes& state = *state_out;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    if (!nodes[i].is_placeholder()) continue;
    auto [it, inserted] = state.emplace(nodes[i].placeholder.state_name, i);
    if (!inserted)
      return NodeError(nodes, i,
                       absl::StrCat("state name '", nodes[i].placeholder.state_name,
                                    "' is already used by ", Where(nodes, it->second)));
  }
  return absl::OkStatus();
}

// The output node: one list, a role per value; one LOSS of one element; each
// updated state names a placeholder of the matching role, has its type and is
// updated once.
absl::Status VerifyOutputRoles(const std::vector<Node>& nodes, const StateNodes& state) {
  const int out = static_cast<int>(nodes.size()) - 1;
  const Node& o = nodes[out];
  const Argument::List* returned =
      o.args.size() == 1 ? o.args[0].get_if<Argument::List>() : nullptr;
  if (returned == nullptr || !o.kwargs.empty())
    return NodeError(nodes, out, "the output node must take exactly one list argument");
  if (o.output_specs.size() != returned->size())
    return NodeError(nodes, out,
                     absl::StrCat("has ", o.output_specs.size(), " output roles for ",
                                  returned->size(), " returned values"));
  absl::flat_hash_set<std::string> updated;
  int losses = 0;
  for (size_t k = 0; k < returned->size(); ++k) {
    const OutputSpec& spec = o.output_specs[k];
    const ValueRef* r = (*returned)[k].get_if<ValueRef>();
    const std::string label = absl::StrCat("returned value ", k, " (", OutputRoleName(spec.role),
                                           spec.state_name.empty() ? "" : " '", spec.state_name,
                                           spec.state_name.empty() ? "" : "'", ")");
    if (spec.role == OutputRole::kOther) continue;
    if (r == nullptr || !nodes[r->node.value].outputs[r->output].is_tensor())
      return NodeError(nodes, out, absl::StrCat(label, ": expected a tensor"));
    const TensorType& t = nodes[r->node.value].outputs[r->output].tensor;
    if (spec.role == OutputRole::kLoss) {
      if (!spec.state_name.empty())
        return NodeError(nodes, out, absl::StrCat(label, ": a LOSS output has no state name"));
      if (++losses > 1) return NodeError(nodes, out, absl::StrCat(label, ": a second LOSS output"));
      if (t.numel() != 1)
        return NodeError(
            nodes, out,
            absl::StrCat(label, ": the loss must have one element, got ", t.ToString()));
      continue;
    }
    auto it = state.find(spec.state_name);
    if (it == state.end())
      return NodeError(nodes, out, absl::StrCat(label, ": no placeholder has that state name"));
    const Node& p = nodes[it->second];
    if (p.placeholder.role == PlaceholderRole::kHyperparameter)
      return NodeError(nodes, out,
                       absl::StrCat(label, ": '", p.name, "' is a HYPERPARAMETER placeholder, ",
                                    "which the step never updates (a schedule feeds it)"));
    if (UpdatedRole(spec.role) != p.placeholder.role)
      return NodeError(nodes, out,
                       absl::StrCat(label, ": expected a placeholder of role ",
                                    PlaceholderRoleName(*UpdatedRole(spec.role)), ", but '", p.name,
                                    "' is ", PlaceholderRoleName(p.placeholder.role)));
    const TensorType& pt = p.outputs[0].tensor;
    if (t.shape != pt.shape || t.dtype != pt.dtype)
      return NodeError(nodes, out,
                       absl::StrCat(label, ": type ", t.ToString(), " differs from the state it ",
                                    "replaces (", pt.ToString(), ")"));
    if (!updated.insert(spec.state_name).second)
      return NodeError(nodes, out, absl::StrCat(label, ": that state is updated twice"));
  }
  return absl::OkStatus();
}

// grad_of names a parameter, once, with the parameter's shape.
absl::Status VerifyGradients(const std::vector<Node>& nodes, const StateNodes& state) {
  absl::flat_hash_map<std::string, int> grads;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    const std::string& g = nodes[i].grad_of;
    if (g.empty()) continue;
    auto it = state.find(g);
    if (it == state.end() || nodes[it->second].placeholder.role != PlaceholderRole::kParameter)
      return NodeError(nodes, i, absl::StrCat("grad_of names '", g, "', which is not a parameter"));
    auto [prev, inserted] = grads.emplace(g, i);
    if (!inserted)
      return NodeError(nodes, i,
                       absl::StrCat("a second gradient for parameter '", g, "' (the first is ",
                                    Where(nodes, prev->second), ")"));
    const TensorType& pt = nodes[it->second].outputs[0].tensor;
    const TensorType& gt = nodes[i].outputs[0].tensor;
    if (gt.shape != pt.shape)
      return NodeError(nodes, i,
                       absl::StrCat("gradient of '", g, "' has type ", gt.ToString(),
                                    ", expected the parameter's shape (", pt.ToString(), ")"));
  }
  return absl::OkStatus();
}

absl::Status VerifyRoles(const std::vector<Node>& nodes) {
  StateNodes state;
  FXDP_RETURN_IF_ERROR(CollectStateNames(nodes, &state));
  FXDP_RETURN_IF_ERROR(VerifyOutputRoles(nodes, state));
  return VerifyGradients(nodes, state);
}

}  // namespace

absl::Status VerifyGraph(const GraphHeader& header, const std::vector<Node>& nodes,
                         absl::flat_hash_map<absl::string_view, NodeId>* name_index) {
  if (header.format_version != kFormatVersion)
    return absl::InvalidArgumentError(absl::StrCat("unsupported format_version ",
                                                   header.format_version, " (this build reads ",
                                                   kFormatVersion, ")"));
  if (static_cast<int64_t>(nodes.size()) > kMaxNodes)
    return absl::InvalidArgumentError(
        absl::StrCat("graph has ", nodes.size(), " nodes, more than the limit ", kMaxNodes));
  if (nodes.empty() || !nodes.back().is_output())
    return absl::InvalidArgumentError("graph has no output node (the last node must be OUTPUT)");
  absl::flat_hash_map<absl::string_view, NodeId> local;
  absl::flat_hash_map<absl::string_view, NodeId>& names = name_index ? *name_index : local;
  names.clear();
  names.reserve(nodes.size());
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    FXDP_RETURN_IF_ERROR(VerifyNode(nodes, i));
    auto [it, inserted] = names.emplace(nodes[i].name, NodeId{i});
    if (!inserted)
      return NodeError(nodes, i,
                       absl::StrCat("duplicate node name (also node #", it->second.value, ")"));
  }
  return VerifyRoles(nodes);
}

}  // namespace fxdp::ir
