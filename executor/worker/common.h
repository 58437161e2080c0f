// What both fxdp-worker modes need: `run` (run_command.h: a launcher such as
// torchrun or Slurm started the ranks) and `attach` (attach.h: an fxdp server
// assigns the jobs). Device names, one rank's set-up (RankSetup: the
// rendezvous and the program), a rank's slice of a global batch, reading a
// step's losses.
#ifndef FXDP_EXECUTOR_WORKER_COMMON_H_
#define FXDP_EXECUTOR_WORKER_COMMON_H_

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "executor/communicator.h"
#include "executor/gloo/gloo_backend.h"
#include "executor/interpreter.h"
#include "executor/socket_abort.h"
#include "executor/step_runner.h"

namespace fxdp::executor {

// "cpu", "cuda", "cuda:N" (anything c10::Device parses); "cuda" means
// cuda:<local_rank>. INVALID_ARGUMENT naming `what` (e.g. "--device") else.
absl::StatusOr<c10::Device> ParseWorkerDevice(const std::string& name, int local_rank,
                                              const std::string& what);

// The address this rank's Gloo device binds to, one the other ranks reach this
// host by: $FXDP_GLOO_HOST, else loopback when the rendezvous host is local
// ("localhost", "127.x"), else this host's name.
std::string GlooInterfaceHost(const std::string& rendezvous_host);

// world_size > 1: the rendezvous (rank 0 serves the c10d TCPStore at
// opts.host:opts.port) and a Gloo process group whose collectives fail after
// opts.timeout (CPU only: UNIMPLEMENTED for another device). world_size 1: a
// LocalCommunicator. On a failed collective the Gloo communicator must not be
// destroyed (ProcessGroupGloo's destructor drains its queue, which behind a
// lost peer can take another timeout): release() it.
// `backend`: "auto" (NCCL for a CUDA device where built, else Gloo), "nccl",
// or "gloo" (on a CUDA device: host-staged, executor/gloo/host_staged_communicator.h,
// e.g. several ranks on one GPU).
absl::StatusOr<std::unique_ptr<Communicator>> ConnectCommunicator(
    const RendezvousOptions& opts, const c10::Device& device, const std::string& backend = "auto");

// One rank's set-up, the same in both modes: its device, how it meets its
// peers and how its program is loaded.
struct RankSetup {
  c10::Device device{c10::kCPU};
  // Where the ranks meet, this rank, the world size and the timeout (also
  // every collective's).
  RendezvousOptions rendezvous;
  std::string communicator = "auto";  // ConnectCommunicator's backend
  bool check_outputs = false;         // ProgramOptions::check_outputs
  bool record_memory = false;         // ProgramOptions::record_memory
  std::optional<uint64_t> seed;       // ProgramOptions::seed (fxdp-worker run --seed)
};

// This thread's intra-op threads: `threads` > 0 sets them (at::set_num_threads);
// either way OpenMP's dynamic adjustment is switched off for the calling thread,
// so every team has that many threads. With OMP_DYNAMIC=true libgomp sizes each
// team as the cores minus the 15-minute load average, and ops whose reduction
// order follows the team size (native_layer_norm_backward's weight gradient)
// gave other bits under load (docs/randomness.md).
void SetIntraOpThreads(int threads);

// World size > 1: logs "rendezvous at H:P (world size N, timeout T s)" after
// `log_prefix` and meets the peers (ConnectCommunicator); `watch` (when not
// null) is given the store's address first, so that an abort ends a
// rendezvous that waits for a peer. World size 1: a LocalCommunicator.
absl::StatusOr<std::unique_ptr<Communicator>> Rendezvous(const RankSetup& setup,
                                                         const std::string& log_prefix,
                                                         ConnectionAborter* watch = nullptr);

// The rank's graph as a Program on setup.device whose collectives go through
// `comm` (a TimedCommunicator whose communicator may be set after the
// rendezvous) and time out after setup.rendezvous.timeout.
absl::StatusOr<Program> LoadRankProgram(const ir::Graph& graph, const RankSetup& setup,
                                        Communicator* comm);

// "cuda:0 peak 12.3 MB allocated, 20.0 MB reserved (caching allocator)": the
// device allocator's peak since the process started ("" on cpu).
std::string DeviceMemorySummary(const c10::Device& device);

// This rank's part of a global batch: every INPUT with a batch dim whose size
// differs from the graph's becomes this rank's rows (ir::RankRows: its
// balanced contiguous slice, the first B % N ranks getting one extra sample,
// or with micro-batches, Program::micro_batch, its share of each); tensors
// that already have the graph's size are used as they are. A ragged input
// (ProgramInput::ragged_offsets) of a global batch becomes its rows' bags
// (ir::CutRagged by its offsets' values) and its offsets those rows rebased
// to them. INVALID_ARGUMENT when the rows would not have the graph's size,
// and naming both inputs and the element for offsets that decrease or pass
// the input's end.
absl::StatusOr<TensorMap> ShardBatch(const TensorMap& batch, const Program& program, int rank,
                                     int world_size);

// Every INPUT tensor placeholder of `program` is in `batch` with the graph's
// dtype and shape (this rank's shard; a ragged input at most the graph's
// length, InputFits): INVALID_ARGUMENT naming the input,
// what the graph expects and what came, else.
absl::Status CheckBatch(const TensorMap& batch, const Program& program);

// Graph metadata by key (ir::GraphHeader::metadata).
using GraphMetadata = std::map<std::string, std::string>;

// What every program of one job (one per batch shape, docs/shapes.md) must
// share of its graph's metadata: the random seed and step offset, the world
// size, the FULLY_SHARD style and sharded state (kSharedMetadataKeys). A
// program whose graph differs would draw other random numbers or hold the
// state otherwise than program 0.
GraphMetadata SharedMetadata(const ir::Graph& graph);
// INVALID_ARGUMENT naming the key and both values (long ones cut) when
// `next`'s SharedMetadata differs from `first`.
absl::Status CheckSharedMetadata(const GraphMetadata& first, const ir::Graph& next);

// The position in StepRunner::other_outputs() of the "local_loss" OTHER
// output the expansion adds (the rank's loss over its own shard), or -1.
int LocalLossIndex(const Program& program);

// A 0-dim (or one-element) loss tensor as a double (synchronises the device);
// NaN for an undefined tensor.
double LossValue(const at::Tensor& loss);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_WORKER_COMMON_H_
