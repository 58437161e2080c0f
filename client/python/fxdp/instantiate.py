"""The static graph of a symbolic one at a batch's shapes (docs/shapes.md build plan step 3; the
Python mirror of analysis/ir/instantiate): ``TracedStep.instantiate(batch)`` and ``run_local``.

:func:`instantiate` binds each symbol to its input dim, checks every INPUT placeholder's dims,
every symbol's range and every guard (a failure is a :class:`ShapeError` naming the input, its
shape, the guard and the user's line that assumed it, and what to do), then substitutes the values
into every shape, stride, storage offset and size argument. The result has no symbols: the graph a
concrete trace of that batch gives, for ``run_local``, ``analyze`` and ``expand`` as they are.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence

from . import sizes
from .errors import ShapeError
from .v1 import graph_pb2 as pb

WHAT_TO_DO = (
    "pad the batches to the shapes the trace allows (e.g. DataCollatorWithPadding("
    "pad_to_multiple_of=...)), drop a last partial batch (DataLoader(drop_last=True)), or trace "
    "again with this batch as the example (fxdp.trace_step(..., dynamic=True))"
)


def _shape_text(shape: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in shape) or "scalar"


def input_shapes(graph: "pb.GraphDef") -> Dict[str, Sequence[int]]:
    """The traced example's shape of each input, by name."""
    return {
        n.placeholder.state_name: list(n.outputs[0].tensor.shape)
        for n in graph.nodes
        if n.kind == pb.PLACEHOLDER and n.placeholder.role == pb.INPUT
    }


def _symbol_names(graph: "pb.GraphDef") -> List[str]:
    """Each symbol as its input dim: ``input_ids.shape[0]``."""
    return [
        f"{graph.nodes[s.input_node].placeholder.state_name}.shape[{s.dim}]" for s in graph.symbols
    ]


def _bind(graph: "pb.GraphDef", shapes: Mapping[str, Sequence[int]], got: str) -> List[int]:
    values = []
    for s in graph.symbols:
        name = graph.nodes[s.input_node].placeholder.state_name
        if name not in shapes:
            raise ShapeError(f"the batch has no input '{name}' (it has {sorted(shapes)})")
        shape = shapes[name]
        if not 0 <= s.dim < len(shape):
            raise ShapeError(
                f"input '{name}' is {_shape_text(shape)}: it has no dim {s.dim}, which the trace "
                f"made the size {s.name} ({got})"
            )
        values.append(int(shape[s.dim]))
    return values


def _check_ranges(graph: "pb.GraphDef", values: List[int], got: str) -> None:
    """After the guards (which name the user's line), the ranges: e.g. min 2 where the trace
    treated sizes 0 and 1 apart."""
    for s, v in zip(graph.symbols, values):
        if v < s.min or (s.max and v > s.max):
            name = graph.nodes[s.input_node].placeholder.state_name
            hi = f"..{s.max}" if s.max else " or more"
            raise ShapeError(
                f"input '{name}': dim {s.dim} is {v}, the trace holds for {s.min}{hi} ({got}); "
                f"{WHAT_TO_DO}"
            )


def _check_inputs(graph, shapes, vals, got: str) -> None:
    for n in graph.nodes:
        if n.kind != pb.PLACEHOLDER or n.placeholder.role != pb.INPUT:
            continue
        name, t = n.placeholder.state_name, n.outputs[0].tensor
        shape = [int(d) for d in shapes[name]]
        want = [
            vals[e - 1] if e else d for d, e in zip(t.shape, t.shape_expr or [0] * len(t.shape))
        ]
        if shape == want:
            continue
        if len(shape) != len(want):
            raise ShapeError(
                f"input '{name}' is {_shape_text(shape)}: {len(shape)} dims, the graph's have "
                f"{len(want)} (traced as {_shape_text(t.shape)})"
            )
        d = next(i for i, (a, b) in enumerate(zip(shape, want)) if a != b)
        e = t.shape_expr[d] if t.shape_expr else 0
        how = (
            f"it is {sizes.render(graph, e - 1, _symbol_names(graph))} = {want[d]} for this batch"
            if e
            else f"the trace has it static ({want[d]}: a dim dynamic= did not name, or one the step "
            "pinned, metadata fxdp.specialized)"
            if graph.symbols
            else f"the graph is static (traced at {want[d]}; trace_step(..., dynamic=True) traces every shape)"
        )
        raise ShapeError(
            f"input '{name}' is {_shape_text(shape)}: dim {d} is {shape[d]}, but {how} "
            f"({got}); {WHAT_TO_DO}"
        )


def _check_guards(graph, vals, got: str) -> None:
    """Every guard, in order; a side that divides by zero at these sizes (None) breaks it."""
    names = _symbol_names(graph)
    for g in graph.guards:
        a, b = vals[g.lhs], vals[g.rhs]
        defined = a is not None and b is not None
        if defined and {
            pb.GUARD_EQ: a == b,
            pb.GUARD_NE: a != b,
            pb.GUARD_LT: a < b,
            pb.GUARD_LE: a <= b,
        }.get(g.kind, False):
            continue
        text = f"{sizes.render(graph, g.lhs, names)} {sizes.GUARD_TEXT.get(g.kind, '?')} {sizes.render(graph, g.rhs, names)}"
        what = f"{a} vs {b}" if defined else "a side divides by zero at these sizes"
        at = f" at {g.source}" if g.source else ""
        raise ShapeError(
            f"the batch ({got}) breaks the guard {text} ({what}), which the trace assumed{at}; "
            f"{WHAT_TO_DO}"
        )


def _substitute(t: "pb.TensorMeta", vals: List[int]) -> None:
    for i, e in enumerate(t.shape_expr):
        if e:
            t.shape[i] = vals[e - 1]
    for i, e in enumerate(t.stride_expr):
        if e:
            t.stride[i] = vals[e - 1]
    if t.storage_offset_expr:
        t.storage_offset = vals[t.storage_offset_expr - 1]
    t.ClearField("shape_expr")
    t.ClearField("stride_expr")
    t.ClearField("storage_offset_expr")


def _substitute_arg(a: "pb.Argument", vals: List[int]) -> None:
    if a.size_expr:
        a.int_value = vals[a.size_expr - 1]
        a.ClearField("size_expr")
    elif a.WhichOneof("value") == "list":
        for x in a.list.items:
            _substitute_arg(x, vals)


def instantiate(graph: "pb.GraphDef", shapes: Mapping[str, Sequence[int]]) -> "pb.GraphDef":
    """The static GraphDef of ``graph`` (symbolic) for inputs of these shapes (by input name); a
    static ``graph`` is returned as it is when the shapes are its own. Raises :class:`ShapeError`."""
    got = ", ".join(f"{k} {_shape_text(v)}" for k, v in shapes.items())
    if not graph.symbols:
        _check_inputs(graph, shapes, [], got)
        return graph
    bound = _bind(graph, shapes, got)
    vals = sizes.evaluate(graph, bound, strict=False)  # a zero divisor: None, the guards refuse
    _check_inputs(graph, shapes, vals, got)
    _check_guards(graph, vals, got)
    _check_ranges(graph, bound, got)
    if None in vals:
        i = vals.index(None)
        raise ShapeError(
            f"size expression {i} ({sizes.render(graph, i, _symbol_names(graph))}) divides by zero "
            f"at this batch ({got}), though every guard holds; {WHAT_TO_DO}"
        )
    out = pb.GraphDef()
    out.CopyFrom(graph)
    for f in ("symbols", "size_exprs", "guards"):
        out.ClearField(f)
    for n in out.nodes:
        for o in n.outputs:
            if o.kind == pb.TENSOR:
                _substitute(o.tensor, vals)
        for a in n.args:
            _substitute_arg(a, vals)
        for kw in n.kwargs:
            _substitute_arg(kw.value, vals)
    return out
