// CompileServiceImpl: fxdp.v1.CompileService (proto/fxdp/v1/compile.proto)
// over the library: ir::DecodeGraph -> AnalyzeBatchDims -> ExpandDataParallel.
//
// Thread-safe (the gRPC sync server calls it from its thread pool). Results
// are cached by a content hash of the request (compile_cache.h): the same
// submission twice is computed once, the second answer has cached = true.
// Errors are absl::Status from the library, mapped to grpc::Status once, in
// ToGrpcStatus (the codes are the same numbers).
#ifndef FXDP_SERVER_COMPILE_SERVICE_H_
#define FXDP_SERVER_COMPILE_SERVICE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "proto/fxdp/v1/compile.grpc.pb.h"
#include "server/compile_cache.h"

namespace fxdp::server {

// absl::Status -> grpc::Status, code and message kept.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The library calls behind the RPCs, without gRPC or the cache.
absl::StatusOr<v1::AnalyzeResponse> RunAnalyze(const v1::AnalyzeRequest& request);
absl::StatusOr<v1::ExpandResponse> RunExpand(const v1::ExpandRequest& request);

class CompileServiceImpl final : public v1::CompileService::Service {
 public:
  explicit CompileServiceImpl(CompileCacheOptions cache_options = {}) : cache_(cache_options) {}

  grpc::Status Analyze(grpc::ServerContext* context, const v1::AnalyzeRequest* request,
                       v1::AnalyzeResponse* response) override;
  grpc::Status Expand(grpc::ServerContext* context, const v1::ExpandRequest* request,
                      v1::ExpandResponse* response) override;

  CompileCacheStats cache_stats() const { return cache_.stats(); }

 private:
  CompileCache cache_;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_COMPILE_SERVICE_H_
