// How every `fxdp` command that talks to fxdp-server connects: --tls-ca FILE
// (TLS: the CA the server's certificate must chain to) and --token-file FILE
// (a bearer token, sent over TLS only), defaulting to $FXDP_TLS_CA and
// $FXDP_TOKEN_FILE (docs/security.md).
#ifndef FXDP_CLIENT_CLI_CONNECT_H_
#define FXDP_CLIENT_CLI_CONNECT_H_

#include <memory>
#include <string>
#include <vector>

#include "analysis/ir/instantiate.h"
#include "grpcpp/grpcpp.h"
#include "security/credentials.h"
#include "util/flags.h"

namespace fxdp::cli {

// The usage lines of the two flags (for a command's usage text).
#define FXDP_CLI_CREDENTIAL_USAGE                                                           \
  "  --tls-ca FILE        TLS: the CA of the server's certificate (default $FXDP_TLS_CA)\n" \
  "  --token-file FILE    a bearer token for the server, sent over TLS (default\n"          \
  "                       $FXDP_TOKEN_FILE; see docs/security.md)\n"

// What every command that talks to fxdp-server takes: registers --server ADDR
// (into *server, whose value is the default) and --tls-ca / --token-file
// (into `s`, filled from the environment first).
void AddServerFlags(util::Flags* flags, std::string* server, security::ChannelSecurity* s);

// The flags of a command that asks the server and can answer in JSON:
// AddServerFlags, then --json. `default_server` is DefaultServer() for the job
// and worker commands, "" for analyze and expand (which then run locally).
struct ServerQuery {
  std::string server;
  security::ChannelSecurity creds;
  bool json = false;
};
void AddServerQueryFlags(util::Flags* flags, const std::string& default_server, ServerQuery* q);

// Parses the arguments of a command on one GRAPH file (analyze, expand) into
// *graph: the exit code to end with (usage printed), or -1 to go on.
int ParseGraphArgs(util::Flags* flags, const std::vector<std::string>& args, std::string* graph);
// The same with --shape NAME=8x60 (repeatable) into *shapes: the input shapes
// a symbolic graph is instantiated at (analysis/ir/instantiate.h).
int ParseGraphArgs(util::Flags* flags, const std::vector<std::string>& args, std::string* graph,
                   ir::InputShapes* shapes);
// The --shape lines of a command's usage.
#define FXDP_CLI_SHAPE_USAGE                                                              \
  "  --shape NAME=AxB     the shape of batch input NAME (repeat per input; NAME= for a\n" \
  "                       0-d input): a graph traced with symbolic sizes is first\n"      \
  "                       instantiated at these shapes, its guards checked\n"             \
  "                       (docs/shapes.md); a static graph's inputs must have them\n"

// A channel to `server` with `s`'s credentials; nullptr after printing
// "fxdp CMD: ..." when a credential file is bad or, with `wait_ready`, when
// no connection (TLS handshake included) is made within 5 s.
std::shared_ptr<grpc::Channel> Connect(const std::string& cmd, const std::string& server,
                                       const security::ChannelSecurity& s, bool wait_ready = true);

// "; start one there (...) or pass its address: ..." when `s` is gRPC's own
// failure to connect (a server's own UNAVAILABLE, e.g. a lost worker, gets ""):
// what to do about an unreachable server, as the Python client says it.
std::string UnreachableHint(const grpc::Status& s);

}  // namespace fxdp::cli

#endif  // FXDP_CLIENT_CLI_CONNECT_H_
