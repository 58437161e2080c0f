#include "server/compile/compile_service.h"

#include <malloc.h>

#include <climits>
#include <cmath>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

#include "absl/strings/str_cat.h"
#include "analysis/analysis_table.h"
#include "analysis/batch_dim.h"
#include "analysis/ir/proto_codec.h"
#include "expansion/data_parallel.h"
#include "expansion/state_memory.h"
#include "expansion/style_proto.h"
#include "server/grpc_status.h"
#include "util/bytes.h"
#include "util/status_macros.h"

namespace fxdp::server {
namespace {

absl::Status CheckWorldSize(int32_t world, const CompileLimits& limits) {
  if (world < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world_size must be >= 1, got ", world));
  }
  if (world > limits.max_world_size) {
    return absl::ResourceExhaustedError(
        absl::StrCat("world_size ", world, " is over this server's limit of ",
                     limits.max_world_size, " (fxdp-server --max-world-size)"));
  }
  return absl::OkStatus();
}

// ExpandOptions::before_rank_graphs for `request`: the rank graphs against
// --max-expanded-nodes and --max-expanded-mb.
absl::Status CheckRankGraphs(const v1::ExpandRequest& request, const CompileLimits& limits,
                             int32_t graphs) {
  const int64_t nodes = request.graph().nodes_size();
  const int64_t bytes = static_cast<int64_t>(request.graph().ByteSizeLong());
  const std::string why =
      graphs == 1
          ? std::string("one graph for every rank")
          : absl::StrCat(
                "one graph per rank: the ranks' graphs differ (the batch splits unevenly over ",
                request.world_size(), " ranks, or values are sliced per rank)");
  if (graphs * nodes > limits.max_expanded_nodes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the expansion for world_size ", request.world_size(), " would build ", graphs,
                     " rank graphs (", why, ") of the ", nodes, "-node graph: ", graphs * nodes,
                     " nodes, over this server's limit of ", limits.max_expanded_nodes,
                     " (fxdp-server --max-expanded-nodes)"));
  }
  if (graphs * bytes > limits.max_expanded_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the expansion for world_size %d would build %d rank graphs (%s) of the %d-byte graph: "
        "%s, over this server's limit of %d MiB (fxdp-server --max-expanded-mb)",
        request.world_size(), graphs, why, bytes, util::MiB(graphs * bytes),
        limits.max_expanded_bytes >> 20));
  }
  return absl::OkStatus();
}

absl::StatusOr<ir::Graph> DecodeRequestGraph(bool has_graph, const v1::GraphDef& def) {
  if (!has_graph) return absl::InvalidArgumentError("the request has no graph");
  return ir::DecodeGraph(def);
}

absl::Status CheckBucketMb(double mb, absl::string_view field) {
  if (!std::isfinite(mb) || mb < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": bucket sizes must be finite and >= 0 (0: the default), got ", mb));
  }
  return absl::OkStatus();
}

void AddShardedState(const ShardedState& s, v1::ShardedState* x) {
  x->set_state_name(s.state_name);
  *x->mutable_shape() = {s.shape.begin(), s.shape.end()};
  x->set_dtype(static_cast<v1::DType>(ir::DTypeToWire(s.dtype)));
  x->set_shard_numel(s.shard_numel);
}

}  // namespace

absl::Status CheckCompileLimits(const CompileLimits& limits, absl::string_view what, int64_t bytes,
                                int64_t nodes) {
  if (bytes > limits.max_request_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s is %s, over this server's limit of %d MiB (fxdp-server --max-graph-mb)",
                        what, util::MiBWithBytes(bytes), limits.max_request_bytes >> 20));
  }
  if (nodes > limits.max_graph_nodes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, "'s graph has ", nodes, " nodes, over this server's limit of ",
                     limits.max_graph_nodes, " (fxdp-server --max-graph-nodes)"));
  }
  return absl::OkStatus();
}

int64_t CountRequestGraphNodes(absl::string_view bytes) {
  namespace io = google::protobuf::io;
  using google::protobuf::internal::WireFormatLite;
  constexpr uint32_t kGraphTag = (1 << 3) | WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
  constexpr uint32_t kNodesTag = (4 << 3) | WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
  io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  in.SetTotalBytesLimit(INT_MAX);
  int64_t nodes = 0;
  while (uint32_t tag = in.ReadTag()) {
    if (tag != kGraphTag) {
      if (!WireFormatLite::SkipField(&in, tag)) return -1;
      continue;
    }
    uint32_t len = 0;
    if (!in.ReadVarint32(&len)) return -1;
    const io::CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(len));
    while (uint32_t t = in.ReadTag()) {
      if (t == kNodesTag) ++nodes;
      if (!WireFormatLite::SkipField(&in, t)) return -1;
    }
    if (!in.ConsumedEntireMessage() || in.BytesUntilLimit() != 0) return -1;
    in.PopLimit(limit);
  }
  return in.ConsumedEntireMessage() ? nodes : -1;
}

absl::StatusOr<v1::AnalyzeResponse> RunAnalyze(const v1::AnalyzeRequest& request) {
  return AnalyzeWithin(request, CompileLimits{});
}

absl::StatusOr<v1::ExpandResponse> RunExpand(const v1::ExpandRequest& request) {
  return ExpandWithin(request, CompileLimits{});
}

absl::StatusOr<v1::AnalyzeResponse> AnalyzeWithin(const v1::AnalyzeRequest& request,
                                                  const CompileLimits& limits) {
  FXDP_RETURN_IF_ERROR(CheckWorldSize(request.world_size(), limits));
  FXDP_RETURN_IF_ERROR(CheckBucketMb(request.bucket_cap_mb(), "AnalyzeRequest.bucket_cap_mb"));
  std::optional<StyledAnalysis> styled;
  ExpandOptions opts;
  if (request.has_style()) {
    FXDP_ASSIGN_OR_RETURN(opts.style, StyleFromProto(request.style(), "AnalyzeRequest.style"));
  }
  FXDP_ASSIGN_OR_RETURN(ir::Graph g, DecodeRequestGraph(request.has_graph(), request.graph()));
  FXDP_ASSIGN_OR_RETURN(
      BatchDimAnalysis a,
      AnalyzeBatchDims(g, AnalyzeOptions{request.world_size(), request.sync_batchnorm(),
                                         /*guess_unruled_ops=*/true}));
  if (request.has_style()) {
    opts.world_size = request.world_size();
    opts.sync_batchnorm = request.sync_batchnorm();
    if (request.bucket_cap_mb() > 0) opts.bucket_cap_mb = request.bucket_cap_mb();
    FXDP_ASSIGN_OR_RETURN(styled, AnalyzeStyle(g, a, opts));
  }
  v1::AnalyzeResponse r = AnalysisToProto(g, a, styled ? &styled->overrides : nullptr);
  if (styled) {
    *r.mutable_memory() = StateMemoryToProto(styled->memory);
    for (const ShardedState& s : styled->sharded_state) AddShardedState(s, r.add_sharded_state());
  }
  if (request.include_json())
    r.set_json(styled ? StyledAnalysisToJson(g, a, *styled) : AnalysisToJson(g, a));
  return r;
}

absl::StatusOr<v1::ExpandResponse> ExpandWithin(const v1::ExpandRequest& request,
                                                const CompileLimits& limits) {
  FXDP_RETURN_IF_ERROR(CheckWorldSize(request.world_size(), limits));
  ExpandOptions opts;
  opts.world_size = request.world_size();
  opts.before_rank_graphs = [&](int32_t graphs) {
    return CheckRankGraphs(request, limits, graphs);
  };
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
  opts.sync_batchnorm = request.sync_batchnorm();
  FXDP_ASSIGN_OR_RETURN(opts.style, StyleFromProto(request.style(), "ExpandRequest.style"));
  FXDP_ASSIGN_OR_RETURN(ir::Graph g, DecodeRequestGraph(request.has_graph(), request.graph()));
  FXDP_ASSIGN_OR_RETURN(BatchDimAnalysis a,
                        AnalyzeBatchDims(g, AnalyzeOptions{opts.world_size, opts.sync_batchnorm}));
  FXDP_ASSIGN_OR_RETURN(Expansion e, ExpandDataParallel(g, a, opts));
  v1::ExpandResponse r;
  r.set_identical(e.identical);
  for (const ir::Graph& rank_graph : e.distinct_graphs)
    *r.add_graphs() = ir::EncodeGraph(rank_graph);
  r.set_report_json(e.report.ToJson());
  r.set_report_table(e.report.ToTable());
  r.set_style(StyleToProto(opts.style));
  for (const ShardedState& s : e.sharded_state) AddShardedState(s, r.add_sharded_state());
  *r.mutable_memory() = StateMemoryToProto(ExpansionStateMemory(e));
  return r;
}

namespace {

// Hands the heap's free memory back to the system when a large request is
// done: glibc keeps what a 100 MB graph's decode and analysis freed (GBs)
// in its arenas otherwise.
class ReleaseMemoryAfter {
 public:
  explicit ReleaseMemoryAfter(int64_t request_bytes)
      : large_(request_bytes >= (int64_t{16} << 20)) {}
  ~ReleaseMemoryAfter() {
    if (large_) malloc_trim(0);
  }

 private:
  const bool large_;
};

// A ByteBuffer over `bytes` without copying them: the slice holds a reference.
grpc::ByteBuffer SharedBuffer(CachedBytes bytes) {
  auto* holder = new CachedBytes(std::move(bytes));
  grpc::Slice slice(
      const_cast<char*>((*holder)->data()), (*holder)->size(),
      [](void* p) { delete static_cast<CachedBytes*>(p); }, holder);
  return grpc::ByteBuffer(&slice, 1);
}

// Computes `request` with `run`; caches the response (serialized, cached =
// true) under `key` and returns it with cached = false.
// `run(request)`, with what it throws as a status: an allocation failure
// RESOURCE_EXHAUSTED naming the request, anything else INTERNAL.
template <typename Response, typename Request, typename Run>
absl::StatusOr<Response> Guarded(absl::string_view method, const Request& request, Run run) {
  try {
    return run(request);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the server ran out of memory computing the ", method, " request (world_size ",
                     request.world_size(), ", ", request.graph().nodes_size(),
                     " nodes); its other calls go on"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("computing the ", method, " request: ", e.what()));
  }
}

template <typename Response, typename Request, typename Run>
absl::StatusOr<Response> Compute(CompileCache& cache, absl::string_view method,
                                 const std::string& key, const Request& request, Run run) {
  absl::StatusOr<Response> r = Guarded<Response>(method, request, run);
  if (!r.ok()) return r;
  if (cache.enabled()) {
    r->set_cached(true);
    cache.Insert(key, std::make_shared<const std::string>(r->SerializeAsString()));
    r->set_cached(false);
  }
  return r;
}

// The message-level path: looks `request` up in `cache`; on a miss computes it.
template <typename Response, typename Request, typename Run>
absl::StatusOr<Response> Cached(CompileCache& cache, const CompileLimits& limits,
                                absl::string_view method, const Request& request, Run run) {
  const int64_t graph_bytes = static_cast<int64_t>(request.graph().ByteSizeLong());
  FXDP_RETURN_IF_ERROR(CheckCompileLimits(limits, absl::StrCat("the ", method, " request"),
                                          graph_bytes, request.graph().nodes_size()));
  ReleaseMemoryAfter release(graph_bytes);
  const std::string key = CompileCacheKey(method, request);
  if (CachedBytes hit = cache.Lookup(key)) {
    Response response;
    if (!response.ParseFromString(*hit))
      return absl::InternalError("cannot parse a cached response");
    return response;
  }
  return Compute<Response>(cache, method, key, request, run);
}

// A message-level result as an RPC's status and response.
template <typename Response>
grpc::Status Reply(absl::StatusOr<Response> r, Response* response) {
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

// The RPC path, bytes to bytes. A hit: hash the received bytes, send the
// cached ones. Otherwise parse, look up the canonical key (the same key
// unless the client serialized non-canonically), compute.
template <typename Request, typename Response, typename Run>
grpc::Status CachedRaw(CompileCache& cache, const CompileLimits& limits, absl::string_view method,
                       const grpc::ByteBuffer& in, grpc::ByteBuffer* out, Run run) {
  const std::string what = absl::StrCat("the ", method, " request");
  const int64_t size = in.Valid() ? static_cast<int64_t>(in.Length()) : 0;
  if (absl::Status s = CheckCompileLimits(limits, what, size, 0); !s.ok()) return ToGrpcStatus(s);
  std::vector<grpc::Slice> slices;
  if (in.Valid() && !in.Dump(&slices).ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the request");
  }
  absl::InlinedVector<absl::string_view, 4> chunks;
  chunks.reserve(slices.size());
  for (const grpc::Slice& s : slices) {
    chunks.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  const std::string wire_key = CompileCacheKeyOfBytes(method, chunks);
  if (CachedBytes hit = cache.Lookup(wire_key, /*count_miss=*/false)) {
    *out = SharedBuffer(std::move(hit));
    return grpc::Status::OK;
  }
  // One contiguous view of the bytes (joined only when gRPC split them).
  std::string joined;
  absl::string_view bytes;
  if (chunks.size() == 1) {
    bytes = chunks[0];
  } else {
    joined = absl::StrJoin(chunks, "");
    bytes = joined;
  }
  // The node limit before the parse allocates per node (~1 KB each).
  if (absl::Status s = CheckCompileLimits(limits, what, size, CountRequestGraphNodes(bytes));
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  ReleaseMemoryAfter release(size);
  google::protobuf::Arena arena;
  Request* request = google::protobuf::Arena::CreateMessage<Request>(&arena);
  const bool parsed = request->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  if (!parsed) {
    size_t bytes = 0;
    for (absl::string_view c : chunks) bytes += c.size();
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("the ", method, " request (", bytes,
                                     " bytes) is not a valid protobuf message of its type"));
  }
  const std::string key = CompileCacheKey(method, *request);
  if (CachedBytes hit = cache.Lookup(key)) {
    *out = SharedBuffer(std::move(hit));
    return grpc::Status::OK;
  }
  absl::StatusOr<Response> r = Compute<Response>(cache, method, key, *request, run);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *out = SharedBuffer(std::make_shared<const std::string>(r->SerializeAsString()));
  return grpc::Status::OK;
}

// The raw handlers' own work (the request's bytes, the parse, the cache,
// the response's serialization) with what it throws as a status.
template <typename Run>
grpc::Status RawGuarded(absl::string_view method, Run run) {
  try {
    return run();
  } catch (const std::bad_alloc&) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("the server ran out of memory handling the ", method,
                                     " request; its other calls go on"));
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        absl::StrCat("handling the ", method, " request: ", e.what()));
  }
}

}  // namespace

grpc::ServerUnaryReactor* CompileServiceImpl::Analyze(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auto who = security::CallPrincipal(auth_.get(), *context, "/fxdp.v1.CompileService/Analyze");
      !who.ok()) {
    reactor->Finish(ToGrpcStatus(who.status()));
    return reactor;
  }
  reactor->Finish(RawGuarded("Analyze", [&] {
    return CachedRaw<v1::AnalyzeRequest, v1::AnalyzeResponse>(cache_, limits_, "Analyze", *request,
                                                              response, AnalyzeRun());
  }));
  return reactor;
}

grpc::ServerUnaryReactor* CompileServiceImpl::Expand(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auto who = security::CallPrincipal(auth_.get(), *context, "/fxdp.v1.CompileService/Expand");
      !who.ok()) {
    reactor->Finish(ToGrpcStatus(who.status()));
    return reactor;
  }
  reactor->Finish(RawGuarded("Expand", [&] {
    return CachedRaw<v1::ExpandRequest, v1::ExpandResponse>(cache_, limits_, "Expand", *request,
                                                            response, ExpandRun());
  }));
  return reactor;
}

grpc::Status CompileServiceImpl::Analyze(grpc::ServerContext*, const v1::AnalyzeRequest* request,
                                         v1::AnalyzeResponse* response) {
  return Reply(Cached<v1::AnalyzeResponse>(cache_, limits_, "Analyze", *request, AnalyzeRun()),
               response);
}

grpc::Status CompileServiceImpl::Expand(grpc::ServerContext*, const v1::ExpandRequest* request,
                                        v1::ExpandResponse* response) {
  return Reply(ExpandCached(*request), response);
}

absl::StatusOr<v1::ExpandResponse> CompileServiceImpl::ExpandCached(
    const v1::ExpandRequest& request) {
  return Cached<v1::ExpandResponse>(cache_, limits_, "Expand", request, ExpandRun());
}

}  // namespace fxdp::server
