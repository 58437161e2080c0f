// `fxdp-worker attach`: the worker daemon that serves an fxdp server over the
// worker protocol (proto/fxdp/v1/worker.proto, WorkerService.Attach).
//
// The worker is the gRPC client. It registers (device, capacity, memory,
// versions), heartbeats from its own thread, and runs one job at a time: an
// AssignJob (rank, world size, rendezvous, graph) followed by the initial
// state in chunks sets the job up (c10d TCPStore rendezvous + Gloo for world
// size > 1, the LibTorch interpreter), each Batch runs one step and is
// answered by a StepResult, FetchState streams the state back in chunks,
// CancelJob abandons the job. A failure is reported as JobFailed naming the
// job, rank and step, and the worker stays attached and IDLE. If the server
// goes away the worker reconnects with backoff; Shutdown or SIGTERM/SIGINT
// make it exit cleanly (status 0).
#ifndef FXDP_EXECUTOR_WORKER_ATTACH_H_
#define FXDP_EXECUTOR_WORKER_ATTACH_H_

#include <string>
#include <vector>

namespace fxdp::executor {

// The usage text of `fxdp-worker attach --help`.
extern const char kAttachUsage[];

// Runs `fxdp-worker attach ARGS...` (args exclude "attach"); returns the exit
// code (0 after Shutdown or SIGTERM, 2 for bad arguments).
int AttachCommand(const std::vector<std::string>& args);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_WORKER_ATTACH_H_
