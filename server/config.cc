#include "server/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "analysis/ir/verifier.h"
#include "server/workers/local_workers.h"
#include "util/flags.h"

namespace fxdp::server {
namespace {

constexpr char kUsage[] =
    "usage: fxdp-server [--listen HOST:PORT] [--max-message-mb N] [--cache-entries N]\n"
    "                   [--cache-mb N] [--heartbeat-ms MS] [--local-workers N]\n"
    "                   [--worker-binary PATH] [--max-queued-jobs N] [--max-state-mb N]\n"
    "                   [--max-finished-jobs N] [--data-root DIR ...] [--queue-grace-s S]\n"
    "                   [--client-idle-s S] [--keep-state-s S]\n"
    "                   [--tls-cert FILE --tls-key FILE [--tls-ca FILE]]\n"
    "                   [--client-tokens FILE] [--worker-token-file FILE] [--insecure]\n"
    "                   [--health-listen HOST:PORT] [--metrics-port PORT]\n"
    "                   [--state-dir DIR [--checkpoint-every K]]\n"
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
    "  --max-message-mb N    largest message received or sent, MiB (default 1024); tensor\n"
    "                        chunks are kept 64 KiB under it\n"
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
    "  --keep-state-s S      a running job that fails (bad input, an idle client) or is\n"
    "                        cancelled keeps the state of its last completed step: its\n"
    "                        ranks finish the steps sent and give their state, within S\n"
    "                        seconds (else its last checkpoint is kept; default 60)\n"
    "  --max-collective-timeout-s S  the most a job's JobSpec.collective_timeout_s may\n"
    "                        ask for (it bounds each rendezvous and collective, so how long\n"
    "                        a hung peer can hold a worker); more is INVALID_ARGUMENT at\n"
    "                        Submit (default 600)\n"
    "  --state-dir DIR       keep the jobs in DIR (created): their records in SQLite\n"
    "                        (DIR/jobs.db), final states as safetensors files\n"
    "                        (DIR/states/). After a restart on the same DIR finished jobs\n"
    "                        are listed and fetchable, data_paths jobs that were queued\n"
    "                        run, and running ones with a checkpoint (the server's or\n"
    "                        their workers') go on from it; other jobs that were running\n"
    "                        are FAILED ('the server restarted'), other queued jobs too\n"
    "                        (their stream is gone); docs/jobs.md.\n"
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
    "  --metrics-port PORT   also serve Prometheus text metrics (jobs and workers by state,\n"
    "                        steps, step time, bytes) at http://HOST:PORT/metrics, HOST\n"
    "                        being --listen's; plain HTTP, no authentication (0: a free\n"
    "                        port, printed); off by default\n"
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
void IntFlag(util::Flags& f, const std::string& name, int64_t* out, int64_t min, int64_t max) {
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
void SecondsFlag(util::Flags& f, const std::string& name, double* out) {
  f.Custom(name, "a number of seconds in (0, 31536000]", [out](const std::string& v) {
    double x = 0;
    if (!absl::SimpleAtod(v, &x) || !(x > 0) || x > 86400.0 * 365) return false;
    *out = x;
    return true;
  });
}

// The flags whose values are converted (MiB to bytes, to narrower types)
// once parsed; each starts at its option's default.
struct Raw {
  explicit Raw(const ServerConfig& c)
      : max_message_mb(c.max_message_bytes >> 20),
        cache_mb(c.cache.max_bytes >> 20),
        max_queued(static_cast<int64_t>(c.jobs.max_queued_jobs)),
        max_state_mb(static_cast<int64_t>(c.jobs.max_state_bytes >> 20)),
        max_finished(static_cast<int64_t>(c.jobs.max_finished_jobs)),
        max_auth_failures(c.security.auth_limits.max_failures),
        max_graph_mb(c.limits.max_request_bytes >> 20),
        max_worker_streams(c.registry.max_streams),
        max_submit_streams(static_cast<int64_t>(c.jobs.max_submit_streams)),
        max_initial_state_mb(static_cast<int64_t>(c.jobs.max_initial_state_bytes >> 20)),
        max_batch_mb(static_cast<int64_t>(c.jobs.max_batch_bytes >> 20)),
        max_world_size(c.limits.max_world_size),
        max_expanded_mb(c.limits.max_expanded_bytes >> 20),
        quotas{static_cast<int64_t>(c.jobs.max_submit_streams_per_identity),
               static_cast<int64_t>(c.jobs.max_queued_jobs_per_identity),
               static_cast<int64_t>(c.jobs.max_fetch_streams),
               static_cast<int64_t>(c.jobs.max_fetch_streams_per_identity)} {}

  int64_t max_message_mb, cache_mb, heartbeat_ms = 1000, local_workers = 0, max_queued,
                                    max_state_mb, max_finished, max_auth_failures, max_graph_mb,
                                    max_worker_streams, max_submit_streams, max_initial_state_mb,
                                    max_batch_mb, max_world_size, max_expanded_mb;
  int64_t quotas[4];  // submit streams and queued jobs per identity, fetch streams, per identity
};

// --listen, the compile service's cache and limits, the workers.
void AddServingFlags(util::Flags& f, ServerConfig* c, Raw* r) {
  f.Custom("--listen", "HOST:PORT", [c](const std::string& v) {
    c->listen = v;
    return !v.empty();
  });
  f.String("--health-listen", &c->health_listen);
  IntFlag(f, "--metrics-port", &c->metrics_port, 0, 65535);
  IntFlag(f, "--max-message-mb", &r->max_message_mb, 1, 2047);
  IntFlag(f, "--cache-entries", &c->cache.max_entries, 0, INT64_MAX);
  IntFlag(f, "--cache-mb", &r->cache_mb, 0, INT64_MAX >> 20);
  IntFlag(f, "--max-graph-nodes", &c->limits.max_graph_nodes, 1, ir::kMaxNodes);
  IntFlag(f, "--max-graph-mb", &r->max_graph_mb, 1, 2047);
  IntFlag(f, "--max-world-size", &r->max_world_size, 1, INT32_MAX);
  IntFlag(f, "--max-expanded-nodes", &c->limits.max_expanded_nodes, 1, INT64_MAX);
  IntFlag(f, "--max-expanded-mb", &r->max_expanded_mb, 1, INT64_MAX >> 20);
  IntFlag(f, "--heartbeat-ms", &r->heartbeat_ms, 1, 3600 * 1000);
  IntFlag(f, "--max-worker-streams", &r->max_worker_streams, 1, 1 << 20);
  SecondsFlag(f, "--register-deadline-s", &c->registry.register_deadline_s);
  IntFlag(f, "--local-workers", &r->local_workers, 0, 256);
  f.Custom("--worker-memory-limit", "a size in bytes (300MB, 4GiB)", [c](const std::string& v) {
    int64_t bytes = 0;
    c->worker_memory_limit = v;
    return util::ParseByteSize(v, &bytes);
  });
  f.Custom("--worker-binary", "a PATH", [c](const std::string& v) {
    c->worker_binary = v;
    return !v.empty();
  });
  f.Custom("--data-root", "an existing directory", [c](const std::string& v) {
    struct stat st {};
    if (v.empty() || stat(v.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    c->data_roots.push_back(v);
    return true;
  });
  IntFlag(f, "--max-data-mb", &c->max_data_mb, 1, 1 << 30);
}

// The job service: queue, history, states, client and collective timeouts, quotas.
void AddJobFlags(util::Flags& f, ServerConfig* c, Raw* r) {
  IntFlag(f, "--max-queued-jobs", &r->max_queued, 1, INT64_MAX);
  IntFlag(f, "--max-state-mb", &r->max_state_mb, 0, INT64_MAX >> 20);
  IntFlag(f, "--max-finished-jobs", &r->max_finished, 1, INT64_MAX);
  SecondsFlag(f, "--queue-grace-s", &c->jobs.queue_grace_s);
  SecondsFlag(f, "--client-idle-s", &c->jobs.client_idle_s);
  SecondsFlag(f, "--keep-state-s", &c->jobs.keep_state_s);
  SecondsFlag(f, "--max-collective-timeout-s", &c->jobs.max_collective_timeout_s);
  IntFlag(f, "--checkpoint-every", &c->jobs.checkpoint_every, 0, INT64_MAX);
  f.Custom("--state-dir", "a DIR", [c](const std::string& v) {
    c->state_dir = v;
    return !v.empty();
  });
  IntFlag(f, "--max-submit-streams", &r->max_submit_streams, 1, 1 << 20);
  IntFlag(f, "--max-initial-state-mb", &r->max_initial_state_mb, 0, INT64_MAX >> 20);
  IntFlag(f, "--max-batch-mb", &r->max_batch_mb, 1, INT64_MAX >> 20);
  IntFlag(f, "--max-submit-streams-per-identity", &r->quotas[0], 1, 1 << 20);
  IntFlag(f, "--max-queued-jobs-per-identity", &r->quotas[1], 1, INT64_MAX);
  IntFlag(f, "--max-fetch-streams", &r->quotas[2], 1, 1 << 20);
  IntFlag(f, "--max-fetch-streams-per-identity", &r->quotas[3], 1, 1 << 20);
}

void AddSecurityFlags(util::Flags& f, ServerConfig* c, Raw* r) {
  f.String("--tls-cert", &c->security.tls_cert);
  f.String("--tls-key", &c->security.tls_key);
  f.String("--tls-ca", &c->security.tls_ca);
  f.String("--client-tokens", &c->security.client_tokens);
  f.String("--worker-token-file", &c->security.worker_token_file);
  f.Bool("--insecure", &c->insecure);
  IntFlag(f, "--max-auth-failures", &r->max_auth_failures, 0, 1 << 20);
  SecondsFlag(f, "--auth-block-s", &c->security.auth_limits.block_s);
}

void Apply(const Raw& r, ServerConfig* c) {
  c->max_message_bytes = r.max_message_mb << 20;
  c->cache.max_bytes = r.cache_mb << 20;
  c->limits.max_request_bytes = r.max_graph_mb << 20;
  c->limits.max_world_size = static_cast<int32_t>(r.max_world_size);
  c->limits.max_expanded_bytes = r.max_expanded_mb << 20;
  c->registry.heartbeat_interval_ms = static_cast<int>(r.heartbeat_ms);
  c->registry.max_streams = static_cast<int>(r.max_worker_streams);
  c->local_workers = static_cast<int>(r.local_workers);
  c->security.auth_limits.max_failures = static_cast<int>(r.max_auth_failures);
  JobServiceOptions& j = c->jobs;
  j.max_queued_jobs = static_cast<size_t>(r.max_queued);
  j.max_state_bytes = static_cast<uint64_t>(r.max_state_mb) << 20;
  j.max_finished_jobs = static_cast<size_t>(r.max_finished);
  j.max_submit_streams = static_cast<size_t>(r.max_submit_streams);
  j.max_initial_state_bytes = static_cast<uint64_t>(r.max_initial_state_mb) << 20;
  j.max_batch_bytes = static_cast<uint64_t>(r.max_batch_mb) << 20;
  j.max_submit_streams_per_identity = static_cast<size_t>(r.quotas[0]);
  j.max_queued_jobs_per_identity = static_cast<size_t>(r.quotas[1]);
  j.max_fetch_streams = static_cast<size_t>(r.quotas[2]);
  j.max_fetch_streams_per_identity = static_cast<size_t>(r.quotas[3]);
  LimitChunksToMessages(static_cast<size_t>(c->max_message_bytes), &j);
}

}  // namespace

int ParseServerConfig(const std::vector<std::string>& args, ServerConfig* config) {
  Raw raw(*config);
  util::Flags f("fxdp-server", kUsage);
  AddServingFlags(f, config, &raw);
  AddJobFlags(f, config, &raw);
  AddSecurityFlags(f, config, &raw);
  if (int rc = f.Parse(args, nullptr); rc >= 0) return rc;
  Apply(raw, config);
  return -1;
}

std::string CheckServerConfig(bool tls, bool authenticates, ServerConfig* c) {
  if (!tls && !c->insecure && !security::IsLoopbackListen(c->listen)) {
    return "--listen " + c->listen +
           " is not a loopback address: serving it without TLS lets anyone who can reach "
           "it submit, read and cancel jobs and attach workers. Give --tls-cert/--tls-key "
           "(and --client-tokens, --worker-token-file; docs/security.md), or --insecure to "
           "serve it in the clear anyway";
  }
  if (c->local_workers == 0 && !c->worker_memory_limit.empty()) {
    return "--worker-memory-limit applies to --local-workers (give each other worker its own "
           "'fxdp-worker attach --memory-limit')";
  }
  if (c->local_workers > 0 && tls && c->security.tls_ca.empty()) {
    return "--local-workers with TLS need --tls-ca (the CA they check the server's certificate "
           "with)";
  }
  if (c->local_workers > 0 && authenticates && c->security.worker_token_file.empty()) {
    return "--local-workers with authentication need --worker-token-file (their join token)";
  }
  if (c->local_workers > 0) {
    if (c->worker_binary.empty()) c->worker_binary = DefaultWorkerBinary();
    if (access(c->worker_binary.c_str(), X_OK) != 0) {
      return "--local-workers: no executable fxdp-worker at '" + c->worker_binary +
             "' (set --worker-binary)";
    }
  }
  if (c->jobs.checkpoint_every > 0 && c->state_dir.empty()) {
    return "--checkpoint-every needs --state-dir (the checkpoints are kept there)";
  }
  return "";
}

int ServerUsage(const std::string& message) {
  return util::Flags("fxdp-server", kUsage).Usage(message);
}

}  // namespace fxdp::server
