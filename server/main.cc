// fxdp-server: the gRPC front of the analysis and expansion library
// (fxdp.v1.CompileService) and the workers' endpoint (fxdp.v1.WorkerService:
// Attach, ListWorkers) and the job service (fxdp.v1.JobService: Submit, GetJob,
// ListJobs, CancelJob, FetchState: jobs run on the attached workers), with
// gRPC health checking and server reflection.
//
//   fxdp-server [flags]   (kUsage below, `fxdp-server --help`; parsed by util/flags)
//
// Port 0 picks a free port; the server prints "listening on HOST:PORT" on
// stdout once it serves. SIGTERM / SIGINT shut it down cleanly (in-flight
// calls get a few seconds to finish; local workers are stopped first), exit
// status 0.
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "analysis/ir/verifier.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "security/server_auth.h"
#include "server/audit.h"
#include "server/compile/compile_service.h"
#include "server/jobs/job_service.h"
#include "server/jobs/job_store.h"
#include "server/listen_check.h"
#include "server/parse_errors.h"
#include "server/workers/local_workers.h"
#include "server/workers/worker_registry.h"
#include "util/data_roots.h"
#include "util/flags.h"

namespace {

constexpr char kUsage[] =
    "usage: fxdp-server [--listen HOST:PORT] [--max-message-mb N] [--cache-entries N]\n"
    "                   [--cache-mb N] [--heartbeat-ms MS] [--local-workers N]\n"
    "                   [--worker-binary PATH] [--max-queued-jobs N] [--max-state-mb N]\n"
    "                   [--max-finished-jobs N] [--data-root DIR ...] [--queue-grace-s S]\n"
    "                   [--client-idle-s S] [--tls-cert FILE --tls-key FILE [--tls-ca FILE]]\n"
    "                   [--client-tokens FILE] [--worker-token-file FILE] [--insecure]\n"
    "                   [--health-listen HOST:PORT] [--state-dir DIR [--checkpoint-every K]]\n"
    "                   [--max-graph-nodes N] [--max-graph-mb N] [--max-worker-streams N]\n"
    "                   [--max-submit-streams N] [--register-deadline-s S]\n"
    "                   [--max-initial-state-mb N] [--max-batch-mb N]\n"
    "                   [--max-collective-timeout-s S]\n"
    "                   [--max-auth-failures N] [--auth-block-s S] [--max-data-mb N]\n"
    "                   [--max-world-size N] [--max-expanded-nodes N] [--max-expanded-mb N]\n"
    "                   [--max-fetch-streams N] [--max-fetch-streams-per-identity N]\n"
    "                   [--max-submit-streams-per-identity N] [--max-queued-jobs-per-identity N]\n"
    "\n"
    "Serves fxdp.v1.CompileService (Analyze, Expand), fxdp.v1.WorkerService (Attach:\n"
    "the workers' endpoint, ListWorkers) and fxdp.v1.JobService (Submit, GetJob, ListJobs,\n"
    "CancelJob, FetchState: data-parallel jobs on the attached workers, queued in FIFO\n"
    "order while too few are idle) over gRPC, with grpc.health.v1 health checking and\n"
    "server reflection.\n"
    "\n"
    "  --listen HOST:PORT    address to listen on (default 127.0.0.1:50051; port 0 picks\n"
    "                        a free port); prints 'listening on HOST:PORT' once serving\n"
    "  --max-message-mb N    largest message received or sent, MiB (default 1024)\n"
    "  --cache-entries N     compile cache: most results kept (default 256; 0 disables)\n"
    "  --cache-mb N          compile cache: most bytes kept, MiB (default 2048)\n"
    "  --heartbeat-ms MS     heartbeat interval asked of workers (default 1000); a worker\n"
    "                        silent for more than 3 intervals is LOST\n"
    "  --local-workers N     start N CPU workers ('fxdp-worker attach', ids local-0 ...)\n"
    "                        attached to this server; one that exits is restarted\n"
    "  --worker-memory-limit SIZE\n"
    "                        each of the --local-workers' memory (300MB, 4GiB: passed to\n"
    "                        'fxdp-worker attach --memory-limit', enforced there); a job\n"
    "                        whose per-rank state needs more is refused\n"
    "  --worker-binary PATH  the fxdp-worker for --local-workers (default: next to\n"
    "                        fxdp-server)\n"
    "  --data-root DIR       a directory the --local-workers may read JobSpec.data_paths\n"
    "                        from (repeatable; passed to 'fxdp-worker attach --data-root').\n"
    "                        Default: the server's working directory and $TMPDIR (else\n"
    "                        /tmp). Files elsewhere are refused naming the path and roots,\n"
    "                        and so are the --state-dir and the key and token files even\n"
    "                        under a root (at Submit, and by the workers: --data-exclude)\n"
    "  --max-data-mb N       what each of the --local-workers reads from a job's data\n"
    "                        files, MiB, in all (the tensors its graph's inputs name; passed\n"
    "                        to 'fxdp-worker attach --max-data-mb'; default 4096)\n"
    "  --max-queued-jobs N   jobs waiting for idle workers (FIFO); more are refused with\n"
    "                        RESOURCE_EXHAUSTED (default 64)\n"
    "  --max-state-mb N      final states kept for FetchState, MiB; the oldest is evicted\n"
    "                        first (default 2048)\n"
    "  --max-finished-jobs N finished jobs remembered for GetJob/ListJobs (default 1000)\n"
    "  --queue-grace-s S     a job needing more workers than are registered (not LOST)\n"
    "                        waits at most S seconds for them to attach, then fails with\n"
    "                        FAILED_PRECONDITION and the queue behind it moves on; once\n"
    "                        the server has been up S seconds such a Submit fails at once\n"
    "                        (default 10)\n"
    "  --client-idle-s S     a running job waiting on its client (for its initial state,\n"
    "                        or for a batch with no step in flight) fails with\n"
    "                        DEADLINE_EXCEEDED after S seconds without a message, freeing\n"
    "                        its workers; also the limit for a Submit's first message\n"
    "                        and for a FetchState client to take each chunk (default 60)\n"
    "  --max-collective-timeout-s S  the most a job's JobSpec.collective_timeout_s may\n"
    "                        ask for (it bounds each rendezvous and collective, so how long\n"
    "                        a hung peer can hold a worker); more is INVALID_ARGUMENT at\n"
    "                        Submit (default 600)\n"
    "  --state-dir DIR       keep the jobs in DIR (created): their records in SQLite\n"
    "                        (DIR/jobs.db), final states as safetensors files\n"
    "                        (DIR/states/). After a restart on the same DIR finished jobs\n"
    "                        are listed and fetchable, jobs that were running are FAILED\n"
    "                        ('the server restarted'), queued data_paths jobs run, other\n"
    "                        queued jobs are FAILED (their stream is gone); docs/jobs.md.\n"
    "                        Default: in memory only\n"
    "  --checkpoint-every K  with --state-dir: every K steps a running job's state is\n"
    "                        saved in DIR; after a restart a data_paths job resumes from\n"
    "                        its last checkpoint, and a FAILED job keeps it, for its\n"
    "                        client to resume (JobSpec.resume_job; default 0: none)\n"
    "  --max-graph-nodes N   nodes of one request's graph (Analyze, Expand, a job's\n"
    "                        spec); more is RESOURCE_EXHAUSTED (default 1000000)\n"
    "  --max-graph-mb N      bytes of one Analyze/Expand request (of the graph in a job's\n"
    "                        spec), MiB; more is RESOURCE_EXHAUSTED (default 256)\n"
    "  --max-worker-streams N  Attach streams at once (workers attached or attaching);\n"
    "                        more are RESOURCE_EXHAUSTED (default 1024)\n"
    "  --max-submit-streams N  Submit streams at once (jobs queued or running, and\n"
    "                        Submits not yet queued); more are RESOURCE_EXHAUSTED\n"
    "                        (default 256)\n"
    "  --register-deadline-s S  an Attach that sends no Register within S seconds is\n"
    "                        ended with DEADLINE_EXCEEDED (default 10)\n"
    "  --max-initial-state-mb N  initial states held at once, MiB: with --state-dir a\n"
    "                        data_paths job's state is taken at Submit and held until the\n"
    "                        job starts; a Submit whose graph declares more state than is\n"
    "                        free is RESOURCE_EXHAUSTED (default 4096)\n"
    "  --max-batch-mb N      one step's global batch as a streamed job's graph declares it\n"
    "                        (the server assembles it to slice it), MiB; more is\n"
    "                        RESOURCE_EXHAUSTED at Submit (default 2048)\n"
    "  --max-world-size N    world_size of an Analyze, Expand or job; more is\n"
    "                        RESOURCE_EXHAUSTED before anything is computed (default 1024)\n"
    "  --max-expanded-nodes N  the graph's nodes times the rank graphs an Expand (a job's)\n"
    "                        builds: one for all ranks, or one per rank when they differ\n"
    "                        (uneven batch split); more is RESOURCE_EXHAUSTED before any\n"
    "                        is built (default 1000000)\n"
    "  --max-expanded-mb N   the same in the graph's bytes, MiB (default 256)\n"
    "  --max-fetch-streams N FetchState calls at once (each holds one chunk: chunk_bytes\n"
    "                        is clamped to [64 KiB, 4 MiB]); more are RESOURCE_EXHAUSTED;\n"
    "                        a client that takes no chunk for --client-idle-s is cancelled\n"
    "                        (default 16)\n"
    "Per identity (with authentication; without it the server-wide limits alone hold),\n"
    "so that one tenant cannot lock the others out; over one: RESOURCE_EXHAUSTED naming\n"
    "the identity, its count and the flag:\n"
    "  --max-submit-streams-per-identity N  Submit streams (default 64)\n"
    "  --max-queued-jobs-per-identity N     queued jobs (default 16)\n"
    "  --max-fetch-streams-per-identity N   FetchState calls (default 4)\n"
    "\n"
    "Security (docs/security.md). Without the flags below the server serves plain gRPC\n"
    "without authentication, which it does only on a loopback --listen address:\n"
    "  --tls-cert FILE       TLS: the server's certificate chain (PEM); with --tls-key\n"
    "  --tls-key FILE        the certificate's private key (PEM)\n"
    "  --tls-ca FILE         mutual TLS: peers may present a certificate signed by this CA\n"
    "                        (identity = its CN; O=fxdp:workers a worker, O=fxdp:admins\n"
    "                        an admin client); the --local-workers check the server with it\n"
    "  --client-tokens FILE  clients' bearer tokens, lines 'TOKEN IDENTITY [admin]': a\n"
    "                        client sees and acts on its own jobs only, an admin on all\n"
    "  --worker-token-file FILE  the workers' join token (fxdp-worker attach --token-file)\n"
    "  --insecure            serve a non-loopback --listen without TLS (anyone who can\n"
    "                        reach the port can submit, read and cancel jobs and attach\n"
    "                        workers); refused otherwise\n"
    "  --health-listen HOST:PORT  also serve grpc.health.v1 alone, in plain text, here (for\n"
    "                        Kubernetes' gRPC probes, which cannot use TLS); no fxdp\n"
    "                        service is served on it\n"
    "  --max-auth-failures N after N wrong tokens within 60 s on one connection, its calls\n"
    "                        with a token are RESOURCE_EXHAUSTED for --auth-block-s\n"
    "                        (audit-logged once; default 20; 0: no limit)\n"
    "  --auth-block-s S      how long such a connection is refused (default 60)\n"
    "Any of --client-tokens, --worker-token-file, --tls-ca makes every call authenticate\n"
    "(UNAUTHENTICATED otherwise; health checks excepted) and needs TLS.\n"
    "\n"
    "SIGTERM or SIGINT shut the server down. Exit codes: 0 ok, 1 cannot listen (or read\n"
    "--state-dir), 2 usage.\n";

// An integer flag in [min, max] ("NAME needs an integer in [MIN, MAX], got 'V'").
void IntFlag(fxdp::util::Flags& f, const std::string& name, int64_t* out, int64_t min,
             int64_t max) {
  const std::string kind = max == INT64_MAX ? absl::StrCat("an integer >= ", min)
                                            : absl::StrCat("an integer in [", min, ", ", max, "]");
  f.Custom(name, kind, [out, min, max](const std::string& v) {
    int64_t x = 0;
    if (!absl::SimpleAtoi(v, &x) || x < min || x > max) return false;
    *out = x;
    return true;
  });
}

// Seconds in (0, one year].
void SecondsFlag(fxdp::util::Flags& f, const std::string& name, double* out) {
  f.Custom(name, "a number of seconds in (0, 31536000]", [out](const std::string& v) {
    double x = 0;
    if (!absl::SimpleAtod(v, &x) || !(x > 0) || x > 86400.0 * 365) return false;
    *out = x;
    return true;
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:50051";
  int64_t max_message_mb = 1024;
  fxdp::server::CompileCacheOptions cache;
  int64_t cache_mb = cache.max_bytes >> 20;
  int64_t heartbeat_ms = 1000, local_workers = 0;
  std::string worker_binary, worker_memory_limit;
  std::vector<std::string> data_roots;
  int64_t max_data_mb = 4096;
  fxdp::server::JobServiceOptions job_options;
  int64_t max_queued = static_cast<int64_t>(job_options.max_queued_jobs);
  int64_t max_state_mb = static_cast<int64_t>(job_options.max_state_bytes >> 20);
  int64_t max_finished = static_cast<int64_t>(job_options.max_finished_jobs);

  fxdp::util::Flags f("fxdp-server", kUsage);
  f.Custom("--listen", "HOST:PORT", [&](const std::string& v) {
    listen = v;
    return !v.empty();
  });
  IntFlag(f, "--max-message-mb", &max_message_mb, 1, 2047);
  IntFlag(f, "--cache-entries", &cache.max_entries, 0, INT64_MAX);
  IntFlag(f, "--cache-mb", &cache_mb, 0, INT64_MAX >> 20);
  IntFlag(f, "--heartbeat-ms", &heartbeat_ms, 1, 3600 * 1000);
  IntFlag(f, "--local-workers", &local_workers, 0, 256);
  f.Custom("--worker-memory-limit", "a size in bytes (300MB, 4GiB)", [&](const std::string& v) {
    int64_t bytes = 0;
    worker_memory_limit = v;
    return fxdp::util::ParseByteSize(v, &bytes);
  });
  f.Custom("--worker-binary", "a PATH", [&](const std::string& v) {
    worker_binary = v;
    return !v.empty();
  });
  f.Custom("--data-root", "an existing directory", [&](const std::string& v) {
    struct stat st {};
    if (v.empty() || stat(v.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    data_roots.push_back(v);
    return true;
  });
  IntFlag(f, "--max-data-mb", &max_data_mb, 1, 1 << 30);
  IntFlag(f, "--max-queued-jobs", &max_queued, 1, INT64_MAX);
  IntFlag(f, "--max-state-mb", &max_state_mb, 0, INT64_MAX >> 20);
  IntFlag(f, "--max-finished-jobs", &max_finished, 1, INT64_MAX);
  SecondsFlag(f, "--queue-grace-s", &job_options.queue_grace_s);
  SecondsFlag(f, "--client-idle-s", &job_options.client_idle_s);
  SecondsFlag(f, "--max-collective-timeout-s", &job_options.max_collective_timeout_s);
  fxdp::security::ServerSecurityOptions security_options;
  bool insecure = false;
  f.String("--tls-cert", &security_options.tls_cert);
  f.String("--tls-key", &security_options.tls_key);
  f.String("--tls-ca", &security_options.tls_ca);
  f.String("--client-tokens", &security_options.client_tokens);
  f.String("--worker-token-file", &security_options.worker_token_file);
  f.Bool("--insecure", &insecure);
  int64_t max_auth_failures = security_options.auth_limits.max_failures;
  IntFlag(f, "--max-auth-failures", &max_auth_failures, 0, 1 << 20);
  SecondsFlag(f, "--auth-block-s", &security_options.auth_limits.block_s);
  std::string health_listen;
  f.String("--health-listen", &health_listen);
  std::string state_dir;
  IntFlag(f, "--checkpoint-every", &job_options.checkpoint_every, 0, INT64_MAX);
  f.Custom("--state-dir", "a DIR", [&](const std::string& v) {
    state_dir = v;
    return !v.empty();
  });
  fxdp::server::CompileLimits limits;
  int64_t max_graph_mb = limits.max_request_bytes >> 20;
  IntFlag(f, "--max-graph-nodes", &limits.max_graph_nodes, 1, fxdp::ir::kMaxNodes);
  IntFlag(f, "--max-graph-mb", &max_graph_mb, 1, 2047);
  fxdp::server::WorkerRegistryOptions registry_options;
  int64_t max_worker_streams = registry_options.max_streams;
  int64_t max_submit_streams = static_cast<int64_t>(job_options.max_submit_streams);
  IntFlag(f, "--max-worker-streams", &max_worker_streams, 1, 1 << 20);
  IntFlag(f, "--max-submit-streams", &max_submit_streams, 1, 1 << 20);
  SecondsFlag(f, "--register-deadline-s", &registry_options.register_deadline_s);
  int64_t max_initial_state_mb = static_cast<int64_t>(job_options.max_initial_state_bytes >> 20);
  int64_t max_batch_mb = static_cast<int64_t>(job_options.max_batch_bytes >> 20);
  IntFlag(f, "--max-initial-state-mb", &max_initial_state_mb, 0, INT64_MAX >> 20);
  IntFlag(f, "--max-batch-mb", &max_batch_mb, 1, INT64_MAX >> 20);
  int64_t max_world_size = limits.max_world_size, max_expanded_mb = limits.max_expanded_bytes >> 20;
  IntFlag(f, "--max-world-size", &max_world_size, 1, INT32_MAX);
  IntFlag(f, "--max-expanded-nodes", &limits.max_expanded_nodes, 1, INT64_MAX);
  IntFlag(f, "--max-expanded-mb", &max_expanded_mb, 1, INT64_MAX >> 20);
  int64_t quotas[] = {static_cast<int64_t>(job_options.max_submit_streams_per_identity),
                      static_cast<int64_t>(job_options.max_queued_jobs_per_identity),
                      static_cast<int64_t>(job_options.max_fetch_streams),
                      static_cast<int64_t>(job_options.max_fetch_streams_per_identity)};
  IntFlag(f, "--max-submit-streams-per-identity", &quotas[0], 1, 1 << 20);
  IntFlag(f, "--max-queued-jobs-per-identity", &quotas[1], 1, INT64_MAX);
  IntFlag(f, "--max-fetch-streams", &quotas[2], 1, 1 << 20);
  IntFlag(f, "--max-fetch-streams-per-identity", &quotas[3], 1, 1 << 20);
  if (int rc = f.Parse(std::vector<std::string>(argv + 1, argv + argc), nullptr); rc >= 0)
    return rc;

  // Signals are taken by a dedicated thread (sigwait): block them before gRPC
  // starts its threads (creating credentials does), so that they all inherit the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  security_options.auth_limits.max_failures = static_cast<int>(max_auth_failures);
  security_options.auth_limits.on_block = [](const std::string& peer, int failures) {
    fxdp::server::Audit("auth_blocked",
                        {{"peer", peer},
                         {"failures", absl::StrCat(failures)},
                         {"result", "its calls with a token are refused (--auth-block-s)"}});
  };
  security_options.auth_limits.on_failures = [](const std::string& host, int64_t failures) {
    fxdp::server::Audit(
        "auth_failed",
        {{"peer", host},
         {"failures", absl::StrCat(failures)},
         {"result", "wrong tokens since this host's last such line (UNAUTHENTICATED)"}});
  };
  absl::StatusOr<fxdp::security::ServerSecurity> security =
      fxdp::security::MakeServerSecurity(security_options);
  if (!security.ok()) return f.Usage(std::string(security.status().message()));
  if (!security->tls && !insecure && !fxdp::security::IsLoopbackListen(listen)) {
    return f.Usage("--listen " + listen +
                   " is not a loopback address: serving it without TLS lets anyone who can reach "
                   "it submit, read and cancel jobs and attach workers. Give --tls-cert/--tls-key "
                   "(and --client-tokens, --worker-token-file; docs/security.md), or --insecure to "
                   "serve it in the clear anyway");
  }
  if (local_workers == 0 && !worker_memory_limit.empty()) {
    return f.Usage(
        "--worker-memory-limit applies to --local-workers (give each other worker its own "
        "'fxdp-worker attach --memory-limit')");
  }
  if (local_workers > 0 && security->tls && security_options.tls_ca.empty()) {
    return f.Usage(
        "--local-workers with TLS need --tls-ca (the CA they check the server's certificate with)");
  }
  if (local_workers > 0 && security->authenticates && security_options.worker_token_file.empty()) {
    return f.Usage(
        "--local-workers with authentication need --worker-token-file (their join token)");
  }

  cache.max_bytes = cache_mb << 20;
  job_options.max_queued_jobs = static_cast<size_t>(max_queued);
  job_options.max_state_bytes = static_cast<uint64_t>(max_state_mb) << 20;
  job_options.max_finished_jobs = static_cast<size_t>(max_finished);
  job_options.max_submit_streams = static_cast<size_t>(max_submit_streams);
  job_options.max_initial_state_bytes = static_cast<uint64_t>(max_initial_state_mb) << 20;
  job_options.max_batch_bytes = static_cast<uint64_t>(max_batch_mb) << 20;
  limits.max_request_bytes = max_graph_mb << 20;
  limits.max_world_size = static_cast<int32_t>(max_world_size);
  limits.max_expanded_bytes = max_expanded_mb << 20;
  job_options.max_submit_streams_per_identity = static_cast<size_t>(quotas[0]);
  job_options.max_queued_jobs_per_identity = static_cast<size_t>(quotas[1]);
  job_options.max_fetch_streams = static_cast<size_t>(quotas[2]);
  job_options.max_fetch_streams_per_identity = static_cast<size_t>(quotas[3]);
  registry_options.max_streams = static_cast<int>(max_worker_streams);
  if (local_workers > 0) {
    if (worker_binary.empty()) worker_binary = fxdp::server::DefaultWorkerBinary();
    if (access(worker_binary.c_str(), X_OK) != 0) {
      return f.Usage("--local-workers: no executable fxdp-worker at '" + worker_binary +
                     "' (set --worker-binary)");
    }
  }

  fxdp::server::CompileServiceImpl service(cache, limits, security->auth);
  registry_options.heartbeat_interval_ms = static_cast<int>(heartbeat_ms);
  fxdp::server::WorkerRegistry registry(registry_options, security->auth);
  if (job_options.checkpoint_every > 0 && state_dir.empty()) {
    return f.Usage("--checkpoint-every needs --state-dir (the checkpoints are kept there)");
  }
  std::unique_ptr<fxdp::server::JobStore> store;
  if (!state_dir.empty()) {
    absl::StatusOr<std::unique_ptr<fxdp::server::JobStore>> opened =
        fxdp::server::JobStore::Open(state_dir);
    if (!opened.ok()) return f.Usage(std::string(opened.status().message()));
    store = *std::move(opened);
  }
  // The server's own files are never data (issue 25.3): refused at Submit
  // and by the --local-workers as they open a path (--data-exclude).
  for (const std::string* x :
       {&state_dir, &security_options.tls_key, &security_options.client_tokens,
        &security_options.worker_token_file}) {
    if (!x->empty()) job_options.data_excluded.push_back(fxdp::util::RealPathAsFarAsItExists(*x));
  }
  fxdp::server::JobServiceImpl jobs(&service, &registry, job_options, store.get(), security->auth);
  registry.SetJobOwners([&jobs](const std::string& id) { return jobs.OwnerOf(id); });
  if (absl::Status s = jobs.Recover(); !s.ok()) {
    std::fprintf(stderr, "fxdp-server: --state-dir %s: %s\n", state_dir.c_str(),
                 std::string(s.message()).c_str());
    return 1;
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, security->credentials, &port);
  // No SO_REUSEPORT (gRPC's default on Linux): a second server on the port
  // must fail, not take half of the connections (listen_check.h).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  const int max_bytes = static_cast<int>(max_message_mb << 20);
  builder.SetMaxReceiveMessageSize(max_bytes);
  builder.SetMaxSendMessageSize(max_bytes);
  builder.RegisterService(&service);
  builder.RegisterService(&registry);
  builder.RegisterService(&jobs);
  // Requests that do not parse are INVALID_ARGUMENT, not INTERNAL.
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(fxdp::server::MakeParseErrorInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "fxdp-server: %s\n", fxdp::server::WhyCannotListen(listen).c_str());
    return 1;
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  server->GetHealthCheckService()->SetServingStatus(fxdp::v1::CompileService::service_full_name(),
                                                    true);
  server->GetHealthCheckService()->SetServingStatus(fxdp::v1::WorkerService::service_full_name(),
                                                    true);
  server->GetHealthCheckService()->SetServingStatus(fxdp::v1::JobService::service_full_name(),
                                                    true);
  // --health-listen: a second server with nothing but its own health service.
  std::unique_ptr<grpc::Server> health;
  if (!health_listen.empty()) {
    grpc::ServerBuilder hb;
    int health_port = 0;
    hb.AddListeningPort(health_listen, grpc::InsecureServerCredentials(), &health_port);
    hb.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    health = hb.BuildAndStart();
    if (health == nullptr || health_port == 0) {
      std::fprintf(stderr, "fxdp-server: --health-listen: %s\n",
                   fxdp::server::WhyCannotListen(health_listen).c_str());
      server->Shutdown();
      return 1;
    }
    health->GetHealthCheckService()->SetServingStatus(true);
    std::fprintf(stderr, "fxdp-server: health checks (plain text, no fxdp service) on port %d\n",
                 health_port);
  }
  const std::string host = listen.substr(0, listen.rfind(':'));
  std::printf("listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);
  for (const std::string& w : security->warnings)
    std::fprintf(stderr, "fxdp-server: %s\n", w.c_str());
  std::fprintf(stderr, "fxdp-server: security: %s%s\n", security->summary.c_str(),
               !security->tls && !fxdp::security::IsLoopbackListen(listen)
                   ? " (--insecure: anyone who can reach this address has full access)"
                   : "");

  // The workers attach to the address the server listens on (loopback for a
  // wildcard address).
  std::string worker_host = host;
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::")
    worker_host = "127.0.0.1";
  fxdp::server::LocalWorkersOptions lw;
  lw.count = static_cast<int>(local_workers);
  lw.worker_binary = worker_binary;
  lw.server = worker_host + ":" + std::to_string(port);
  lw.extra_args = {"--threads", "1"};
  if (!worker_memory_limit.empty()) {
    lw.extra_args.insert(lw.extra_args.end(), {"--memory-limit", worker_memory_limit});
  }
  if (data_roots.empty()) {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) != nullptr) data_roots.push_back(cwd);
    const char* tmp = std::getenv("TMPDIR");
    const std::string tmp_dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    struct stat st {};
    if (stat(tmp_dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) data_roots.push_back(tmp_dir);
  }
  for (const std::string& r : data_roots) {
    lw.extra_args.push_back("--data-root");
    lw.extra_args.push_back(r);
  }
  for (const std::string& x : job_options.data_excluded) {
    lw.extra_args.push_back("--data-exclude");
    lw.extra_args.push_back(x);
  }
  lw.extra_args.push_back("--max-data-mb");
  lw.extra_args.push_back(std::to_string(max_data_mb));
  if (security->tls && !security_options.tls_ca.empty()) {
    for (const char* a : {"--tls-ca", security_options.tls_ca.c_str()}) lw.extra_args.push_back(a);
  }
  if (security->authenticates) {
    for (const char* a : {"--token-file", security_options.worker_token_file.c_str()})
      lw.extra_args.push_back(a);
  }
  fxdp::server::LocalWorkers workers(lw);
  if (local_workers > 0) workers.Start();

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
