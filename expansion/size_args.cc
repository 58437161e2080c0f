#include "expansion/size_args.h"

#include "absl/container/flat_hash_map.h"

namespace fxdp {
namespace {

// Ops whose argument `index` is a size list that spells the output's shape
// (as_strided_scatter's spells its src's, arg 1; upsample backward's input_size).
struct SizeArg {
  absl::string_view name;
  int index;
};
constexpr SizeArg kSizeArgs[] = {
    {"aten::_unsafe_view", 1}, {"aten::as_strided", 1}, {"aten::as_strided_scatter", 2},
    {"aten::broadcast_to", 1}, {"aten::empty", 0},
    {"aten::empty_strided", 0}, {"aten::expand", 1},      {"aten::full", 0},
    {"aten::new_empty", 1},     {"aten::new_empty_strided", 1}, {"aten::new_full", 1},
    {"aten::new_ones", 1},      {"aten::new_zeros", 1},   {"aten::ones", 0},
    {"aten::rand", 0},          {"aten::randn", 0},       {"aten::reshape", 1},
    {"aten::select_backward", 1}, {"aten::slice_backward", 1},
    {"aten::upsample_bicubic2d_backward", 2}, {"aten::upsample_bilinear2d_backward", 2},
    {"aten::upsample_linear1d_backward", 2}, {"aten::upsample_nearest1d_backward", 2},
    {"aten::upsample_nearest2d_backward", 2}, {"aten::upsample_nearest3d_backward", 2},
    {"aten::upsample_trilinear3d_backward", 2}, {"aten::view", 1},
    {"aten::zeros", 0},
};

}  // namespace

int SizeArgIndex(const ir::Target& t) {
  static const auto* index = [] {
    auto* m = new absl::flat_hash_map<absl::string_view, int>();
    for (const SizeArg& s : kSizeArgs) m->emplace(s.name, s.index);
    return m;
  }();
  auto it = index->find(t.name);
  return it == index->end() ? -1 : it->second;
}

}  // namespace fxdp
