#include "client/cli/connect.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"

namespace fxdp::cli {
namespace {

constexpr int kMaxMessageBytes = std::numeric_limits<int>::max();
constexpr int kConnectTimeoutS = 5;

// How to get a server to talk to (client/python/fxdp/rpc_errors.py says the same).
constexpr char kStartServer[] =
    "; start one there (`fxdp-server --local-workers 2` listens on 127.0.0.1:50051) or pass "
    "its address: --server HOST:PORT or FXDP_SERVER=HOST:PORT";

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

}  // namespace

void AddServerFlags(util::Flags* flags, std::string* server, security::ChannelSecurity* s) {
  flags->String("--server", server);
  s->tls_ca = Env("FXDP_TLS_CA");
  s->token_file = Env("FXDP_TOKEN_FILE");
  flags->String("--tls-ca", &s->tls_ca);
  flags->String("--token-file", &s->token_file);
}

void AddServerQueryFlags(util::Flags* flags, const std::string& default_server, ServerQuery* q) {
  q->server = default_server;
  AddServerFlags(flags, &q->server, &q->creds);
  flags->Bool("--json", &q->json);
}

int ParseGraphArgs(util::Flags* flags, const std::vector<std::string>& args, std::string* graph) {
  std::vector<std::string> pos;
  if (int rc = flags->Parse(args, &pos); rc >= 0) return rc;
  if (pos.size() != 1) return flags->Usage(pos.empty() ? "missing GRAPH" : "takes one GRAPH");
  *graph = pos[0];
  return -1;
}

int ParseGraphArgs(util::Flags* flags, const std::vector<std::string>& args, std::string* graph,
                   ir::InputShapes* shapes) {
  std::vector<std::string> texts;
  flags->Strings("--shape", &texts);
  if (int rc = ParseGraphArgs(flags, args, graph); rc >= 0) return rc;
  for (const std::string& t : texts) {
    absl::Status s = ir::ParseInputShape(t, shapes);
    if (!s.ok()) return flags->Usage(absl::StrCat("--shape: ", s.message()));
  }
  return -1;
}

std::shared_ptr<grpc::Channel> Connect(const std::string& cmd, const std::string& server,
                                       const security::ChannelSecurity& s, bool wait_ready) {
  grpc::ChannelArguments ch;
  ch.SetMaxReceiveMessageSize(kMaxMessageBytes);
  ch.SetMaxSendMessageSize(kMaxMessageBytes);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      security::MakeChannelCredentials(s, &ch);
  if (!creds.ok()) {
    std::fprintf(stderr, "fxdp %s: %s\n", cmd.c_str(),
                 std::string(creds.status().message()).c_str());
    return nullptr;
  }
  auto channel = grpc::CreateCustomChannel(server, *creds, ch);
  if (!wait_ready) return channel;
  const char* hint =
      s.tls_ca.empty() ? "" : "; with TLS, also check --tls-ca and the server's certificate";
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(kConnectTimeoutS);
  for (grpc_connectivity_state st = channel->GetState(true); st != GRPC_CHANNEL_READY;
       st = channel->GetState(true)) {
    if (st == GRPC_CHANNEL_TRANSIENT_FAILURE || st == GRPC_CHANNEL_SHUTDOWN) {
      std::fprintf(stderr, "fxdp %s: server %s is unreachable (the connection failed%s)%s\n",
                   cmd.c_str(), server.c_str(), hint, kStartServer);
      return nullptr;
    }
    if (!channel->WaitForStateChange(st, deadline)) {
      std::fprintf(stderr, "fxdp %s: server %s is unreachable (no connection within %d s%s)%s\n",
                   cmd.c_str(), server.c_str(), kConnectTimeoutS, hint, kStartServer);
      return nullptr;
    }
  }
  return channel;
}

std::string UnreachableHint(const grpc::Status& s) {
  if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return "";
  for (const char* text :
       {"failed to connect to all addresses", "DNS resolution failed", "Connection refused"}) {
    if (s.error_message().find(text) != std::string::npos) return kStartServer;
  }
  return "";
}

}  // namespace fxdp::cli
