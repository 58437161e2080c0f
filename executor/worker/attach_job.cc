// The job's thread of `fxdp-worker attach` (attach_worker.h): rendezvous
// (c10d TCPStore + Gloo for world size > 1), the LibTorch interpreter, then
// one event at a time: a batch runs one step answered by a StepResult, a
// FetchState streams the state in chunks, a cancel ends the job. A failure
// is sent as JobFailed naming the job, rank and step.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "analysis/ir/proto_codec.h"
#include "analysis/ir/random_ops.h"
#include "executor/memory_limit.h"
#include "executor/safetensors.h"
#include "executor/torch_types.h"
#include "executor/worker/attach_worker.h"
#include "executor/worker/checkpoint_read.h"
#include "executor/worker/checkpoint_write.h"
#include "executor/worker/common.h"
#include "executor/worker/named_outputs.h"
#include "util/status_macros.h"

namespace fxdp::executor::attach {

void AttachedWorker::FinishJob(AssignedJob& job, WorkerMessage final_msg) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (job_.get() == &job) job_.reset();
  }
  cv_.notify_all();
  if (!job.final_sent.exchange(true)) job.session->Write(final_msg);
}

void AttachedWorker::SendJobFailed(AssignedJob& job, const absl::Status& s, int64_t step) {
  const std::string error = absl::StrCat("job ", job.id, " rank ", job.rank, " step ",
                                         job.StepName(step), ": ", s.message());
  util::Log(job.Prefix(), "failed: ", absl::StatusCodeToString(s.code()), ": ", s.message());
  WorkerMessage f;
  v1::JobFailed* jf = f.mutable_job_failed();
  jf->set_job_id(job.id);
  jf->set_rank(job.rank);
  jf->set_step(step);
  jf->set_code(static_cast<int>(s.code()));
  jf->set_error(error);
  FinishJob(job, std::move(f));
}

void AttachedWorker::JobThread(std::shared_ptr<AssignedJob> job) {
  std::unique_ptr<Communicator> comm;
  SetIntraOpThreads(o_.threads);  // OpenMP's settings are per thread
  ResetPeakCpuTensorBytes();
  absl::Status s = JobBody(*job, comm);
  if (CpuMemoryLimit() > 0) {
    util::Log(job->Prefix(), "tensors held at most ", PeakCpuTensorBytes(),
              " bytes at once (--memory-limit ", CpuMemoryLimit(), ")");
  }
  if (!s.ok() && job->cancel) {
    // Cancelled while it rendezvoused or ran a step: the abort of its
    // connections ended that with an error.
    EndJob(*job, true,
           absl::StrCat(job->in_step ? absl::StrCat("during step ", job->log_step.load())
                                     : std::string("before the first step"),
                        " (", s.message(), ")"))
        .IgnoreError();  // OK
  } else if (!s.ok()) {
    // The failure is sent first, so that the server hears of it from this
    // rank before its peers report the connections shut down below.
    SendJobFailed(*job, s, job->in_step ? job->log_step.load() : 0);
  }
  // Collectives still queued or blocked on a peer fail at once instead of
  // at the timeout, and the process group's destructor does not wait for
  // them. The communicator goes with the job, however it ended: its
  // threads, its sockets and (rank 0) the store's port.
  if (!s.ok() || job->cancel) job->connections.Abort();
  comm.reset();
  // A job that ended (cancelled or not) says so only now: a worker the
  // server sees IDLE holds nothing of it.
  if (job->ending) FinishJob(*job, *std::move(job->ending));
  {
    std::lock_guard<std::mutex> l(mu_);
    if (job_ == job) job_.reset();  // e.g. the final message was sent at shutdown
    --running_jobs_;
  }
  cv_.notify_all();
}

namespace {

// A data file's error as the job reports it (the message names the path): a
// corrupt file is the client's bad input, a path outside the roots (or
// excluded, or through a link) is denied, anything else (missing, not a
// regular file, a read error) is the file's state on this worker.
absl::Status DataFileError(const absl::Status& s, const std::string& worker_id,
                           const char* what = "data_paths file") {
  const absl::StatusCode code = s.code();
  const absl::StatusCode mapped =
      code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kUnimplemented
          ? absl::StatusCode::kInvalidArgument
      : code == absl::StatusCode::kPermissionDenied  ? absl::StatusCode::kPermissionDenied
      : code == absl::StatusCode::kResourceExhausted ? absl::StatusCode::kResourceExhausted
                                                     : absl::StatusCode::kFailedPrecondition;
  return absl::Status(mapped, absl::StrCat(what, " on worker ", worker_id, ": ", s.message()));
}

// The file's tensors that are the program's INPUTs, as meta tensors (no
// data): what ShardBatch and CheckBatch check before anything is read.
TensorMap DeclaredInputs(const ir::SafetensorsView& header, const std::set<std::string>& inputs,
                         uint64_t* bytes) {
  TensorMap out;
  *bytes = 0;
  for (const ir::SafetensorsEntry& e : header.tensors) {
    if (inputs.count(e.name) == 0) continue;
    out.emplace(e.name,
                at::empty(e.shape, at::TensorOptions().dtype(ToTorch(e.dtype)).device(at::kMeta)));
    *bytes += e.end - e.begin;
  }
  return out;
}

// The rank's RankSetup from its AssignJob (as `fxdp-worker run`'s flags,
// common.h): device (default: the worker's), rendezvous, output checks.
absl::StatusOr<RankSetup> JobRankSetup(const v1::AssignJob& a, const c10::Device& worker_device,
                                       int rank, int world_size) {
  RankSetup setup;
  FXDP_ASSIGN_OR_RETURN(
      setup.device,
      ParseWorkerDevice(a.device().empty() ? worker_device.str() : a.device(),
                        worker_device.is_cuda() ? worker_device.index() : 0, "AssignJob.device"));
  const double timeout_s = a.collective_timeout_s() > 0 ? a.collective_timeout_s() : 60.0;
  setup.rendezvous.host = a.rendezvous_host().empty() ? "127.0.0.1" : a.rendezvous_host();
  setup.rendezvous.port = a.rendezvous_port();
  setup.rendezvous.rank = rank;
  setup.rendezvous.world_size = world_size;
  setup.rendezvous.timeout =
      std::chrono::milliseconds(std::max<int64_t>(1, std::llround(timeout_s * 1000)));
  setup.check_outputs = a.check_outputs();
  return setup;
}

// This rank's rows of Batch event `e`: read from the dataset, or the event's
// tensors (sharded here unless the server did), checked against the program;
// empty when the job reads data_paths files (`from_files`, read at set-up).
absl::StatusOr<TensorMap> RankBatch(const AssignedJob& job, JobTask& e, const Program& program,
                                    bool from_files, DatasetReader* dataset,
                                    const std::string& worker_id) {
  const int64_t step = e.step;
  TensorMap shard;
  if (dataset != nullptr) {
    if (!e.tensors.empty())
      return absl::InvalidArgumentError(
          "a Batch with tensors for a job that reads its batches from a dataset directory");
    absl::StatusOr<TensorMap> read = dataset->ReadStep(step, program);
    if (!read.ok()) return DataFileError(read.status(), worker_id);
    shard = *std::move(read);
  } else if (!from_files) {
    if (job.assign.batches_sharded()) {
      shard = std::move(e.tensors);
    } else {
      FXDP_ASSIGN_OR_RETURN(shard, ShardBatch(e.tensors, program, job.rank, job.world_size));
    }
    if (absl::Status s = CheckBatch(shard, program); !s.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("the batch of step ", step, ": ", s.message()));
  } else if (!e.tensors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a Batch with tensors for a job that reads its batches from AssignJob.data_paths"));
  } else if (e.graph_id != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the batch of step ", step, " names graph_id ", e.graph_id,
        ", but the job's data_paths files were read for graph 0 at set-up: files of another "
        "shape need a dataset directory (docs/datasets.md)"));
  }
  return shard;
}

// A run step's StepResult: its global and local loss, named outputs and times.
WorkerMessage StepResultMessage(const AssignedJob& job, int64_t step, uint32_t graph_id,
                                double loss, double local, double ms, const CollectiveStats& cs,
                                const std::vector<std::pair<std::string, double>>& named) {
  WorkerMessage m;
  v1::StepResult* r = m.mutable_step_result();
  r->set_job_id(job.id);
  r->set_rank(job.rank);
  r->set_step(step);
  r->set_loss(loss);
  r->set_local_loss(local);
  r->set_step_ms(ms);
  r->set_comm_wait_ms(cs.wait_ms);
  r->set_collectives(static_cast<int32_t>(cs.collectives));
  r->set_comm_bytes(cs.bytes);
  AddNamedValues(named, r->mutable_outputs());
  r->set_graph_id(graph_id);
  return m;
}

}  // namespace

// Each file's header is read and checked against the rank's graph first;
// then only the tensors the graph's INPUTs name are read (issue 25.10: a
// file may declare other tensors, of any size, which are never read), and
// --max-data-mb bounds those bytes over the job's files together: each is
// kept (this rank's shard of it) for the whole job, so the same path listed
// many times would otherwise hold as many copies.
absl::StatusOr<std::vector<TensorMap>> AttachedWorker::ReadDataFiles(const AssignedJob& job,
                                                                     const Program& program,
                                                                     const DataPaths& paths,
                                                                     const char* field,
                                                                     uint64_t* held) const {
  static const util::DataRoots kNoRoots;
  std::set<std::string> inputs;
  for (const ProgramInput& in : program.inputs())
    if (in.role == ir::PlaceholderRole::kInput && in.type.is_tensor()) inputs.insert(in.state_name);
  std::vector<TensorMap> files;
  const uint64_t budget = static_cast<uint64_t>(o_.max_data_mb) << 20;
  const uint64_t before = *held;  // the job's other files
  uint64_t read_so_far = before;
  const std::string file_what = absl::StrCat(field, " file");
  for (const std::string& path : paths) {
    const std::string where =
        absl::StrCat(field, " file '", path, "' (on worker ", worker_id_, ")");
    SafetensorsReadOptions read;
    read.roots = o_.data_roots_opened ? o_.data_roots_opened.get() : &kNoRoots;
    read.max_bytes = std::numeric_limits<uint64_t>::max();  // what is read is bounded below
    absl::StatusOr<ir::SafetensorsReader> file = ir::SafetensorsReader::Open(path, read);
    if (!file.ok()) return DataFileError(file.status(), worker_id_, file_what.c_str());
    uint64_t need = 0;
    absl::StatusOr<TensorMap> shard = ShardBatch(DeclaredInputs(file->header(), inputs, &need),
                                                 program, job.rank, job.world_size);
    absl::Status s = shard.ok() ? CheckBatch(*shard, program) : shard.status();
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
    if (need > budget - read_so_far) {
      return absl::ResourceExhaustedError(absl::StrCat(
          field, " on worker ", worker_id_,
          ": the job's files together may hold at most --max-data-mb ", o_.max_data_mb, " MiB; ",
          files.size(), " of its ", paths.size(), " entries hold ", read_so_far - before, " bytes",
          before > 0 ? absl::StrCat(" (the job's other files ", before, " bytes)") : std::string(),
          " and '", path, "' needs ", need, " bytes more for the graph's inputs"));
    }
    absl::StatusOr<SafetensorsFile> f = ReadTensors(*file, path, &inputs);
    if (!f.ok()) return DataFileError(f.status(), worker_id_, file_what.c_str());
    shard = ShardBatch(f->tensors, program, job.rank, job.world_size);
    s = shard.ok() ? CheckBatch(*shard, program) : shard.status();
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
    read_so_far += need;
    util::Log(job.Prefix(), "read ", path, ": ", shard->size(), " tensors (", need,
              " bytes), this rank's shard kept");
    files.push_back(*std::move(shard));
    *held = read_so_far;
  }
  return files;
}

absl::StatusOr<std::optional<DatasetReader>> AttachedWorker::OpenDataset(const AssignedJob& job,
                                                                         const Program& program,
                                                                         int64_t step_offset,
                                                                         const DataPaths& paths,
                                                                         const char* field) const {
  static const util::DataRoots kNoRoots;
  const util::DataRoots* roots = o_.data_roots_opened ? o_.data_roots_opened.get() : &kNoRoots;
  const std::string file_what = absl::StrCat(field, " file");
  for (const std::string& path : paths) {
    absl::StatusOr<bool> dir = roots->IsDirectory(path);
    if (!dir.ok()) return DataFileError(dir.status(), worker_id_, file_what.c_str());
    if (!*dir) continue;
    if (paths.size() > 1)
      return absl::InvalidArgumentError(absl::StrCat(
          field, " entry '", path, "' is a directory (a dataset, docs/datasets.md) among ",
          paths.size(), " entries: name the dataset directory alone, or safetensors files only"));
    DatasetReader::Options o;
    o.roots = roots;
    o.rank = job.rank;
    o.world_size = job.world_size;
    o.step_offset = step_offset;
    o.max_step_bytes = static_cast<uint64_t>(o_.max_data_mb) << 20;
    o.what = field;
    absl::StatusOr<DatasetReader> d = DatasetReader::Open(path, program, std::move(o));
    if (!d.ok()) return DataFileError(d.status(), worker_id_, file_what.c_str());
    util::Log(job.Prefix(), "dataset ", path, ": ", d->num_steps(),
              " steps, this rank's rows read per step");
    return std::optional<DatasetReader>(*std::move(d));
  }
  return std::optional<DatasetReader>();
}

// AssignJob.initial_checkpoint: the tensors this rank reads and creates,
// added to the ones the server sent (a name in both is refused).
absl::Status AttachedWorker::AddCheckpointState(const AssignedJob& job, TensorMap* state) const {
  const RankStateLayout layout =
      LayoutOf(job.assign, &job.declared_state, o_.data_roots_opened.get());
  const auto t0 = Clock::now();
  absl::StatusOr<CheckpointState> read =
      ReadCheckpointState(job.assign.initial_checkpoint(), layout);
  if (!read.ok()) return DataFileError(read.status(), worker_id_, "initial_checkpoint");
  for (auto& [name, t] : read->tensors) {
    if (!state->emplace(name, std::move(t)).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "initial state: '", name,
          "' was both sent and read from initial_checkpoint (JobSpec.num_state_tensors counts "
          "only the tensors the checkpoint does not give)"));
    }
  }
  util::Log(job.Prefix(), "initial_checkpoint '", job.assign.initial_checkpoint().path(),
            "': read ", job.assign.initial_checkpoint().tensors_size(), " tensors from ",
            read->files, " files (", read->bytes_read, " of their ", read->bytes_listed,
            " bytes), filled ", job.assign.initial_checkpoint().fills_size(), " in ",
            absl::StrFormat("%.1f", MsSince(t0)), " ms");
  return absl::OkStatus();
}

absl::Status AttachedWorker::EndJob(AssignedJob& job, bool cancelled, const std::string& why) {
  util::Log(job.Prefix(), cancelled ? "cancelled" : "ended", why.empty() ? "" : ": ", why, " (",
            job.steps_done.load(), " steps done)");
  WorkerMessage m;
  v1::JobEnded* e = m.mutable_job_ended();
  e->set_job_id(job.id);
  e->set_rank(job.rank);
  e->set_cancelled(cancelled);
  e->set_steps_done(job.steps_done.load());
  job.ending = std::move(m);
  return absl::OkStatus();
}

JobTask AssignedJob::Next() {
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return cancel.load() || !events.empty(); });
  if (cancel) {
    for (JobTask& e : events)
      if (e.kind == JobTask::kCancel) return std::move(e);
    return JobTask(JobTask::kCancel);
  }
  JobTask e = std::move(events.front());
  events.pop_front();
  return e;
}

absl::Status AttachedWorker::JobBody(AssignedJob& job, std::unique_ptr<Communicator>& comm) {
  const v1::AssignJob& a = job.assign;
  // The rank's set-up, as `fxdp-worker run`'s (common.h): device, graph,
  // rendezvous (an abort of the job's connections ends it), program.
  FXDP_ASSIGN_OR_RETURN(RankSetup setup, JobRankSetup(a, device_, job.rank, job.world_size));
  absl::StatusOr<ir::Graph> graph = ir::DecodeGraph(a.graph());
  if (!graph.ok())
    return absl::Status(graph.status().code(), absl::StrCat("the graph does not decode or verify: ",
                                                            graph.status().message()));
  FXDP_ASSIGN_OR_RETURN(comm, Rendezvous(setup, job.Prefix(), &job.connections));
  if (job.cancel) return EndJob(job, true, "before the first step");
  TimedCommunicator timed(comm.get());
  FXDP_ASSIGN_OR_RETURN(Program program, LoadRankProgram(*graph, setup, &timed));
  FXDP_ASSIGN_OR_RETURN(job.outputs, NamedOutputs::Of(*graph, program.output_specs()));
  FXDP_ASSIGN_OR_RETURN(const uint64_t step_offset,
                        ir::MetadataNumber(*graph, ir::kStepOffsetKey, 0));
  job.step_offset = static_cast<int64_t>(step_offset);
  job.non_persistent = NonPersistentBuffers(*graph);
  const GraphMetadata shared = SharedMetadata(*graph);  // LoadGraph's programs match it
  graph = absl::StatusOr<ir::Graph>();                  // the program holds what it needs
  job.assign.clear_graph();
  FXDP_ASSIGN_OR_RETURN(std::optional<DatasetReader> dataset,
                        OpenDataset(job, program, job.step_offset, a.data_paths()));
  std::vector<TensorMap> files;
  if (!dataset) {
    FXDP_ASSIGN_OR_RETURN(
        files, ReadDataFiles(job, program, a.data_paths(), "data_paths", &job.data_bytes));
  }
  v1::DatasetShapes dataset_shapes;  // AssignJob.report_dataset_shapes: rank 0's
  if (a.report_dataset_shapes() && dataset) {
    FXDP_ASSIGN_OR_RETURN(dataset_shapes, ReportShapes(job, *dataset, program));
  }
  if (a.has_eval()) FXDP_RETURN_IF_ERROR(SetUpEval(job, setup, &timed));

  // Initial state.
  JobTask e = job.Next();
  if (e.kind == JobTask::kCancel) return EndJob(job, true, e.reason);
  if (e.kind == JobTask::kError) return e.error;
  if (e.kind != JobTask::kState)
    return absl::InternalError("the initial state was expected first");  // the router ensures it
  if (a.has_initial_checkpoint()) FXDP_RETURN_IF_ERROR(AddCheckpointState(job, &e.tensors));
  FXDP_ASSIGN_OR_RETURN(StepRunner runner,
                        StartJob(job, std::move(program), std::move(e.tensors), setup.device,
                                 comm->name(), std::move(dataset_shapes)));

  while (true) {
    e = job.Next();
    switch (e.kind) {
      case JobTask::kCancel: return EndJob(job, true, e.reason);
      case JobTask::kError:
        if (e.step > 0) {
          job.log_step = e.step;
          job.in_step = true;
        }
        return e.error;
      case JobTask::kState:
        return absl::InternalError("a second initial state");  // the router prevents this
      case JobTask::kBatch:
        FXDP_RETURN_IF_ERROR(RunBatch(job, e, runner, timed, files, dataset ? &*dataset : nullptr));
        break;
      case JobTask::kLoadGraph:
        FXDP_RETURN_IF_ERROR(LoadGraph(job, e, runner, setup, timed, shared));
        break;
      case JobTask::kFetch:
        FXDP_RETURN_IF_ERROR(StreamState(job, e, runner));
        if (e.end_job) return EndJob(job, false, "after FetchState");
        break;
    }
  }
}

absl::StatusOr<v1::DatasetShapes> AttachedWorker::ReportShapes(const AssignedJob& job,
                                                               DatasetReader& dataset,
                                                               const Program& program) const {
  absl::StatusOr<DatasetReader::EntryShapes> all = dataset.AllEntryShapes(program);
  if (!all.ok()) return DataFileError(all.status(), worker_id_, "data_paths file");
  v1::DatasetShapes out;
  for (const ir::InputShapes& shape : all->shapes) {
    v1::BatchShape* b = out.add_shapes();
    for (const auto& [name, dims] : shape) {
      v1::NamedShape* t = b->add_tensors();
      t->set_name(name);
      t->mutable_dims()->Assign(dims.begin(), dims.end());
    }
  }
  out.mutable_entries()->Assign(all->entries.begin(), all->entries.end());
  util::Log(job.Prefix(), "dataset: ", all->entries.size(), " index entries of ",
            all->shapes.size(), " batch shapes, reported to the server");
  return out;
}

absl::StatusOr<StepRunner> AttachedWorker::StartJob(AssignedJob& job, Program program,
                                                    TensorMap state, const c10::Device& device,
                                                    const std::string& comm_name,
                                                    v1::DatasetShapes dataset_shapes) {
  const int num_ops = program.num_nodes();
  absl::StatusOr<StepRunner> runner = StepRunner::Create(std::move(program), std::move(state));
  if (!runner.ok())
    return absl::Status(runner.status().code(),
                        absl::StrCat("initial state: ", runner.status().message()));
  const double setup_ms = MsSince(job.assigned_at);
  util::Log(job.Prefix(), "started: ", num_ops, " ops on ", device.str(), ", ", comm_name, ", ",
            runner->state().size(), " state tensors (setup ", absl::StrFormat("%.1f", setup_ms),
            " ms)");
  WorkerMessage m;
  v1::JobStarted* js = m.mutable_job_started();
  js->set_job_id(job.id);
  js->set_rank(job.rank);
  js->set_world_size(job.world_size);
  js->set_device(device.str());
  js->set_num_ops(num_ops);
  js->set_setup_ms(setup_ms);
  if (dataset_shapes.entries_size() > 0) js->mutable_dataset_shapes()->Swap(&dataset_shapes);
  job.session->Write(m);
  return runner;
}

absl::Status AttachedWorker::RunBatch(AssignedJob& job, JobTask& e, StepRunner& runner,
                                      TimedCommunicator& timed, const std::vector<TensorMap>& files,
                                      DatasetReader* dataset) {
  const int64_t step = e.step;
  job.log_step = step;
  job.in_step = true;
  if (step != job.steps_done + 1)
    return absl::InvalidArgumentError(
        absl::StrCat("got the batch for step ", step, ", expected step ", job.steps_done + 1));
  if (job.steps > 0 && step > job.steps)
    return absl::InvalidArgumentError(
        absl::StrCat("a batch for step ", step, " of a job of ", job.steps, " steps"));
  Program* program = runner.FindProgram(e.graph_id);
  if (program == nullptr)  // the router checks it first
    return absl::InvalidArgumentError(absl::StrCat("the batch of step ", step, " names graph_id ",
                                                   e.graph_id, "; the worker holds ",
                                                   runner.ProgramIds()));
  const auto t0 = Clock::now();
  FXDP_ASSIGN_OR_RETURN(TensorMap shard,
                        RankBatch(job, e, *program, !files.empty(), dataset, worker_id_));
  e.tensors.clear();
  // Batch.hyperparameters; the error's prefix names the job, rank and step.
  FXDP_RETURN_IF_ERROR(runner.SetHyperparameters(e.hyperparameters));
  const TensorMap& batch =
      files.empty() || dataset != nullptr ? shard : files[(step - 1) % files.size()];
  timed.TakeStats();
  runner.set_step(step);
  FXDP_ASSIGN_OR_RETURN(at::Tensor loss, runner.Step(batch, e.graph_id));
  const int local_loss = LocalLossIndex(*program);
  double value = 0, local = 0;
  std::vector<std::pair<std::string, double>> named;
  try {
    named = job.outputs.Values(runner.other_outputs());
    value = LossValue(loss);
    local = value;
    if (local_loss >= 0 && local_loss < static_cast<int>(runner.other_outputs().size()) &&
        runner.other_outputs()[local_loss].isTensor())
      local = LossValue(runner.other_outputs()[local_loss].toTensor());
  } catch (const std::exception& ex) {
    return absl::InternalError(absl::StrCat("reading the loss: ", ex.what()));
  }
  const double ms = MsSince(t0);
  const CollectiveStats cs = timed.TakeStats();
  job.steps_done = step;
  job.in_step = false;
  job.session->Write(StepResultMessage(job, step, e.graph_id, value, local, ms, cs, named));
  util::Log(job.Prefix(), "loss ", absl::StrFormat("%.8g", value), NamedValuesText(named),
            " (local ", absl::StrFormat("%.8g", local), ", ", absl::StrFormat("%.1f", ms),
            " ms, comm wait ", absl::StrFormat("%.1f", cs.wait_ms), " ms)");
  FXDP_RETURN_IF_ERROR(MaybeCheckpoint(job, runner, timed, step));
  return MaybeEvaluate(job, runner, step);
}

absl::Status AttachedWorker::LoadGraph(AssignedJob& job, JobTask& e, StepRunner& runner,
                                       const RankSetup& setup, TimedCommunicator& timed,
                                       const GraphMetadata& first) {
  // A failure here fails the step the program is for (the next one).
  job.log_step = job.steps_done + 1;
  job.in_step = true;
  if (!e.error.ok()) return e.error;  // the router refused it
  const auto t0 = Clock::now();
  auto fail = [&](const absl::Status& s, absl::string_view what = "") {
    return absl::Status(s.code(),
                        absl::StrCat("LoadGraph graph_id ", e.graph_id, ": ", what, s.message()));
  };
  if (e.evict_graph_id != 0) {
    if (absl::Status s = runner.DropProgram(e.evict_graph_id); !s.ok())
      return fail(s, absl::StrCat("evict_graph_id ", e.evict_graph_id, ": "));
  }
  absl::StatusOr<ir::Graph> graph = ir::DecodeGraph(*e.graph);
  e.graph.reset();
  if (!graph.ok()) return fail(graph.status(), "the graph does not decode or verify: ");
  if (absl::Status s = CheckSharedMetadata(first, *graph); !s.ok()) return fail(s);
  absl::StatusOr<Program> program = LoadRankProgram(*graph, setup, &timed);
  if (!program.ok()) return fail(program.status());
  const int num_ops = program->num_nodes();
  if (absl::Status s = runner.AddProgram(e.graph_id, *std::move(program)); !s.ok())
    return fail(s, "its placeholders differ from graph 0's, which share the job's state: ");
  util::Log(job.Prefix(), "loaded graph ", e.graph_id, ": ", num_ops, " ops in ",
            absl::StrFormat("%.1f", MsSince(t0)), " ms",
            e.evict_graph_id != 0 ? absl::StrCat(" (evicted graph ", e.evict_graph_id, ")") : "",
            "; holding graphs ", runner.ProgramIds());
  job.in_step = false;
  job.log_step = job.steps_done.load();
  return absl::OkStatus();
}

absl::Status AttachedWorker::StreamState(AssignedJob& job, const JobTask& e,
                                         const StepRunner& runner) {
  // Stream the state: every chunk is written when the next one exists,
  // so the final one can carry `last`.
  std::optional<WorkerMessage> held;
  bool ok = true;
  int64_t bytes = 0;
  const size_t chunk = e.chunk_bytes > 0 ? e.chunk_bytes : kDefaultChunkBytes;
  for (const auto& [name, t] : runner.state()) {
    absl::Status s = ChunkTensor(name, t, chunk, [&](v1::TensorChunk& c) {
      if (held) ok = job.session->Write(*held);
      bytes += static_cast<int64_t>(c.data().size());
      held.emplace();
      held->mutable_state_chunk()->set_job_id(job.id);
      held->mutable_state_chunk()->mutable_tensor()->Swap(&c);
      return ok;
    });
    if (!ok) break;
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("fetching the state: ", s.message()));
  }
  if (ok) {
    if (!held) {
      held.emplace();
      held->mutable_state_chunk()->set_job_id(job.id);
    }
    held->mutable_state_chunk()->set_last(true);
    ok = job.session->Write(*held);
  }
  util::Log(job.Prefix(), ok ? "sent" : "could not send", " the state (", runner.state().size(),
            " tensors, ", bytes, " bytes)");
  return absl::OkStatus();
}

}  // namespace fxdp::executor::attach
