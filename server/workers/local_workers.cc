#include "server/workers/local_workers.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/log.h"

namespace fxdp::server {
namespace {

using Clock = std::chrono::steady_clock;

std::string ExitText(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return absl::StrCat("ended (wait status ", status, ")");
}

}  // namespace

std::string DefaultWorkerBinary() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "fxdp-worker";
  std::string self(buf, static_cast<size_t>(n));
  const size_t slash = self.rfind('/');
  return slash == std::string::npos ? "fxdp-worker" : self.substr(0, slash + 1) + "fxdp-worker";
}

LocalWorkers::LocalWorkers(LocalWorkersOptions options) : options_(std::move(options)) {}

LocalWorkers::~LocalWorkers() { Stop(); }

pid_t LocalWorkers::Spawn(const Child& c) {
  std::vector<std::string> args = {options_.worker_binary, "attach",      "--server",
                                   options_.server,        "--worker-id", c.id};
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls until exec.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // the server blocks SIGTERM/SIGINT
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    setpgid(0, 0);  // a ^C in the server's terminal is the server's to handle
    execv(argv[0], argv.data());
    const char msg[] = "fxdp-server: cannot exec the worker binary\n";
    (void)!write(2, msg, sizeof(msg) - 1);
    _exit(127);
  }
  if (pid < 0) {
    Log(absl::StrCat("local worker ", c.id, ": fork failed: ", std::strerror(errno)));
  } else {
    Log(absl::StrCat("local worker ", c.id, ": started pid ", pid, " (", options_.worker_binary,
                     " attach --server ", options_.server, ")"));
  }
  return pid;
}

void LocalWorkers::Start() {
  std::lock_guard<std::mutex> l(mu_);
  for (int i = 0; i < options_.count; ++i) {
    Child c;
    c.id = absl::StrCat("local-", i);
    c.pid = Spawn(c);
    c.started = Clock::now();
    c.restart_at = c.started + std::chrono::seconds(1);
    children_.push_back(std::move(c));
  }
  thread_ = std::thread(&LocalWorkers::Supervise, this);
}

void LocalWorkers::Supervise() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stopping_) {
    wake_.wait_for(l, std::chrono::milliseconds(100));
    if (stopping_) break;
    const auto now = Clock::now();
    for (Child& c : children_) {
      if (c.pid > 0) {
        int status = 0;
        const pid_t r = waitpid(c.pid, &status, WNOHANG);
        if (r != c.pid) continue;
        const double ran = std::chrono::duration<double>(now - c.started).count();
        if (ran > 30) c.backoff_s = 0.5;
        Log(absl::StrCat("local worker ", c.id, " (pid ", c.pid, ") ", ExitText(status), " after ",
                         static_cast<int>(ran), " s; restarting in ", c.backoff_s, " s"));
        c.pid = -1;
        c.restart_at = now + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(c.backoff_s));
        c.backoff_s = std::min(10.0, c.backoff_s * 2);
      } else if (now >= c.restart_at) {
        c.pid = Spawn(c);
        c.started = now;
        if (c.pid < 0) {
          c.restart_at = now + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(c.backoff_s));
          c.backoff_s = std::min(10.0, c.backoff_s * 2);
        }
      }
    }
  }
}

void LocalWorkers::Stop(double grace_s) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (Child& c : children_) {
    if (c.pid > 0) kill(c.pid, SIGTERM);
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(grace_s));
  for (Child& c : children_) {
    while (c.pid > 0) {
      int status = 0;
      const pid_t r = waitpid(c.pid, &status, WNOHANG);
      if (r == c.pid || (r < 0 && errno == ECHILD)) {
        Log(absl::StrCat("local worker ", c.id, " (pid ", c.pid, ") stopped: ", ExitText(status)));
        c.pid = -1;
      } else if (Clock::now() >= deadline) {
        Log(absl::StrCat("local worker ", c.id, " (pid ", c.pid, ") did not stop: SIGKILL"));
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &status, 0);
        c.pid = -1;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
}

}  // namespace fxdp::server
