// Which argument of an op is a size list that spells a tensor shape: the one
// table the expansion rewrites to local sizes and the shape check verifies.
#ifndef FXDP_EXPANSION_SIZE_ARGS_H_
#define FXDP_EXPANSION_SIZE_ARGS_H_

#include "analysis/ir/graph.h"

namespace fxdp {

// The index of `t`'s size-list argument, or -1 when it has none.
int SizeArgIndex(const ir::Target& t);

}  // namespace fxdp

#endif  // FXDP_EXPANSION_SIZE_ARGS_H_
