#include "executor/collective_steps.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/ir/collectives.h"
#include "analysis/ir/node_error.h"
#include "executor/arg_binding.h"
#include "executor/torch_types.h"
#include "util/status_macros.h"

namespace fxdp::executor {
namespace {

using ir::kAllGather;
using ir::kAllReduce;
using ir::kReduceScatter;
using ir::kWaitTensor;

// A Work whose result is divided by the world size (reduce_op "avg").
class AvgWork : public Work {
 public:
  AvgWork(std::unique_ptr<Work> inner, int world) : inner_(std::move(inner)), world_(world) {}
  absl::StatusOr<at::Tensor> Wait(std::chrono::milliseconds timeout) override {
    FXDP_ASSIGN_OR_RETURN(at::Tensor t, inner_->Wait(timeout));
    return t.div_(world_);
  }
  void Poll() override { inner_->Poll(); }

 private:
  std::unique_ptr<Work> inner_;
  int world_;
};

}  // namespace

bool IsCollectiveNode(const ir::Node& n) { return ir::IsCollective(n.target.name); }

absl::StatusOr<Step> PlanCollective(const ir::Graph& g, const ir::Node& n, Step s,
                                    const std::vector<std::vector<int32_t>>& slot_of) {
  const bool gather = n.target.name == kAllGather, scatter = n.target.name == kReduceScatter;
  if (n.target.name != kAllReduce && n.target.name != kWaitTensor && !gather && !scatter)
    return NodeError(n,
                     "this collective is not supported by the interpreter (supported: "
                     "_c10d_functional::all_reduce, all_gather_into_tensor, "
                     "reduce_scatter_tensor and wait_tensor)",
                     absl::StatusCode::kUnimplemented);
  const bool is_reduce = n.target.name == kAllReduce || scatter;
  s.kind = is_reduce || gather ? StepKind::kAllReduce : StepKind::kWait;
  if (gather || scatter) {
    // all_gather_into_tensor(input, group_size, group),
    // reduce_scatter_tensor(input, reduce_op, group_size, group).
    s.collective = gather ? Step::Collective::kAllGather : Step::Collective::kReduceScatter;
    const size_t at = gather ? 1 : 2;
    const ir::Argument* size = n.args.size() > at ? &n.args[at] : n.kwarg("group_size");
    if (size == nullptr || !size->is<int64_t>())
      return NodeError(n, absl::StrCat("argument 'group_size' expects int, got ",
                                       size == nullptr ? "nothing" : DescribeArgument(g, *size)));
    s.group_size = size->as<int64_t>();
  }
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
    if (red == "avg" && !scatter) {
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
    const std::string who = reader ? reader->label : "output";
    // Name the collective as every rank's graph does: the all_reduce node,
    // what it reduces and its number among this step's collectives.
    std::string what = "all_reduce";
    if (const auto& [from, seq] = work_from[slot]; from != nullptr) {
      const char* op = from->collective == Step::Collective::kAllGather ? "all_gather_into_tensor"
                       : from->collective == Step::Collective::kReduceScatter
                           ? "reduce_scatter_tensor"
                           : "all_reduce";
      what = absl::StrCat(op, " '", from->name, "' (collective ", seq, " of the step",
                          from->out_types.empty() || !from->out_types[0].is_tensor()
                              ? std::string()
                              : absl::StrCat(", ", TypeForMessage(from->out_types[0].tensor)),
                          ")");
    }
    return absl::Status(r.status().code(),
                        absl::StrCat(who, ": waiting for ", what, ": ", r.status().message()));
  }
  slots[slot] = c10::IValue(*std::move(r));
  return absl::OkStatus();
}

absl::Status Program::Impl::RunAllReduce(Step& s) {
  const ArgPlan& in = s.args[0];
  if (in.maybe_pending) FXDP_RETURN_IF_ERROR(Resolve(in.slot, &s));
  const c10::IValue& v = slots[in.slot];
  if (!v.isTensor())
    return absl::InternalError(absl::StrCat(s.label, ": input is ", v.tagKind(), ", not a tensor"));
  ++collectives_started;
  if (s.collective != Step::Collective::kAllReduce && s.group_size != comm->world_size())
    return absl::InvalidArgumentError(
        absl::StrCat(s.label, ": group_size ", s.group_size, " but this program's communicator (",
                     comm->name(), ") has ", comm->world_size(), " ranks"));
  // The bucket (or loss) is usually a fresh tensor read by this all_reduce
  // (or reduce_scatter) only: donate it so the communicator reduces in place.
  const bool last_use =
      std::find(s.free_after.begin(), s.free_after.end(), in.slot) != s.free_after.end();
  const bool donate = s.collective != Step::Collective::kAllGather && last_use &&
                      v.toTensor().use_count() == 1 && v.toTensor().storage().use_count() == 1;
  absl::StatusOr<std::unique_ptr<Work>> w;
  if (s.collective == Step::Collective::kAllGather) {
    w = comm->AllGather(v.toTensor());
  } else if (donate) {
    at::Tensor donated = std::move(slots[in.slot]).toTensor();
    slots[in.slot] = c10::IValue();
    w = s.collective == Step::Collective::kReduceScatter
            ? comm->ReduceScatterSumDonated(std::move(donated))
            : comm->AllReduceSumDonated(std::move(donated));
  } else if (s.collective == Step::Collective::kReduceScatter) {
    w = comm->ReduceScatterSum(v.toTensor());
  } else {
    w = comm->AllReduceSum(v.toTensor());
  }
  if (!w.ok())
    return absl::Status(w.status().code(),
                        absl::StrCat(s.label, ": collective ", collectives_started,
                                     " of the step: ", w.status().message()));
  // Collectives that finished meanwhile release their buffers now.
  size_t kept = 0;
  for (int32_t slot : in_flight) {
    if (!works[slot]) continue;
    works[slot]->Poll();
    in_flight[kept++] = slot;
  }
  in_flight.resize(kept);
  in_flight.push_back(s.out_slots[0]);
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
