#include "server/jobs/dataset_shapes.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/jobs/batch_sharder.h"

namespace fxdp::server {
namespace {

// Shape `s` of the report as InputShapes, checked against `inputs`; `what`
// names it in errors.
absl::StatusOr<ir::InputShapes> CheckedShape(const v1::BatchShape& s,
                                             const std::vector<InputSpec>& inputs,
                                             const std::string& what) {
  ir::InputShapes out;
  for (const v1::NamedShape& t : s.tensors()) {
    const InputSpec* in = FindInputSpec(inputs, t.name());
    if (in == nullptr) {
      std::vector<std::string> names;
      for (const InputSpec& i : inputs) names.push_back(i.name);
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": '", t.name().substr(0, 256),
          "' is not an INPUT of the graph (its inputs: ", absl::StrJoin(names, ", "), ")"));
    }
    std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
    for (int64_t d : dims) {
      if (d < 0 || d > (int64_t{1} << 40))
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": input '", in->name, "' has dim ", d, " (not in [0, 2^40])"));
    }
    if (absl::Status st = CheckInputShape(what, *in, in->dtype, dims); !st.ok()) return st;
    if (!out.emplace(in->name, std::move(dims)).second)
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": input '", in->name, "' is named twice"));
  }
  for (const InputSpec& in : inputs) {
    if (out.count(in.name) == 0)
      return absl::InvalidArgumentError(absl::StrCat(what, " lacks input '", in.name, "'"));
  }
  return out;
}

}  // namespace

absl::StatusOr<DatasetStepShapes> DatasetStepShapes::Of(const v1::DatasetShapes& report,
                                                        const std::vector<InputSpec>& inputs,
                                                        const std::string& dataset) {
  const std::string where = absl::StrCat("dataset '", dataset, "' (rank 0's report of its index)");
  const int64_t n = report.entries_size();
  if (n == 0 || n > kMaxDatasetEntries || report.shapes_size() == 0 || report.shapes_size() > n) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", n, " index entries of ", report.shapes_size(), " shapes; expected 1 to ",
        kMaxDatasetEntries, " entries and 1 to as many shapes"));
  }
  // The first entry of each shape names it in errors.
  std::vector<int64_t> first(report.shapes_size(), -1);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t k = report.entries(static_cast<int>(i));
    if (k >= static_cast<uint32_t>(report.shapes_size()))
      return absl::InvalidArgumentError(absl::StrCat(where, ": index entry ", i, " names shape ", k,
                                                     " of ", report.shapes_size()));
    if (first[k] < 0) first[k] = i;
  }
  DatasetStepShapes out;
  out.shapes_.reserve(report.shapes_size());
  for (int k = 0; k < report.shapes_size(); ++k) {
    const std::string what = first[k] < 0
                                 ? absl::StrCat(where, ": shape ", k, " (no entry has it)")
                                 : absl::StrCat(where, ": index entry ", first[k], "'s batch");
    absl::StatusOr<ir::InputShapes> s = CheckedShape(report.shapes(k), inputs, what);
    if (!s.ok()) return s.status();
    out.shapes_.push_back(*std::move(s));
  }
  out.entries_.assign(report.entries().begin(), report.entries().end());
  return out;
}

const ir::InputShapes& DatasetStepShapes::At(int64_t job_step) const {
  const int64_t n = entries();
  return shapes_[entries_[static_cast<size_t>(((job_step - 1) % n + n) % n)]];
}

}  // namespace fxdp::server
