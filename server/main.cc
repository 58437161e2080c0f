// fxdp-server: the gRPC front of the analysis and expansion library
// (fxdp.v1.CompileService), with gRPC health checking and server reflection.
//
//   fxdp-server [--listen HOST:PORT] [--max-message-mb N] [--cache-entries N]
//               [--cache-mb N]
//
// Port 0 picks a free port; the server prints "listening on HOST:PORT" on
// stdout once it serves. SIGTERM / SIGINT shut it down cleanly (in-flight
// calls get a few seconds to finish), exit status 0.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/compile_service.h"

namespace {

constexpr char kUsage[] =
    "usage: fxdp-server [--listen HOST:PORT] [--max-message-mb N] [--cache-entries N]\n"
    "                   [--cache-mb N]\n"
    "\n"
    "Serves fxdp.v1.CompileService (Analyze, Expand) over gRPC, with grpc.health.v1\n"
    "health checking and server reflection.\n"
    "\n"
    "  --listen HOST:PORT    address to listen on (default 127.0.0.1:50051; port 0 picks\n"
    "                        a free port); prints 'listening on HOST:PORT' once serving\n"
    "  --max-message-mb N    largest message received or sent, MiB (default 1024)\n"
    "  --cache-entries N     compile cache: most results kept (default 256; 0 disables)\n"
    "  --cache-mb N          compile cache: most bytes kept, MiB (default 2048)\n"
    "  --local-workers N     start N CPU workers (not implemented yet)\n"
    "\n"
    "SIGTERM or SIGINT shut the server down. Exit codes: 0 ok, 1 cannot listen, 2 usage.\n";

int Usage(const std::string& msg) {
  std::fprintf(stderr, "fxdp-server: %s\n\n%s", msg.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:50051";
  int64_t max_message_mb = 1024;
  fxdp::server::CompileCacheOptions cache;
  int64_t cache_mb = cache.max_bytes >> 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], value;
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    bool inline_value = false;
    if (size_t eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      inline_value = true;
    }
    auto next = [&]() -> bool {
      if (inline_value) return true;
      if (i + 1 >= argc) return false;
      value = argv[++i];
      return true;
    };
    auto int_flag = [&](int64_t* out, int64_t min) -> int {
      if (!next()) return Usage(a + " needs an integer");
      if (!absl::SimpleAtoi(value, out) || *out < min)
        return Usage(a + " needs an integer >= " + std::to_string(min) + ", got '" + value + "'");
      return -1;
    };
    int rc = -1;
    if (a == "--listen") {
      if (!next() || value.empty()) return Usage("--listen needs HOST:PORT");
      listen = value;
    } else if (a == "--max-message-mb") {
      rc = int_flag(&max_message_mb, 1);
      if (rc < 0 && max_message_mb > 2047) return Usage("--max-message-mb must be <= 2047");
    } else if (a == "--cache-entries") {
      rc = int_flag(&cache.max_entries, 0);
    } else if (a == "--cache-mb") {
      rc = int_flag(&cache_mb, 0);
    } else if (a == "--local-workers") {
      int64_t n = 0;
      rc = int_flag(&n, 0);
      if (rc < 0) {
        std::fprintf(stderr, "fxdp-server: --local-workers is not implemented yet\n");
        return 2;
      }
    } else {
      return Usage("unknown argument '" + a + "'");
    }
    if (rc >= 0) return rc;
  }
  cache.max_bytes = cache_mb << 20;

  // Signals are taken by a dedicated thread (sigwait): block them before gRPC
  // starts its threads, so that they all inherit the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  fxdp::server::CompileServiceImpl service(cache);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  const int max_bytes = static_cast<int>(max_message_mb << 20);
  builder.SetMaxReceiveMessageSize(max_bytes);
  builder.SetMaxSendMessageSize(max_bytes);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "fxdp-server: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  server->GetHealthCheckService()->SetServingStatus(
      fxdp::v1::CompileService::service_full_name(), true);
  const std::string host = listen.substr(0, listen.rfind(':'));
  std::printf("listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "fxdp-server: %s, shutting down\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    server->GetHealthCheckService()->SetServingStatus(false);
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  });
  server->Wait();
  waiter.join();
  const auto s = service.cache_stats();
  std::fprintf(stderr, "fxdp-server: stopped (cache: %lld hits, %lld misses, %lld entries)\n",
               static_cast<long long>(s.hits), static_cast<long long>(s.misses),
               static_cast<long long>(s.entries));
  return 0;
}
