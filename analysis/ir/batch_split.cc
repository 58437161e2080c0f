#include "analysis/ir/batch_split.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fxdp::ir {

RankSlice SliceForRank(int64_t batch, int32_t world, int32_t rank) {
  const int64_t base = batch / world, extra = batch % world;
  return RankSlice{rank, rank * base + std::min<int64_t>(rank, extra),
                   base + (rank < extra ? 1 : 0)};
}

std::vector<RankSlice> SplitBatch(int64_t batch, int32_t world) {
  std::vector<RankSlice> out;
  out.reserve(world);
  for (int32_t r = 0; r < world; ++r) out.push_back(SliceForRank(batch, world, r));
  return out;
}

std::vector<RankSlice> RankRows(int64_t batch, int64_t micro, int32_t world, int32_t rank) {
  if (micro <= 0 || micro >= batch) return {SliceForRank(batch, world, rank)};
  std::vector<RankSlice> out;
  for (int64_t first = 0; first < batch; first += micro) {
    RankSlice s = SliceForRank(std::min(micro, batch - first), world, rank);
    s.start += first;
    out.push_back(s);
  }
  return out;
}

int64_t RowCount(const std::vector<RankSlice>& rows) {
  int64_t n = 0;
  for (const RankSlice& s : rows) n += s.size;
  return n;
}

std::string FormatRagged(const RaggedInputs& inputs) {
  std::string out;
  for (const auto& [input, offsets] : inputs) absl::StrAppend(&out, input, " ", offsets, "\n");
  return out;
}

absl::StatusOr<RaggedInputs> ParseRagged(const std::string& value) {
  RaggedInputs out;
  for (absl::string_view line : absl::StrSplit(value, '\n', absl::SkipEmpty())) {
    std::vector<std::string> names = absl::StrSplit(line, ' ');
    if (names.size() != 2 || names[0].empty() || names[1].empty())
      return absl::InternalError(absl::StrCat("graph metadata ", kRaggedKey, ": line '", line,
                                              "' is not 'INPUT OFFSETS'"));
    out.emplace_back(names[0], names[1]);
  }
  return out;
}

int64_t RaggedCut::length() const {
  int64_t n = 0;
  for (const auto& [begin, end] : spans) n += end - begin;
  return n;
}

absl::StatusOr<RaggedCut> CutRagged(const std::vector<int64_t>& offsets, int64_t length,
                                    const std::vector<RankSlice>& rows) {
  const int64_t b = static_cast<int64_t>(offsets.size());
  for (int64_t i = 0; i < b; ++i) {
    const int64_t lo = i == 0 ? 0 : offsets[i - 1];
    if (offsets[i] < lo || offsets[i] > length)
      return absl::InvalidArgumentError(
          absl::StrCat("offsets[", i, "] is ", offsets[i], ", outside [", lo, ", ", length,
                       "]: offsets start at 0 or more, never decrease and stay within the input's ",
                       length, " elements"));
  }
  RaggedCut cut;
  for (const RankSlice& s : rows) {
    if (s.start < 0 || s.size < 0 || s.start + s.size > b)
      return absl::InvalidArgumentError(
          absl::StrCat("rows [", s.start, ", ", s.start + s.size, ") pass the ", b, " offsets"));
    if (s.size == 0) continue;
    const int64_t begin = offsets[s.start];
    const int64_t end = s.start + s.size < b ? offsets[s.start + s.size] : length;
    const int64_t base = cut.length();
    for (int64_t i = s.start; i < s.start + s.size; ++i)
      cut.offsets.push_back(offsets[i] - begin + base);
    cut.spans.emplace_back(begin, end);
  }
  return cut;
}

}  // namespace fxdp::ir
