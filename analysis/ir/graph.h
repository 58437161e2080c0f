// The fxdp graph IR: an immutable, topologically ordered list of nodes.
//
// A Graph is built once (by decoding a GraphDef, parsing the text form, or a
// GraphBuilder) and verified on construction; passes that rewrite a graph
// build a new one. Node ids are indices into nodes(); an argument refers to
// an earlier node's output by ValueRef. Use-def is computed on demand
// (ComputeUses), never stored in the graph.
#ifndef FXDP_ANALYSIS_IR_GRAPH_H_
#define FXDP_ANALYSIS_IR_GRAPH_H_

#include <complex>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "analysis/ir/types.h"

namespace fxdp::ir {

// A typed node index. Ids are dense: 0 .. graph.size()-1.
struct NodeId {
  int32_t value = -1;
  bool valid() const { return value >= 0; }
  bool operator==(NodeId o) const { return value == o.value; }
  bool operator!=(NodeId o) const { return value != o.value; }
  bool operator<(NodeId o) const { return value < o.value; }
  template <typename H>
  friend H AbslHashValue(H h, NodeId id) {
    return H::combine(std::move(h), id.value);
  }
};

// Output `output` of node `node`.
struct ValueRef {
  NodeId node;
  int32_t output = 0;
  bool operator==(const ValueRef& o) const { return node == o.node && output == o.output; }
  bool operator!=(const ValueRef& o) const { return !(*this == o); }
  template <typename H>
  friend H AbslHashValue(H h, const ValueRef& r) {
    return H::combine(std::move(h), r.node, r.output);
  }
};

struct NoneArg {
  bool operator==(const NoneArg&) const { return true; }
};

// A value for a `Scalar` schema argument.
struct Scalar {
  std::variant<int64_t, double, bool, std::complex<double>> value;
  bool operator==(const Scalar& o) const;  // by bit pattern for floats
};

// A node argument: a typed union, lists nest.
class Argument {
 public:
  using List = std::vector<Argument>;
  using Value = std::variant<ValueRef, int64_t, double, bool, std::string, NoneArg, DType, Device,
                             Layout, MemoryFormat, Scalar, List>;

  Argument() : value_(NoneArg{}) {}
  Argument(ValueRef r) : value_(r) {}                // NOLINT: implicit by design
  Argument(int64_t v) : value_(v) {}                 // NOLINT
  Argument(int v) : value_(int64_t{v}) {}            // NOLINT
  Argument(double v) : value_(v) {}                  // NOLINT
  Argument(bool v) : value_(v) {}                    // NOLINT
  Argument(std::string v) : value_(std::move(v)) {}  // NOLINT
  Argument(NoneArg v) : value_(v) {}                 // NOLINT
  Argument(DType v) : value_(v) {}                   // NOLINT
  Argument(Device v) : value_(v) {}                  // NOLINT
  Argument(Layout v) : value_(v) {}                  // NOLINT
  Argument(MemoryFormat v) : value_(v) {}            // NOLINT
  Argument(Scalar v) : value_(std::move(v)) {}       // NOLINT
  Argument(List v) : value_(std::move(v)) {}         // NOLINT

  const Value& value() const { return value_; }
  template <typename T>
  bool is() const {
    return std::holds_alternative<T>(value_);
  }
  template <typename T>
  const T& as() const {
    return std::get<T>(value_);
  }
  template <typename T>
  const T* get_if() const {
    return std::get_if<T>(&value_);
  }
  bool is_ref() const { return is<ValueRef>(); }
  bool is_list() const { return is<List>(); }
  bool is_none() const { return is<NoneArg>(); }

  // Structural equality; floats compare by bit pattern, so NaN == NaN.
  bool operator==(const Argument& o) const;
  bool operator!=(const Argument& o) const { return !(*this == o); }

  // Calls f(ref) for every ValueRef inside this argument, lists included.
  template <typename F>
  void ForEachRef(F&& f) const {
    if (auto* r = get_if<ValueRef>()) {
      f(*r);
    } else if (auto* l = get_if<List>()) {
      for (const Argument& a : *l) a.ForEachRef(f);
    }
  }
  // Whether a ValueRef is inside this argument, lists included.
  bool HasRef() const {
    if (is<ValueRef>()) return true;
    if (auto* l = get_if<List>()) {
      for (const Argument& a : *l)
        if (a.HasRef()) return true;
    }
    return false;
  }

 private:
  Value value_;
};

struct KeywordArgument {
  std::string name;
  Argument value;
  bool operator==(const KeywordArgument& o) const { return name == o.name && value == o.value; }
};

enum class NodeKind : int8_t { kPlaceholder, kCallFunction, kGetAttr, kOutput };
absl::string_view NodeKindName(NodeKind k);  // "placeholder", "call_function", ...

enum class PlaceholderRole : int8_t {
  kParameter,
  kBuffer,
  kOptimizerState,
  kInput,
  kConstant,
  kHyperparameter
};
absl::string_view PlaceholderRoleName(PlaceholderRole r);  // "PARAMETER", ...
absl::StatusOr<PlaceholderRole> PlaceholderRoleFromName(absl::string_view s);

enum class OutputRole : int8_t {
  kUpdatedParameter,
  kUpdatedBuffer,
  kUpdatedOptimizerState,
  kLoss,
  kOther
};
absl::string_view OutputRoleName(OutputRole r);  // "UPDATED_PARAMETER", ...
absl::StatusOr<OutputRole> OutputRoleFromName(absl::string_view s);
// The placeholder role an UPDATED_* output replaces; nullopt for LOSS/OTHER.
std::optional<PlaceholderRole> UpdatedRole(OutputRole r);

struct Target {
  std::string name;      // "aten::addmm", "operator.getitem", placeholder name
  std::string overload;  // "" for the default overload
  bool operator==(const Target& o) const { return name == o.name && overload == o.overload; }
  // "aten::sum.dim_IntList", "aten::addmm", "operator.getitem"
  std::string ToString() const;
};

inline constexpr absl::string_view kGetItem = "operator.getitem";

struct PlaceholderSpec {
  PlaceholderRole role = PlaceholderRole::kInput;
  std::string state_name;
  int32_t batch_dim = 0;  // INPUT: the batch dim, or -1 for none.
  bool operator==(const PlaceholderSpec& o) const {
    return role == o.role && state_name == o.state_name && batch_dim == o.batch_dim;
  }
};

struct OutputSpec {
  OutputRole role = OutputRole::kOther;
  std::string state_name;  // UPDATED_*: the placeholder's state_name.
  bool operator==(const OutputSpec& o) const {
    return role == o.role && state_name == o.state_name;
  }
};

struct Node {
  std::string name;
  NodeKind kind = NodeKind::kCallFunction;
  Target target;
  std::vector<Argument> args;
  std::vector<KeywordArgument> kwargs;
  std::vector<ValueType> outputs;
  PlaceholderSpec placeholder;           // kPlaceholder only.
  std::vector<OutputSpec> output_specs;  // kOutput only.
  std::string grad_of;                   // parameter whose gradient is output 0.
  std::string source;                    // the user's line (graph.proto Node.source), or "".

  bool is_placeholder() const { return kind == NodeKind::kPlaceholder; }
  bool is_output() const { return kind == NodeKind::kOutput; }
  bool is_call() const { return kind == NodeKind::kCallFunction; }
  bool is_getitem() const { return kind == NodeKind::kCallFunction && target.name == kGetItem; }
  // Keyword argument `name`, or nullptr.
  const Argument* kwarg(absl::string_view name) const;
  // Calls f(ref) for every value this node reads (args then kwargs).
  template <typename F>
  void ForEachInput(F&& f) const {
    for (const Argument& a : args) a.ForEachRef(f);
    for (const KeywordArgument& k : kwargs) k.value.ForEachRef(f);
  }
  bool operator==(const Node& o) const;
};

struct GraphHeader {
  int32_t format_version = 1;
  std::string producer;
  std::string torch_version;
  std::vector<std::pair<std::string, std::string>> metadata;
  bool operator==(const GraphHeader& o) const {
    return format_version == o.format_version && producer == o.producer &&
           torch_version == o.torch_version && metadata == o.metadata;
  }
};

inline constexpr int32_t kFormatVersion = 1;

class Graph {
 public:
  // Verifies `nodes` (see verifier.h) and builds the graph.
  static absl::StatusOr<Graph> Create(GraphHeader header, std::vector<Node> nodes);

  const GraphHeader& header() const { return header_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  int32_t size() const { return static_cast<int32_t>(nodes_.size()); }
  const Node& node(NodeId id) const { return nodes_[id.value]; }
  const Node& output_node() const { return nodes_.back(); }
  std::optional<NodeId> FindNode(absl::string_view name) const;
  // The type of a value. Precondition: the ref is valid in this graph.
  const ValueType& type(ValueRef r) const { return nodes_[r.node.value].outputs[r.output]; }
  // Placeholders with the given state name, or nullopt.
  std::optional<NodeId> FindState(absl::string_view state_name) const;

  bool operator==(const Graph& o) const { return header_ == o.header_ && nodes_ == o.nodes_; }

  // The name index points into nodes_: a copy rebuilds it, a move keeps it
  // (the nodes stay in the same buffer).
  Graph(const Graph& o) : header_(o.header_), nodes_(o.nodes_) { Index(); }
  Graph& operator=(const Graph& o) {
    if (this != &o) {
      header_ = o.header_;
      nodes_ = o.nodes_;
      Index();
    }
    return *this;
  }
  Graph(Graph&&) = default;
  Graph& operator=(Graph&&) = default;

 private:
  Graph() = default;
  void Index();
  GraphHeader header_;
  std::vector<Node> nodes_;
  absl::flat_hash_map<absl::string_view, NodeId> by_name_;  // views into nodes_
};

// Who reads a value: node `user` at argument position `arg_index` (kwargs
// are numbered after args).
struct Use {
  NodeId user;
  int32_t arg_index;
};
// uses[node][output] lists the users of each output, in node order.
using UseMap = std::vector<std::vector<std::vector<Use>>>;
UseMap ComputeUses(const Graph& g);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_GRAPH_H_
