#include "expansion/sync_batchnorm.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/ir/node_error.h"
#include "analysis/op_rules.h"

namespace fxdp {

using ir::Argument;
using ir::Node;
using ir::TensorType;
using ir::ValueRef;

namespace {

// A batch-norm op's argument positions (-1: the op has none), read from its
// row of the op table (analysis/op_rules.cc): the kBatchNorm rows that take
// a training flag and the kBatchNormBackward row. In the backward,
// running_mean and running_var name save_mean and save_invstd.
struct BatchNormOp {
  SyncBatchNormRole role = SyncBatchNormRole::kNone;
  int weight = -1, bias = -1, running_mean = -1, running_var = -1, training = -1, momentum = -1,
      eps = -1;
  bool functional = false;  // outputs 3 and 4 are the updated running statistics
};

int ArgIndex(const OpParam* p) { return p == nullptr ? -1 : p->index; }

int ReplicatedIndex(const OpRule& rule, absl::string_view name) {
  for (const OpParam& p : rule.params) {
    if (p.role == ParamRole::kReplicated && p.name == name) return p.index;
  }
  return -1;
}

std::optional<BatchNormOp> FindOp(const Node& n) {
  const OpRule* rule = n.is_call() ? FindOpRule(n.target) : nullptr;
  // Without a training flag a batch norm never uses batch statistics.
  if (rule == nullptr || rule->param(ParamRole::kTraining) == nullptr) return std::nullopt;
  BatchNormOp op;
  const bool backward = rule->family == OpFamily::kBatchNormBackward;
  if (rule->family != OpFamily::kBatchNorm && !backward) return std::nullopt;
  op.role = backward ? SyncBatchNormRole::kBackward : SyncBatchNormRole::kForward;
  op.weight = ReplicatedIndex(*rule, "weight");
  op.bias = ReplicatedIndex(*rule, "bias");
  op.running_mean = backward ? ArgIndex(rule->param(ParamRole::kSaveMean))
                             : ReplicatedIndex(*rule, "running_mean");
  op.running_var = backward ? ArgIndex(rule->param(ParamRole::kSaveInvstd))
                            : ReplicatedIndex(*rule, "running_var");
  op.training = ArgIndex(rule->param(ParamRole::kTraining));
  op.momentum = ArgIndex(rule->param(ParamRole::kMomentum));
  op.eps = ArgIndex(rule->param(ParamRole::kEps));
  op.functional = rule->has(kReturnsRunningStats);
  return op;
}

absl::Status Error(const Node& n, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: sync_batchnorm: %s", ir::NodeLabel(n), what));
}

// Appends the nodes of one rewrite; every helper returns the new value.
class Emitter {
 public:
  Emitter(const SyncBatchNormSite& s, RankGraphBuilder& b) : b_(b), base_(s.node->name) {
    x_ = s.input;
    x_.requires_grad = false;
    x_.storage_offset = 0;
    const int64_t channels = x_.rank() >= 2 ? x_.shape[1] : 1;
    broadcast_.assign(x_.rank(), 1);
    if (x_.rank() >= 2) broadcast_[1] = channels;
    for (int64_t d = 0; d < x_.rank(); ++d) {
      if (d != 1) reduce_dims_.emplace_back(d);
    }
    stat_ = x_;
    stat_.shape = {channels};
    stat_.stride = {1};
  }

  const TensorType& stat() const { return stat_; }

  ValueRef Call(absl::string_view op, absl::string_view overload, std::vector<Argument> args,
                const TensorType& t) {
    return b_.Add(absl::StrCat(base_, "_sync"), op, overload, std::move(args), t);
  }
  // Per-channel sum over every dim but 1.
  ValueRef SumPerChannel(ValueRef v) {
    return Call("aten::sum", "dim_IntList", {v, Argument(reduce_dims_), Argument(false)}, stat_);
  }
  // [C] -> [1, C, 1, ...], to broadcast against the input.
  ValueRef Broadcastable(ValueRef c) {
    TensorType t = stat_;
    t.shape = broadcast_;
    t.stride = ir::ContiguousStrides(broadcast_);
    Argument::List sizes;
    for (int64_t s : broadcast_) sizes.emplace_back(s);
    return Call("aten::view", "", {c, Argument(std::move(sizes))}, t);
  }
  ValueRef Binary(absl::string_view op, ValueRef a, ValueRef b, const TensorType& t) {
    return Call(op, "Tensor", {a, b}, t);
  }
  ValueRef Scaled(ValueRef a, double s, const TensorType& t) {
    return Call("aten::mul", "Scalar", {a, Argument(s)}, t);
  }
  ValueRef Divided(ValueRef a, double s, const TensorType& t) {
    return Call("aten::div", "Scalar", {a, Argument(s)}, t);
  }
  // (1 - m) * running + m * batch, torch's running-statistics update.
  ValueRef RunningUpdate(ValueRef running, ValueRef batch, double m, const TensorType& t) {
    return Binary("aten::add", Scaled(batch, m, t), Scaled(running, 1.0 - m, t), t);
  }
  const TensorType& x() const { return x_; }
  // `what`: "stats" (forward) or "grad" (backward), for the report.
  ValueRef AllReduce(ValueRef v, const TensorType& t, double weight, absl::string_view what) {
    return b_.AllReduceSum(v, t, weight, absl::StrCat("bn ", what, " ", base_));
  }

 private:
  RankGraphBuilder& b_;
  std::string base_;
  TensorType x_, stat_;
  std::vector<int64_t> broadcast_;
  Argument::List reduce_dims_;
};

std::optional<ValueRef> RefArg(const SyncBatchNormSite& s, int i) {
  if (i < 0 || i >= static_cast<int>(s.args.size())) return std::nullopt;
  if (const ValueRef* r = s.args[i].get_if<ValueRef>()) return *r;
  return std::nullopt;
}

std::optional<double> FloatArg(const SyncBatchNormSite& s, int i) {
  if (i < 0 || i >= static_cast<int>(s.args.size())) return std::nullopt;
  if (const double* d = s.args[i].get_if<double>()) return *d;
  if (const int64_t* k = s.args[i].get_if<int64_t>()) return static_cast<double>(*k);
  return std::nullopt;
}

const TensorType* OutType(const SyncBatchNormSite& s, size_t k) {
  return k < s.outputs.size() && s.outputs[k].is_tensor() ? &s.outputs[k].tensor : nullptr;
}

absl::StatusOr<std::vector<std::optional<ValueRef>>> Forward(const SyncBatchNormSite& s,
                                                             const BatchNormOp& op,
                                                             RankGraphBuilder& b) {
  const Node& n = *s.node;
  const std::optional<ValueRef> x = RefArg(s, 0);
  const std::optional<double> momentum = FloatArg(s, op.momentum);
  const std::optional<double> eps = FloatArg(s, op.eps);
  if (!x || !momentum || !eps) {
    return Error(n, absl::StrFormat("expected the input at arg 0, momentum at arg %d and eps at "
                                    "arg %d as literals",
                                    op.momentum, op.eps));
  }
  const std::optional<ValueRef> running_mean = RefArg(s, op.running_mean);
  const std::optional<ValueRef> running_var = RefArg(s, op.running_var);
  if (!op.functional && (running_mean || running_var)) {
    return Error(n,
                 "updates its running statistics in place; trace the step with fxdp.trace, "
                 "which produces _native_batch_norm_legit_functional");
  }
  if (op.functional && (!running_mean || !running_var)) {
    return Error(n, "expected running_mean and running_var tensors");
  }
  const TensorType* save_mean = OutType(s, 1);
  if (save_mean == nullptr || s.input.rank() < 2) {
    return Error(n, "expected an input of rank >= 2 and the batch mean as output 1");
  }
  if (save_mean->dtype != s.input.dtype) {
    return Error(n, absl::StrFormat("the input is %s but its statistics are %s; synchronized "
                                    "statistics need one dtype",
                                    ir::DTypeShortName(s.input.dtype),
                                    ir::DTypeShortName(save_mean->dtype)));
  }
  Emitter e(s, b);
  const TensorType& st = e.stat();
  const double count = static_cast<double>(s.global_count);
  const ValueRef mean = e.Divided(e.AllReduce(e.SumPerChannel(*x), st, 1.0, "stats"), count, st);
  const ValueRef xmu = e.Binary("aten::sub", *x, e.Broadcastable(mean), e.x());
  const ValueRef var_sum =
      e.AllReduce(e.SumPerChannel(e.Binary("aten::mul", xmu, xmu, e.x())), st, 1.0, "stats");
  const ValueRef invstd = e.Call(
      "aten::rsqrt", "",
      {e.Call("aten::add", "Scalar", {e.Divided(var_sum, count, st), Argument(*eps)}, st)}, st);
  ValueRef alpha = invstd;
  if (const std::optional<ValueRef> w = RefArg(s, op.weight))
    alpha = e.Binary("aten::mul", invstd, *w, st);
  ValueRef out = e.Binary("aten::mul", xmu, e.Broadcastable(alpha), e.x());
  if (const std::optional<ValueRef> bias = RefArg(s, op.bias)) {
    out = e.Binary("aten::add", out, e.Broadcastable(*bias), e.x());
  }
  std::vector<std::optional<ValueRef>> result(s.outputs.size());
  result[0] = out;
  result[1] = mean;
  if (s.outputs.size() > 2) result[2] = invstd;
  if (op.functional && s.outputs.size() > 4) {
    // Unbiased variance over the global batch, as one device's running_var.
    const ValueRef unbiased = e.Divided(var_sum, count - 1.0, st);
    result[3] = e.RunningUpdate(*running_mean, mean, *momentum, *OutType(s, 3));
    result[4] = e.RunningUpdate(*running_var, unbiased, *momentum, *OutType(s, 4));
  }
  return result;
}

absl::StatusOr<std::vector<std::optional<ValueRef>>> Backward(const SyncBatchNormSite& s,
                                                              const BatchNormOp& op,
                                                              RankGraphBuilder& b) {
  const Node& n = *s.node;
  const std::optional<ValueRef> dy = RefArg(s, 0);
  const std::optional<ValueRef> x = RefArg(s, 1);
  const std::optional<ValueRef> mean = RefArg(s, op.running_mean);
  const std::optional<ValueRef> invstd = RefArg(s, op.running_var);
  if (!dy || !x || !mean || !invstd || s.input.rank() < 2) {
    return Error(n, "expected grad_output, input (rank >= 2), save_mean and save_invstd tensors");
  }
  if (const TensorType* gw = OutType(s, 1); gw != nullptr && gw->dtype != s.input.dtype) {
    return Error(n,
                 absl::StrFormat("the input is %s but the weight's gradient is %s; "
                                 "synchronized statistics need one dtype",
                                 ir::DTypeShortName(s.input.dtype), ir::DTypeShortName(gw->dtype)));
  }
  Emitter e(s, b);
  const TensorType& st = e.stat();
  const ValueRef xmu = e.Binary("aten::sub", *x, e.Broadcastable(*mean), e.x());
  const ValueRef sum_dy = e.SumPerChannel(*dy);
  const ValueRef sum_dy_xmu = e.SumPerChannel(e.Binary("aten::mul", *dy, xmu, e.x()));
  std::vector<std::optional<ValueRef>> result(s.outputs.size());
  if (OutType(s, 0) != nullptr) {
    const int64_t c = st.shape[0];
    TensorType packed_t = st;
    packed_t.shape = {2 * c};
    const ValueRef packed =
        e.Call("aten::cat", "",
               {Argument(Argument::List{sum_dy, sum_dy_xmu}), Argument(int64_t{0})}, packed_t);
    const ValueRef global = e.AllReduce(packed, packed_t, s.grad_weight, "grad");
    const auto half = [&](int64_t from) {
      return e.Call(
          "aten::slice", "Tensor",
          {global, Argument(int64_t{0}), Argument(from), Argument(from + c), Argument(int64_t{1})},
          st);
    };
    const ValueRef mean_dy = e.Scaled(half(0), s.grad_factor, st);
    const ValueRef proj = e.Binary("aten::mul", e.Scaled(half(c), s.grad_factor, st),
                                   e.Binary("aten::mul", *invstd, *invstd, st), st);
    ValueRef scale = *invstd;
    if (const std::optional<ValueRef> w = RefArg(s, op.weight)) {
      scale = e.Binary("aten::mul", *invstd, *w, st);
    }
    const ValueRef centred =
        e.Binary("aten::sub", e.Binary("aten::sub", *dy, e.Broadcastable(mean_dy), e.x()),
                 e.Binary("aten::mul", xmu, e.Broadcastable(proj), e.x()), e.x());
    result[0] = e.Binary("aten::mul", centred, e.Broadcastable(scale), e.x());
  }
  // The parameters' gradients are the rank's partial sums, reduced in buckets.
  if (const TensorType* gw = OutType(s, 1))
    result[1] = e.Binary("aten::mul", sum_dy_xmu, *invstd, *gw);
  if (OutType(s, 2) != nullptr) result[2] = sum_dy;
  return result;
}

}  // namespace

SyncBatchNormRole SyncBatchNormRoleOf(const Node& n) {
  const std::optional<BatchNormOp> op = FindOp(n);
  return op ? op->role : SyncBatchNormRole::kNone;
}

bool BatchNormBackwardTrains(const Node& n) {
  const std::optional<BatchNormOp> op = FindOp(n);
  if (!op || op->role != SyncBatchNormRole::kBackward ||
      op->training >= static_cast<int>(n.args.size())) {
    return false;
  }
  const bool* train = n.args[op->training].get_if<bool>();
  return train != nullptr && *train;
}

absl::StatusOr<std::vector<std::optional<ValueRef>>> EmitSyncBatchNorm(
    const SyncBatchNormSite& site, RankGraphBuilder& builder) {
  const std::optional<BatchNormOp> op = FindOp(*site.node);
  if (!op) return Error(*site.node, "not a batch-norm op");
  if (site.global_count < 2) {
    return Error(*site.node, absl::StrFormat("the global batch has %d element(s) per channel; "
                                             "batch norm in training needs more than 1",
                                             site.global_count));
  }
  return op->role == SyncBatchNormRole::kForward ? Forward(site, *op, builder)
                                                 : Backward(site, *op, builder);
}

}  // namespace fxdp
