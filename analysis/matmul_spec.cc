#include "analysis/matmul_spec.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fxdp {
namespace {

std::vector<int> Letters(absl::string_view s) { return std::vector<int>(s.begin(), s.end()); }

// The last `k` of `total` broadcast dims.
std::vector<int> Broadcast(int64_t k, int64_t total) {
  std::vector<int> v;
  for (int64_t i = total - k; i < total; ++i) v.push_back(1000 + static_cast<int>(i));
  return v;
}

std::vector<int> Cat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

int64_t RankAt(const std::vector<int64_t>& ranks, int arg) {
  return arg < static_cast<int>(ranks.size()) ? ranks[arg] : -1;
}

}  // namespace

std::string MatmulSpec::ToString() const {
  switch (kind_) {
    case Kind::kNone: return "";
    case Kind::kLinear: return "linear";
    case Kind::kMatmul: return "matmul";
    case Kind::kInvalid: return "<invalid>";
    case Kind::kEinsum: break;
  }
  std::string s = bias_ ? "+" : "";
  for (int i = 0; i < num_operands_; ++i) {
    if (i > 0) s += ',';
    s.append(labels_[i], rank_[i]);
  }
  s += "->";
  s.append(out_, out_rank_);
  return s;
}

absl::StatusOr<MatmulLabels> MatmulSpec::Bind(const std::vector<int64_t>& ranks) const {
  MatmulLabels l;
  switch (kind_) {
    case Kind::kLinear: {
      const int64_t r = RankAt(ranks, 0);
      if (r < 1) return absl::InvalidArgumentError("arg 0 must be a tensor of rank >= 1");
      l.operands = {Cat(Broadcast(r - 1, r - 1), Letters("k")), Letters("nk"), Letters("n")};
      l.output = Cat(Broadcast(r - 1, r - 1), Letters("n"));
      l.args = {0, 1, 2};
      l.bias_arg = 2;
      return l;
    }
    case Kind::kMatmul: {
      const int64_t ra = RankAt(ranks, 0), rb = RankAt(ranks, 1);
      if (ra < 1 || rb < 1) {
        return absl::InvalidArgumentError("args 0 and 1 must be tensors of rank >= 1");
      }
      const int64_t e = std::max<int64_t>({ra - 2, rb - 2, 0});
      if (ra == 1 && rb == 1) {
        l.operands = {Letters("k"), Letters("k")};
      } else if (rb == 1) {
        l.operands = {Cat(Broadcast(ra - 2, e), Letters("ik")), Letters("k")};
        l.output = Cat(Broadcast(ra - 2, e), Letters("i"));
      } else if (ra == 1) {
        l.operands = {Letters("k"), Cat(Broadcast(rb - 2, e), Letters("kj"))};
        l.output = Cat(Broadcast(rb - 2, e), Letters("j"));
      } else {
        l.operands = {Cat(Broadcast(ra - 2, e), Letters("ik")),
                      Cat(Broadcast(rb - 2, e), Letters("kj"))};
        l.output = Cat(Broadcast(e, e), Letters("ij"));
      }
      l.args = {0, 1};
      return l;
    }
    case Kind::kEinsum:
      for (int i = 0; i < num_operands_; ++i) {
        l.operands.emplace_back(labels_[i], labels_[i] + rank_[i]);
        l.args.push_back(i);
      }
      l.output.assign(out_, out_ + out_rank_);
      if (bias_) l.bias_arg = 0;
      return l;
    case Kind::kNone:
    case Kind::kInvalid: break;
  }
  return absl::InvalidArgumentError(absl::StrCat("no product spec (", ToString(), ")"));
}

}  // namespace fxdp
