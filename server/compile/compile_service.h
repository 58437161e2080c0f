// CompileServiceImpl: fxdp.v1.CompileService (proto/fxdp/v1/compile.proto)
// over the library: ir::DecodeGraph -> AnalyzeBatchDims -> ExpandDataParallel.
//
// Thread-safe. Analyze and Expand are served through gRPC's callback API as
// raw methods (grpc::ByteBuffer in and out, the wire messages unchanged): a
// cache hit hashes the received bytes and sends the cached serialized response
// by reference, with no parse, copy or serialization; a miss parses the
// request (on an arena) and computes inline. The message-level overloads do
// the same for in-process callers (JobServiceImpl, tests). Results are cached
// by a content hash of the request (compile_cache.h): the same submission
// twice is computed once, the second answer has cached = true.
// Errors are absl::Status from the library, mapped to grpc::Status once, in
// ToGrpcStatus (server/grpc_status.h). A request that runs the
// server out of memory (std::bad_alloc) is RESOURCE_EXHAUSTED naming it; no
// exception leaves a handler (gRPC would answer UNIMPLEMENTED with no text,
// and a job thread would abort the server).
#ifndef FXDP_SERVER_COMPILE_COMPILE_SERVICE_H_
#define FXDP_SERVER_COMPILE_COMPILE_SERVICE_H_

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "proto/fxdp/v1/compile.grpc.pb.h"
#include "security/call_auth.h"
#include "server/compile/compile_cache.h"

namespace fxdp::server {

// What one compile request may cost (docs/robustness.md): checked before the
// request is parsed (raw RPCs: its size, and its graph's nodes counted on the
// wire) or, for in-process callers (a job's spec), before it is decoded; the
// world size before anything else, the rank graphs before the first is
// built. Over a limit: RESOURCE_EXHAUSTED naming the limit, its flag and the
// value.
struct CompileLimits {
  // --max-graph-nodes: nodes of the request's graph.
  int64_t max_graph_nodes = 1000000;
  // --max-graph-mb: serialized bytes of an Analyze/Expand request (of the
  // GraphDef, for a job's spec).
  int64_t max_request_bytes = int64_t{256} << 20;
  // --max-world-size: world_size of an Analyze/Expand request (a job's).
  int32_t max_world_size = 1024;
  // --max-expanded-nodes: the request graph's nodes times the rank graphs
  // an Expand builds (one when every rank runs the same graph, world_size
  // when they differ: an uneven batch split, per-rank slices). Each costs
  // ~3 KB (measured: 20 nodes x 30,000 rank graphs peaked at +1.6 GB), so
  // the defaults let an Expand cost what one graph at --max-graph-nodes and
  // --max-graph-mb does.
  int64_t max_expanded_nodes = 1000000;
  // --max-expanded-mb: the request graph's bytes times those rank graphs.
  int64_t max_expanded_bytes = int64_t{256} << 20;
};

// The library calls behind the RPCs, without gRPC or the cache, within
// `limits` (the one-argument forms: within the defaults).
absl::StatusOr<v1::AnalyzeResponse> RunAnalyze(const v1::AnalyzeRequest& request);
absl::StatusOr<v1::ExpandResponse> RunExpand(const v1::ExpandRequest& request);
absl::StatusOr<v1::AnalyzeResponse> AnalyzeWithin(const v1::AnalyzeRequest& request,
                                                  const CompileLimits& limits);
absl::StatusOr<v1::ExpandResponse> ExpandWithin(const v1::ExpandRequest& request,
                                                const CompileLimits& limits);

// OK, or RESOURCE_EXHAUSTED naming the limit: `what` ("the Analyze request")
// is `bytes` long and its graph has `nodes` nodes.
absl::Status CheckCompileLimits(const CompileLimits& limits, absl::string_view what, int64_t bytes,
                                int64_t nodes);
// Nodes of the `graph` field (1) of a serialized AnalyzeRequest or
// ExpandRequest, counted without parsing; -1 when the bytes are malformed.
int64_t CountRequestGraphNodes(absl::string_view request_bytes);

class CompileServiceImpl final
    : public v1::CompileService::WithRawCallbackMethod_Analyze<
          v1::CompileService::WithRawCallbackMethod_Expand<v1::CompileService::Service>> {
 public:
  // `auth`: who may call (call_auth.h); null: the server does not authenticate.
  explicit CompileServiceImpl(CompileCacheOptions cache_options = {}, CompileLimits limits = {},
                              std::shared_ptr<security::CallAuth> auth = nullptr)
      : cache_(cache_options), limits_(limits), auth_(std::move(auth)) {}

  // The RPCs (gRPC calls these; the bytes are compile.proto's messages).
  grpc::ServerUnaryReactor* Analyze(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Expand(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;

  // The same, message to message, for in-process callers (same cache).
  grpc::Status Analyze(grpc::ServerContext* context, const v1::AnalyzeRequest* request,
                       v1::AnalyzeResponse* response) override;
  grpc::Status Expand(grpc::ServerContext* context, const v1::ExpandRequest* request,
                      v1::ExpandResponse* response) override;

  // Expand through the cache, for the job service (absl::Status).
  absl::StatusOr<v1::ExpandResponse> ExpandCached(const v1::ExpandRequest& request);

  CompileCacheStats cache_stats() const { return cache_.stats(); }

 private:
  // The library calls within limits_.
  auto AnalyzeRun() const {
    return [this](const v1::AnalyzeRequest& r) { return AnalyzeWithin(r, limits_); };
  }
  auto ExpandRun() const {
    return [this](const v1::ExpandRequest& r) { return ExpandWithin(r, limits_); };
  }

  CompileCache cache_;
  const CompileLimits limits_;
  const std::shared_ptr<security::CallAuth> auth_;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_COMPILE_COMPILE_SERVICE_H_
