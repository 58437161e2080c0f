#include "server/jobs/ragged_batch.h"

#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace fxdp::server {
namespace {

const RawTensor* FindTensor(const std::vector<RawTensor>& tensors, const std::string& name) {
  for (const RawTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// The values of a 1-D offsets tensor (int64 or int32, little-endian bytes).
absl::StatusOr<std::vector<int64_t>> OffsetValues(const RawTensor& t, const std::string& what) {
  const bool wide = t.dtype == ir::DType::kInt64;
  if (!wide && t.dtype != ir::DType::kInt32) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", TypeString(t.dtype, t.shape),
                                                   "; offsets are int64 or int32 (torch.long)"));
  }
  const size_t item = wide ? 8 : 4;
  if (t.shape.size() != 1 || t.data.size() != static_cast<size_t>(t.shape[0]) * item) {
    return absl::InternalError(absl::StrCat(what, " is ", TypeString(t.dtype, t.shape), " of ",
                                            t.data.size(), " bytes, not 1-D offsets"));
  }
  std::vector<int64_t> out(static_cast<size_t>(t.shape[0]));
  for (size_t i = 0; i < out.size(); ++i) {
    if (wide) {
      std::memcpy(&out[i], t.data.data() + i * item, item);
    } else {
      int32_t v = 0;
      std::memcpy(&v, t.data.data() + i * item, item);
      out[i] = v;
    }
  }
  return out;
}

// `values` as the bytes of a 1-D tensor of `dtype` (int64 or int32).
std::string OffsetBytes(ir::DType dtype, const std::vector<int64_t>& values) {
  std::string out;
  for (int64_t v : values) {
    if (dtype == ir::DType::kInt64) {
      out.append(reinterpret_cast<const char*>(&v), sizeof(v));
    } else {
      const int32_t n = static_cast<int32_t>(v);  // rebased: <= the given int32 value
      out.append(reinterpret_cast<const char*>(&n), sizeof(n));
    }
  }
  return out;
}

// Every rank's cut of ragged input `input` by offsets `offsets`.
absl::StatusOr<std::vector<ir::RaggedCut>> CutForRanks(const std::string& input,
                                                       const std::string& offsets,
                                                       const std::vector<RawTensor>& tensors,
                                                       const RankRows& rows, int world) {
  const std::string what =
      absl::StrCat("input '", offsets, "' (the offsets of the bags of input '", input, "')");
  const RawTensor* text = FindTensor(tensors, input);
  const RawTensor* off = FindTensor(tensors, offsets);
  auto rows_of = rows.find(offsets);
  if (text == nullptr || off == nullptr) {
    return absl::InternalError(
        absl::StrCat("the rank graphs list '", input, "' as a ragged input cut by '", offsets,
                     "', but the step's batch lacks '", text == nullptr ? input : offsets, "'"));
  }
  if (text->shape.size() != 1 || rows.count(input) > 0) {
    return absl::InternalError(absl::StrCat(
        "ragged input '", input, "' is ", TypeString(text->dtype, text->shape),
        rows.count(input) > 0 ? " with a batch dim" : "", "; a ragged input is 1-D without one"));
  }
  const size_t ranks = rows_of == rows.end() ? 0 : rows_of->second.size();
  if (ranks != static_cast<size_t>(world)) {
    return absl::InternalError(absl::StrCat(what, " has rows on ", ranks, " of ", world, " ranks"));
  }
  FXDP_ASSIGN_OR_RETURN(const std::vector<int64_t> values, OffsetValues(*off, what));
  const std::string of = absl::StrCat("input '", offsets, "' (the offsets of the bags of input '",
                                      input, "' ", TypeString(text->dtype, text->shape), "): ");
  std::vector<ir::RaggedCut> out;
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<ir::RaggedCut> cut = ir::CutRagged(values, text->shape[0], rows_of->second[r]);
    if (!cut.ok())
      return absl::Status(cut.status().code(), absl::StrCat(of, cut.status().message()));
    out.push_back(*std::move(cut));
  }
  return out;
}

}  // namespace

absl::StatusOr<ir::RaggedInputs> RaggedOf(const v1::ExpandResponse& expanded) {
  ir::RaggedInputs first;
  for (int r = 0; r < expanded.graphs_size(); ++r) {
    std::string value;
    for (const v1::StringPair& m : expanded.graphs(r).metadata()) {
      if (m.key() == ir::kRaggedKey) value = m.value();
    }
    FXDP_ASSIGN_OR_RETURN(ir::RaggedInputs pairs, ir::ParseRagged(value));
    if (r == 0) {
      first = std::move(pairs);
    } else if (pairs != first) {
      return absl::InternalError(absl::StrCat(
          "the rank graphs list different ragged inputs (", ir::kRaggedKey, "): rank 0 '",
          ir::FormatRagged(first), "', rank ", r, " '", ir::FormatRagged(pairs), "'"));
    }
  }
  return first;
}

absl::StatusOr<RaggedCuts> CutRaggedBatch(const ir::RaggedInputs& ragged,
                                          const std::vector<RawTensor>& tensors,
                                          const RankRows& rows, int world) {
  RaggedCuts out;
  for (const auto& [input, offsets] : ragged) {
    FXDP_ASSIGN_OR_RETURN(std::vector<ir::RaggedCut> cuts,
                          CutForRanks(input, offsets, tensors, rows, world));
    out.inputs[input] = std::move(cuts);
    out.offsets.emplace(offsets, input);  // keeps the first
  }
  return out;
}

absl::StatusOr<bool> RaggedRankTensor(const RaggedCuts& cuts, const RawTensor& t, int rank,
                                      v1::TensorChunk* c) {
  const ir::RaggedCut* cut = nullptr;
  bool is_offsets = false;
  if (auto it = cuts.inputs.find(t.name); it != cuts.inputs.end()) {
    cut = &it->second.at(rank);
  } else if (auto o = cuts.offsets.find(t.name); o != cuts.offsets.end()) {
    cut = &cuts.inputs.at(o->second).at(rank);
    is_offsets = true;
  } else {
    return false;
  }
  c->clear_shape();
  if (is_offsets) {
    c->set_data(OffsetBytes(t.dtype, cut->offsets));
    c->add_shape(static_cast<int64_t>(cut->offsets.size()));
    return true;
  }
  std::vector<ir::RankSlice> spans;
  for (const auto& [begin, end] : cut->spans) spans.push_back({0, begin, end - begin});
  FXDP_ASSIGN_OR_RETURN(std::string data, SliceRows(t, 0, spans));
  c->set_data(std::move(data));
  c->add_shape(cut->length());
  return true;
}

}  // namespace fxdp::server
