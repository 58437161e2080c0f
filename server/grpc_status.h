// The server's one mapping of a library error to the wire: every service
// (compile/, workers/, jobs/) answers an absl::Status through ToGrpcStatus.
#ifndef FXDP_SERVER_GRPC_STATUS_H_
#define FXDP_SERVER_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace fxdp::server {

// absl::Status -> grpc::Status, code and message kept (absl::StatusCode and
// grpc::StatusCode share google.rpc.Code's numbers).
inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(status.code())),
                      std::string(status.message()));
}

}  // namespace fxdp::server

#endif  // FXDP_SERVER_GRPC_STATUS_H_
