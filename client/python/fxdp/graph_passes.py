"""Passes over the traced FX graph that give it the fxdp shape: clean-up, roles and gradient marks,
lifted constants, readable placeholder names and exact layouts.

The traced function returns ``[*state_out, loss, *extras, *grad_snapshots]``; these passes turn
that into the wire graph's outputs (UPDATED_* for state that changed, LOSS, OTHER) and mark each
gradient node with ``grad_of``.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx as fx

from .errors import TraceError
from .sizes import SizeArg, expr_of
from .trace_errors import node_source
from .v1 import graph_pb2 as pb

if TYPE_CHECKING:
    from .step_signature import Signature

aten = torch.ops.aten

_IDENTITY_OPS = {aten.detach.default, aten.alias.default}
_PREFIX = {
    pb.PARAMETER: "p",
    pb.BUFFER: "b",
    pb.OPTIMIZER_STATE: "s",
    pb.HYPERPARAMETER: "h",
    pb.INPUT: "x",
    pb.CONSTANT: "c",
}


def ident(s: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in s)
    return out or "v"


def _is_profiler(n: fx.Node) -> bool:
    t = n.target
    return isinstance(t, torch._ops.OpOverload) and t.namespace == "profiler"


def cleanup(gm: fx.GraphModule, dynamic: bool = False) -> None:
    """Remove profiler ops, ``detach``/``alias``, and the clones the step function makes of its inputs;
    a symbolic trace (``dynamic``) also loses what a concrete trace never records
    (:func:`elide_full_slices`, :func:`drop_noop_clones`)."""
    g = gm.graph
    for n in reversed(list(g.nodes)):
        if n.op == "call_function" and _is_profiler(n) and not n.users:
            g.erase_node(n)
    for n in list(g.nodes):
        if n.op == "call_function" and _is_profiler(n):
            for u in list(n.users):
                g.erase_node(u)
            g.erase_node(n)
    for n in list(g.nodes):
        if n.op != "call_function":
            continue
        if n.target in _IDENTITY_OPS:
            n.replace_all_uses_with(n.args[0])
            g.erase_node(n)
        elif (
            n.target is aten.clone.default
            and isinstance(n.args[0], fx.Node)
            and n.args[0].op == "placeholder"
            and n.kwargs.get("memory_format", torch.preserve_format) == torch.preserve_format
        ):
            n.replace_all_uses_with(n.args[0])
            g.erase_node(n)
    if dynamic:
        elide_full_slices(gm)
        drop_noop_clones(gm)
    g.eliminate_dead_code()


# --------------------------------------------------------------------------- symbolic traces

_INT64_MAX = 2**63 - 1


def _size(a) -> Optional[Any]:
    """The sympy expression of a size argument (an int, a SymInt node, a SizeArg), else None."""
    if isinstance(a, fx.Node):
        v = a.meta.get("val")
        return expr_of(v) if isinstance(v, torch.SymInt) else None
    try:
        return expr_of(a)
    except TypeError:
        return None


def _layout_exprs(v) -> Optional[Tuple]:
    if not isinstance(v, torch.Tensor):
        return None
    return (
        tuple(expr_of(s) for s in v.shape),
        tuple(expr_of(s) for s in v.stride()),
        expr_of(v.storage_offset()),
    )


def _is(a, value: int) -> bool:
    e = _size(a)
    return e is not None and e.is_Integer and int(e) == value


def _full_range(start, end, step, size) -> bool:
    """start 0 (or None), step 1 (or None) and end None, INT64_MAX or ``size`` itself (the same
    expression: sizes are compared symbolically, never through a SymInt, which would guard)."""
    if not (start is None or _is(start, 0)) or not (step is None or _is(step, 1)):
        return False
    return end is None or _is(end, _INT64_MAX) or (_size(end) is not None and _size(end) == size)


def elide_full_slices(gm: fx.GraphModule) -> None:
    """A symbolic trace records ``x[:, :S]`` and ``x[:, 0:]`` (and their ``slice_backward``) where a
    concrete trace sees that the slice covers the whole dim and records nothing; the analyzer refuses
    a slice of the batch dim. A full ``slice`` is its input (same shape, strides and offset); a full
    ``slice_backward`` whose gradient already has the result's layout is that gradient."""
    g = gm.graph
    for n in list(g.nodes):
        if n.op != "call_function":
            continue
        if n.target is aten.slice.Tensor and not n.kwargs:
            x, dim, start, end, step = (list(n.args) + [0, None, None, 1][len(n.args) - 1 :])[:5]
            xv = x.meta.get("val") if isinstance(x, fx.Node) else None
            if not isinstance(xv, torch.Tensor) or not isinstance(dim, int):
                continue
            if _full_range(start, end, step, expr_of(xv.shape[dim % xv.dim()])):
                n.replace_all_uses_with(x)
                g.erase_node(n)
        elif n.target is aten.slice_backward.default:
            grad, sizes, dim, start, end, step = n.args
            want = tuple(_size(s) for s in sizes)
            mine, its = _layout_exprs(n.meta.get("val")), _layout_exprs(grad.meta.get("val"))
            if (
                mine is not None
                and its == mine
                and want == mine[0]
                and _full_range(start, end, step, want[dim % len(want)])
            ):
                n.replace_all_uses_with(grad)
                g.erase_node(n)


def drop_noop_clones(gm: fx.GraphModule) -> None:
    """A symbolic trace runs ``dropout(p=0)``'s Python decomposition, ``input.clone()``, where a
    concrete trace returns the input: a ``clone`` (preserve format) of a computed value whose result
    has the value's exact layout is the value itself in a graph without mutation. Clones the outputs
    take (the gradient snapshots mark_gradients reads) stay."""
    g = gm.graph
    for n in list(g.nodes):
        if n.op != "call_function" or n.target is not aten.clone.default:
            continue
        x = n.args[0]
        if not isinstance(x, fx.Node) or x.op == "placeholder":
            continue
        if n.kwargs.get("memory_format", torch.preserve_format) != torch.preserve_format:
            continue
        if any(u.op == "output" for u in n.users):
            continue
        mine = _layout_exprs(n.meta.get("val"))
        if mine is not None and mine == _layout_exprs(x.meta.get("val")):
            n.replace_all_uses_with(x)
            g.erase_node(n)


def fold_sizes(gm: fx.GraphModule) -> None:
    """The size arithmetic of a symbolic trace (``sym_size``, ``operator.mul`` of SymInts...) becomes
    :class:`fxdp.sizes.SizeArg` arguments of the ops that take the sizes (its expression and its
    value at the example): every remaining call is a dispatcher op. A float or bool computed from
    sizes cannot be written: a TraceError names the node and the user's line."""
    g = gm.graph
    folded: Dict[fx.Node, SizeArg] = {}
    for n in g.nodes:
        if n.op != "call_function":
            continue
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt):
            hint = v.node.hint
            if hint is None:
                raise TraceError(
                    f"node '{n.name}' ({node_source(n) or 'an unknown line'}): the size {v} depends "
                    "on tensor values; trace with dynamic=False"
                )
            folded[n] = SizeArg(expr_of(v), int(hint))
        elif isinstance(v, (torch.SymFloat, torch.SymBool)):
            raise TraceError(
                f"node '{n.name}' ({node_source(n) or 'an unknown line'}): a {type(v).__name__} "
                f"computed from sizes ({v}), which the wire format cannot carry (only integer sizes); "
                "trace with dynamic=False"
            )
    for n in g.nodes:
        if n not in folded and n.op != "placeholder":
            n.args = fx.node.map_aggregate(
                n.args, lambda a: folded.get(a, a) if isinstance(a, fx.Node) else a
            )
            n.kwargs = fx.node.map_aggregate(
                n.kwargs, lambda a: folded.get(a, a) if isinstance(a, fx.Node) else a
            )
    for n in reversed(list(folded)):
        g.erase_node(n)


def validate_ops(gm: fx.GraphModule) -> None:
    """Every call is an aten dispatcher op (or getitem) and nothing mutates."""
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        t = n.target
        if t is operator.getitem:
            continue
        if not isinstance(t, torch._ops.OpOverload):
            raise TraceError(f"node '{n.name}': {t} is not a dispatcher op")
        if t.namespace != "aten":
            raise TraceError(
                f"node '{n.name}': op {t} is not an aten op (prims and other namespaces cannot be called by "
                "schema name from the C++ executor)"
            )
        for a in t._schema.arguments:
            if a.alias_info is not None and a.alias_info.is_write:
                raise TraceError(_surviving_mutation(n, t))


def _surviving_mutation(n: fx.Node, t) -> str:
    """What the user did when an in-place op survives functionalization: it writes into a placeholder
    (functionalization hands a mutated graph input back with ``copy_``), and what to do instead."""
    src = node_source(n)
    at = f" ({src})" if src else ""
    dst = n.args[0] if n.args else None
    spec = (
        dst.meta.get("fxdp_placeholder")
        if isinstance(dst, fx.Node) and dst.op == "placeholder"
        else None
    )
    if spec is None:
        return f"node '{n.name}'{at}: in-place op {t} survived functionalization"
    role, name, _ = spec
    if role == pb.HYPERPARAMETER:
        return (
            f"train_step changes the hyper-parameter '{name}' in place{at}: a learning-rate scheduler's "
            "step() (or an assignment to param_group[...]) inside the traced step; one graph runs every step, "
            "so a value cannot change inside it. Call scheduler.step() outside train_step and give the "
            "schedule to fxdp instead (run_local(..., schedule=sched, step=k), Client.train(..., "
            "schedule=sched), fxdp.schedule)"
        )
    what = {pb.INPUT: "its input", pb.BUFFER: "the buffer", pb.PARAMETER: "the parameter"}.get(
        role, pb.PlaceholderRole.Name(role).lower().replace("_", " ")
    )
    return (
        f"train_step writes into {what} '{name}' in place{at}, outside what the graph can hand back "
        f"({t} survived functionalization); compute on a copy (x = x.clone()) or, for model state, "
        "change it inside the model's forward or the optimizer's step"
    )


def mark_gradients(
    graph: fx.Graph, snaps: Sequence[Any], trainable: Sequence[str], ph_of: Dict[str, fx.Node]
) -> List[fx.Node]:
    """Mark each parameter's gradient node with ``grad_of``; returns the nodes that must stay alive as
    OTHER outputs (a gradient that cannot carry the mark itself keeps its own clone)."""
    marked = set()
    extra = []
    for pn, s in zip(trainable, snaps):
        if s is None:
            continue
        ph_of[pn].meta["fxdp_requires_grad"] = True
        src = s.args[0] if (s.op == "call_function" and s.target is aten.clone.default) else None
        if src is not None and src.op == "call_function" and src not in marked:
            s.replace_all_uses_with(src)
            graph.erase_node(s)
            s = src
        else:
            # an input, or a node shared with another parameter's gradient
            if s.op == "placeholder" or s in marked:
                out_node = next(n for n in graph.nodes if n.op == "output")
                with graph.inserting_before(out_node):
                    s = graph.call_function(aten.clone.default, (s,))
                s.meta["val"] = s.args[0].meta["val"]
            extra.append(s)
        s.meta["fxdp_grad_of"] = pn
        marked.add(s)
    return extra


def assign_roles(graph: fx.Graph, sig: "Signature", n_extras: int) -> List[Tuple[int, str]]:
    """Give each placeholder its role and name, mark the gradients (``grad_of``), keep the state
    outputs that changed, the loss and the extras; returns the roles of the outputs kept."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    specs = sig.placeholder_specs()
    assert len(placeholders) == len(specs), (len(placeholders), len(specs))
    for ph, spec in zip(placeholders, specs):
        ph.meta["fxdp_placeholder"] = spec
        # requires_grad is True exactly for the parameters whose gradient the graph computes
        ph.meta["fxdp_requires_grad"] = False

    out_node = next(n for n in graph.nodes if n.op == "output")
    ret = list(out_node.args[0])
    n_kept = sig.n_state + 1 + n_extras
    n_p = len(sig.pnames)
    extra_grads = mark_gradients(
        graph, ret[n_kept:], sig.trainable, dict(zip(sig.pnames, placeholders[:n_p]))
    )
    final_ret, final_roles = [], []
    for i, (v, r) in enumerate(zip(ret[:n_kept], sig.output_specs(n_extras))):
        if i < sig.n_state and v is placeholders[i]:
            continue  # unchanged state
        final_ret.append(v)
        final_roles.append(r)
    for n in extra_grads:
        final_ret.append(n)
        final_roles.append((pb.OTHER, ""))
    out_node.args = (final_ret,)
    graph.eliminate_dead_code()
    return final_roles


def first_input(graph: fx.Graph, sig: "Signature") -> Optional[fx.Node]:
    """The first INPUT placeholder (lifted constants go before it), or None without inputs."""
    if not sig.batch.values:
        return None
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    return placeholders[sig.n_state + len(sig.hnames)]


def lift_constants(gm: fx.GraphModule, before: fx.Node) -> "OrderedDict[str, torch.Tensor]":
    """Turn tensor attributes into CONSTANT placeholders (inserted before ``before``, or last)."""
    graph = gm.graph
    consts: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    lifted: Dict[str, fx.Node] = {}
    for n in list(graph.nodes):
        if n.op != "get_attr":
            continue
        if n.target not in lifted:
            val = getattr(gm, n.target)
            if not isinstance(val, torch.Tensor):
                raise TraceError(f"node '{n.name}': non-tensor attribute {n.target}")
            if val.device.type == "meta" and val.numel() > 0:
                users = ", ".join(u.name for u in n.users)
                raise TraceError(
                    f"tensor constant {n.target} (read by {users}) is on the meta device: its "
                    f"{val.numel()} values are unknown; make it a buffer of the model, or build "
                    "it from a tensor the step receives"
                )
            sname = f"const.{n.target}"
            anchor = (
                graph.inserting_before(before)
                if before is not None
                else graph.inserting_after([p for p in graph.nodes if p.op == "placeholder"][-1])
            )
            with anchor:
                ph = graph.placeholder(ident(str(n.target)))
            ph.meta["val"] = val
            ph.meta["fxdp_placeholder"] = (pb.CONSTANT, sname, 0)
            lifted[n.target] = ph
            consts[sname] = val.detach().clone()
        n.replace_all_uses_with(lifted[n.target])
        graph.erase_node(n)
    return consts


def renamed(graph: fx.Graph, output_specs: List[Tuple[int, str]]) -> fx.GraphModule:
    """A copy of ``graph`` whose placeholders are named after their role and state name."""
    new = fx.Graph()
    env: Dict[fx.Node, fx.Node] = {}
    used_names = {n.name for n in graph.nodes if n.op != "placeholder"}
    for n in graph.nodes:
        if n.op == "placeholder":
            role, sname, _ = n.meta["fxdp_placeholder"]
            base = cand = f"{_PREFIX[role]}_{ident(sname)}"
            k = 1
            while cand in used_names:
                cand = f"{base}_{k}"
                k += 1
            used_names.add(cand)
            nn_ = new.placeholder(cand)
            nn_.meta = dict(n.meta)
            env[n] = nn_
        elif n.op == "output":
            o = new.output(fx.node.map_arg(n.args[0], lambda a: env[a]))
            o.meta["fxdp_output_specs"] = output_specs
        else:
            env[n] = new.node_copy(n, lambda a: env[a])
    new.lint()
    return fx.GraphModule(torch.nn.Module(), new)


def record_real_meta(gm: fx.GraphModule, args: Sequence[Any]) -> None:
    """Run the graph once on real tensors and store each value's exact layout in node.meta['val']
    (a meta-device tensor with the same shape/stride/offset) and its device in
    node.meta['fxdp_device'], so the wire metadata matches what the kernels really produce."""

    def describe(v):
        if isinstance(v, torch.Tensor):
            m = torch.empty(0, dtype=v.dtype, device="meta").as_strided(
                v.shape, v.stride(), v.storage_offset()
            )
            return m, v.device
        return v, None

    class _Rec(fx.Interpreter):
        def run_node(self, n):
            r = super().run_node(n)
            if n.op != "output":
                if isinstance(r, (tuple, list)):
                    d = [describe(x) for x in r]
                    n.meta["val"] = type(r)(x for x, _ in d)
                    n.meta["fxdp_device"] = [dev for _, dev in d]
                else:
                    n.meta["val"], n.meta["fxdp_device"] = describe(r)
            return r

    with torch.no_grad():
        _Rec(gm).run(*args)


def record_layouts(
    gm: fx.GraphModule, sig: "Signature", consts: "OrderedDict[str, torch.Tensor]"
) -> None:
    """Real mode: run the finished graph once on the example tensors to record exact layouts."""
    by_spec = {spec[:2]: t for spec, t in zip(sig.placeholder_specs(), sig.example_args())}
    by_spec.update(((pb.CONSTANT, n), t) for n, t in consts.items())
    args = [
        by_spec[n.meta["fxdp_placeholder"][:2]] for n in gm.graph.nodes if n.op == "placeholder"
    ]
    try:
        record_real_meta(gm, args)
    except Exception as e:  # noqa: BLE001
        raise TraceError(
            f"the traced graph does not run on the example tensors: {type(e).__name__}: {e}"
        ) from e
