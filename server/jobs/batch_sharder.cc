#include "server/jobs/batch_sharder.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "expansion/data_parallel.h"
#include "util/status_macros.h"

namespace fxdp::server {
namespace {

void AddHyperparameters(const ir::HyperparameterValues& values, v1::Batch* b) {
  for (const auto& [name, value] : values) {
    v1::HyperparameterValue* h = b->add_hyperparameters();
    h->set_name(name);
    h->set_value(value);
  }
}

// What to do about a global batch input of `dtype` and `shape` that is not
// the static graph's `in` (issue 26): a partial last batch, another sequence
// length, another dtype, each with what fixes it.
std::string ShapeAdvice(const InputSpec& in, v1::DType dtype, const std::vector<int64_t>& shape) {
  constexpr char kSymbolic[] =
      "or trace with symbolic sizes (fxdp.trace_step(..., dynamic=True)): one job then runs every "
      "batch shape (docs/shapes.md)";
  if (dtype != in.dtype) {
    return absl::StrCat("convert it to the traced dtype (", TypeString(in.dtype, in.shape), ")");
  }
  if (shape.size() != in.shape.size()) {
    return absl::StrCat("it has ", shape.size(), " dims, the traced batch ", in.shape.size());
  }
  std::vector<std::string> advice;
  const int bd = in.batch_dim;
  if (bd >= 0 && shape[bd] < in.shape[bd]) {
    advice.push_back(absl::StrCat("a partial last batch (", shape[bd], " of ", in.shape[bd],
                                  " samples): drop it (DataLoader(..., drop_last=True)) or pad it "
                                  "to ",
                                  in.shape[bd], " samples"));
  } else if (bd >= 0 && shape[bd] > in.shape[bd]) {
    advice.push_back(absl::StrCat(shape[bd], " samples, traced with ", in.shape[bd],
                                  ": send batches of ", in.shape[bd]));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (static_cast<int>(d) == bd || shape[d] == in.shape[d]) continue;
    advice.push_back(
        absl::StrCat("dim ", d, " is ", shape[d], ", traced with ", in.shape[d],
                     " (a padded sequence length?): pad every batch to ", in.shape[d],
                     " (a tokenizer's padding=\"max_length\", max_length=", in.shape[d], ")"));
    break;
  }
  advice.push_back(kSymbolic);
  return absl::StrJoin(advice, "; ");
}

// "f32[s, s, 4]": `in`'s type, a symbolic dim as 's'.
std::string SymbolicTypeText(const InputSpec& in) {
  std::string dims;
  for (size_t d = 0; d < in.shape.size(); ++d) {
    absl::StrAppend(&dims, d ? ", " : "", in.symbolic[d] ? "s" : absl::StrCat(in.shape[d]));
  }
  const std::string t = TypeString(in.dtype, {});  // "f32[]"
  return absl::StrCat(t.substr(0, t.size() - 1), dims, "]");
}

}  // namespace

absl::Status CheckInputShape(const std::string& what, const InputSpec& in, v1::DType dtype,
                             const std::vector<int64_t>& shape) {
  const std::string got = TypeString(dtype, shape);
  if (in.symbolic.empty()) {
    if (dtype == in.dtype && shape == in.shape) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": input '", in.name, "' is ", got, ", the graph expects ",
        TypeString(in.dtype, in.shape), " (the global batch): ", ShapeAdvice(in, dtype, shape)));
  }
  const std::string want =
      absl::StrCat(what, ": input '", in.name, "' is ", got, ", the graph expects ",
                   SymbolicTypeText(in), " (the global batch; s: a size its guards allow)");
  if (dtype != in.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(want, ": convert it to the traced dtype (",
                                                   TypeString(in.dtype, in.shape), ")"));
  }
  if (shape.size() != in.shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(want, ": it has ", shape.size(), " dims, the traced batch ", in.shape.size()));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (in.symbolic[d] || shape[d] == in.shape[d]) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        want, ": dim ", d, " is ", shape[d], ", but the trace made it static at ", in.shape[d],
        " (the model used its size as a constant); pad it to ", in.shape[d],
        ", or trace with dynamic={'", in.name, "': [...]} naming the dims that vary"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> MicroBatchOf(const v1::ExpandResponse& expanded) {
  int64_t rows = 0;
  if (expanded.graphs_size() == 0) return 0;
  for (const v1::StringPair& m : expanded.graphs(0).metadata()) {
    if (m.key() == ir::kMicroBatchKey && (!absl::SimpleAtoi(m.value(), &rows) || rows < 0)) {
      return absl::InternalError(absl::StrCat("the rank graphs' ", ir::kMicroBatchKey, " is '",
                                              m.value(), "', not a number of rows"));
    }
  }
  return rows;
}

absl::StatusOr<RankRows> RankRowsOf(const v1::ExpandResponse& expanded, int world,
                                    const std::vector<InputSpec>& inputs,
                                    const ir::InputShapes& shapes) {
  FXDP_ASSIGN_OR_RETURN(const int64_t micro, MicroBatchOf(expanded));
  RankRows rows;
  std::map<std::string, int64_t> global;  // each batch input's rows
  for (const InputSpec& in : inputs) {
    auto it = shapes.find(in.name);
    if (in.batch_dim >= 0 && it != shapes.end() &&
        in.batch_dim < static_cast<int>(it->second.size()))
      global[in.name] = it->second[in.batch_dim];
  }
  for (int r = 0; r < world && !global.empty(); ++r) {
    for (const InputSpec& local : GraphInputs(expanded.graphs(r % expanded.graphs_size()))) {
      auto it = global.find(local.name);
      if (it == global.end()) continue;
      const int bd = FindInputSpec(inputs, local.name)->batch_dim;
      std::vector<ir::RankSlice> mine = ir::RankRows(it->second, micro, world, r);
      const int64_t declared = bd < static_cast<int>(local.shape.size()) ? local.shape[bd] : -1;
      if (ir::RowCount(mine) != declared) {
        return absl::InternalError(
            absl::StrCat("rank ", r, "'s graph declares ", declared, " rows of input '", local.name,
                         "', but its rows of the global batch of ", it->second,
                         micro > 0 ? absl::StrCat(" in micro-batches of ", micro) : std::string(),
                         " are ", ir::RowCount(mine), " (", ir::InputShapesText(shapes), ")"));
      }
      rows[local.name].push_back(std::move(mine));
    }
  }
  for (const auto& [name, n] : global) {
    if (static_cast<int>(rows[name].size()) != world) {
      return absl::InternalError(absl::StrCat("the rank graphs declare input '", name, "' on ",
                                              rows[name].size(), " of ", world, " ranks (",
                                              ir::InputShapesText(shapes), ")"));
    }
  }
  return rows;
}

const InputSpec* BatchSharder::FindInput(const std::string& name) const {
  return FindInputSpec(*inputs_, name);
}

absl::StatusOr<bool> BatchSharder::Add(int64_t step, const v1::SubmitJobRequest& req) {
  using absl::InvalidArgumentError;
  const int64_t job_step = first_ + step;
  const std::string what = absl::StrCat("step ", job_step, "'s batch");
  if (!req.has_batch())
    return InvalidArgumentError(absl::StrCat("expected ", what, ", got ", SubmitRequestKind(req)));
  const v1::StepBatch& b = req.batch();
  if (b.step() != job_step) {
    return InvalidArgumentError(absl::StrCat(
        "got a StepBatch for step ", b.step(), ", expected step ", job_step,
        first_ > 0 ? absl::StrCat(" (the job resumes after its checkpoint of step ", first_,
                                  " (JobEvent.first_step), then steps are consecutive)")
                   : std::string(" (steps count from 1, consecutively)")));
  }
  if (batch_ == nullptr) {
    batch_ = std::make_unique<ChunkStream>(what, /*keep_data=*/true);
    step_hyper_.clear();
    Clear();
    shapes_.clear();
    step_bytes_ = 0;
  }
  for (const v1::HyperparameterValue& h : b.hyperparameters()) {
    if (absl::Status s =
            placeholders_->Check({h.name()}, absl::StrCat(what, ": StepBatch.hyperparameters"));
        !s.ok()) {
      return InvalidArgumentError(s.message());
    }
    if (!std::isfinite(h.value())) {
      return InvalidArgumentError(absl::StrCat(what, ": hyper-parameter '", h.name(), "' is ",
                                               h.value(), ", not a finite number"));
    }
    step_hyper_[h.name()] = h.value();
  }
  for (const v1::TensorChunk& c : b.tensors()) {
    if (!batch_->pending()) {
      const InputSpec* in = FindInput(c.name());
      if (in == nullptr) {
        std::vector<std::string> names;
        for (const InputSpec& i : *inputs_) names.push_back(i.name);
        return InvalidArgumentError(absl::StrCat(
            what, ": tensor '", c.name(),
            "' is not an INPUT of the graph (its inputs: ", absl::StrJoin(names, ", "), ")"));
      }
      const std::vector<int64_t> shape(c.shape().begin(), c.shape().end());
      if (absl::Status s = CheckInputShape(what, *in, c.dtype(), shape); !s.ok()) return s;
      if (absl::Status s = batch_->Add(c); !s.ok()) return InvalidArgumentError(s.message());
      if (absl::Status s = CountBytes(what, c.name()); !s.ok()) return s;
      continue;
    }
    if (absl::Status s = batch_->Add(c); !s.ok()) return InvalidArgumentError(s.message());
  }
  if (b.more()) return false;
  if (batch_->pending()) {
    return InvalidArgumentError(absl::StrCat(what, ": tensor '", batch_->pending_name(),
                                             "' is incomplete and StepBatch.more is not set"));
  }
  std::vector<RawTensor> tensors = batch_->Take();
  batch_.reset();
  for (const InputSpec& in : *inputs_) {
    if (std::none_of(tensors.begin(), tensors.end(),
                     [&](const RawTensor& t) { return t.name == in.name; })) {
      return InvalidArgumentError(absl::StrCat(what, " lacks input '", in.name, "' (",
                                               TypeString(in.dtype, in.shape), ")"));
    }
  }
  std::map<std::string, double> merged;
  for (const auto& [name, value] : schedule_->At(job_step)) merged[name] = value;
  for (const auto& [name, value] : step_hyper_) merged[name] = value;
  hyper_.assign(merged.begin(), merged.end());
  for (const RawTensor& t : tensors) shapes_[t.name] = t.shape;
  tensors_ = std::move(tensors);
  step_ = step;
  return true;
}

absl::Status BatchSharder::CountBytes(const std::string& what, const std::string& name) {
  step_bytes_ += batch_->current_bytes();
  if (step_bytes_ <= max_batch_bytes_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      what, " is ", step_bytes_, " bytes with input '", name, "', over this server's limit of ",
      max_batch_bytes_ >> 20, " MiB per step (fxdp-server --max-batch-mb)"));
}

absl::Status BatchSharder::CutRagged(const ir::RaggedInputs& ragged, const RankRows& rows) {
  absl::StatusOr<RaggedCuts> cuts = CutRaggedBatch(ragged, tensors_, rows, world_);
  if (!cuts.ok()) {
    return absl::Status(cuts.status().code(), absl::StrCat("step ", first_ + step_,
                                                           "'s batch: ", cuts.status().message()));
  }
  ragged_ = *std::move(cuts);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::ServerMessage>> BatchSharder::RankBatch(int rank,
                                                                       const RankRows& rows,
                                                                       uint32_t graph_id) {
  std::vector<v1::TensorChunk> chunks;
  for (const RawTensor& t : tensors_) {
    const InputSpec& in = *FindInput(t.name);
    v1::TensorChunk c;
    c.set_name(t.name);
    c.set_dtype(static_cast<v1::DType>(ir::DTypeToWire(t.dtype)));
    absl::StatusOr<bool> cut = RaggedRankTensor(ragged_, t, rank, &c);
    if (!cut.ok()) {
      return absl::Status(cut.status().code(), absl::StrCat("step ", first_ + step_,
                                                            "'s batch: ", cut.status().message()));
    }
    if (*cut) {
      RechunkTensor(c, chunk_bytes_, &chunks);
      continue;
    }
    std::vector<int64_t> shape = t.shape;
    if (in.batch_dim >= 0 && in.batch_dim < static_cast<int>(shape.size())) {
      auto it = rows.find(t.name);
      if (it == rows.end() || static_cast<int>(it->second.size()) <= rank) {
        return absl::InternalError(absl::StrCat("step ", first_ + step_, "'s batch: no rows of '",
                                                t.name, "' for rank ", rank));
      }
      const std::vector<RankSlice>& slices = it->second[rank];
      absl::StatusOr<std::string> data = SliceRows(t, in.batch_dim, slices);
      if (!data.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("step ", first_ + step_, "'s batch: ", data.status().message()));
      }
      shape[in.batch_dim] = ir::RowCount(slices);
      c.set_data(*std::move(data));
    } else {
      c.set_data(t.data);
    }
    for (int64_t d : shape) c.add_shape(d);
    RechunkTensor(c, chunk_bytes_, &chunks);
  }
  // Chunks grouped up to chunk_bytes per message; the hyper-parameters on
  // the step's first message.
  std::vector<v1::ServerMessage> out(1);
  auto start = [&] {
    v1::Batch* b = out.back().mutable_batch();
    b->set_job_id(job_id_);
    b->set_step(step_);
    b->set_graph_id(graph_id);
  };
  start();
  AddHyperparameters(hyper_, out.back().mutable_batch());
  size_t bytes = 0;
  for (v1::TensorChunk& c : chunks) {
    v1::Batch* b = out.back().mutable_batch();
    if (b->tensors_size() > 0 && bytes + c.data().size() > chunk_bytes_) {
      b->set_more(true);
      out.emplace_back();
      start();
      bytes = 0;
    }
    bytes += c.data().size();
    out.back().mutable_batch()->add_tensors()->Swap(&c);
  }
  return out;
}

v1::ServerMessage BatchSharder::ScheduleOnlyBatch(int64_t step, int64_t schedule_step) const {
  v1::ServerMessage m;
  m.mutable_batch()->set_job_id(job_id_);
  m.mutable_batch()->set_step(step);
  AddHyperparameters(schedule_->At(schedule_step), m.mutable_batch());
  return m;
}

}  // namespace fxdp::server
