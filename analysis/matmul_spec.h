// MatmulSpec: the einsum-like spec of a product op, parsed once (at compile
// time, in the op-rule table) into a value with a text form.
//
//   "ik,kj->ij"       mm: one letter per operand dim, the output's letters
//                     after "->"; a letter missing from the output is contracted.
//   "+ij,ik,kj->ij"   addmm: "+" marks a leading bias operand, right-aligned
//                     against its letters (it may broadcast).
//   "ij,ik,jk,,ij->ik"  _cdist_backward(grad, x1, x2, p, cdist): an empty operand
//                     is an argument that is not a tensor (p).
//   "linear"          linear(x, w, b): [..., k] x [n, k] + [n] -> [..., n].
//   "matmul"          torch.matmul's broadcasting rules, by the operands' ranks.
//
// Bind() gives the labels of one call: letters for named dims, 1000 + i for
// the broadcast (batch-like) leading dims of "linear" and "matmul".
//
//   constexpr MatmulSpec mm = MatmulSpec::Parse("ik,kj->ij");
//   mm.ToString();  // "ik,kj->ij"
#ifndef FXDP_ANALYSIS_MATMUL_SPEC_H_
#define FXDP_ANALYSIS_MATMUL_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fxdp {

// The labels of one call: one list per operand (by position), the output's.
struct MatmulLabels {
  std::vector<std::vector<int>> operands;
  std::vector<int> output;
  // Positional argument of each labelled operand.
  std::vector<int> args;
  // The argument that adds a bias (broadcast onto the product), or -1.
  int bias_arg = -1;
};

class MatmulSpec {
 public:
  enum class Kind : int8_t { kNone, kEinsum, kLinear, kMatmul, kInvalid };
  static constexpr int kMaxOperands = 5;
  static constexpr int kMaxRank = 4;

  constexpr MatmulSpec() = default;

  // Parses a spec (see the file comment); an unparsable one is kInvalid
  // (tests/analysis/op_rules_test.cc checks every row parses).
  static constexpr MatmulSpec Parse(absl::string_view s) {
    MatmulSpec m;
    if (s == "linear") {
      m.kind_ = Kind::kLinear;
      return m;
    }
    if (s == "matmul") {
      m.kind_ = Kind::kMatmul;
      return m;
    }
    m.kind_ = Kind::kEinsum;
    size_t i = 0;
    if (i < s.size() && s[i] == '+') {
      m.bias_ = true;
      ++i;
    }
    int op = 0;
    bool out = false;
    for (; i < s.size(); ++i) {
      const char c = s[i];
      if (c == ',') {
        if (out || ++op >= kMaxOperands) return Invalid();
      } else if (c == '-') {
        if (out || i + 1 >= s.size() || s[i + 1] != '>') return Invalid();
        out = true;
        ++i;
      } else if (c >= 'a' && c <= 'z') {
        int8_t& r = out ? m.out_rank_ : m.rank_[op];
        if (r >= kMaxRank) return Invalid();
        (out ? m.out_[r] : m.labels_[op][r]) = c;
        ++r;
      } else {
        return Invalid();
      }
    }
    if (!out) return Invalid();
    m.num_operands_ = static_cast<int8_t>(op + 1);
    return m;
  }

  constexpr Kind kind() const { return kind_; }
  constexpr bool valid() const { return kind_ != Kind::kInvalid; }
  // "ik,kj->ij", "+ij,ik,kj->ij", "linear", "matmul"; "" for none.
  std::string ToString() const;

  // The labels for operands of these ranks (by positional argument; -1 when
  // the argument is not a tensor). INVALID_ARGUMENT when a rank does not fit.
  absl::StatusOr<MatmulLabels> Bind(const std::vector<int64_t>& ranks) const;

 private:
  static constexpr MatmulSpec Invalid() {
    MatmulSpec m;
    m.kind_ = Kind::kInvalid;
    return m;
  }

  Kind kind_ = Kind::kNone;
  bool bias_ = false;
  int8_t num_operands_ = 0;
  int8_t rank_[kMaxOperands] = {};
  char labels_[kMaxOperands][kMaxRank] = {};
  int8_t out_rank_ = 0;
  char out_[kMaxRank] = {};
};

}  // namespace fxdp

#endif  // FXDP_ANALYSIS_MATMUL_SPEC_H_
