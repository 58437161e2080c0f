#include "executor/worker/common.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/InferenceMode.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "analysis/ir/batch_split.h"
#include "analysis/ir/random_ops.h"
#include "executor/gloo/gloo_communicator.h"
#include "executor/gloo/host_staged_communicator.h"
#include "executor/torch_types.h"
#include "util/log.h"
#include "util/status_macros.h"
#if defined(FXDP_HAVE_NCCL)
#include "executor/nccl/nccl_communicator.h"
#endif

namespace fxdp::executor {

absl::StatusOr<c10::Device> ParseWorkerDevice(const std::string& name, int local_rank,
                                              const std::string& what) {
  try {
    return name == "cuda" ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank))
                          : c10::Device(name);
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", name, "' is not a device (cpu, cuda, cuda:N)"));
  }
}

std::string GlooInterfaceHost(const std::string& rendezvous_host) {
  if (const char* h = std::getenv("FXDP_GLOO_HOST"); h != nullptr && *h != '\0') return h;
  if (rendezvous_host == "localhost" || rendezvous_host.rfind("127.", 0) == 0) return "127.0.0.1";
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') return host;
  return "127.0.0.1";
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectCommunicator(const RendezvousOptions& opts,
                                                                  const c10::Device& device,
                                                                  const std::string& backend) {
  if (backend != "auto" && backend != "gloo" && backend != "nccl")
    return absl::InvalidArgumentError(
        absl::StrCat("communicator '", backend, "' is not one of auto, gloo, nccl"));
  if (backend == "nccl" && device.is_cpu())
    return absl::InvalidArgumentError("the nccl communicator needs a cuda device, not cpu");
  if (opts.world_size <= 1) return std::unique_ptr<Communicator>(new LocalCommunicator());
  if (!device.is_cpu() && backend != "gloo") {
#if defined(FXDP_HAVE_NCCL)
    return MakeNcclCommunicator(opts, device.has_index() ? device.index() : 0);
#else
    return absl::UnimplementedError(absl::StrCat(
        "world size ", opts.world_size, " on ", device.str(),
        " needs the NCCL communicator; this fxdp-worker was built without NCCL (configure "
        "with the CUDA toolkit and NCCL present, FXDP_WITH_NCCL=AUTO|ON), or use cpu (Gloo)"));
#endif
  }
  FXDP_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> g,
                        GlooCommunicator::Connect(opts, GlooInterfaceHost(opts.host)));
  if (!device.is_cpu())
    return std::unique_ptr<Communicator>(new HostStagedCommunicator(std::move(g)));
  return std::unique_ptr<Communicator>(std::move(g));
}

absl::StatusOr<std::unique_ptr<Communicator>> Rendezvous(const RankSetup& setup,
                                                         const std::string& log_prefix,
                                                         ConnectionAborter* watch) {
  const RendezvousOptions& ro = setup.rendezvous;
  if (ro.world_size <= 1) return std::unique_ptr<Communicator>(new LocalCommunicator());
  util::Log(log_prefix, "rendezvous at ", ro.host, ":", ro.port, " (world size ", ro.world_size,
            ", timeout ", absl::StrFormat("%.3g", ro.timeout.count() / 1000.0), " s)");
  if (watch != nullptr) watch->Watch(ResolveAddresses(ro.host, ro.port));
  // Gloo (cpu) or NCCL (cuda); Gloo binds to an address the other ranks
  // reach this host by (GlooInterfaceHost).
  FXDP_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                        ConnectCommunicator(ro, setup.device, setup.communicator));
  if (watch != nullptr) watch->Watch(comm->PeerSocketAddresses());
  return comm;
}

void SetIntraOpThreads(int threads) {
  if (threads > 0) at::set_num_threads(threads);
  // libgomp comes with libtorch_cpu, not linked to the worker: found at run time.
  using SetDynamic = void (*)(int);
  if (auto off = reinterpret_cast<SetDynamic>(dlsym(RTLD_DEFAULT, "omp_set_dynamic"))) off(0);
}

absl::StatusOr<Program> LoadRankProgram(const ir::Graph& graph, const RankSetup& setup,
                                        Communicator* comm) {
  ProgramOptions po;
  po.device = setup.device;
  po.communicator = comm;
  po.collective_timeout = setup.rendezvous.timeout;
  po.check_outputs = setup.check_outputs;
  po.record_memory = setup.record_memory;
  po.seed = setup.seed;
  if (const char* trace = std::getenv("FXDP_VALUE_TRACE"); trace != nullptr)
    po.value_trace = absl::StrReplaceAll(trace, {{"{rank}", absl::StrCat(setup.rendezvous.rank)}});
  return Program::Load(graph, po);
}

std::string DeviceMemorySummary(const c10::Device& device) {
  if (device.is_cpu()) return "";
  try {
    using c10::CachingAllocator::StatType;
    const auto stats = c10::getDeviceAllocator(device.type())->getDeviceStats(device.index());
    const size_t all = static_cast<size_t>(StatType::AGGREGATE);
    return absl::StrFormat("%s peak %.1f MB allocated, %.1f MB reserved (caching allocator)",
                           device.str(), stats.allocated_bytes[all].peak / 1e6,
                           stats.reserved_bytes[all].peak / 1e6);
  } catch (const std::exception& e) {
    return absl::StrCat(device.str(), " memory statistics unavailable: ", ExceptionMessage(e));
  }
}

namespace {

// The values of a 1-D int64 or int32 tensor.
absl::StatusOr<std::vector<int64_t>> OffsetValues(const at::Tensor& t) {
  if (t.dim() != 1 || (t.scalar_type() != at::kLong && t.scalar_type() != at::kInt))
    return absl::InvalidArgumentError(absl::StrCat("the offsets are ", DescribeTorchTensor(t),
                                                   "; offsets are a 1-D int64 or int32 tensor"));
  const at::Tensor v = t.to(at::kCPU, at::kLong).contiguous();
  const int64_t* p = v.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + v.numel());
}

// The graph's rows of INPUT `name` (its dim 0), -1 when it has none.
int64_t GraphRows(const Program& program, const std::string& name) {
  for (const ProgramInput& in : program.inputs())
    if (in.role == ir::PlaceholderRole::kInput && in.state_name == name && in.type.is_tensor() &&
        !in.type.tensor.shape.empty())
      return in.type.tensor.shape[0];
  return -1;
}

// The spans of `t` (dim 0), concatenated.
at::Tensor Gather(const at::Tensor& t, const ir::RaggedCut& cut) {
  std::vector<at::Tensor> pieces;
  for (const auto& [begin, end] : cut.spans) pieces.push_back(t.narrow(0, begin, end - begin));
  if (pieces.empty()) return t.narrow(0, 0, 0).contiguous();
  return pieces.size() == 1 ? pieces[0].contiguous() : at::cat(pieces, 0);
}

// Ragged inputs of a global batch (issue 23): each becomes this rank's bags'
// elements (ir::CutRagged by its offsets' global values) and its offsets
// this rank's rows rebased to them, in `out`; read from `batch`, before any
// offsets are narrowed. Offsets that already have the graph's rows (this
// rank's batch) or hold no values (meta tensors: shapes checked before a
// file is read) are left to the plain narrowing.
absl::Status CutRaggedInputs(const TensorMap& batch, const Program& program, int rank,
                             int world_size, TensorMap& out) {
  for (const ProgramInput& in : program.inputs()) {
    if (in.ragged_offsets.empty()) continue;
    auto text = batch.find(in.state_name);
    auto offs = batch.find(in.ragged_offsets);
    if (text == batch.end() || offs == batch.end()) continue;  // reported by the step
    const at::Tensor& o = offs->second;
    if (o.dim() != 1 || o.size(0) == GraphRows(program, in.ragged_offsets) || o.is_meta() ||
        text->second.is_meta())
      continue;
    const std::vector<ir::RankSlice> rows =
        ir::RankRows(o.size(0), program.micro_batch(), world_size, rank);
    // Rows the graph does not take: the plain narrowing says so.
    if (ir::RowCount(rows) != GraphRows(program, in.ragged_offsets)) continue;
    const std::string what =
        absl::StrCat("input '", in.state_name, "' cut by the offsets '", in.ragged_offsets,
                     "' for rank ", rank, " of ", world_size, ": ");
    if (text->second.dim() != 1)
      return absl::InvalidArgumentError(absl::StrCat(
          what, "it is ", DescribeTorchTensor(text->second), ", a ragged input is 1-D"));
    absl::StatusOr<std::vector<int64_t>> values = OffsetValues(o);
    if (!values.ok())
      return absl::InvalidArgumentError(absl::StrCat(what, values.status().message()));
    absl::StatusOr<ir::RaggedCut> cut = ir::CutRagged(*values, text->second.size(0), rows);
    if (!cut.ok()) return absl::InvalidArgumentError(absl::StrCat(what, cut.status().message()));
    out[in.state_name] = Gather(text->second, *cut);
    out[in.ragged_offsets] = at::tensor(cut->offsets, at::kLong).to(o.device(), o.scalar_type());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TensorMap> ShardBatch(const TensorMap& batch, const Program& program, int rank,
                                     int world_size) {
  TensorMap out = batch;
  FXDP_RETURN_IF_ERROR(CutRaggedInputs(batch, program, rank, world_size, out));
  for (const ProgramInput& in : program.inputs()) {
    if (in.role != ir::PlaceholderRole::kInput || !in.type.is_tensor()) continue;
    auto it = out.find(in.state_name);
    if (it == out.end()) continue;  // reported by the step
    const int32_t dim = in.batch_dim;
    const auto& want = in.type.tensor.shape;
    at::Tensor& t = it->second;
    if (dim < 0 || t.dim() != static_cast<int64_t>(want.size()) || dim >= t.dim() ||
        t.size(dim) == want[dim])
      continue;
    const int64_t b = t.size(dim);
    const std::vector<ir::RankSlice> rows =
        ir::RankRows(b, program.micro_batch(), world_size, rank);
    if (ir::RowCount(rows) != want[dim])
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", in.state_name, "' has ", b, " samples on dim ", dim, "; rank ", rank, " of ",
          world_size, " would get ", ir::RowCount(rows),
          program.micro_batch() > 0
              ? absl::StrCat(" (its share of each micro-batch of ", program.micro_batch(), ")")
              : std::string(),
          " but its graph expects ", want[dim]));
    std::vector<at::Tensor> pieces;
    for (const ir::RankSlice& s : rows) pieces.push_back(t.narrow(dim, s.start, s.size));
    t = pieces.size() == 1 ? pieces[0].contiguous() : at::cat(pieces, dim);
  }
  return out;
}

absl::Status CheckBatch(const TensorMap& batch, const Program& program) {
  for (const ProgramInput& in : program.inputs()) {
    if (in.role != ir::PlaceholderRole::kInput || !in.type.is_tensor()) continue;
    const std::string expected = InputTypeText(in);
    auto it = batch.find(in.state_name);
    if (it == batch.end() || !it->second.defined())
      return absl::InvalidArgumentError(absl::StrCat("no tensor for input '", in.state_name,
                                                     "' (the graph expects ", expected, ")"));
    const at::Tensor& t = it->second;
    if (!InputFits(t, in))
      return absl::InvalidArgumentError(absl::StrCat("input '", in.state_name, "' is ",
                                                     DescribeTorchTensor(t),
                                                     ", this rank's graph expects ", expected));
  }
  return absl::OkStatus();
}

namespace {

// The metadata keys every program of a job shares (SharedMetadata).
constexpr absl::string_view kSharedMetadataKeys[] = {
    ir::kSeedKey, ir::kStepOffsetKey, "fxdp.world_size", "fxdp.style", "fxdp.sharded_state",
};

std::string Cut(const std::string& v) {
  if (v.empty()) return "(absent)";
  return v.size() <= 80 ? absl::StrCat("'", v, "'")
                        : absl::StrCat("'", v.substr(0, 77), "...' (", v.size(), " bytes)");
}

}  // namespace

GraphMetadata SharedMetadata(const ir::Graph& graph) {
  GraphMetadata out;
  for (const auto& [k, v] : graph.header().metadata) {
    for (absl::string_view key : kSharedMetadataKeys)
      if (k == key) out[k] = v;
  }
  return out;
}

absl::Status CheckSharedMetadata(const GraphMetadata& first, const ir::Graph& next) {
  const GraphMetadata got = SharedMetadata(next);
  for (absl::string_view key : kSharedMetadataKeys) {
    auto a = first.find(std::string(key));
    auto b = got.find(std::string(key));
    const std::string want = a == first.end() ? "" : a->second;
    const std::string have = b == got.end() ? "" : b->second;
    if (want != have)
      return absl::InvalidArgumentError(absl::StrCat("its metadata ", key, " is ", Cut(have),
                                                     ", graph 0's ", Cut(want),
                                                     ": every program of a job shares it"));
  }
  return absl::OkStatus();
}

int LocalLossIndex(const Program& program) {
  int k = 0;
  for (const ir::OutputSpec& s : program.output_specs()) {
    if (ir::UpdatedRole(s.role).has_value() || s.role == ir::OutputRole::kLoss) continue;
    if (s.role == ir::OutputRole::kOther && s.state_name == "local_loss") return k;
    ++k;
  }
  return -1;
}

double LossValue(const at::Tensor& loss) {
  if (!loss.defined()) return std::nan("");
  c10::InferenceMode guard;
  return loss.to(at::kCPU).to(at::kDouble).reshape({-1})[0].item<double>();
}

}  // namespace fxdp::executor
