// fxdp-server's configuration: every flag (`fxdp-server --help`, the usage
// text in config.cc) parsed into one ServerConfig, the values converted to
// the options of the parts they configure (MiB to bytes, counts to sizes).
// main.cc only runs what it describes.
#ifndef FXDP_SERVER_CONFIG_H_
#define FXDP_SERVER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "security/server_auth.h"
#include "server/compile/compile_service.h"
#include "server/jobs/job_options.h"
#include "server/workers/worker_registry.h"

namespace fxdp::server {

struct ServerConfig {
  std::string listen = "127.0.0.1:50051";
  int64_t max_message_bytes = int64_t{1024} << 20;  // --max-message-mb
  std::string health_listen;
  int64_t metrics_port = -1;  // --metrics-port (server/metrics_http.h); -1: off
  CompileCacheOptions cache;
  CompileLimits limits;
  WorkerRegistryOptions registry;
  JobServiceOptions jobs;
  std::string state_dir;
  security::ServerSecurityOptions security;
  bool insecure = false;
  // --local-workers: how many, their binary, memory limit and data roots,
  // the largest data file they read.
  int local_workers = 0;
  std::string worker_binary, worker_memory_limit;
  std::vector<std::string> data_roots;
  int64_t max_data_mb = 4096;
};

// Parses fxdp-server's arguments into `config`. -1 when the server should
// run; otherwise the exit code (0 after --help or --version, 2 after a usage
// error, printed with the usage).
int ParseServerConfig(const std::vector<std::string>& args, ServerConfig* config);

// Checks of a parsed config against the security it makes (`tls`,
// `authenticates`: MakeServerSecurity's), and the --local-workers binary
// (DefaultWorkerBinary when none was given): "" or the usage error.
std::string CheckServerConfig(bool tls, bool authenticates, ServerConfig* config);

// Prints "fxdp-server: `message`" and the usage to stderr; returns 2.
int ServerUsage(const std::string& message);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_CONFIG_H_
