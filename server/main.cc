// fxdp-server: the gRPC front of the analysis and expansion library
// (fxdp.v1.CompileService) and the workers' endpoint (fxdp.v1.WorkerService:
// Attach, ListWorkers) and the job service (fxdp.v1.JobService: Submit, GetJob,
// ListJobs, CancelJob, FetchState: jobs run on the attached workers), with
// gRPC health checking and server reflection.
//
//   fxdp-server [flags]   (`fxdp-server --help`; parsed into a ServerConfig: config.h)
//
// Port 0 picks a free port; the server prints "listening on HOST:PORT" on
// stdout once it serves. SIGTERM / SIGINT shut it down cleanly (in-flight
// calls get a few seconds to finish; local workers are stopped first), exit
// status 0.
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "security/server_auth.h"
#include "server/audit.h"
#include "server/compile/compile_service.h"
#include "server/config.h"
#include "server/jobs/job_service.h"
#include "server/jobs/job_store.h"
#include "server/listen_check.h"
#include "server/metrics_http.h"
#include "server/parse_errors.h"
#include "server/workers/local_workers.h"
#include "server/workers/worker_registry.h"
#include "util/data_roots.h"

namespace fxdp::server {
namespace {

// Blocked repeated wrong tokens and their counts go to the audit log.
void AuditAuthFailures(security::ServerSecurityOptions* o) {
  o->auth_limits.on_block = [](const std::string& peer, int failures) {
    Audit("auth_blocked", {{"peer", peer},
                           {"failures", absl::StrCat(failures)},
                           {"result", "its calls with a token are refused (--auth-block-s)"}});
  };
  o->auth_limits.on_failures = [](const std::string& host, int64_t failures) {
    Audit("auth_failed",
          {{"peer", host},
           {"failures", absl::StrCat(failures)},
           {"result", "wrong tokens since this host's last such line (UNAUTHENTICATED)"}});
  };
}

// The server's own files are never data (issue 25.3): refused at Submit and
// by the --local-workers as they open a path (--data-exclude).
void ExcludeServerFiles(ServerConfig* c) {
  for (const std::string* x : {&c->state_dir, &c->security.tls_key, &c->security.client_tokens,
                               &c->security.worker_token_file}) {
    if (!x->empty()) c->jobs.data_excluded.push_back(util::RealPathAsFarAsItExists(*x));
  }
}

// The services on --listen, with health checking, reflection and the
// parse-error interceptor; null (and `*port` 0) when it cannot listen.
std::unique_ptr<grpc::Server> StartServer(const ServerConfig& c,
                                          const std::shared_ptr<grpc::ServerCredentials>& creds,
                                          const std::vector<grpc::Service*>& services, int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(c.listen, creds, port);
  // No SO_REUSEPORT (gRPC's default on Linux): a second server on the port
  // must fail, not take half of the connections (listen_check.h).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  const int max_bytes = static_cast<int>(c.max_message_bytes);
  builder.SetMaxReceiveMessageSize(max_bytes);
  builder.SetMaxSendMessageSize(max_bytes);
  for (grpc::Service* s : services) builder.RegisterService(s);
  // Requests that do not parse are INVALID_ARGUMENT, not INTERNAL.
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MakeParseErrorInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) return nullptr;
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(v1::CompileService::service_full_name(), true);
  health->SetServingStatus(v1::WorkerService::service_full_name(), true);
  health->SetServingStatus(v1::JobService::service_full_name(), true);
  return server;
}

// --health-listen: a second server with nothing but its own health service.
std::unique_ptr<grpc::Server> StartHealth(const std::string& listen) {
  grpc::ServerBuilder hb;
  int health_port = 0;
  hb.AddListeningPort(listen, grpc::InsecureServerCredentials(), &health_port);
  hb.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<grpc::Server> health = hb.BuildAndStart();
  if (health == nullptr || health_port == 0) {
    std::fprintf(stderr, "fxdp-server: --health-listen: %s\n", WhyCannotListen(listen).c_str());
    return nullptr;
  }
  health->GetHealthCheckService()->SetServingStatus(true);
  std::fprintf(stderr, "fxdp-server: health checks (plain text, no fxdp service) on port %d\n",
               health_port);
  return health;
}

void PrintStarted(const ServerConfig& c, const security::ServerSecurity& security,
                  const std::string& host, int port) {
  std::printf("listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);
  for (const std::string& w : security.warnings)
    std::fprintf(stderr, "fxdp-server: %s\n", w.c_str());
  std::fprintf(stderr, "fxdp-server: security: %s%s\n", security.summary.c_str(),
               !security.tls && !security::IsLoopbackListen(c.listen)
                   ? " (--insecure: anyone who can reach this address has full access)"
                   : "");
}

// The --local-workers: they attach to the address the server listens on
// (loopback for a wildcard address), read data under the --data-root
// directories (default: the working directory and $TMPDIR or /tmp), never the
// server's files, with the server's CA and join token.
LocalWorkersOptions LocalWorkersOf(const ServerConfig& c, const security::ServerSecurity& security,
                                   const std::string& host, int port) {
  const bool wildcard = host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::";
  LocalWorkersOptions lw;
  lw.count = c.local_workers;
  lw.worker_binary = c.worker_binary;
  lw.server = (wildcard ? "127.0.0.1" : host) + ":" + std::to_string(port);
  lw.extra_args = {"--threads", "1"};
  if (!c.worker_memory_limit.empty()) {
    lw.extra_args.insert(lw.extra_args.end(), {"--memory-limit", c.worker_memory_limit});
  }
  std::vector<std::string> roots = c.data_roots;
  if (roots.empty()) {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) != nullptr) roots.push_back(cwd);
    const char* tmp = std::getenv("TMPDIR");
    const std::string tmp_dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    struct stat st {};
    if (stat(tmp_dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) roots.push_back(tmp_dir);
  }
  for (const std::string& r : roots) lw.extra_args.insert(lw.extra_args.end(), {"--data-root", r});
  for (const std::string& x : c.jobs.data_excluded) {
    lw.extra_args.insert(lw.extra_args.end(), {"--data-exclude", x});
  }
  lw.extra_args.insert(lw.extra_args.end(), {"--max-data-mb", std::to_string(c.max_data_mb)});
  if (security.tls && !c.security.tls_ca.empty()) {
    lw.extra_args.insert(lw.extra_args.end(), {"--tls-ca", c.security.tls_ca});
  }
  if (security.authenticates) {
    lw.extra_args.insert(lw.extra_args.end(), {"--token-file", c.security.worker_token_file});
  }
  return lw;
}

// Serves `c` until SIGTERM or SIGINT (blocked in every thread: taken here by sigwait).
int RunServer(ServerConfig c, sigset_t sigs) {
  AuditAuthFailures(&c.security);
  absl::StatusOr<security::ServerSecurity> security = security::MakeServerSecurity(c.security);
  if (!security.ok()) return ServerUsage(std::string(security.status().message()));
  if (std::string e = CheckServerConfig(security->tls, security->authenticates, &c); !e.empty()) {
    return ServerUsage(e);
  }
  CompileServiceImpl service(c.cache, c.limits, security->auth);
  WorkerRegistry registry(c.registry, security->auth);
  std::unique_ptr<JobStore> store;
  if (!c.state_dir.empty()) {
    absl::StatusOr<std::unique_ptr<JobStore>> opened = JobStore::Open(c.state_dir);
    if (!opened.ok()) return ServerUsage(std::string(opened.status().message()));
    store = *std::move(opened);
  }
  ExcludeServerFiles(&c);
  JobServiceImpl jobs(&service, &registry, c.jobs, store.get(), security->auth);
  registry.SetJobOwners([&jobs](const std::string& id) { return jobs.OwnerOf(id); });
  if (absl::Status s = jobs.Recover(); !s.ok()) {
    std::fprintf(stderr, "fxdp-server: --state-dir %s: %s\n", c.state_dir.c_str(),
                 std::string(s.message()).c_str());
    return 1;
  }
  int port = 0;
  std::unique_ptr<grpc::Server> server =
      StartServer(c, security->credentials, {&service, &registry, &jobs}, &port);
  if (server == nullptr) {
    std::fprintf(stderr, "fxdp-server: %s\n", WhyCannotListen(c.listen).c_str());
    return 1;
  }
  std::unique_ptr<grpc::Server> health;
  if (!c.health_listen.empty() && (health = StartHealth(c.health_listen)) == nullptr) {
    server->Shutdown();
    return 1;
  }
  const std::string host = c.listen.substr(0, c.listen.rfind(':'));
  std::unique_ptr<MetricsHttp> metrics;
  if (c.metrics_port >= 0) {
    absl::StatusOr<std::unique_ptr<MetricsHttp>> m = MetricsHttp::Start(
        host, static_cast<int>(c.metrics_port), [&jobs] { return jobs.Metrics(); });
    if (!m.ok()) {
      std::fprintf(stderr, "fxdp-server: %s\n", std::string(m.status().message()).c_str());
      server->Shutdown();
      return 1;
    }
    metrics = *std::move(m);
    std::fprintf(stderr, "fxdp-server: metrics on http://%s:%d/metrics\n", host.c_str(),
                 metrics->port());
  }
  PrintStarted(c, *security, host, port);
  LocalWorkers workers(LocalWorkersOf(c, *security, host, port));
  if (c.local_workers > 0) workers.Start();
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "fxdp-server: %s, shutting down\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    server->GetHealthCheckService()->SetServingStatus(false);
    if (health) health->GetHealthCheckService()->SetServingStatus(false);
    jobs.CancelAll("the server is shutting down");
    workers.Stop();
    registry.Shutdown();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  });
  server->Wait();
  waiter.join();
  if (health) health->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  const auto s = service.cache_stats();
  std::fprintf(stderr, "fxdp-server: stopped (cache: %lld hits, %lld misses, %lld entries)\n",
               static_cast<long long>(s.hits), static_cast<long long>(s.misses),
               static_cast<long long>(s.entries));
  return 0;
}

}  // namespace
}  // namespace fxdp::server

// Flags -> config -> run.
int main(int argc, char** argv) {
  fxdp::server::ServerConfig config;
  if (int rc =
          fxdp::server::ParseServerConfig(std::vector<std::string>(argv + 1, argv + argc), &config);
      rc >= 0) {
    return rc;
  }
  // Signals are taken by a dedicated thread (sigwait): block them before gRPC
  // starts its threads (creating credentials does), so that they all inherit the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  return fxdp::server::RunServer(std::move(config), sigs);
}
