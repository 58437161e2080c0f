// `fxdp-worker attach` (attach.h): flags, signals, and the daemon
// (attach_worker.h: the attachment, the message routing and the job's thread
// are in attach_session.cc, attach_routing.cc and attach_job.cc).
#include "executor/worker/attach.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "executor/worker/attach_worker.h"
#include "security/credentials.h"
#include "util/flags.h"

namespace fxdp::executor {

const char kAttachUsage[] =
    "usage: fxdp-worker attach [--server HOST:PORT] [--device cpu|cuda:N] [--worker-id ID]\n"
    "                          [--heartbeat-ms 1000] [--threads N] [--max-message-mb 1024]\n"
    "                          [--data-root DIR ...] [--data-exclude PATH ...]\n"
    "                          [--max-data-mb 65536]\n"
    "                          [--memory-limit SIZE]\n"
    "                          [--tls-ca FILE [--tls-cert FILE --tls-key FILE | --token-file "
    "FILE]]\n"
    "\n"
    "Serves an fxdp server as a worker daemon (protocol: proto/fxdp/v1/worker.proto,\n"
    "WorkerService.Attach). Connects to the server, registers (device, capacity 1, memory,\n"
    "versions), sends a heartbeat every --heartbeat-ms (or the interval the server asks\n"
    "for), and runs the jobs the server assigns, one at a time: for each, the rank's graph\n"
    "and initial state, a rendezvous with the job's other ranks (c10d TCPStore at the\n"
    "address the server gives, then Gloo), one step per batch the server sends (this\n"
    "rank's shard, or read from the job's data files on this host; each step answered\n"
    "with the global and local loss and timings), the state streamed back in chunks\n"
    "when asked. A failing job (bad graph or state, a kernel error, a lost peer) is\n"
    "reported to the server naming the job, rank and step; the worker stays attached and\n"
    "takes the next job. When the server goes away it reconnects with backoff (0.2 s\n"
    "doubling to 5 s). Logs go to stderr as '[worker ID] ...' and, about a job,\n"
    "'[job J rank R step S/K] ...'.\n"
    "\n"
    "  --server HOST:PORT    the fxdp server's worker endpoint (default $FXDP_SERVER,\n"
    "                        else 127.0.0.1:50051)\n"
    "  --device DEV          default device of the jobs: cpu (default) or cuda:N\n"
    "  --worker-id ID        the id to register with (default HOSTNAME:PID)\n"
    "  --heartbeat-ms MS     heartbeat interval unless the server sets one (default 1000)\n"
    "  --threads N           intra-op CPU threads per step (default: OMP_NUM_THREADS, else\n"
    "                        all cores; give 1 or cores/workers when several workers share\n"
    "                        a host)\n"
    "  --max-message-mb MB   largest message accepted from the server (default 1024: the\n"
    "                        graph travels in one message; state and batches are chunked)\n"
    "  --data-root DIR       a directory whose files jobs may name in data_paths; repeat\n"
    "                        for several. A path must lie under a root ('..' collapsed as\n"
    "                        text) and is opened beneath it without following any\n"
    "                        symbolic link (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS);\n"
    "                        only regular files are read. None given: jobs cannot read\n"
    "                        files on this worker\n"
    "  --data-exclude PATH   a file or directory under a root that jobs may never read\n"
    "                        (repeatable): give the server's --state-dir and its key and\n"
    "                        token files when they lie under a root (fxdp-server passes\n"
    "                        them to its --local-workers); this worker's own --tls-key\n"
    "                        and --token-file are always excluded\n"
    "  --max-data-mb MB      the bytes a job reads from its data files, in all: only the\n"
    "                        tensors its graph's inputs name are read (each is kept for\n"
    "                        the job; default 65536)\n"
    "  --memory-limit SIZE   the most memory the worker's tensors may hold at once (300MB,\n"
    "                        4GiB: powers of 1024). Enforced: an allocation past it fails\n"
    "                        the step (RESOURCE_EXHAUSTED naming the node), as a device of\n"
    "                        that size would. The worker registers the smallest of this,\n"
    "                        its cgroup's memory limit and the host's memory, and the\n"
    "                        server refuses to run a rank whose state needs more\n"
    "                        (docs/fully_shard.md: whether a model fits)\n"
    "  --tls-ca FILE         TLS: the CA of the server's certificate (docs/security.md)\n"
    "  --tls-cert FILE, --tls-key FILE\n"
    "                        mutual TLS: this worker's certificate (subject O=fxdp:workers)\n"
    "                        and key, signed by the server's --tls-ca\n"
    "  --token-file FILE     the server's worker join token (its --worker-token-file)\n"
    "  --tls-server-name N   the name the server's certificate is checked against (default:\n"
    "                        the host of --server)\n"
    "\n"
    "SIGTERM, SIGINT or the server's Shutdown: the job in progress is reported failed\n"
    "(CANCELLED), the stream is closed, exit status 0. Exit status 2: bad arguments.\n";

namespace {

// Signals: a handler writes to a pipe; a thread reads it.
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const char c = static_cast<char>(sig);
  if (g_signal_pipe[1] >= 0) (void)!write(g_signal_pipe[1], &c, 1);
}

// Serves until the server or a signal ends it. SIGTERM / SIGINT: a clean
// shutdown, from a thread (handlers cannot take locks or touch gRPC).
int ServeUntilSignalled(attach::AttachedWorker& worker) {
  if (pipe(g_signal_pipe) != 0) {
    std::perror("fxdp-worker attach: pipe");
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::thread signals([&worker] {
    char c = 0;
    while (true) {
      const ssize_t n = read(g_signal_pipe[0], &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || c == 0) return;  // 0: Serve returned
      worker.RequestShutdown(c == SIGINT ? "SIGINT" : "SIGTERM");
    }
  });
  const int code = worker.Serve();
  const char stop = 0;
  (void)!write(g_signal_pipe[1], &stop, 1);
  signals.join();
  std::fflush(stderr);
  return code;
}

}  // namespace

int AttachCommand(const std::vector<std::string>& argv) {
  attach::AttachOptions o;
  // The same default as every `fxdp` subcommand: $FXDP_SERVER, else fxdp-server's default.
  const char* env_server = std::getenv("FXDP_SERVER");
  o.server = env_server != nullptr && *env_server != '\0' ? env_server : "127.0.0.1:50051";
  util::Flags flags("fxdp-worker attach", kAttachUsage);
  flags.Custom("--server", "HOST:PORT", [&o](const std::string& v) {
    o.server = v;
    return !v.empty();
  });
  flags.String("--device", &o.device);
  flags.Custom("--worker-id", "an id without spaces or control characters",
               [&o](const std::string& v) {
                 o.worker_id = v;
                 return util::IsPlainName(v);
               });
  auto in_range = [](int* out, int max) {
    return [out, max](const std::string& v) {
      return absl::SimpleAtoi(v, out) && *out >= 1 && *out <= max;
    };
  };
  flags.Custom("--heartbeat-ms", "a positive number of milliseconds",
               in_range(&o.heartbeat_ms, 3600 * 1000));
  flags.Custom("--threads", "a positive integer", in_range(&o.threads, 4096));
  flags.Custom("--max-message-mb", "a positive integer", in_range(&o.max_message_mb, 1 << 20));
  flags.Custom("--data-root", "an existing directory", [&o](const std::string& v) {
    struct stat st {};
    if (v.empty() || stat(v.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    o.data_roots.push_back(v);
    return true;
  });
  flags.Custom("--data-exclude", "a PATH", [&o](const std::string& v) {
    o.data_excluded.push_back(v);
    return !v.empty();
  });
  flags.Custom("--max-data-mb", "a positive integer", in_range(&o.max_data_mb, 1 << 30));
  flags.Custom("--memory-limit", "a size in bytes (300MB, 4GiB)",
               [&o](const std::string& v) { return util::ParseByteSize(v, &o.memory_limit); });
  flags.String("--tls-ca", &o.creds.tls_ca);
  flags.String("--tls-cert", &o.creds.tls_cert);
  flags.String("--tls-key", &o.creds.tls_key);
  flags.String("--token-file", &o.creds.token_file);
  flags.String("--tls-server-name", &o.creds.server_name);
  if (int rc = flags.Parse(argv, nullptr); rc >= 0) return rc;
  if (absl::Status s = security::MakeChannelCredentials(o.creds, nullptr).status(); !s.ok()) {
    return flags.Usage(std::string(s.message()));
  }

  // The worker's own secrets are never data either, wherever they lie.
  for (const std::string* own : {&o.creds.tls_key, &o.creds.token_file})
    if (!own->empty()) o.data_excluded.push_back(*own);
  absl::StatusOr<util::DataRoots> roots = util::DataRoots::Open(o.data_roots, o.data_excluded);
  if (!roots.ok()) return flags.Usage(std::string(roots.status().message()));
  o.data_roots_opened = std::make_shared<const util::DataRoots>(*std::move(roots));
  attach::AttachedWorker worker(o);
  return ServeUntilSignalled(worker);
}
}  // namespace fxdp::executor
