// JobRunner's initial state (job_runner.h): taken before the job is queued
// under --state-dir, or forwarded from the client as it arrives; FULLY_SHARD
// split into each rank's shards. The state out of the ranks is the job's
// StateCollector's (state_collector.h).
#include <optional>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/raw_tensors.h"
#include "server/jobs/state_shards.h"
#include "util/bytes.h"

namespace fxdp::server {
namespace {

// A whole-state tensor (REPLICATE) to every rank, re-chunked to `chunk_bytes`
// pieces; `last` on the last piece when it is the state's last tensor.
template <typename SendAll>
absl::Status SendRechunked(const std::string& job_id, const v1::TensorChunk& tensor,
                           size_t chunk_bytes, bool last_tensor, SendAll send_all) {
  v1::ServerMessage m;
  v1::StateChunk* sc = m.mutable_state_chunk();
  sc->set_job_id(job_id);
  std::vector<v1::TensorChunk> pieces;
  RechunkTensor(tensor, chunk_bytes, &pieces);
  for (size_t i = 0; i < pieces.size(); ++i) {
    sc->mutable_tensor()->Swap(&pieces[i]);
    sc->set_last(last_tensor && i + 1 == pieces.size());
    if (absl::Status s = send_all(m); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status JobRunner::CheckDeclaredSizes(const v1::JobSpec& spec,
                                           const ir::DeclaredTensors& state,
                                           const ir::DeclaredTensors& batch, bool hold_state) {
  const JobServiceOptions& o = ctx_.options;
  if (spec.data_paths_size() == 0 && batch.bytes() > o.max_batch_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the graph's ", batch.size(), " INPUTs declare a global batch of ",
                     util::MiBWithBytes(batch.bytes()), " per step (", batch.Names(),
                     "), over this server's limit of ", o.max_batch_bytes >> 20,
                     " MiB (fxdp-server --max-batch-mb)"));
  }
  if (!hold_state) return absl::OkStatus();
  const uint64_t want = state.bytes();
  const uint64_t max = o.max_initial_state_bytes;
  const std::string declared =
      absl::StrCat("the graph declares ", state.size(), " state tensors of ",
                   util::MiBWithBytes(want), " in all");
  if (want > max) {
    return absl::ResourceExhaustedError(
        absl::StrCat(declared, ", over this server's limit of ", max >> 20,
                     " MiB for the initial states it holds "
                     "(fxdp-server --max-initial-state-mb; with --state-dir a data_paths job's "
                     "state is held from its "
                     "Submit until it starts)"));
  }
  if (ctx_.held_state_bytes == nullptr) return absl::OkStatus();
  uint64_t held = ctx_.held_state_bytes->load();
  do {
    if (held + want > max) {
      return absl::ResourceExhaustedError(absl::StrCat(
          declared, "; the initial states of other jobs that have not started yet hold ",
          util::MiBWithBytes(held),
          " of this "
          "server's ",
          max >> 20, " MiB (fxdp-server --max-initial-state-mb): submit again once they ran"));
    }
  } while (!ctx_.held_state_bytes->compare_exchange_weak(held, held + want));
  held_reserved_ = want;
  return absl::OkStatus();
}

void JobRunner::ReleaseHeldState() {
  job_->DropInitialState();
  if (held_reserved_ > 0 && ctx_.held_state_bytes != nullptr)
    ctx_.held_state_bytes->fetch_sub(held_reserved_);
  held_reserved_ = 0;
}

absl::Status JobRunner::CheckStateCount() const {
  const JobPlan& plan = job_->plan();
  const uint32_t n = plan.spec.num_state_tensors();
  if (n == plan.declared_sent.size()) return absl::OkStatus();
  const v1::CheckpointSource& c = plan.spec.initial_checkpoint();
  const std::string read =
      plan.spec.has_initial_checkpoint()
          ? absl::StrCat(", of which JobSpec.initial_checkpoint reads ", c.tensors_size(),
                         " and fills ", c.fills_size(), "; the client sends the other ",
                         plan.declared_sent.size())
          : "";
  return absl::InvalidArgumentError(absl::StrCat(
      "JobSpec.num_state_tensors is ", n, ", the graph declares ", plan.declared_state.size(),
      " state tensors", read, " (", plan.declared_sent.Names(), ")"));
}

// Before the job is queued (--state-dir, data_paths): its initial state,
// whole, kept on the job.
absl::Status JobRunner::TakeInitialState() {
  const uint32_t n = job_->plan().spec.num_state_tensors();
  if (absl::Status s = CheckStateCount(); !s.ok()) return s;
  ChunkStream stream("initial state", /*keep_data=*/true, &job_->plan().declared_sent);
  v1::SubmitJobRequest req;
  Job::Msg unused;
  client_->SetReadBudget(ctx_.options.read_ahead_bytes);
  while (stream.complete() < n) {
    const double idle = ctx_.options.client_idle_s;
    const Got got = Next(true, true, idle, &unused, &req);
    if (got == Got::kTimeout) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the Submit stream sent nothing for ", idle,
          " s while the server waited for its initial state (", stream.complete(), " of the ", n,
          " tensors of JobSpec.num_state_tensors received; "
          "fxdp-server --client-idle-s)"));
    }
    if (got == Got::kCancel) return absl::CancelledError("the client went away");
    if (got == Got::kClientEnd) {
      return absl::InvalidArgumentError(
          absl::StrCat("the client ended the stream after ", stream.complete(), " of the ", n,
                       " initial-state tensors (JobSpec.num_state_tensors)"));
    }
    if (!req.has_state()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected initial-state chunks (", stream.complete(), " of the ", n,
          " tensors of JobSpec.num_state_tensors so far), got ", SubmitRequestKind(req)));
    }
    if (absl::Status s = stream.Add(req.state()); !s.ok()) return s;
  }
  client_->SetReadBudget(0);
  std::vector<v1::TensorChunk> held;
  for (RawTensor& t : stream.Take()) {
    v1::TensorChunk& c = held.emplace_back();
    c.set_name(t.name);
    c.set_dtype(static_cast<v1::DType>(ir::DTypeToWire(t.dtype)));
    for (int64_t d : t.shape) c.add_shape(d);
    c.set_data(std::move(t.data));
  }
  job_->HoldInitialState(std::move(held));
  return absl::OkStatus();
}

absl::Status JobRunner::ForwardState() {
  const uint32_t n = job_->plan().spec.num_state_tensors();
  const size_t chunk_bytes = ctx_.options.chunk_bytes;
  auto send_all = [this](const v1::ServerMessage& m) { return SendAll(m); };
  if (!job_->has_initial_state()) {  // the client streams it
    if (absl::Status s = CheckStateCount(); !s.ok()) return BadInput(s.message());
  }
  if (n == 0) {
    v1::ServerMessage m;
    m.mutable_state_chunk()->set_job_id(id_);
    m.mutable_state_chunk()->set_last(true);
    return SendAll(m);
  }
  // FULLY_SHARD: each rank gets its own shards, so its own messages; each
  // rank's latest piece is held back until the next, so the last one can
  // carry `last`.
  std::optional<StateSplitter> splitter;
  if (job_->plan().expanded.sharded_state_size() > 0) {
    splitter.emplace(world_, job_->plan().expanded.sharded_state(), ctx_.options.chunk_bytes);
  }
  std::vector<std::optional<v1::TensorChunk>> held(world_);
  if (job_->has_initial_state()) {  // taken before the job was queued (--state-dir)
    // Its reservation is given back once it is sent (after `state` is freed).
    absl::Cleanup release = [this] { ReleaseHeldState(); };
    std::vector<v1::TensorChunk> state = job_->TakeInitialState();
    for (size_t t = 0; t < state.size(); ++t) {
      const bool complete = t + 1 == state.size();
      if (absl::Status s = splitter ? SendShards(*splitter, state[t], complete, &held)
                                    : SendRechunked(id_, state[t], chunk_bytes, complete, send_all);
          !s.ok())
        return s;
    }
    return absl::OkStatus();
  }
  ChunkStream stream("initial state", /*keep_data=*/false, &job_->plan().declared_sent);
  v1::SubmitJobRequest req;
  Job::Msg msg;
  Clock::time_point idle_from = Clock::now();
  while (stream.complete() < n) {
    const double left = ClientIdleLeft(idle_from);
    if (left <= 0) {
      return ClientIdle(absl::StrCat("its initial state (", stream.complete(), " of the ", n,
                                     " tensors of JobSpec.num_state_tensors received)"));
    }
    const Got got = Next(true, true, left, &msg, &req);
    if (got == Got::kTimeout) continue;
    if (got == Got::kCancel) return Cancelled();
    if (got == Got::kWorker) {
      if (absl::Status s = OnWorker(msg); !s.ok()) return s;
      continue;
    }
    if (got == Got::kClientEnd) {
      return BadInput(absl::StrCat("the client ended the stream after ", stream.complete(),
                                   " of the ", n,
                                   " initial-state tensors (JobSpec.num_state_tensors)"));
    }
    idle_from = Clock::now();
    if (!req.has_state()) {
      return BadInput(absl::StrCat("expected initial-state chunks (", stream.complete(), " of the ",
                                   n, " tensors of JobSpec.num_state_tensors so far), got ",
                                   SubmitRequestKind(req)));
    }
    if (absl::Status s = stream.Add(req.state()); !s.ok()) return BadInput(s.message());
    const bool complete = stream.complete() == n;
    if (absl::Status s = splitter
                             ? SendShards(*splitter, req.state(), complete, &held)
                             : SendRechunked(id_, req.state(), chunk_bytes, complete, send_all);
        !s.ok())
      return s;
  }
  return absl::OkStatus();
}

absl::Status JobRunner::SendShards(const StateSplitter& splitter, const v1::TensorChunk& chunk,
                                   bool complete,
                                   std::vector<std::optional<v1::TensorChunk>>* held) {
  std::vector<std::vector<v1::TensorChunk>> to(world_);
  if (absl::Status s = splitter.Add(chunk, &to); !s.ok()) return BadInput(s.message());
  v1::ServerMessage m;
  v1::StateChunk* sc = m.mutable_state_chunk();
  sc->set_job_id(id_);
  for (int r = 0; r < world_; ++r) {
    std::optional<v1::TensorChunk>& h = (*held)[r];
    for (v1::TensorChunk& piece : to[r]) {
      if (h) {
        sc->mutable_tensor()->Swap(&*h);
        sc->set_last(false);
        if (!ranks_->Send(r, m)) return Lost(r);
      }
      h = std::move(piece);
    }
    if (complete && h) {
      sc->mutable_tensor()->Swap(&*h);
      sc->set_last(true);
      h.reset();
      if (!ranks_->Send(r, m)) return Lost(r);
    }
  }
  return absl::OkStatus();
}

}  // namespace fxdp::server
