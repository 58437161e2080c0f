// fxdp run --server HOST:PORT: submits a job to fxdp-server's JobService
// (proto/fxdp/v1/jobs.proto), streams its state and batches, shows its
// events and fetches its final state.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/ir/hyperparameters.h"
#include "analysis/ir/random_ops.h"
#include "analysis/ir/safetensors.h"
#include "analysis/ir/tensor_chunks.h"
#include "client/cli/commands.h"
#include "client/cli/connect.h"
#include "client/cli/job_format.h"
#include "client/cli/run_checkpoints.h"
#include "expansion/style_proto.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/fxdp/v1/jobs.grpc.pb.h"
#include "util/flags.h"

namespace fxdp::cli {
namespace {

using ir::RawTensor;

constexpr char kRunUsage[] =
    "usage: fxdp run GRAPH --world-size N --state S.safetensors --data D.safetensors\n"
    "                [--data D2.safetensors ...] [--steps K] [--out FINAL.safetensors]\n"
    "                [--style replicate|fully_shard] [--bucket-mb X] [--sync-batchnorm]\n"
    "                [--name NAME] [--timeout S] [--seed S]\n"
    "                [--schedule FILE] [--json] [--server HOST:PORT]\n"
    "                [--checkpoint-dir D [--checkpoint-every K] [--keep-checkpoints N]]\n"
    "                [--initial-checkpoint P]\n"
    "       fxdp run GRAPH ... --data-on-workers PATH [--data-on-workers PATH2 ...] --steps K\n"
    "       fxdp run GRAPH --world-size N --data D.safetensors ... --resume JOB\n"
    "\n"
    "Runs a traced training step (GRAPH, what fxdp.trace saved) data-parallel on N\n"
    "workers of fxdp-server (JobService.Submit). S holds the initial state (every\n"
    "non-input placeholder), each D one global batch (every input placeholder by\n"
    "name); step i uses data file i mod (number of --data files). The state and the\n"
    "batches are streamed in 1 MiB chunks; the server sends each worker only its\n"
    "shard of each batch. With --data-on-workers the workers read the batches from\n"
    "that safetensors file on their own filesystem instead (nothing is sent).\n"
    "While fewer than N workers are idle the job is queued (FIFO): 'queued' lines say\n"
    "its position and what it waits for. Then prints a line per step (step i/K loss\n"
    "L (T ms); a progress bar on a terminal) and the job id at the end.\n"
    "With --resume JOB (a FAILED or CANCELLED job that kept the state of its last\n"
    "step, or a checkpoint: fxdp-server --state-dir) the same command continues\n"
    "that job from there as a new job: its state, step counter and schedule\n"
    "position are the checkpoint's, the batches of the steps before it are skipped, and the\n"
    "final state equals an uninterrupted run's (docs/jobs.md).\n"
    "\n"
    "  --server HOST:PORT   the fxdp server (default $FXDP_SERVER, else "
    "127.0.0.1:50051)\n" FXDP_CLI_CREDENTIAL_USAGE
    "  --world-size N       number of data-parallel ranks (default 1)\n"
    "  --state FILE         initial state, safetensors (required; not with --resume)\n"
    "  --data FILE          a global batch, safetensors (repeatable)\n"
    "  --data-on-workers P  a global batch, safetensors on the workers (repeatable;\n"
    "                       instead of --data; needs --steps; read only under the\n"
    "                       workers' --data-root directories), or a dataset\n"
    "                       directory alone (shards + index.json, docs/datasets.md:\n"
    "                       each worker reads only its rows of each step)\n"
    "  --steps K            number of steps (default: the number of --data files)\n"
    "  --seed S             the seed of the graph's random ops (dropout...), an unsigned\n"
    "                       64-bit number recorded in the job's graph (metadata\n"
    "                       fxdp.seed; default: the one the graph has). The same\n"
    "                       seed gives the same draws on any number of workers\n"
    "                       (docs/randomness.md)\n"
    "  --out FILE           write the final state (FetchState) as safetensors: whole\n"
    "                       tensors, whatever the style (not with --checkpoint-dir)\n"
    "  --style S            replicate (default: every worker holds the whole state,\n"
    "                       as DDP) or fully_shard (each holds a flat 1/N shard of\n"
    "                       every parameter and its optimizer state, as FSDP; the\n"
    "                       server splits --state and reassembles --out)\n"
    "  --bucket-mb X        gradient bucket cap, MiB (default: DDP's)\n"
    "  --sync-batchnorm     batch norm with the global batch's statistics, all-reduced\n"
    "                       (as SyncBatchNorm; default: each rank's, as DDP)\n"
    "  --name NAME          a label for `fxdp jobs` (default: GRAPH's file name)\n"
    "  --timeout S          rendezvous / collective timeout, seconds (default 60)\n"
    "  --schedule FILE      per-step values of the graph's hyper-parameters (its\n"
    "                       HYPERPARAMETER placeholders: optim.group0.lr, ...), JSON:\n"
    "                       {\"optim.group0.lr\": [v1, v2, ...]} (one value per step) or a\n"
    "                       closed form: {\"constant\": v}, {\"linear_warmup_cosine\":\n"
    "                       {\"peak\": P, \"warmup_steps\": W, \"total_steps\": T, \"final\": "
    "F}},\n"
    "                       {\"step_decay\": {\"initial\": V, \"step_size\": N, \"gamma\": G}}\n"
    "                       (docs/schedules.md). Sent in the JobSpec; the graph is\n"
    "                       compiled once for the whole run. Names the schedule leaves\n"
    "                       out keep their traced value\n"
    "  --json               one JSON object per line per event instead of text\n"
    "  --checkpoint-dir D   the workers write checkpoints, each its own part, into\n"
    "                       D/step-K/ under their --data-root (docs/checkpoints.md): every\n"
    "                       --checkpoint-every K steps (0, default: after the last), the\n"
    "                       --keep-checkpoints N newest of this job kept (0: all; one\n"
    "                       dir per job: older jobs' are not removed); the last, printed,\n"
    "                       is the final state (the server collects none)\n"
    "  --initial-checkpoint P  the workers read what --state lacks (optional then) from\n"
    "                       the checkpoint P on their filesystem (one they wrote, or a\n"
    "                       Hugging Face one), each state tensor under its own name\n"
    "  --resume JOB         continue the FAILED or CANCELLED job JOB from its kept\n"
    "                       state (give the first run's GRAPH, --world-size, --style, --data,\n"
    "                       --steps and --schedule; not --state): a new job\n"
    "                       that runs the steps after the checkpoint. With an\n"
    "                       evaluation GRAPH (fxdp.trace_eval) instead: evaluates the\n"
    "                       state any finished job JOB kept, on the workers\n"
    "  --eval G             evaluate the state while training: the evaluation graph G\n"
    "                       (fxdp.trace_eval) after every --eval-every steps and the last,\n"
    "                       over the --eval-data batches on the workers; prints\n"
    "                       'evaluation after step K: loss=... name=...' (summed over\n"
    "                       the batches; docs/evaluation.md)\n"
    "  --eval-data P        an evaluation batch on the workers, safetensors (repeatable),\n"
    "                       or a dataset directory alone\n"
    "  --eval-every K       evaluate after every K-th step (default 0: after the last)\n"
    "\n"
    "Exit codes: 0 ok, 1 the job failed, was cancelled or was refused, 2 usage, 3 the\n"
    "server is unreachable or a file cannot be read or written.\n";

constexpr size_t kChunkBytes = size_t{1} << 20;

// Calls `emit` with `t` as TensorChunks of at most kChunkBytes (the
// protocol's spans, ir::ChunkSpans); false when `emit` does.
template <typename Emit>
bool EmitChunks(const RawTensor& t, Emit emit) {
  for (const auto& [off, n] : ir::ChunkSpans(t.data.size(), kChunkBytes)) {
    v1::TensorChunk c;  // `emit` may take it apart
    c.set_name(t.name);
    c.set_dtype(static_cast<v1::DType>(ir::DTypeToWire(t.dtype)));
    for (int64_t d : t.shape) c.add_shape(d);
    c.set_offset(off);
    c.set_data(t.data.substr(off, n));
    if (!emit(c)) return false;
  }
  return true;
}

// --resume: the step the resumed job continues from, as its first event
// (JobEvent.first_step) tells; -1 when the call ended before any event.
class FirstStep {
 public:
  void Set(int64_t step) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (set_) return;
      step_ = step;
      set_ = true;
    }
    cv_.notify_all();
  }
  int64_t Wait() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return set_; });
    return step_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
  int64_t step_ = 0;
};

// Writes the Submit stream: spec, state, then each step's global batch
// (cycling through `batches`; a resumed job's from the step after its
// checkpoint, once `resumed` knows it); WritesDone at the end. Stops when a
// write fails (the server ended the call).
void WriteSubmit(grpc::ClientReaderWriter<v1::SubmitJobRequest, v1::JobEvent>* stream,
                 v1::JobSpec spec, const std::vector<RawTensor>& state,
                 const std::vector<std::vector<RawTensor>>& batches, FirstStep* resumed) {
  const int64_t steps = spec.steps();
  v1::SubmitJobRequest req;
  req.mutable_spec()->Swap(&spec);
  if (!stream->Write(req)) return;
  for (const RawTensor& t : state) {
    const bool ok = EmitChunks(t, [&](v1::TensorChunk& c) {
      req.mutable_state()->Swap(&c);
      return stream->Write(req);
    });
    if (!ok) return;
  }
  int64_t first = 0;
  if (resumed != nullptr && !batches.empty()) {
    first = resumed->Wait();
    if (first < 0) return;
  }
  for (int64_t step = first + 1; !batches.empty() && step <= steps; ++step) {
    const std::vector<RawTensor>& batch = batches[(step - 1) % batches.size()];
    // Each chunk is written when the next exists, so the last can clear `more`.
    std::optional<v1::SubmitJobRequest> held;
    for (const RawTensor& t : batch) {
      const bool ok = EmitChunks(t, [&](v1::TensorChunk& c) {
        if (held && !stream->Write(*held)) return false;
        held.emplace();
        v1::StepBatch* b = held->mutable_batch();
        b->set_step(step);
        b->set_more(true);
        b->add_tensors()->Swap(&c);
        return true;
      });
      if (!ok) return;
    }
    if (!held) held.emplace().mutable_batch()->set_step(step);
    held->mutable_batch()->set_more(false);
    if (!stream->Write(*held)) return;
  }
  stream->WritesDone();
}

// How `fxdp run` shows the job's events: text lines, a progress bar on a
// terminal, or JSON lines.
class RunPrinter {
 public:
  RunPrinter(bool json, int64_t steps, std::string resume, BatchCounts batch)
      : json_(json),
        tty_(!json && isatty(fileno(stdout))),
        steps_(steps),
        resume_(std::move(resume)),
        batch_(batch) {}

  void Event(const v1::JobEvent& e) {
    if (e.has_eval()) return json_ ? PrintLine(EventJson(e, steps_)) : Line(EvalText(e.eval()));
    const bool step_done = e.state() == v1::JOB_STATE_RUNNING && e.step() > 0;
    const StepRate::Rates rate =
        step_done ? rate_.Add(e.step(), StepCounts(batch_, e.shape())) : StepRate::Rates{};
    if (json_) {
      nlohmann::ordered_json o = EventJson(e, steps_);
      if (rate.steps > 0) {
        o["steps_per_s"] = rate.steps;
        if (rate.samples > 0) o["samples_per_s"] = rate.samples;
        if (rate.tokens > 0) o["tokens_per_s"] = rate.tokens;
      }
      return PrintLine(o);
    }
    if (!resume_.empty() && !told_) {
      told_ = true;
      Line(e.first_step() > 0
               ? absl::StrFormat("job %s resumes job %s from its checkpoint of step %d", e.job_id(),
                                 resume_, e.first_step())
               : absl::StrFormat("job %s evaluates the state job %s kept", e.job_id(), resume_));
    }
    if (e.state() == v1::JOB_STATE_QUEUED && e.queue_position() == 0) {
      Line(absl::StrFormat("job %s submitted", e.job_id()));
    } else if (e.state() == v1::JOB_STATE_QUEUED) {
      Line(absl::StrFormat("job %s queued: position %d, %s", e.job_id(), e.queue_position(),
                           e.message()));
    } else if (e.state() == v1::JOB_STATE_RUNNING && e.step() == 0) {
      Line(absl::StrFormat("job %s running on %s", e.job_id(), absl::StrJoin(e.workers(), ", ")));
    } else if (e.state() == v1::JOB_STATE_RUNNING) {
      const std::string text =
          absl::StrCat(absl::StrFormat("step %d/%s loss %.6g", e.step(),
                                       steps_ > 0 ? absl::StrCat(steps_) : "?", e.loss()),
                       OutputsText(e), absl::StrFormat(" (%.1f ms)", e.step_ms()),
                       e.shape().empty() ? "" : absl::StrCat(" [", e.shape(), "]"), RateText(rate));
      if (!tty_) return Line(text);
      constexpr int kBar = 30;
      const int filled =
          steps_ > 0 ? static_cast<int>(kBar * std::min(e.step(), steps_) / steps_) : 0;
      std::printf("\r[%s%s] %s\x1b[K", std::string(filled, '#').c_str(),
                  std::string(kBar - filled, ' ').c_str(), text.c_str());
      bar_open_ = true;
      std::fflush(stdout);
    }
  }
  // Ends an open progress bar line.
  void Close() {
    if (bar_open_) std::printf("\n");
    bar_open_ = false;
  }

 private:
  void Line(const std::string& text) {
    Close();
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  }
  // "evaluation after step 10: loss=3.2 correct=45 (summed over 8 batches, 12.5 ms)".
  static std::string EvalText(const v1::EvalMetrics& m) {
    std::string out = absl::StrCat("evaluation after step ", m.step(), ":");
    for (const v1::NamedValue& v : m.metrics())
      absl::StrAppend(&out, " ", v.name(), "=", absl::StrFormat("%.6g", v.value()));
    return absl::StrCat(
        out, absl::StrFormat(" (summed over %d batches, %.1f ms)", m.batches(), m.eval_ms()));
  }
  // " correct=5 accuracy=0.625": the step's named outputs.
  static std::string OutputsText(const v1::JobEvent& e) {
    std::string out;
    for (const v1::NamedValue& v : e.outputs())
      absl::StrAppend(&out, " ", v.name(), "=", absl::StrFormat("%.6g", v.value()));
    return out;
  }
  // "  12.5 steps/s  150 samples/s" (tokens/s for token ids); "" before a rate.
  static std::string RateText(const StepRate::Rates& rate) {
    if (rate.steps <= 0) return "";
    std::string out = absl::StrFormat("  %.3g steps/s", rate.steps);
    if (rate.tokens > 0) return absl::StrCat(out, absl::StrFormat("  %.4g tokens/s", rate.tokens));
    if (rate.samples > 0)
      return absl::StrCat(out, absl::StrFormat("  %.4g samples/s", rate.samples));
    return out;
  }

  const bool json_, tty_;
  const int64_t steps_;
  const std::string resume_;
  const BatchCounts batch_;
  StepRate rate_;
  bool bar_open_ = false, told_ = false;
};

// What `fxdp run` is asked: its GRAPH and flags, checked.
struct RunArgs {
  std::string graph, server, state_path, out, name, schedule_path, resume, eval, checkpoint_dir,
      initial_checkpoint;
  std::vector<std::string> data, data_on_workers, eval_data;
  int32_t world = 1, steps = 0, eval_every = 0, checkpoint_every = 0, keep_checkpoints = 0;
  double bucket_mb = 0, timeout_s = 0;
  bool json = false, sync_bn = false;
  DataParallelStyle style = DataParallelStyle::kReplicate;
  security::ChannelSecurity creds;
  std::optional<uint64_t> seed;  // --seed
};

// Records `seed` as the graph's metadata fxdp.seed (analysis/ir/random_ops.h).
void SetGraphSeed(v1::GraphDef& graph, uint64_t seed) {
  auto* meta = graph.mutable_metadata();
  for (int i = meta->size() - 1; i >= 0; --i)
    if (meta->Get(i).key() == ir::kSeedKey) meta->DeleteSubrange(i, 1);
  v1::StringPair* p = graph.add_metadata();
  p->set_key(std::string(ir::kSeedKey));
  p->set_value(absl::StrCat(seed));
}

// The exit code to end with (the usage printed), or -1 with `a` filled.
int ParseRunArgs(const std::vector<std::string>& args, RunArgs* a) {
  util::Flags flags("fxdp run", kRunUsage);
  a->server = DefaultServer();
  AddServerFlags(&flags, &a->server, &a->creds);
  flags.Int("--world-size", &a->world);
  flags.String("--state", &a->state_path);
  flags.Strings("--data", &a->data);
  flags.Strings("--data-on-workers", &a->data_on_workers);
  flags.Int("--steps", &a->steps);
  flags.String("--out", &a->out, "-o");
  flags.Double("--bucket-mb", &a->bucket_mb);
  flags.Bool("--sync-batchnorm", &a->sync_bn);
  std::string style = "replicate";
  flags.String("--style", &style);
  flags.String("--name", &a->name);
  flags.Double("--timeout", &a->timeout_s);
  flags.String("--schedule", &a->schedule_path);
  flags.Bool("--json", &a->json);
  flags.String("--resume", &a->resume);
  flags.String("--eval", &a->eval);
  flags.Strings("--eval-data", &a->eval_data);
  flags.Int("--eval-every", &a->eval_every);
  flags.String("--checkpoint-dir", &a->checkpoint_dir);
  flags.String("--initial-checkpoint", &a->initial_checkpoint);
  flags.Int("--checkpoint-every", &a->checkpoint_every);
  flags.Int("--keep-checkpoints", &a->keep_checkpoints);
  std::string seed_text;
  flags.String("--seed", &seed_text);
  std::vector<std::string> pos;
  if (int rc = flags.Parse(args, &pos); rc >= 0) return rc;
  if (pos.size() != 1) return flags.Usage("expected exactly one GRAPH");
  a->graph = pos[0];
  if (a->world < 1) return flags.Usage("--world-size must be >= 1");
  if (a->state_path.empty() && a->resume.empty() && a->initial_checkpoint.empty())
    return flags.Usage("--state is required (unless --resume or --initial-checkpoint)");
  if (!a->state_path.empty() && !a->resume.empty()) {
    return flags.Usage(
        "--state and --resume exclude each other: a resumed job's state is its checkpoint's");
  }
  if (a->data.empty() == a->data_on_workers.empty())
    return flags.Usage("give either --data or --data-on-workers");
  if (a->steps < 0) return flags.Usage("--steps must be >= 0");
  if (!a->data_on_workers.empty() && a->steps == 0)
    return flags.Usage("--data-on-workers needs --steps");
  if (a->steps == 0) a->steps = static_cast<int32_t>(a->data.size());
  if (a->bucket_mb < 0) return flags.Usage("--bucket-mb must be >= 0");
  if (a->eval.empty() != a->eval_data.empty())
    return flags.Usage("--eval and --eval-data go together");
  if (a->eval_every < 0) return flags.Usage("--eval-every must be >= 0");
  if (a->checkpoint_every < 0 || a->keep_checkpoints < 0)
    return flags.Usage("--checkpoint-every and --keep-checkpoints must be >= 0");
  if (a->checkpoint_dir.empty() && (a->checkpoint_every > 0 || a->keep_checkpoints > 0))
    return flags.Usage("--checkpoint-every and --keep-checkpoints need --checkpoint-dir");
  if (!a->checkpoint_dir.empty() && !a->out.empty())
    return flags.Usage(
        "--out with --checkpoint-dir: the job's final state is the workers' last checkpoint, "
        "which the server does not collect; fxdp export it (fxdp export JOB --hf DIR)");
  if (!seed_text.empty()) {
    uint64_t seed = 0;
    if (!absl::SimpleAtoi(seed_text, &seed))
      return flags.Usage(
          absl::StrCat("--seed: '", seed_text, "' is not an unsigned 64-bit number"));
    a->seed = seed;
  }
  const absl::StatusOr<DataParallelStyle> parsed_style = ParseDataParallelStyle(style);
  if (!parsed_style.ok())
    return flags.Usage(absl::StrCat("--style: ", parsed_style.status().message()));
  a->style = *parsed_style;
  return -1;
}

// The job to submit: its spec (the graph, the options, the schedule), the
// initial state (none when resuming: the checkpoint's) and the batches. The
// exit code to end with (the error printed), or -1.
int ReadGraph(const std::string& path, v1::GraphDef* graph) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fxdp run: cannot read %s\n", path.c_str());
    return kExitIo;
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!graph->ParseFromString(bytes)) {
    std::fprintf(stderr, "fxdp run: %s: not a serialized GraphDef\n", path.c_str());
    return kExitInvalidInput;
  }
  return -1;
}

int BuildJob(const RunArgs& a, v1::JobSpec* spec, std::vector<RawTensor>* state,
             std::vector<std::vector<RawTensor>>* batches) {
  if (int rc = ReadGraph(a.graph, spec->mutable_graph()); rc >= 0) return rc;
  if (!a.eval.empty()) {
    v1::EvalPolicy* e = spec->mutable_eval();
    if (int rc = ReadGraph(a.eval, e->mutable_graph()); rc >= 0) return rc;
    for (const std::string& p : a.eval_data) e->add_data_paths(p);
    e->set_every(a.eval_every);
  }
  if (!a.state_path.empty()) {
    absl::StatusOr<std::vector<RawTensor>> s = ir::ReadSafetensorsFile(a.state_path);
    if (!s.ok()) return ReportError("run", s.status());
    *state = *std::move(s);
  }
  for (const std::string& d : a.data) {
    auto b = ir::ReadSafetensorsFile(d);
    if (!b.ok()) return ReportError("run", b.status());
    batches->push_back(*std::move(b));
  }
  spec->set_world_size(a.world);
  spec->set_steps(a.steps);
  spec->set_num_state_tensors(static_cast<uint32_t>(state->size()));
  for (const std::string& p : a.data_on_workers) spec->add_data_paths(p);
  spec->set_bucket_cap_mb(a.bucket_mb);
  spec->set_sync_batchnorm(a.sync_bn);
  spec->set_style(StyleToProto(a.style));
  spec->set_collective_timeout_s(a.timeout_s);
  spec->set_name(a.name.empty() ? std::filesystem::path(a.graph).filename().string() : a.name);
  spec->set_resume_job(a.resume);
  AddCheckpointSpec(a.initial_checkpoint, a.checkpoint_dir, a.checkpoint_every, a.keep_checkpoints,
                    *state, spec);
  if (a.seed.has_value()) SetGraphSeed(*spec->mutable_graph(), *a.seed);
  if (!a.schedule_path.empty()) {
    absl::StatusOr<ir::Schedule> schedule = ir::Schedule::ReadFile(a.schedule_path, a.steps);
    if (!schedule.ok()) return ReportError("run", schedule.status());
    const absl::Status names =
        ir::PlaceholderNames::Of(spec->graph())
            .Check(schedule->names(), absl::StrCat("--schedule ", a.schedule_path));
    if (!names.ok()) return ReportError("run", names);
    for (const auto& [hp, values] : schedule->series()) {
      v1::HyperparameterSeries* h = spec->add_schedule();
      h->set_name(hp);
      *h->mutable_values() = {values.begin(), values.end()};
    }
  }
  return -1;
}

// How the Submit call ended: its status, whether any event came, the last.
struct Submitted {
  grpc::Status status;
  bool any = false;
  v1::JobEvent last;
};

// Submits the job, writing its state and batches from a thread of their own
// while its events are printed as they come.
Submitted SubmitJob(v1::JobService::Stub* stub, const RunArgs& a, v1::JobSpec spec,
                    const std::vector<RawTensor>& state,
                    const std::vector<std::vector<RawTensor>>& batches) {
  const BatchCounts batch = CountBatch(spec.graph());
  grpc::ClientContext ctx;
  auto stream = stub->Submit(&ctx);
  std::atomic<bool> written{false};
  FirstStep first_step;
  std::thread writer([&] {
    WriteSubmit(stream.get(), std::move(spec), state, batches,
                a.resume.empty() ? nullptr : &first_step);
    written = true;
  });
  RunPrinter printer(a.json, a.steps, a.resume, batch);
  Submitted r;
  v1::JobEvent e;
  while (stream->Read(&e)) {
    if (!r.any) first_step.Set(e.first_step());
    r.any = true;
    r.last = e;
    printer.Event(e);
  }
  first_step.Set(-1);  // the call ended before any event: nothing more is written
  printer.Close();
  // The server has ended the call: a write still blocked fails soon; cancel
  // it if it does not.
  for (int i = 0; i < 50 && !written; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (!written) ctx.TryCancel();
  writer.join();
  r.status = stream->Finish();
  return r;
}

// The exit code of a Submit call that failed, the failure printed.
int ReportFailedCall(const RunArgs& a, const Submitted& r) {
  const grpc::Status& s = r.status;
  if (!r.any) {
    if (a.json) {
      nlohmann::ordered_json o;
      o["event"] = "error";
      o["code"] = CodeName(s.error_code());
      o["error"] = s.error_message();
      PrintLine(o);
    }
    return ReportRpcError("run", a.server, s);
  }
  const std::string& job_id = r.last.job_id();
  const std::string st = s.error_code() == grpc::StatusCode::CANCELLED ? "CANCELLED" : "FAILED";
  if (a.json && r.last.state() != v1::JOB_STATE_FAILED &&
      r.last.state() != v1::JOB_STATE_CANCELLED) {
    nlohmann::ordered_json o;
    o["event"] = "job";
    o["job_id"] = job_id;
    o["state"] = st;
    o["code"] = CodeName(s.error_code());
    o["error"] = s.error_message();
    PrintLine(o);
  }
  std::fprintf(stderr, "fxdp run: job %s %s (%s): %s\n", job_id.c_str(), st.c_str(),
               CodeName(s.error_code()).c_str(), s.error_message().c_str());
  return kExitInvalidInput;
}

}  // namespace

int RunCommand(const std::vector<std::string>& args) {
  RunArgs a;
  if (int rc = ParseRunArgs(args, &a); rc >= 0) return rc;
  v1::JobSpec spec;
  std::vector<RawTensor> state;
  std::vector<std::vector<RawTensor>> batches;
  if (int rc = BuildJob(a, &spec, &state, &batches); rc >= 0) return rc;
  auto channel = Connect("run", a.server, a.creds);
  if (!channel) return kExitIo;
  auto stub = v1::JobService::NewStub(channel);
  const Submitted r = SubmitJob(stub.get(), a, std::move(spec), state, batches);
  if (!r.status.ok()) return ReportFailedCall(a, r);
  const std::string& job_id = r.last.job_id();
  if (r.last.state() != v1::JOB_STATE_SUCCEEDED) {
    std::fprintf(stderr, "fxdp run: job %s ended %s: %s\n", job_id.c_str(),
                 StateName(r.last.state()).c_str(), r.last.error().c_str());
    return kExitInvalidInput;
  }
  if (!a.out.empty()) {
    if (int rc = FetchStateToFile(stub.get(), "run", a.server, job_id, a.out, a.json);
        rc != kExitOk)
      return rc;
  }
  if (!a.checkpoint_dir.empty()) PrintWorkerCheckpoint(stub.get(), a.json, job_id);
  if (!a.json && a.resume.empty())
    std::printf("job %s SUCCEEDED (%d steps on %d workers)\n", job_id.c_str(), a.steps, a.world);
  if (!a.json && !a.resume.empty()) {
    std::printf("job %s SUCCEEDED (steps %lld to %d on %d workers, resuming job %s)\n",
                job_id.c_str(), static_cast<long long>(r.last.first_step() + 1), a.steps, a.world,
                a.resume.c_str());
  }
  return kExitOk;
}

}  // namespace fxdp::cli
