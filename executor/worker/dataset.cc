#include "executor/worker/dataset.h"

#include <ATen/ATen.h>

#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "analysis/ir/batch_split.h"
#include "executor/torch_types.h"
#include "util/files.h"
#include "util/status_macros.h"

namespace fxdp::executor {
namespace {

absl::Status BadIndex(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// A shard's name: a relative path whose components are neither empty, "."
// nor "..", so that it stays in the dataset directory lexically (the data
// roots still decide what may be opened).
bool PlainRelativePath(const std::string& s) {
  if (s.empty() || s.size() > 1024 || s.front() == '/' || s.find('\0') != std::string::npos)
    return false;
  for (absl::string_view part : absl::StrSplit(s, '/'))
    if (part.empty() || part == "." || part == "..") return false;
  return true;
}

// An entry's "shape": {name: [rows, dims...], ...}, its rows those of `s`.
absl::StatusOr<ir::InputShapes> ParseShape(const nlohmann::json& v, const DatasetStep& s,
                                           const std::string& where, const std::string& at) {
  if (!v.is_object() || v.empty() || v.size() > kMaxDatasetShapeTensors)
    return BadIndex(where, absl::StrCat(at, ".shape is not an object of 1 to ",
                                        kMaxDatasetShapeTensors, " tensors' dims"));
  ir::InputShapes out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& name = it.key();
    if (name.empty() || name.size() > 256 || name.find('\0') != std::string::npos)
      return BadIndex(where, absl::StrCat(at,
                                          ".shape has a name that is empty, longer than 256 "
                                          "bytes or holds a NUL"));
    const std::string dims_at = absl::StrCat(at, ".shape['", name, "']");
    const nlohmann::json& dims = it.value();
    if (!dims.is_array() || dims.empty() || dims.size() > static_cast<size_t>(ir::kMaxRank))
      return BadIndex(where,
                      absl::StrCat(dims_at, " is not a list of 1 to ", ir::kMaxRank, " dims"));
    std::vector<int64_t> d;
    for (const nlohmann::json& x : dims) {
      if (!x.is_number_unsigned() || x.get<uint64_t>() > (uint64_t{1} << 62))
        return BadIndex(where, absl::StrCat(dims_at,
                                            " has a dim that is not a non-negative "
                                            "integer"));
      d.push_back(static_cast<int64_t>(x.get<uint64_t>()));
    }
    if (d[0] != s.end - s.begin)
      return BadIndex(where, absl::StrCat(dims_at, " has ", d[0], " rows; the entry's rows [",
                                          s.begin, ", ", s.end, "] are ", s.end - s.begin));
    out.emplace(name, std::move(d));
  }
  return out;
}

absl::StatusOr<DatasetStep> ParseStep(const nlohmann::json& v, const std::string& where, size_t i) {
  const std::string at = absl::StrCat("steps[", i, "]");
  if (!v.is_object()) return BadIndex(where, absl::StrCat(at, " is not an object"));
  auto file = v.find("file");
  auto rows = v.find("rows");
  if (file == v.end() || !file->is_string())
    return BadIndex(where, absl::StrCat(at, " has no \"file\" string"));
  DatasetStep s;
  s.file = file->get<std::string>();
  if (!PlainRelativePath(s.file))
    return BadIndex(where, absl::StrCat(at,
                                        ".file is not a relative path inside the dataset "
                                        "directory (no leading '/', no '.' or '..' parts, at "
                                        "most 1024 bytes)"));
  if (rows == v.end() || !rows->is_array() || rows->size() != 2 ||
      !(*rows)[0].is_number_unsigned() || !(*rows)[1].is_number_unsigned())
    return BadIndex(where, absl::StrCat(at, ".rows is not [begin, end] (non-negative integers)"));
  const uint64_t b = (*rows)[0].get<uint64_t>(), e = (*rows)[1].get<uint64_t>();
  if (e <= b || e > (uint64_t{1} << 62))
    return BadIndex(where, absl::StrCat(at, ".rows [", b, ", ", e, "] is not a non-empty range"));
  s.begin = static_cast<int64_t>(b);
  s.end = static_cast<int64_t>(e);
  return s;
}

std::string JoinPath(const std::string& dir, const std::string& rel) {
  return !dir.empty() && dir.back() == '/' ? dir + rel : absl::StrCat(dir, "/", rel);
}

absl::StatusOr<std::string> ReadIndex(const std::string& path, const util::DataRoots* roots) {
  if (roots == nullptr) return util::ReadRegularFile(path, kMaxDatasetIndexBytes);
  FXDP_ASSIGN_OR_RETURN(util::RegularFile f, roots->OpenFile(path, kMaxDatasetIndexBytes));
  std::string text(f.size(), '\0');
  FXDP_RETURN_IF_ERROR(f.ReadAt(0, f.size(), text.data()));
  return text;
}

}  // namespace

absl::StatusOr<DatasetIndex> ParseDatasetIndex(const std::string& text, const std::string& where) {
  // Never nlohmann's message, nor any of the text, before the file says it
  // is an fxdp dataset index (it may be any file under a data root).
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("fxdp_dataset"))
    return BadIndex(where, absl::StrCat("not an fxdp dataset index (", text.size(),
                                        " bytes; expected a JSON object with \"fxdp_dataset\": "
                                        "1 and \"steps\", docs/datasets.md)"));
  if (j["fxdp_dataset"] != 1)
    return BadIndex(where, "\"fxdp_dataset\" is not 1 (the only version this worker reads)");
  auto steps = j.find("steps");
  if (steps == j.end() || !steps->is_array() || steps->empty())
    return BadIndex(where, "\"steps\" is not a non-empty list");
  if (steps->size() > static_cast<size_t>(kMaxDatasetSteps))
    return BadIndex(
        where, absl::StrCat("it lists ", steps->size(), " steps, more than ", kMaxDatasetSteps));
  DatasetIndex out;
  out.steps.reserve(steps->size());
  std::map<ir::InputShapes, int32_t> ids;  // each distinct "shape" once
  for (size_t i = 0; i < steps->size(); ++i) {
    const nlohmann::json& v = (*steps)[i];
    FXDP_ASSIGN_OR_RETURN(DatasetStep s, ParseStep(v, where, i));
    if (auto shape = v.find("shape"); shape != v.end()) {
      FXDP_ASSIGN_OR_RETURN(ir::InputShapes dims,
                            ParseShape(*shape, s, where, absl::StrCat("steps[", i, "]")));
      auto [it, added] = ids.emplace(std::move(dims), static_cast<int32_t>(out.shapes.size()));
      if (added) out.shapes.push_back(it->first);
      s.shape = it->second;
    }
    out.steps.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<DatasetReader> DatasetReader::Open(const std::string& dir, const Program& program,
                                                  Options options) {
  DatasetReader r;
  r.dir_ = dir;
  r.o_ = std::move(options);
  const std::string index = JoinPath(dir, kDatasetIndexName);
  const std::string where = absl::StrCat("dataset index '", index, "'");
  absl::StatusOr<std::string> text = ReadIndex(index, r.o_.roots);
  if (!text.ok())
    return absl::Status(
        text.status().code(),
        absl::StrCat("dataset directory '", dir, "' (", r.o_.what, "): ", text.status().message()));
  FXDP_ASSIGN_OR_RETURN(DatasetIndex parsed, ParseDatasetIndex(*text, where));
  r.steps_ = std::move(parsed.steps);
  r.shapes_ = std::move(parsed.shapes);
  for (const ProgramInput& in : program.inputs()) {
    if (in.role != ir::PlaceholderRole::kInput || !in.type.is_tensor()) continue;
    if (in.batch_dim != 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "dataset directory '", dir, "': input '", in.state_name, "' has ",
          !in.ragged_offsets.empty()
              ? absl::StrCat("no batch dim (it is ragged: its samples are bags delimited by the "
                             "offsets '",
                             in.ragged_offsets, "')")
          : in.batch_dim < 0 ? std::string("no batch dim")
                             : absl::StrCat("its batch on dim ", in.batch_dim),
          "; a dataset holds samples as rows along dim 0 (stream such batches from the client, "
          "or give files with --data / data_paths)"));
  }
  return r;
}

absl::Status DatasetReader::OpenShard(const std::string& file) {
  if (shard_ != nullptr && shard_name_ == file) return absl::OkStatus();
  shard_.reset();
  shard_name_.clear();
  ir::SafetensorsReadOptions read;
  read.roots = o_.roots;
  FXDP_ASSIGN_OR_RETURN(ir::SafetensorsReader reader,
                        ir::SafetensorsReader::Open(JoinPath(dir_, file), read));
  shard_ = std::make_unique<ir::SafetensorsReader>(std::move(reader));
  shard_name_ = file;
  return absl::OkStatus();
}

absl::StatusOr<const DatasetStep*> DatasetReader::Locate(int64_t step, std::string* where) {
  return LocateEntry(static_cast<size_t>((step + o_.step_offset - 1) % num_steps()),
                     step + o_.step_offset, where);
}

absl::StatusOr<const DatasetStep*> DatasetReader::LocateEntry(size_t index, int64_t step,
                                                              std::string* where) {
  const DatasetStep& s = steps_[index];
  const std::string path = JoinPath(dir_, s.file);
  const std::string rows = absl::StrCat("rows [", s.begin, ", ", s.end, ") of '", path, "'), rank ",
                                        o_.rank, " of ", o_.world_size);
  *where = step > 0 ? absl::StrCat("dataset '", dir_, "' step ", step, " (index entry ", index,
                                   ", ", rows)
                    : absl::StrCat("dataset '", dir_, "' index entry ", index, " (", rows);
  FXDP_RETURN_IF_ERROR(OpenShard(s.file));
  return &s;
}

absl::StatusOr<const ir::SafetensorsEntry*> DatasetReader::Entry(const ProgramInput& in,
                                                                 const std::string& where) const {
  for (const ir::SafetensorsEntry& x : shard_->header().tensors)
    if (x.name == in.state_name) return &x;
  return absl::InvalidArgumentError(absl::StrCat(where, ": the shard has no tensor '",
                                                 in.state_name, "' (the graph expects ",
                                                 TypeForMessage(in.type.tensor), " on this rank)"));
}

absl::StatusOr<std::vector<int64_t>> DatasetReader::ShardShape(const DatasetStep& s,
                                                               const ProgramInput& in,
                                                               const std::string& where) const {
  FXDP_ASSIGN_OR_RETURN(const ir::SafetensorsEntry* e, Entry(in, where));
  if (e->shape.empty())
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tensor '", in.state_name, "' is 0-d in the shard: it has no rows"));
  std::vector<int64_t> shape = e->shape;
  shape[0] = s.end - s.begin;
  return shape;
}

absl::StatusOr<ir::InputShapes> DatasetReader::StepShapes(int64_t step, const Program& program) {
  std::string where;
  FXDP_ASSIGN_OR_RETURN(const DatasetStep* s, Locate(step, &where));
  ir::InputShapes out;
  for (const ProgramInput& in : program.inputs()) {
    if (in.role != ir::PlaceholderRole::kInput || !in.type.is_tensor()) continue;
    FXDP_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ShardShape(*s, in, where));
    out.emplace(in.state_name, std::move(shape));
  }
  return out;
}

absl::Status DatasetReader::CheckIndexShape(const DatasetStep& s, const Program& program,
                                            const std::string& where) const {
  if (s.shape < 0) return absl::OkStatus();
  const ir::InputShapes& said = shapes_[s.shape];
  for (const ProgramInput& in : program.inputs()) {
    if (in.role != ir::PlaceholderRole::kInput || !in.type.is_tensor()) continue;
    auto it = said.find(in.state_name);
    if (it == said.end())
      return absl::InvalidArgumentError(absl::StrCat(where, ": the index's shape of the step (",
                                                     ir::InputShapesText(said),
                                                     ") names no tensor '", in.state_name, "'"));
    FXDP_ASSIGN_OR_RETURN(std::vector<int64_t> got, ShardShape(s, in, where));
    if (got != it->second)
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor '", in.state_name,
                       "': the index says the step's batch is [", absl::StrJoin(it->second, ", "),
                       "], its rows in the shard are [", absl::StrJoin(got, ", "), "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DatasetReader::EntryShapes> DatasetReader::AllEntryShapes(const Program& program) {
  EntryShapes out;
  std::map<ir::InputShapes, uint32_t> ids;
  std::vector<int64_t> of_index(shapes_.size(), -1);  // the index's shape k: its id in `out`
  out.entries.reserve(steps_.size());
  for (size_t i = 0; i < steps_.size(); ++i) {
    const DatasetStep& s = steps_[i];
    if (s.shape >= 0 && of_index[s.shape] >= 0) {
      out.entries.push_back(static_cast<uint32_t>(of_index[s.shape]));
      continue;
    }
    ir::InputShapes shape;
    std::string where;
    if (s.shape < 0) FXDP_RETURN_IF_ERROR(LocateEntry(i, 0, &where).status());
    for (const ProgramInput& in : program.inputs()) {
      if (in.role != ir::PlaceholderRole::kInput || !in.type.is_tensor()) continue;
      if (s.shape < 0) {
        FXDP_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ShardShape(s, in, where));
        shape.emplace(in.state_name, std::move(dims));
        continue;
      }
      auto it = shapes_[s.shape].find(in.state_name);
      if (it == shapes_[s.shape].end())
        return absl::InvalidArgumentError(
            absl::StrCat("dataset '", dir_, "' index entry ", i, ": its shape (",
                         ir::InputShapesText(shapes_[s.shape]), ") names no tensor '",
                         in.state_name, "' (an INPUT of the graph)"));
      shape.emplace(in.state_name, it->second);
    }
    auto [it, added] = ids.emplace(std::move(shape), static_cast<uint32_t>(out.shapes.size()));
    if (added) out.shapes.push_back(it->first);
    if (s.shape >= 0) of_index[s.shape] = it->second;
    out.entries.push_back(it->second);
  }
  return out;
}

absl::StatusOr<TensorMap> DatasetReader::ReadStep(int64_t step, const Program& program) {
  std::string where;
  FXDP_ASSIGN_OR_RETURN(const DatasetStep* step_entry, Locate(step, &where));
  const DatasetStep& s = *step_entry;
  FXDP_RETURN_IF_ERROR(CheckIndexShape(s, program, where));
  const std::vector<ir::RankSlice> rows =
      ir::RankRows(s.end - s.begin, program.micro_batch(), o_.world_size, o_.rank);
  const int64_t count = ir::RowCount(rows);
  // Everything is checked before a byte is read.
  struct Piece {
    const ProgramInput* in;
    std::vector<std::pair<uint64_t, uint64_t>> reads;  // (offset, bytes), one per row range
  };
  std::vector<Piece> pieces;
  uint64_t total = 0;
  for (const ProgramInput& in : program.inputs()) {
    if (in.role != ir::PlaceholderRole::kInput || !in.type.is_tensor()) continue;
    const ir::TensorType& want = in.type.tensor;
    FXDP_ASSIGN_OR_RETURN(const ir::SafetensorsEntry* e, Entry(in, where));
    const std::string expected = TypeForMessage(want);
    std::vector<int64_t> got_rest(e->shape.begin() + (e->shape.empty() ? 0 : 1), e->shape.end());
    std::vector<int64_t> want_rest(want.shape.begin() + 1, want.shape.end());
    if (e->dtype != want.dtype || e->shape.empty() || got_rest != want_rest)
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor '", in.state_name, "' is ", ir::DTypeShortName(e->dtype),
                       "[", absl::StrJoin(e->shape, ", "), "] in the shard; its rows must be ",
                       ir::DTypeShortName(want.dtype), "[", absl::StrJoin(want_rest, ", "),
                       "] (this rank's graph expects ", expected, ")"));
    if (e->shape[0] < s.end)
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor '", in.state_name, "' has ",
                                                     e->shape[0], " rows, fewer than ", s.end));
    if (count != want.shape[0])
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the step has ", s.end - s.begin, " rows, of which this rank gets ", count,
          "; its graph expects ", want.shape[0], " for input '", in.state_name, "'"));
    const uint64_t row = (e->end - e->begin) / static_cast<uint64_t>(e->shape[0]);
    Piece p{&in, {}};
    for (const ir::RankSlice& r : rows) {
      p.reads.emplace_back(e->begin + row * static_cast<uint64_t>(s.begin + r.start),
                           row * static_cast<uint64_t>(r.size));
      total += p.reads.back().second;
    }
    pieces.push_back(std::move(p));
  }
  if (total > o_.max_step_bytes)
    return absl::ResourceExhaustedError(absl::StrCat(where, ": this rank's rows are ", total,
                                                     " bytes, more than the limit of ",
                                                     o_.max_step_bytes, " (--max-data-mb)"));
  TensorMap out;
  for (const Piece& p : pieces) {
    at::Tensor t = at::empty(p.in->type.tensor.shape,
                             at::TensorOptions().dtype(ToTorch(p.in->type.tensor.dtype)));
    char* dst = static_cast<char*>(t.data_ptr());
    for (const auto& [offset, bytes] : p.reads) {
      if (absl::Status st = shard_->Read(offset, bytes, dst); !st.ok())
        return absl::Status(st.code(), absl::StrCat(where, ": ", st.message()));
      dst += bytes;
    }
    out.emplace(p.in->state_name, std::move(t));
  }
  return out;
}

}  // namespace fxdp::executor
