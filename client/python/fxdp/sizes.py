"""Symbolic sizes on the wire (docs/shapes.md, graph.proto ``GraphDef.symbols/size_exprs/guards``).

A step traced with ``dynamic=True`` has sizes that are sympy expressions over the input dims'
symbols. :class:`SizeWriter` writes them into a GraphDef: each input dim's symbol (``Symbol``: the
INPUT placeholder, the dim, the traced value and the range the trace holds for), one table of
expressions (``SizeExpr``, operands before their users), the guards the trace assumed (with the
user's line) and, on every tensor and size argument, the traced value (the hint) plus the index of
its expression. Nothing here ``int()``s a SymInt: that would make the ShapeEnv specialise the
symbol to the example's value, turning the graph static without a word.

:func:`evaluate` and :func:`render` read a GraphDef's table back (the instantiation of
:mod:`fxdp.instantiate`, and error messages).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import sympy
import torch
from torch.utils._sympy import functions as symfn

from .errors import TraceError
from .v1 import graph_pb2 as pb

INT_OO_MAX = 2**62  # a range bound at or above this is "unbounded" (Symbol.max 0)


class SizeArg:
    """A size argument computed from the batch's shape (a folded SymInt node): its sympy expression
    and its value at the traced example. ``convert`` writes it as ``int_value`` (the hint) plus
    ``size_expr``."""

    __slots__ = ("expr", "hint")

    def __init__(self, expr: sympy.Expr, hint: int):
        self.expr, self.hint = expr, int(hint)

    def __repr__(self) -> str:
        return (
            f"SizeArg({str(self.expr)!r}, {self.hint})"  # valid Python: GraphModule code shows it
        )


def expr_of(x) -> sympy.Expr:
    """The sympy expression of an int, a SymInt (its ShapeEnv's replacements applied; never
    guarded) or a :class:`SizeArg`."""
    if isinstance(x, SizeArg):
        return x.expr
    if isinstance(x, torch.SymInt):
        return x.node.expr
    if isinstance(x, int) and not isinstance(x, bool):
        return sympy.Integer(x)
    raise TypeError(f"not a size: {x!r}")


# sympy function -> (wire op); Pow, CeilDiv and the relations are handled by hand
_NARY = {
    sympy.Add: pb.SIZE_OP_ADD,
    sympy.Mul: pb.SIZE_OP_MUL,
    symfn.Min: pb.SIZE_OP_MIN,
    symfn.Max: pb.SIZE_OP_MAX,
}
_BINARY = {
    symfn.FloorDiv: pb.SIZE_OP_FLOORDIV,
    symfn.CleanDiv: pb.SIZE_OP_FLOORDIV,  # an exact division: floor division gives it
    symfn.Mod: pb.SIZE_OP_MOD,
    symfn.PythonMod: pb.SIZE_OP_MOD,
    sympy.Mod: pb.SIZE_OP_MOD,
}
# guard relation -> (kind, operands swapped)
_RELATIONS = {
    sympy.Eq: (pb.GUARD_EQ, False),
    sympy.Ne: (pb.GUARD_NE, False),
    sympy.StrictLessThan: (pb.GUARD_LT, False),
    sympy.LessThan: (pb.GUARD_LE, False),
    sympy.StrictGreaterThan: (pb.GUARD_LT, True),
    sympy.GreaterThan: (pb.GUARD_LE, True),
}


class SizeWriter:
    """Writes one symbolic graph's sizes (see the module docstring). ``inputs``: each INPUT
    placeholder's (node index, name, traced value), in graph order."""

    def __init__(self, shape_env, inputs: Sequence[Tuple[int, str, torch.Tensor]]):
        self.env = shape_env
        self.table: List[pb.SizeExpr] = []
        self.index: Dict[sympy.Expr, int] = {}
        self.symbols: List[pb.Symbol] = []
        self.symbol_of: Dict[sympy.Symbol, int] = {}
        hints = {k: int(v) for k, v in shape_env.backed_var_to_val.items()}
        for node, name, val in inputs:
            for d, size in enumerate(val.shape):
                e = expr_of(size)
                if isinstance(e, sympy.Symbol) and e not in self.symbol_of:
                    lo, hi = _range(shape_env, e)
                    self.symbol_of[e] = len(self.symbols)
                    self.symbols.append(
                        pb.Symbol(
                            name=str(e), input_node=node, dim=d, hint=hints[e], min=lo, max=hi
                        )
                    )
        self.hints = {s: hints[s] for s in self.symbol_of}

    # ----------------------------------------------------------------- expressions
    def hint(self, e: sympy.Expr) -> int:
        return int(e.xreplace(self.hints))

    def expr(self, e: sympy.Expr, where: str) -> int:
        """1 + the table index of ``e`` (added with its operands when new)."""
        e = sympy.sympify(e)
        hit = self.index.get(e)
        if hit is not None:
            return hit + 1
        entry = self._entry(e, where)
        self.table.append(entry)
        self.index[e] = len(self.table) - 1
        return len(self.table)

    def _entry(self, e: sympy.Expr, where: str) -> "pb.SizeExpr":
        if e.is_Integer:
            return pb.SizeExpr(op=pb.SIZE_OP_CONST, value=int(e))
        if isinstance(e, sympy.Symbol):
            if e not in self.symbol_of:
                raise TraceError(
                    f"{where}: the size {e} is not a dim of any input (a data-dependent size, or a "
                    "symbol the trace made up); trace with dynamic=False"
                )
            return pb.SizeExpr(op=pb.SIZE_OP_SYMBOL, symbol=self.symbol_of[e])
        if type(e) in _NARY or type(e) in _BINARY:
            op = _NARY.get(type(e), _BINARY.get(type(e)))
            return pb.SizeExpr(op=op, operands=[self.expr(a, where) - 1 for a in e.args])
        if (
            isinstance(e, (sympy.Pow, symfn.PowByNatural))
            and e.args[1].is_Integer
            and e.args[1] >= 1
        ):
            base = self.expr(e.args[0], where) - 1
            return pb.SizeExpr(op=pb.SIZE_OP_MUL, operands=[base] * int(e.args[1]))
        if isinstance(e, symfn.CeilDiv):  # ceil(a / b) = -((-a) // b)
            floor = self.expr(symfn.FloorDiv(-e.args[0], e.args[1]), where) - 1
            return pb.SizeExpr(op=pb.SIZE_OP_NEG, operands=[floor])
        raise TraceError(
            f"{where}: the size {e} uses {type(e).__name__}, which the wire format's size "
            "expressions (+, *, //, %, min, max) cannot express; trace with dynamic=False"
        )

    def tensor(self, v: torch.Tensor, out: "pb.TensorMeta", where: str) -> None:
        """Hints into shape/stride/storage_offset, expression indices beside them (only when
        some dim is symbolic, so a static tensor's bytes are a static graph's)."""
        shape = [expr_of(s) for s in v.shape]
        stride = [expr_of(s) for s in v.stride()]
        offset = expr_of(v.storage_offset())
        out.shape.extend(self.hint(e) for e in shape)
        out.stride.extend(self.hint(e) for e in stride)
        out.storage_offset = self.hint(offset)
        if any(not e.is_Integer for e in shape):
            out.shape_expr.extend(0 if e.is_Integer else self.expr(e, where) for e in shape)
        if any(not e.is_Integer for e in stride):
            out.stride_expr.extend(0 if e.is_Integer else self.expr(e, where) for e in stride)
        if not offset.is_Integer:
            out.storage_offset_expr = self.expr(offset, where)

    # ----------------------------------------------------------------- the graph's tables
    def _relations(self, rel) -> List:
        """A guard as relations that must all hold: And is each; Or is its first argument that
        holds at the example (stronger than the Or: a batch it refuses is traced again, none is
        accepted that the trace does not hold for)."""
        if isinstance(rel, sympy.And):
            return [r for a in rel.args for r in self._relations(a)]
        if isinstance(rel, sympy.Or):
            held = next(a for a in rel.args if bool(a.xreplace(self.hints)))
            return self._relations(held)
        return [rel]

    def guards(self) -> List["pb.Guard"]:
        out = []
        for g in self.env.guards:
            src = (g.sloc.maybe_user_loc or "") if g.sloc is not None else ""
            where = f"the guard {g.expr}" + (f" ({src})" if src else "")
            for rel in self._relations(self.env.replace(g.expr)):
                if rel is sympy.true:
                    continue
                kind = _RELATIONS.get(type(rel))
                if kind is None:
                    raise TraceError(
                        f"{where}: a {type(rel).__name__} of sizes, which the wire format's guards "
                        "(==, !=, <, <=) cannot express; trace with dynamic=False"
                    )
                lhs, rhs = (rel.rhs, rel.lhs) if kind[1] else (rel.lhs, rel.rhs)
                out.append(
                    pb.Guard(
                        kind=kind[0],
                        lhs=self.expr(lhs, where) - 1,
                        rhs=self.expr(rhs, where) - 1,
                        source=src,
                    )
                )
        return out

    def write(self, g: "pb.GraphDef") -> None:
        """Symbols, expressions and guards into ``g`` (after every node is written)."""
        guards = self.guards()
        g.symbols.extend(self.symbols)
        g.size_exprs.extend(self.table)
        g.guards.extend(guards)


def _range(env, s: sympy.Symbol) -> Tuple[int, int]:
    vr = env.var_to_range.get(s)
    if vr is None:
        return 0, 0
    lo = int(vr.lower) if vr.lower.is_Integer else 0
    hi = int(vr.upper) if vr.upper.is_Integer and int(vr.upper) < INT_OO_MAX else 0
    return max(lo, 0), hi


# --------------------------------------------------------------------------- reading a graph's table


def _floordiv(a: int, b: int, i: int) -> int:
    if b == 0:
        raise ZeroDivisionError(f"size expression {i} divides by zero")
    return a // b


def evaluate(g: "pb.GraphDef", symbols: Sequence[int], strict: bool = True) -> List[Optional[int]]:
    """Every entry of ``g.size_exprs`` at the given symbol values (Python's // and %). A zero
    divisor is a ValueError, or with ``strict=False`` the entry (and every entry that reads it)
    is None: instantiation checks the guards first, which refuse such a batch by name."""
    vals: List[Optional[int]] = []
    for i, e in enumerate(g.size_exprs):
        if any(k >= i for k in e.operands):
            raise ValueError(f"size expression {i} refers to a later entry {list(e.operands)}")
        xs = [vals[k] for k in e.operands]
        if any(x is None for x in xs):
            vals.append(None)
            continue
        try:
            vals.append(_apply(e, xs, symbols, i))
        except ZeroDivisionError as err:
            if strict:
                raise ValueError(str(err)) from None
            vals.append(None)
    return vals


def _apply(e: "pb.SizeExpr", xs: List[int], symbols: Sequence[int], i: int) -> int:
    """One entry of the table from its operands' values."""
    if e.op == pb.SIZE_OP_CONST:
        return e.value
    if e.op == pb.SIZE_OP_SYMBOL:
        return symbols[e.symbol]
    if e.op == pb.SIZE_OP_ADD:
        return sum(xs)
    if e.op == pb.SIZE_OP_MUL:
        v = 1
        for x in xs:
            v *= x
        return v
    if e.op == pb.SIZE_OP_MIN:
        return min(xs)
    if e.op == pb.SIZE_OP_MAX:
        return max(xs)
    if e.op == pb.SIZE_OP_FLOORDIV:
        return _floordiv(xs[0], xs[1], i)
    if e.op == pb.SIZE_OP_MOD:
        return xs[0] - xs[1] * _floordiv(xs[0], xs[1], i)
    if e.op == pb.SIZE_OP_NEG:
        return -xs[0]
    raise ValueError(f"size expression {i} has an unknown op {e.op}")


_TEXT = {
    pb.SIZE_OP_ADD: " + ",
    pb.SIZE_OP_MUL: "*",
    pb.SIZE_OP_FLOORDIV: " // ",
    pb.SIZE_OP_MOD: " % ",
}
GUARD_TEXT = {pb.GUARD_EQ: "==", pb.GUARD_NE: "!=", pb.GUARD_LT: "<", pb.GUARD_LE: "<="}


def render(g: "pb.GraphDef", i: int, names: Optional[Sequence[str]] = None) -> str:
    """Entry ``i`` of ``g.size_exprs`` as text; symbols as ``names`` (default: their names)."""
    e = g.size_exprs[i]
    if e.op == pb.SIZE_OP_CONST:
        return str(e.value)
    if e.op == pb.SIZE_OP_SYMBOL:
        return names[e.symbol] if names is not None else g.symbols[e.symbol].name
    xs = [render(g, k, names) for k in e.operands]
    if e.op in _TEXT:
        return "(" + _TEXT[e.op].join(xs) + ")"
    if e.op == pb.SIZE_OP_NEG:
        return f"-{xs[0]}"
    return f"{'min' if e.op == pb.SIZE_OP_MIN else 'max'}({', '.join(xs)})"
