// LocalWorkers: `fxdp-server --local-workers N` starts N `fxdp-worker attach`
// child processes on this host and keeps them running: one that exits is
// restarted after a backoff (0.5 s doubling to 10 s; back to 0.5 s once a
// worker ran 30 s), and Stop() ends them all (SIGTERM, SIGKILL after a grace
// period). Worker i registers as "local-<i>"; every start and exit is logged
// with its pid. The children also get SIGTERM when the server dies
// (PR_SET_PDEATHSIG), so that even a killed server leaves no orphans.
#ifndef FXDP_SERVER_WORKERS_LOCAL_WORKERS_H_
#define FXDP_SERVER_WORKERS_LOCAL_WORKERS_H_

#include <sys/types.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fxdp::server {

struct LocalWorkersOptions {
  int count = 0;
  std::string worker_binary;            // fxdp-worker
  std::string server;                   // HOST:PORT the workers attach to
  std::vector<std::string> extra_args;  // appended to `attach --server ... --worker-id ...`
};

class LocalWorkers {
 public:
  explicit LocalWorkers(LocalWorkersOptions options);
  ~LocalWorkers();  // Stop()

  // Starts the children and the supervising thread.
  void Start();
  // Ends every child and waits for it (SIGKILL after `grace_s`). Idempotent.
  void Stop(double grace_s = 5);

 private:
  struct Child {
    std::string id;
    pid_t pid = -1;
    double backoff_s = 0.5;
    std::chrono::steady_clock::time_point started, restart_at;
  };
  pid_t Spawn(const Child& c);
  void Supervise();

  const LocalWorkersOptions options_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<Child> children_;
  std::thread thread_;
};

// The fxdp-worker next to the running executable (/proc/self/exe).
std::string DefaultWorkerBinary();

}  // namespace fxdp::server

#endif  // FXDP_SERVER_WORKERS_LOCAL_WORKERS_H_
