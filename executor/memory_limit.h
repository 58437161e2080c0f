// The memory a worker offers jobs, and the cap that makes it true.
//
// `fxdp-worker --memory-limit BYTES` caps the bytes of CPU tensors the
// process holds at once: torch's CPU allocator is wrapped so that an
// allocation that would take the live total past the cap throws
// c10::OutOfMemoryError before any memory is taken, as a device of that size
// would (the CPU analogue of torch.cuda.set_per_process_memory_fraction).
// The interpreter reports it as RESOURCE_EXHAUSTED naming the node; the job
// fails naming the rank and step, the worker stays up. Tensor storage only:
// the process' own code, gRPC and Gloo's buffers outside tensors are not
// counted.
//
// The worker registers the smallest of the host's physical memory, its
// cgroup's memory limit (v2 memory.max, v1 memory.limit_in_bytes) and
// --memory-limit (worker.proto's Register.memory_bytes and memory_source);
// fxdp-server refuses a job whose per-rank state needs more
// (server/jobs/memory_admission.h).
#ifndef FXDP_EXECUTOR_MEMORY_LIMIT_H_
#define FXDP_EXECUTOR_MEMORY_LIMIT_H_

#include <cstdint>
#include <string>

namespace fxdp::executor {

// Installs the cap (once per process; a second call changes the limit).
void InstallCpuMemoryLimit(int64_t bytes);
// The cap (0: none), the bytes of tensors allocated through it now, and
// the most held at once since the last ResetPeakCpuTensorBytes.
int64_t CpuMemoryLimit();
int64_t CpuTensorBytesInUse();
int64_t PeakCpuTensorBytes();
void ResetPeakCpuTensorBytes();

// What the worker registers: the smallest known figure and where it comes
// from ("physical memory", "cgroup memory limit", "--memory-limit"); 0 and ""
// when none is known.
struct MemoryFigure {
  int64_t bytes = 0;
  std::string source;
};
MemoryFigure CpuMemoryFigure(int64_t memory_limit);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_MEMORY_LIMIT_H_
