"""``trace_step(..., dynamic=True)``: one trace for every batch shape (docs/shapes.md, issue 26).

The flat step's arguments become FakeTensors of one ``ShapeEnv(duck_shape=False)``: parameters,
buffers, optimizer state and hyper-parameters with static shapes, the INPUT dims that ``dynamic``
names with a symbol each (``DimDynamic.DYNAMIC``; without ``duck_shape``, two dims of equal size
stay two symbols unless the model equates them). ``make_fx(tracing_mode="symbolic")`` records the
step once; what the model assumed of the sizes is in the ShapeEnv's guards, each with the user's
line that made it (:class:`GuardSources`). :func:`fxdp.graph_passes.fold_sizes` turns the size
arithmetic into size arguments and :class:`fxdp.sizes.SizeWriter` writes it all.

A dim the model forced to one value (``x.shape[1] == 16``, or an example dim of size 0 or 1, which
the ShapeEnv never makes symbolic) stays static: :func:`specialized` reports it, and an instance
at another size fails its check naming the dim.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Dict, List, Optional, Sequence, Union

import torch
from torch.fx.experimental import symbolic_shapes as ss

from . import layouts
from .errors import TraceError
from .sizes import expr_of
from .trace_errors import node_source, user_line

Dynamic = Union[bool, Dict[str, Sequence[int]]]


def _user_line() -> str:
    """The user's line that made a guard (trace_errors.user_line: outside torch, fxdp and
    installed packages such as transformers, whose frame it names after it)."""
    return user_line(sys._getframe(2))


class GuardSources(ss.ShapeEnv):
    """A ShapeEnv whose guards carry the user's line (``ShapeGuard.sloc.maybe_user_loc``), the
    ``Guard.source`` an instantiation error quotes."""

    def _get_sloc(self, framework_loc=None):
        sloc = super()._get_sloc(framework_loc)
        return ss.SLoc(sloc.framework_loc, _user_line() or sloc.maybe_user_loc)


def dynamic_dims(
    spec: Dynamic, names: Sequence[str], values: Sequence[torch.Tensor]
) -> List[List[int]]:
    """Per input, the dims to make symbolic: every dim for ``True``, else the dict's (by input
    name; negative dims count from the end)."""
    if spec is True:
        return [list(range(v.dim())) for v in values]
    if not isinstance(spec, dict):
        raise TraceError(
            f"dynamic must be True, False or a dict {{input name: [dims]}}, got {spec!r}"
        )
    unknown = [k for k in spec if k not in names]
    if unknown:
        raise TraceError(
            f"dynamic names {unknown}, which are not inputs; the inputs are {list(names)}"
        )
    out = []
    for n, v in zip(names, values):
        dims = []
        for d in spec.get(n, ()):
            if not -v.dim() <= int(d) < v.dim():
                raise TraceError(
                    f"dynamic: dim {d} of input '{n}' is out of range for its shape {tuple(v.shape)}"
                )
            dims.append(int(d) % v.dim())
        out.append(sorted(set(dims)))
    return out


def symbolic_args(sig, dims: List[List[int]]):
    """The flat step's arguments as FakeTensors of one GuardSources ShapeEnv (see the module
    docstring), and that ShapeEnv."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if sig.device.type == "meta":
        raise TraceError(
            "dynamic=True traces a model with weights (its example batch on the model's device); "
            "this one is on the meta device: build it with weights, or trace with dynamic=False"
        )
    env = GuardSources(duck_shape=False)
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
    args = sig.example_args()
    n_in = len(sig.batch.values)
    out = [mode.from_tensor(a, static_shapes=True) for a in args[: len(args) - n_in]]
    for x, ds in zip(args[len(args) - n_in :], dims):
        sizes = [ss.DimDynamic.DYNAMIC if d in ds else ss.DimDynamic.STATIC for d in range(x.dim())]
        ctx = ss.StatelessSymbolicContext(dynamic_sizes=sizes, constraint_sizes=[None] * x.dim())
        out.append(mode.from_tensor(x, symbolic_context=ctx))
    return out, env


def specialized(env, names: Sequence[str], fakes, dims: List[List[int]]) -> List[Dict]:
    """The dims ``dynamic`` asked for that the trace made static: {input, dim, value, why}.
    ``fakes``: the inputs :func:`symbolic_args` made (their sizes keep their own symbols)."""
    out = []
    for n, x, ds in zip(names, fakes, dims):
        for d in ds:
            size = x.shape[d]
            if not isinstance(size, torch.SymInt):
                why = f"the example's size {int(size)}: sizes 0 and 1 are never symbolic; trace with a larger example"
                out.append({"input": n, "dim": d, "value": int(size), "why": why})
                continue
            e = expr_of(size)
            if e.is_Integer:
                src = _guard_source(env, size.node._expr)
                why = "the step requires it" + (f" ({src})" if src else "")
                out.append({"input": n, "dim": d, "value": int(e), "why": why})
    return out


def _guard_source(env, sym) -> str:
    for g in env.guards:
        if sym in g.expr.free_symbols and g.sloc is not None and g.sloc.maybe_user_loc:
            return g.sloc.maybe_user_loc
    return ""


@contextlib.contextmanager
def frozen(env):
    """Raises a TraceError when what runs inside adds a guard or a replacement: every pass after
    the trace reads sizes as expressions; a comparison of SymInts would quietly assume a size."""
    n_guards, repl = len(env.guards), dict(env.replacements)
    yield
    if len(env.guards) != n_guards or dict(env.replacements) != repl:
        new = [str(g.expr) for g in env.guards[n_guards:]]
        raise TraceError(
            f"fxdp: a pass after the symbolic trace assumed sizes (new guards {new}, replacements "
            f"{ {str(k): str(v) for k, v in env.replacements.items() if k not in repl} }): a bug in fxdp"
        )


def hinted(v):
    """A meta tensor of ``v``'s layout at the traced example (its sizes' hints), or ``v``."""
    if not isinstance(v, torch.Tensor):
        return v
    h = lambda s: int(s.node.hint) if isinstance(s, torch.SymInt) else int(s)  # noqa: E731
    return torch.empty(0, dtype=v.dtype, device="meta").as_strided(
        [h(s) for s in v.shape], [h(s) for s in v.stride()], h(v.storage_offset())
    )


def check_layouts(gm: torch.fx.GraphModule, device: torch.device) -> None:
    """``tracing_mode="auto"``'s layout check (fxdp.layouts) at the example's sizes; a node whose
    real layout differs is a TraceError (a symbolic trace cannot fall back to real tensors)."""
    bad = layouts.check(gm, device, val_of=_hinted_val)
    if not bad:
        return
    n, fake, real = bad[0]
    raise TraceError(
        f"node '{n.name}' ({layouts._op_name(n)}) at {node_source(n) or 'an unknown line'} lays out its "
        f"output as {real} on {device}, FakeTensor says {fake}: a symbolic trace would not be exact; "
        "trace with dynamic=False (the default tracing mode then traces on real tensors)"
    )


def _hinted_val(n: torch.fx.Node):
    v = n.meta.get("val")
    if isinstance(v, (tuple, list)):
        return type(v)(hinted(x) for x in v)
    return hinted(v)


def spec_or_none(dynamic: Optional[Dynamic]) -> Optional[Dynamic]:
    """None for a static trace (False, None, {}), else ``dynamic``."""
    return dynamic if dynamic else None
