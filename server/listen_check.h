// Why fxdp-server could not listen on its --listen address. gRPC's
// BuildAndStart only says that it failed; this binds the address once more
// (as gRPC does: SO_REUSEADDR, never SO_REUSEPORT) to name the cause:
// "address 127.0.0.1:50051 is in use (another fxdp-server?)", or the
// system's error for it. The server sets GRPC_ARG_ALLOW_REUSEPORT to 0, so
// a second server on the same port fails here instead of sharing the port
// with the first (SO_REUSEPORT: the kernel split connections between them,
// issue 25).
#ifndef FXDP_SERVER_LISTEN_CHECK_H_
#define FXDP_SERVER_LISTEN_CHECK_H_

#include <string>

namespace fxdp::server {

// `listen` as --listen takes it: HOST:PORT ([V6]:PORT), or unix:PATH.
std::string WhyCannotListen(const std::string& listen);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_LISTEN_CHECK_H_
