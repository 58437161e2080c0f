// The checkpoints a rank of `fxdp-worker attach` writes itself
// (AssignJob.checkpoints; checkpoint_write.h, docs/checkpoints.md): after
// a step the policy names, every rank writes its part, the ranks agree that
// all of them did (an all-reduce of one flag each), each answers
// CheckpointWritten, and the checkpoints older than the `keep` newest
// complete ones are removed.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "analysis/ir/checkpoint_index.h"
#include "executor/torch_types.h"
#include "executor/worker/attach_worker.h"
#include "executor/worker/checkpoint_write.h"
#include "util/status_macros.h"

namespace fxdp::executor::attach {
namespace {

// How many ranks wrote their part (`wrote` is this rank's): the sum over the
// ranks of one flag each, on the job's device (NCCL sums CUDA tensors only).
absl::StatusOr<int> RanksThatWrote(Communicator& comm, bool wrote, double timeout_s,
                                   const c10::Device& device) {
  if (comm.world_size() <= 1) return wrote ? 1 : 0;
  at::Tensor flag =
      at::full({1}, wrote ? 1.0 : 0.0, at::TensorOptions().dtype(at::kFloat).device(device));
  FXDP_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, comm.AllReduceSum(flag));
  const auto timeout =
      std::chrono::milliseconds(std::max<int64_t>(1, std::llround(timeout_s * 1000)));
  FXDP_ASSIGN_OR_RETURN(at::Tensor sum, work->Wait(timeout));
  return static_cast<int>(std::lround(sum.item<double>()));
}

// Whether the job goes on from a checkpoint in its own checkpoint directory
// (a job re-queued after a server restart, or resumed with the same policy):
// the checkpoints that directory holds of later steps, written by the run cut
// short, are superseded by the ones this run writes (the same steps again).
bool GoesOnInItsOwnDir(const v1::AssignJob& a, int64_t first_step) {
  return first_step > 0 && a.has_initial_checkpoint() &&
         a.initial_checkpoint().path() ==
             ir::JoinCheckpointPath(a.checkpoints().dir(), ir::CheckpointStepDir(first_step));
}

std::map<std::string, std::string> RolesOf(const Program& program) {
  std::map<std::string, std::string> out;
  for (const ProgramInput& in : program.inputs())
    out.emplace(in.state_name, std::string(ir::PlaceholderRoleName(in.role)));
  return out;
}

}  // namespace

absl::Status AttachedWorker::MaybeCheckpoint(AssignedJob& job, const StepRunner& runner,
                                             Communicator& comm, int64_t step) {
  if (!job.assign.has_checkpoints()) return absl::OkStatus();
  const v1::CheckpointPolicy& policy = job.assign.checkpoints();
  const int64_t k = job.step_offset + step;  // the job's step
  if (!CheckpointDue(policy, k, job.steps > 0 && step == job.steps)) return absl::OkStatus();
  const auto t0 = Clock::now();
  const RankStateLayout layout =
      LayoutOf(job.assign, &job.declared_state, o_.data_roots_opened.get());
  // StepRunner::program() has no const overload; RolesOf only reads its inputs.
  const Program& program = const_cast<StepRunner&>(runner).program();
  if (GoesOnInItsOwnDir(job.assign, job.step_offset)) {
    // Files only: another rank may be writing into the directory already.
    if (absl::Status s = RemoveCheckpointPart(policy, k, layout, /*directory=*/false); !s.ok())
      util::Log(job.Prefix(), "could not remove the superseded checkpoint of step ", k, ": ",
                s.message());
  }
  absl::StatusOr<WrittenPart> part =
      WriteCheckpointPart(policy, k, layout, runner.state(), RolesOf(program), job.non_persistent);
  const double timeout_s =
      job.assign.collective_timeout_s() > 0 ? job.assign.collective_timeout_s() : 60.0;
  FXDP_ASSIGN_OR_RETURN(const int wrote,
                        RanksThatWrote(comm, part.ok(), timeout_s, program.device()));
  if (!part.ok()) {
    return absl::Status(part.status().code(),
                        absl::StrCat("writing its part of the checkpoint of step ", k,
                                     " on worker ", worker_id_, ": ", part.status().message()));
  }
  if (wrote < job.world_size) {
    // The rank that failed says why (JobFailed); this one's file stays, an
    // index is never committed.
    util::Log(job.Prefix(), "checkpoint of step ", k, ": only ", wrote, " of ", job.world_size,
              " ranks wrote their part; not complete");
    return absl::OkStatus();
  }
  if (part->index) {
    if (absl::Status s = part->index->Commit(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("writing the index of the checkpoint of step ", k,
                                                 " on worker ", worker_id_, ": ", s.message()));
    }
  }
  const double ms = MsSince(t0);
  WorkerMessage m;
  v1::CheckpointWritten* w = m.mutable_checkpoint_written();
  w->set_job_id(job.id);
  w->set_rank(job.rank);
  w->set_step(k);
  w->set_path(part->dir);
  w->set_bytes(static_cast<int64_t>(part->bytes));
  w->set_write_ms(ms);
  job.session->Write(m);
  util::Log(job.Prefix(), "checkpoint of step ", k, " written: '", part->dir, "' (", part->bytes,
            " bytes of this rank's, ", absl::StrFormat("%.1f", ms), " ms)");
  job.checkpoints.push_back(k);
  while (policy.keep() > 0 && job.checkpoints.size() > static_cast<size_t>(policy.keep())) {
    const int64_t old = job.checkpoints.front();
    job.checkpoints.pop_front();
    if (absl::Status s = RemoveCheckpointPart(policy, old, layout); !s.ok()) {
      util::Log(job.Prefix(), "could not remove the checkpoint of step ", old, " (keep ",
                policy.keep(), "): ", s.message());
    }
  }
  return absl::OkStatus();
}

}  // namespace fxdp::executor::attach
