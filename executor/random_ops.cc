// The random ops' kernels (random_ops.h): stream words at each element's global
// index, turned into values as client/python/fxdp/random_ops.py does.
#include "executor/random_ops.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "analysis/ir/node_error.h"
#include "executor/torch_types.h"
#include "util/philox.h"

namespace fxdp::executor {
namespace {

using ir::RandomKind;
constexpr int64_t kChunk = 1024;  // elements drawn at a time (on the stack)

// Calls fn(local start, words, count) for chunks of the runs, k words per
// element, in parallel: each element's words depend only on its global index.
template <typename Fn>
void ForEachChunk(const std::vector<IndexRun>& runs, const philox::StreamKey& key, int k, Fn fn) {
  std::vector<IndexRun> chunks;
  for (const IndexRun& r : runs) {
    for (int64_t o = 0; o < r.count; o += kChunk)
      chunks.push_back(
          {r.local + o, r.global + static_cast<uint64_t>(o), std::min(kChunk, r.count - o)});
  }
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 16, [&](int64_t b, int64_t e) {
    uint32_t words[2 * kChunk];
    for (int64_t c = b; c < e; ++c) {
      const IndexRun& ch = chunks[c];
      philox::Words(key, ch.global * k, ch.count * k, words);
      fn(ch.local, words, ch.count);
    }
  });
}

// The number of 24-bit draws below p * 2^24: (w >> 8) < Threshold(p) holds
// with probability p (p quantised to 2^-24), exactly as in Python.
uint32_t Threshold(double p) {
  if (!(p > 0)) return 0;
  if (p >= 1) return 1u << 24;
  return static_cast<uint32_t>(std::ceil(p * 16777216.0));
}

// u in (0, 1] from one word.
inline double OpenUniform(uint32_t w) { return (static_cast<double>(w) + 1.0) * 0x1p-32; }

double Number(const c10::IValue& v) {
  return v.isInt() ? static_cast<double>(v.toInt()) : v.toDouble();
}

// `fill(double* out, words, count)` per chunk: a float64 tensor of the output's shape.
template <typename Fill>
at::Tensor Doubles(const std::vector<IndexRun>& runs, const philox::StreamKey& key, int k,
                   const RandomPlan& p, Fill fill) {
  at::Tensor d = at::empty(p.out.shape, at::kDouble);
  double* o = d.data_ptr<double>();
  ForEachChunk(runs, key, k, [&](int64_t l, const uint32_t* w, int64_t n) { fill(o + l, w, n); });
  return d;
}

at::Tensor Mask(const std::vector<IndexRun>& runs, const philox::StreamKey& key,
                const std::vector<int64_t>& sizes, uint32_t t, at::ScalarType dtype) {
  at::Tensor m = at::empty(sizes, dtype);
  AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, dtype, "fxdp_mask", [&] {
    scalar_t* o = m.data_ptr<scalar_t>();
    ForEachChunk(runs, key, 1, [&](int64_t l, const uint32_t* w, int64_t n) {
      for (int64_t j = 0; j < n; ++j) o[l + j] = static_cast<scalar_t>((w[j] >> 8) < t);
    });
  });
  return m;
}

// native_dropout: mask kept with probability 1 - p, output input * mask * 1/(1-p)
// (ATen's arithmetic: input.mul(mask).mul_(scale)).
std::vector<at::Tensor> Dropout(const std::vector<IndexRun>& runs, const philox::StreamKey& key,
                                const RandomPlan& p, const std::vector<c10::IValue>& stack) {
  const at::Tensor input = stack[p.params[0]].toTensor();
  const double drop = Number(stack[p.params[1]]);
  const c10::IValue& train = stack[p.params[2]];
  if (!train.isNone() && !train.toBool()) return {input.clone(), at::ones_like(input, at::kBool)};
  const double q = 1.0 - drop;
  const double scale = q == 0 ? 0.0 : 1.0 / q;
  at::Tensor mask = Mask(runs, key, p.out.shape, Threshold(q), at::kBool);
  if (input.is_cpu() && input.scalar_type() == at::kFloat && input.is_contiguous()) {
    // One pass, the same float arithmetic as input.mul(mask).mul_(scale).
    at::Tensor out = at::empty_like(input);
    const float* x = input.data_ptr<float>();
    const bool* m = mask.data_ptr<bool>();
    float* o = out.data_ptr<float>();
    const float s = static_cast<float>(scale);
    at::parallel_for(0, input.numel(), 32768, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = (x[i] * static_cast<float>(m[i])) * s;
    });
    return {out, mask};
  }
  return {input.mul(mask.to(input.device())).mul_(scale), mask};
}

absl::StatusOr<std::vector<at::Tensor>> Draw(const RandomPlan& p, const RandomContext& ctx,
                                             const std::vector<IndexRun>& runs,
                                             const std::vector<c10::IValue>& stack) {
  const philox::StreamKey key{ctx.seed, static_cast<uint32_t>(ctx.step), p.node_id};
  const int k = ir::WordsPerElement(p.op->kind, p.out.dtype);
  const at::ScalarType dtype = ToTorch(p.out.dtype);
  auto param = [&](int i) { return Number(stack[p.params[i]]); };
  switch (p.op->kind) {
    case RandomKind::kBernoulli:
      return std::vector<at::Tensor>{Mask(runs, key, p.out.shape, Threshold(param(0)), dtype)};
    case RandomKind::kBernoulliProbs: {
      const at::Tensor probs = stack[p.params[0]].toTensor().to(at::kCPU, at::kDouble);
      const at::Tensor u = Doubles(runs, key, k, p, [](double* o, const uint32_t* w, int64_t n) {
        for (int64_t j = 0; j < n; ++j) o[j] = (w[j] >> 8) * 0x1p-24;
      });
      return std::vector<at::Tensor>{u.lt(probs).to(dtype)};
    }
    case RandomKind::kDropout: return Dropout(runs, key, p, stack);
    case RandomKind::kUniform: {
      const int bits = p.out.dtype == ir::DType::kFloat16    ? 11
                       : p.out.dtype == ir::DType::kBFloat16 ? 8
                                                             : 24;
      at::Tensor u = Doubles(runs, key, k, p, [&](double* o, const uint32_t* w, int64_t n) {
        if (k == 2) {
          for (int64_t j = 0; j < n; ++j)
            o[j] = ((w[2 * j] >> 5) * 67108864.0 + (w[2 * j + 1] >> 6)) * 0x1p-53;
        } else {
          for (int64_t j = 0; j < n; ++j)
            o[j] = std::ldexp(static_cast<double>(w[j] >> (32 - bits)), -bits);
        }
      });
      u = u.to(dtype);
      if (!p.params.empty()) u = u.mul(param(1) - param(0)).add_(param(0));
      return std::vector<at::Tensor>{u};
    }
    case RandomKind::kNormal: {
      at::Tensor z = Doubles(runs, key, k, p, [&](double* o, const uint32_t* w, int64_t n) {
        for (int64_t j = 0; j < n; ++j)
          o[j] = std::sqrt(-2.0 * std::log(OpenUniform(w[2 * j]))) *
                 std::cos(6.283185307179586 * (w[2 * j + 1] * 0x1p-32));
      });
      z = z.to(dtype);
      if (!p.params.empty()) z = z.mul_(param(1)).add_(param(0));
      return std::vector<at::Tensor>{z};
    }
    case RandomKind::kRandint: {
      const int64_t low = p.params.size() == 2 ? stack[p.params[0]].toInt() : 0;
      const int64_t high = stack[p.params.back()].toInt();
      if (high <= low || static_cast<uint64_t>(high - low) > (uint64_t{1} << 32))
        return absl::InvalidArgumentError(absl::StrCat("randint over [", low, ", ", high,
                                                       "): fxdp draws ranges of 1 to 2^32 values"));
      const uint64_t range = static_cast<uint64_t>(high - low);
      at::Tensor v = at::empty(p.out.shape, at::kLong);
      int64_t* o = v.data_ptr<int64_t>();
      ForEachChunk(runs, key, 1, [&](int64_t l, const uint32_t* w, int64_t n) {
        for (int64_t j = 0; j < n; ++j) o[l + j] = low + static_cast<int64_t>(w[j] % range);
      });
      return std::vector<at::Tensor>{v.to(dtype)};
    }
    case RandomKind::kExponential: {
      const double lambd = param(0);
      const at::Tensor z = Doubles(runs, key, k, p, [&](double* o, const uint32_t* w, int64_t n) {
        for (int64_t j = 0; j < n; ++j) o[j] = -std::log(OpenUniform(w[j])) / lambd;
      });
      return std::vector<at::Tensor>{z.to(dtype)};
    }
  }
  return absl::InternalError("unknown random kind");
}

}  // namespace

absl::StatusOr<std::vector<IndexRun>> GlobalIndexRuns(const std::vector<int64_t>& sizes,
                                                      const ir::RandomLayout& layout, int64_t batch,
                                                      const ir::RankSlice& slice) {
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  if (layout.dim < 0) return std::vector<IndexRun>{{0, 0, numel}};
  const int32_t d = layout.dim;
  if (d >= static_cast<int32_t>(sizes.size()))
    return absl::InvalidArgumentError(
        absl::StrCat("the batch dim ", d, " of a ", sizes.size(), "-d output"));
  int64_t before = 1, inner = 1;
  for (int32_t i = 0; i < d; ++i) before *= sizes[i];
  for (size_t i = d + 1; i < sizes.size(); ++i) inner *= sizes[i];
  const int64_t g = layout.global_extent, outer = layout.outer;
  const int64_t rows = batch > 0 && g % (outer * batch) == 0 ? g / (outer * batch) : 0;
  if (rows == 0 || sizes[d] != outer * slice.size * rows)
    return absl::InvalidArgumentError(absl::StrCat(
        "dim ", d, " has ", sizes[d], " entries; the graph's layout (global extent ", g, ", outer ",
        outer, ", batch ", batch, ") gives this rank's ", slice.size, " samples ",
        rows == 0 ? "no whole number of" : absl::StrCat(outer * slice.size * rows)));
  std::vector<IndexRun> runs;
  const int64_t count = slice.size * rows * inner;
  if (count == 0) return runs;
  for (int64_t a = 0; a < before; ++a) {
    for (int64_t ob = 0; ob < outer; ++ob) {
      runs.push_back(
          {(a * sizes[d] + ob * slice.size * rows) * inner,
           static_cast<uint64_t>((a * g + ob * batch * rows + slice.start * rows) * inner), count});
    }
  }
  return runs;
}

absl::StatusOr<RandomPlan> PlanRandom(const ir::RandomOp& op, const c10::FunctionSchema& schema,
                                      const ir::Node& n,
                                      const std::vector<ir::RandomLayout>& layouts) {
  RandomPlan p;
  p.op = &op;
  p.node_id = philox::NodeId(n.name.data(), static_cast<int64_t>(n.name.size()));
  for (absl::string_view name : absl::StrSplit(op.params, ' ', absl::SkipEmpty())) {
    const std::optional<int> i =
        schema.argumentIndexWithName(std::string_view(name.data(), name.size()));
    if (!i.has_value())
      return ir::NodeError(n,
                           absl::StrCat("the schema has no argument '", name, "' (", schema.name(),
                                        "): fxdp's random-op table does not fit this LibTorch"));
    p.params.push_back(*i);
  }
  if (n.outputs.empty() || !n.outputs[0].is_tensor())
    return ir::NodeError(n, "a random op must output a tensor");
  p.out = n.outputs[0].tensor;
  for (const ir::RandomLayout& l : layouts)
    if (l.node == n.name) p.layout = l;
  return p;
}

absl::Status RunRandom(const RandomPlan& plan, const RandomContext& ctx, c10::Device device,
                       std::vector<c10::IValue>& stack) {
  if (ctx.step < 0 || ctx.step >= (int64_t{1} << 32))
    return absl::InvalidArgumentError(absl::StrCat("step ", ctx.step, " is not in [0, 2^32)"));
  auto runs = GlobalIndexRuns(plan.out.shape, plan.layout, ctx.batch, ctx.slice);
  if (!runs.ok()) return runs.status();
  auto drawn = Draw(plan, ctx, *runs, stack);
  if (!drawn.ok()) return drawn.status();
  stack.clear();
  for (at::Tensor& t : *drawn) stack.emplace_back(device.is_cpu() ? std::move(t) : t.to(device));
  return absl::OkStatus();
}

}  // namespace fxdp::executor
