#include "executor/collective_steps.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "analysis/ir/status_macros.h"
#include "executor/arg_binding.h"
#include "executor/torch_types.h"

namespace fxdp::executor {
namespace {

constexpr absl::string_view kAllReduce = "_c10d_functional::all_reduce";
constexpr absl::string_view kWaitTensor = "_c10d_functional::wait_tensor";
constexpr absl::string_view kFunctionalPrefix = "_c10d_functional::";

// A Work whose result is divided by the world size (reduce_op "avg").
class AvgWork : public Work {
 public:
  AvgWork(std::unique_ptr<Work> inner, int world) : inner_(std::move(inner)), world_(world) {}
  absl::StatusOr<at::Tensor> Wait(std::chrono::milliseconds timeout) override {
    FXDP_ASSIGN_OR_RETURN(at::Tensor t, inner_->Wait(timeout));
    return t.div_(world_);
  }

 private:
  std::unique_ptr<Work> inner_;
  int world_;
};

}  // namespace

bool IsCollectiveNode(const ir::Node& n) {
  return absl::StartsWith(n.target.name, kFunctionalPrefix);
}

absl::StatusOr<Step> PlanCollective(const ir::Graph& g, const ir::Node& n, Step s,
                                    const std::vector<std::vector<int32_t>>& slot_of) {
  if (n.target.name != kAllReduce && n.target.name != kWaitTensor)
    return NodeError(n,
                     "this collective is not supported by the interpreter (supported: "
                     "_c10d_functional::all_reduce and wait_tensor)",
                     absl::StatusCode::kUnimplemented);
  const bool is_reduce = n.target.name == kAllReduce;
  s.kind = is_reduce ? StepKind::kAllReduce : StepKind::kWait;
  if (!n.target.overload.empty())
    return NodeError(n, "unknown overload", absl::StatusCode::kNotFound);
  if (n.args.empty() || !n.args[0].is_ref() || !g.type(n.args[0].as<ir::ValueRef>()).is_tensor())
    return NodeError(n, absl::StrCat("argument 'input' expects Tensor, got ",
                                     n.args.empty() ? "nothing" : DescribeArgument(g, n.args[0])));
  if (n.outputs.size() != 1 || !n.outputs[0].is_tensor())
    return NodeError(n, "must have one tensor output");
  ArgPlan in;
  in.kind = ArgPlan::Kind::kSlot;
  const ir::ValueRef& r = n.args[0].as<ir::ValueRef>();
  in.slot = slot_of[r.node.value][r.output];
  s.args.push_back(std::move(in));
  if (is_reduce) {
    const ir::Argument* op = n.args.size() > 1 ? &n.args[1] : n.kwarg("reduce_op");
    if (op == nullptr || !op->is<std::string>())
      return NodeError(n, absl::StrCat("argument 'reduce_op' expects str, got ",
                                       op == nullptr ? "nothing" : DescribeArgument(g, *op)));
    const std::string& red = op->as<std::string>();
    if (red == "avg") {
      s.avg = true;
    } else if (red != "sum") {
      return NodeError(n, absl::StrCat("reduce_op \"", red, "\" is not supported (sum, avg)"),
                       absl::StatusCode::kUnimplemented);
    }
  }
  s.ret = ReturnKind::kSingle;
  s.out_types = n.outputs;
  return s;
}

absl::Status Program::Impl::Resolve(int32_t slot, const Step* reader) {
  std::unique_ptr<Work> w = std::move(works[slot]);
  if (!w) return absl::OkStatus();
  absl::StatusOr<at::Tensor> r = w->Wait(options.collective_timeout);
  if (!r.ok()) {
    const std::string who =
        reader ? absl::StrCat("node '", reader->name, "' (", reader->op_name, ")") : "output";
    // Name the collective as every rank's graph does: the all_reduce node,
    // what it reduces and its number among this step's collectives.
    std::string what = "all_reduce";
    if (const auto& [from, seq] = work_from[slot]; from != nullptr) {
      what = absl::StrCat("all_reduce '", from->name, "' (collective ", seq, " of the step",
                          from->out_types.empty() || !from->out_types[0].is_tensor()
                              ? std::string()
                              : absl::StrCat(", ", TypeForMessage(from->out_types[0].tensor)),
                          ")");
    }
    return absl::Status(r.status().code(), absl::StrCat(who, ": waiting for ", what, ": ",
                                                        r.status().message()));
  }
  slots[slot] = c10::IValue(*std::move(r));
  return absl::OkStatus();
}

absl::Status Program::Impl::RunAllReduce(Step& s) {
  const ArgPlan& in = s.args[0];
  if (in.maybe_pending) FXDP_RETURN_IF_ERROR(Resolve(in.slot, &s));
  const c10::IValue& v = slots[in.slot];
  if (!v.isTensor())
    return absl::InternalError(absl::StrCat("node '", s.name, "' (", s.op_name,
                                            "): input is ", v.tagKind(), ", not a tensor"));
  ++collectives_started;
  // The bucket (or loss) is usually a fresh tensor read by this all_reduce
  // only: donate it so the communicator reduces in place.
  const bool last_use =
      std::find(s.free_after.begin(), s.free_after.end(), in.slot) != s.free_after.end();
  absl::StatusOr<std::unique_ptr<Work>> w;
  if (last_use && v.toTensor().use_count() == 1 && v.toTensor().storage().use_count() == 1) {
    at::Tensor donated = std::move(slots[in.slot]).toTensor();
    slots[in.slot] = c10::IValue();
    w = comm->AllReduceSumDonated(std::move(donated));
  } else {
    w = comm->AllReduceSum(v.toTensor());
  }
  if (!w.ok())
    return absl::Status(w.status().code(),
                        absl::StrCat("node '", s.name, "' (", s.op_name, ", collective ",
                                     collectives_started, " of the step): ",
                                     w.status().message()));
  work_from[s.out_slots[0]] = {&s, collectives_started};
  std::unique_ptr<Work> work = *std::move(w);
  if (s.avg) work = std::make_unique<AvgWork>(std::move(work), comm->world_size());
  works[s.out_slots[0]] = std::move(work);
  return absl::OkStatus();
}

absl::Status Program::Impl::RunWait(Step& s) {
  const int32_t in = s.args[0].slot;
  FXDP_RETURN_IF_ERROR(Resolve(in, &s));
  slots[s.out_slots[0]] = slots[in];
  return absl::OkStatus();
}

}  // namespace fxdp::executor
