#include "server/compile_service.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/batch_dim.h"
#include "analysis/ir/proto_codec.h"
#include "analysis/ir/status_macros.h"
#include "expansion/data_parallel.h"

namespace fxdp::server {
namespace {

absl::Status CheckWorldSize(int32_t world) {
  if (world < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world_size must be >= 1, got ", world));
  }
  return absl::OkStatus();
}

absl::StatusOr<ir::Graph> DecodeRequestGraph(bool has_graph, const v1::GraphDef& def) {
  if (!has_graph) return absl::InvalidArgumentError("the request has no graph");
  return ir::DecodeGraph(def);
}

const char* ReduceName(ReduceOp op) { return op == ReduceOp::kAvg ? "avg" : "sum"; }

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share google.rpc.Code's numbers.
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(status.code())),
                      std::string(status.message()));
}

absl::StatusOr<v1::AnalyzeResponse> RunAnalyze(const v1::AnalyzeRequest& request) {
  FXDP_RETURN_IF_ERROR(CheckWorldSize(request.world_size()));
  FXDP_ASSIGN_OR_RETURN(ir::Graph g, DecodeRequestGraph(request.has_graph(), request.graph()));
  FXDP_ASSIGN_OR_RETURN(BatchDimAnalysis a,
                        AnalyzeBatchDims(g, AnalyzeOptions{request.world_size()}));
  v1::AnalyzeResponse r;
  r.set_world_size(a.world_size());
  r.set_batch_size(a.batch_size());
  r.mutable_nodes()->Reserve(g.size());
  for (int32_t i = 0; i < g.size(); ++i) {
    const ir::NodeId id{i};
    const ir::Node& n = g.node(id);
    v1::NodePlacement* p = r.add_nodes();
    p->set_name(n.name);
    p->set_target(n.is_call() ? n.target.ToString() : std::string(ir::NodeKindName(n.kind)));
    const bool tensor = !n.outputs.empty() && n.outputs[0].is_tensor();
    const int32_t bd = a.primary(id).batch_dim();
    p->set_batch_dim(tensor && bd >= 0 ? bd : -1);
    p->set_placement(PlacementsString(g, a, id));
    p->set_reason(DescribeDecision(g, a, id));
  }
  for (const Reduction& red : a.reductions()) {
    v1::Reduction* x = r.add_reductions();
    x->set_value(g.node(red.value.node).name);
    x->set_output(red.value.output);
    x->set_op(ReduceName(red.op));
    x->set_first_use(red.first_use.valid() ? g.node(red.first_use).name : std::string());
    x->set_grad_of(red.grad_of);
  }
  for (const ShardedRead& s : a.sharded_reads()) {
    v1::ShardedRead* x = r.add_sharded_reads();
    x->set_value(g.node(s.value.node).name);
    x->set_output(s.value.output);
    x->set_dim(s.dim);
    x->set_user(g.node(s.user).name);
  }
  for (const std::string& w : a.warnings()) r.add_warnings(w);
  for (const std::string& w : a.notes()) r.add_notes(w);
  if (request.include_json()) r.set_json(AnalysisToJson(g, a));
  return r;
}

absl::StatusOr<v1::ExpandResponse> RunExpand(const v1::ExpandRequest& request) {
  FXDP_RETURN_IF_ERROR(CheckWorldSize(request.world_size()));
  ExpandOptions opts;
  opts.world_size = request.world_size();
  for (double mb : {request.bucket_cap_mb(), request.first_bucket_mb(),
                    request.has_last_bucket_mb() ? request.last_bucket_mb() : 0.0}) {
    if (!std::isfinite(mb) || mb < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket sizes must be finite and >= 0 (0: the default), got ", mb));
    }
  }
  if (request.bucket_cap_mb() > 0) opts.bucket_cap_mb = request.bucket_cap_mb();
  if (request.first_bucket_mb() > 0) opts.first_bucket_mb = request.first_bucket_mb();
  if (!request.group_name().empty()) opts.group_name = request.group_name();
  if (request.has_last_bucket_mb()) opts.last_bucket_mb = request.last_bucket_mb();
  opts.overlap_schedule = !request.no_overlap_schedule();
  FXDP_ASSIGN_OR_RETURN(ir::Graph g, DecodeRequestGraph(request.has_graph(), request.graph()));
  FXDP_ASSIGN_OR_RETURN(BatchDimAnalysis a, AnalyzeBatchDims(g, AnalyzeOptions{opts.world_size}));
  FXDP_ASSIGN_OR_RETURN(Expansion e, ExpandDataParallel(g, a, opts));
  v1::ExpandResponse r;
  r.set_identical(e.identical);
  for (const ir::Graph& rank_graph : e.distinct_graphs) *r.add_graphs() = ir::EncodeGraph(rank_graph);
  r.set_report_json(e.report.ToJson());
  r.set_report_table(e.report.ToTable());
  return r;
}

namespace {

// Looks `request` up in `cache`; on a miss computes it with `run` and caches it.
template <typename Response, typename Request, typename Run>
grpc::Status Cached(CompileCache& cache, absl::string_view method, const Request& request,
                    Response* response, Run run) {
  const std::string key = CompileCacheKey(method, request);
  if (auto hit = cache.Lookup(key)) {
    response->CopyFrom(*hit);
    response->set_cached(true);
    return grpc::Status::OK;
  }
  absl::StatusOr<Response> r = run(request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  auto value = std::make_shared<Response>(std::move(*r));
  cache.Insert(key, value);
  response->CopyFrom(*value);
  response->set_cached(false);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status CompileServiceImpl::Analyze(grpc::ServerContext*, const v1::AnalyzeRequest* request,
                                         v1::AnalyzeResponse* response) {
  return Cached(cache_, "Analyze", *request, response, RunAnalyze);
}

grpc::Status CompileServiceImpl::Expand(grpc::ServerContext*, const v1::ExpandRequest* request,
                                        v1::ExpandResponse* response) {
  return Cached(cache_, "Expand", *request, response, RunExpand);
}

}  // namespace fxdp::server
