"""fx_baseline.py's analyze phase: every node's batch dim / placement over a torch.fx graph.

View ops go through DTensor's rules (``torch.distributed.tensor._ops._view_ops``), walked the
way DTensor's ``propagate_shape_and_sharding`` keeps a ``Shard``; simple rules cover the rest
(pointwise with broadcasting and linearity, mm/addmm/bmm, sums, softmax, layer norm,
embedding, nll loss, select, factories). See fx_baseline.py's docstring for the whole pipeline.
"""

from __future__ import annotations

import operator
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python"))

import torch  # noqa: E402
import torch.fx as fx  # noqa: E402
from fxdp.v1 import graph_pb2 as pb  # noqa: E402
from torch.distributed.tensor._ops import _view_ops as vo  # noqa: E402

aten = torch.ops.aten
R = -1  # replicated
P_SUM = -2  # partial, summed over ranks
P_AVG = -3  # partial, averaged over ranks


class _Meta:
    """What DTensor's dim_maps read from a tensor argument: shape and ndim."""

    __slots__ = ("shape", "ndim")

    def __init__(self, shape):
        self.shape = shape
        self.ndim = len(shape)


def _carries(spec, b: int) -> bool:
    """Whether an output dim with DimSpec `spec` keeps input dim `b` sharded, as DTensor's
    propagate_shape_and_sharding decides for Shard(b): the input dim itself, the first
    (outermost) dim of a flatten, piece 0 of a split."""
    t = type(spec)
    if t is vo.InputDim:
        return spec.input_dim == b
    if t is vo.Flatten:
        return _carries(spec.input_dims[0], b)
    if t is vo.Split:
        return spec.split_id == 0 and _carries(spec.input_dim, b)
    return False  # Singleton, Broadcast, NewDim, Repeat


class Analysis:
    def __init__(self, graph: fx.Graph, nodes: list, world: int, check_dtensor: bool = False):
        self.graph, self.nodes, self.world = graph, nodes, world
        self.pl: dict = {}  # node -> placement of output 0, or a list for sequences
        self.scaled: set = set()  # values holding B/B_r times their rows (a local mean)
        self.reduced: dict = {}  # partial value -> (op, first non-linear use)
        self.pos: dict = {}
        self.batch = 0
        self.warnings: dict = {}
        self.check = check_dtensor
        self.view_checks = 0

    # -- helpers

    def read(self, a):
        """Placement of argument `a` as a use sees it (R once it is all-reduced)."""
        if a.__class__ is not fx.Node:
            return None
        if a in self.reduced:
            return R
        return self.pl.get(a, R)

    def reduce(self, a, op, use):
        if a not in self.reduced:
            self.reduced[a] = (op, use)

    @staticmethod
    def shape(node, k: int = 0):
        tm = node.meta["tm"]
        return tm[k][0] if k < len(tm) and tm[k] is not None else ()

    def warn(self, node, why):
        w = self.warnings.setdefault(node.target, [0, node.name, why])
        w[0] += 1

    # -- rules

    def view_rule(self, node, dimmap):
        x = node.args[0]
        p = self.read(x)
        if p is None or p == R:
            return R
        if p < R:  # partial through a view stays partial (linear)
            return p
        rule = dimmap(_Meta(self.shape(x)), *node.args[1:])
        out = R
        for o, spec in enumerate(rule):
            if _carries(spec, p):
                out = o
                break
        if self.check:
            self.view_checks += 1
            from torch.distributed.tensor.placement_types import Shard

            _, outp = vo.propagate_shape_and_sharding(
                [Shard(p)], self.shape(x), rule, (self.world,), False
            )
            want = outp[0].dim if type(outp[0]) is Shard else R
            if want != out:
                raise AssertionError(f"{node.name}: walk says {out}, DTensor {outp[0]}")
        if out == R:
            self.warn(node, "batch dim not kept by the view")
        if x in self.scaled:
            self.scaled.add(node)
        return out

    def pointwise(self, node, linear: str | None = None):
        """Broadcasting elementwise op. `linear`: "add" (sum of partials stays partial),
        "mul" (one partial times replicated values stays partial), None (not linear)."""
        rank = len(self.shape(node))
        shard, partial, others, scaled = R, [], 0, False
        for a in node.args:
            p = self.read(a)
            if p is None:
                continue
            if p >= 0:
                d = p + rank - len(self.shape(a))
                if shard != R and shard != d:
                    self.warn(node, "inputs sharded on different dims")
                shard = d
                scaled |= a in self.scaled
            elif p < R:
                partial.append((a, p))
            else:
                others += 1
        if partial:
            ops = {p for _, p in partial}
            ok = (
                shard == R
                and len(ops) == 1
                and ((linear == "add" and others == 0) or (linear == "mul" and len(partial) == 1))
            )
            if ok:
                return ops.pop()
            for a, p in partial:
                self.reduce(a, p, node)
        if scaled:
            self.scaled.add(node)
        return shard

    def contract(self, node, scaled_inputs) -> int:
        return P_AVG if any(a in self.scaled for a in scaled_inputs) else P_SUM

    def mm_rule(self, node, a, b, bias=None, batched=False):
        pa, pb_ = self.read(a), self.read(b)
        for x, p in ((a, pa), (b, pb_), (bias, self.read(bias))):
            if p is not None and p < R:
                self.reduce(x, p, node)
        pa = R if pa is None or pa < R else pa
        pb_ = R if pb_ is None or pb_ < R else pb_
        ra = len(self.shape(a))
        if batched:  # [B?, M, K] @ [B?, K, N]
            if pa == 0 or pb_ == 0:
                out = 0
            elif pa == ra - 2:
                out = 1
            elif pb_ == 2:
                out = 2
            elif pa == ra - 1 and pb_ == 1:
                return self.contract(node, (a, b))
            else:
                out = R
        else:
            if pa == 0:
                out = 0
            elif pb_ == 1:
                out = 1
            elif pa == 1 and pb_ == 0:
                return self.contract(node, (a, b))
            else:
                out = R
        if out != R and (a in self.scaled or b in self.scaled):
            self.scaled.add(node)
        return out

    def reduce_rule(self, node, x, dims, keepdim):
        p = self.read(x)
        if p is None or p == R:
            return R
        if p < R:
            return p
        r = len(self.shape(x))
        dims = [d + r if d < 0 else d for d in (dims if dims else range(r))]
        if p in dims:
            return self.contract(node, (x,))
        if x in self.scaled:
            self.scaled.add(node)
        return p if keepdim else p - sum(1 for d in dims if d < p)

    def same_as(self, node, x, forbidden_dim=None):
        p = self.read(x)
        if p is None:
            return R
        if p < R:
            self.reduce(x, p, node)
            return R
        if forbidden_dim is not None and p >= 0:
            r = len(self.shape(x))
            if (forbidden_dim + r if forbidden_dim < 0 else forbidden_dim) == p:
                raise ValueError(f"{node.name}: {node.target} along the batch dim")
        if x in self.scaled:
            self.scaled.add(node)
        return p

    def visit(self, node):
        t = node.target
        a = node.args
        if node.op == "placeholder":
            role, _, bd = node.meta["ph"]
            if role == pb.INPUT and bd >= 0:
                self.batch = self.batch or self.shape(node)[bd]
                return bd
            return R
        if node.op == "output":
            return R
        if t is operator.getitem:
            p = self.pl.get(a[0], R)
            if a[0] in self.scaled:
                self.scaled.add(node)
            return p[a[1]] if isinstance(p, list) else p
        rule = VIEWS.get(t)
        if rule is not None:
            return self.view_rule(node, rule)
        kind = POINTWISE.get(t, 0)
        if kind != 0:
            return self.pointwise(node, kind)
        if t is aten.mm.default:
            return self.mm_rule(node, a[0], a[1])
        if t is aten.addmm.default:
            return self.mm_rule(node, a[1], a[2], bias=a[0])
        if t is aten.bmm.default:
            return self.mm_rule(node, a[0], a[1], batched=True)
        if t is aten.sum.dim_IntList:
            return self.reduce_rule(node, a[0], a[1], a[2] if len(a) > 2 else False)
        if t is aten.sum.default:
            return self.reduce_rule(node, a[0], None, False)
        if t in (aten._softmax.default, aten._log_softmax.default):
            return self.same_as(node, a[0], a[1])
        if t in (aten._softmax_backward_data.default, aten._log_softmax_backward_data.default):
            self.same_as(node, a[1], a[2])
            return self.same_as(node, a[0], a[2])
        if t is aten.native_layer_norm.default:
            p = self.same_as(node, a[0])
            return [p, p, p]
        if t is aten.native_layer_norm_backward.default:
            p = self.same_as(node, a[1])
            self.same_as(node, a[0])
            if p == R:
                return [R, R, R]
            w = self.contract(node, (a[0], a[1]))
            return [p, w, w]
        if t is aten.embedding.default:
            return self.same_as(node, a[1])
        if t is aten.embedding_dense_backward.default:
            pg = self.read(a[0])
            if pg is not None and pg < R:  # linear in the gradient
                return pg
            p = self.same_as(node, a[1])
            return R if p == R else self.contract(node, (a[0],))
        if t is aten.nll_loss_forward.default:
            p = self.same_as(node, a[0])
            if p == R:
                return [R, R]
            return [P_AVG if a[3] == 1 else P_SUM, P_SUM]
        if t is aten.nll_loss_backward.default:
            p = self.same_as(node, a[1])
            if p != R and a[4] == 1:
                self.scaled.add(node)
            return p
        if t in (aten.select.int, aten.select_backward.default):
            x = a[0]
            p = self.same_as(node, x)
            if p == R:
                return R
            if t is aten.select.int:
                d = a[1] + len(self.shape(x)) if a[1] < 0 else a[1]
                if d == p:
                    raise ValueError(f"{node.name}: select along the batch dim")
                return p - (d < p)
            d = a[2] + len(self.shape(node)) if a[2] < 0 else a[2]
            return p + (d <= p)
        if t in FACTORIES:
            return R
        if t in LIKE:  # reads only the shape: sharded like its input, else replicated
            p = self.read(a[0])
            return p if p is not None and p >= 0 else R
        # No rule: match sizes (as fxdp's fallback), and say so.
        self.warn(node, "no rule: matched the batch size")
        sh = self.shape(node)
        return sh.index(self.batch) if self.batch in sh else R

    def run(self):
        pos, pl = self.pos, self.pl
        for i, node in enumerate(self.graph.nodes):
            pos[node] = i
            pl[node] = self.visit(node)
        return self


VIEWS = {
    aten.view.default: vo.dim_maps[torch.Tensor.view],
    aten._unsafe_view.default: vo.dim_maps[torch.Tensor.view],
    aten.reshape.default: vo.dim_maps[torch.reshape],
    aten.expand.default: lambda x, size, implicit=False: vo.dim_maps[torch.Tensor.expand](x, size),
    aten.permute.default: vo.dim_maps[torch.permute],
    aten.transpose.int: vo.dim_maps[torch.transpose],
    aten.t.default: lambda x: vo.dim_maps[torch.transpose](x, 0, 1)
    if x.ndim == 2
    else tuple(vo.InputDim(i) for i in range(x.ndim)),
    aten.unsqueeze.default: vo.dim_maps[torch.unsqueeze],
    aten.squeeze.dim: vo.dim_maps[torch.squeeze],
    aten.squeeze.dims: vo.dim_maps[torch.squeeze],
    aten.squeeze.default: vo.dim_maps[torch.squeeze],
}
POINTWISE = {
    **{
        op: "add"
        for op in (
            aten.add.Tensor,
            aten.sub.Tensor,
            aten.clone.default,
            aten.neg.default,
            aten.alias.default,
            aten.detach.default,
            aten._to_copy.default,
        )
    },
    **{op: "mul" for op in (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar)},
    **{
        op: None
        for op in (
            aten.gelu.default,
            aten.gelu_backward.default,
            aten.relu.default,
            aten.threshold_backward.default,
            aten.masked_fill.Scalar,
            aten.where.self,
            aten.exp.default,
            aten.log.default,
            aten.tanh.default,
            aten.sigmoid.default,
            aten.sqrt.default,
            aten.rsqrt.default,
            aten.pow.Tensor_Scalar,
            aten.addcmul.default,
            aten.addcdiv.default,
            aten.lerp.Scalar,
            aten.triu.default,
            aten.add.Scalar,
            aten.sub.Scalar,
            aten.maximum.default,
            aten.minimum.default,
            aten.sign.default,
            aten.abs.default,
        )
    },
}
LIKE = {
    aten.ones_like.default,
    aten.zeros_like.default,
    aten.empty_like.default,
    aten.full_like.default,
}
FACTORIES = {
    aten.ones.default,
    aten.zeros.default,
    aten.empty.memory_format,
    aten.full.default,
    aten.arange.default,
    aten.arange.start,
    aten.scalar_tensor.default,
}
