"""Differential test: fxdp's C++ view-op dim maps against torch 2.13's own rules.

For every generated case (an aten view op, an input shape, arguments) the expected answer is
torch's: the DimMap of DTensor's `dim_maps` function for the op (called as DTensor calls it, with
the aten arguments), or an error when that function raises, never terminates, or when the aten op
itself rejects the arguments (checked by running it on a meta tensor). Composite ops with no entry
of their own use the rule of what they decompose to (unflatten -> view, t -> transpose) or the
generalisation of their Python entry (flatten(start, end) -> dim_flatten(ndim, start, end)).
Where torch's map has a different rank from the op's real output, the C++ side returns the
rank-correct map: those cases are matched against `_DIVERGENCES` below, counted and reported
(see [View Rule Divergences] in analysis/view_dim_maps.h); any other rank mismatch fails.

The C++ side is build/tests/view_rules_driver (FXDP_BUILD_DIR overrides build/).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor._ops import _view_ops as V

SEED = 20260613
CASES_PER_OP = 400
ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("FXDP_BUILD_DIR", ROOT / "build"))
DRIVER = BUILD / "tests" / "view_rules_driver"
aten = torch.ops.aten


# ---- text form: mirrors DimSpec::ToString / DimMapToString (analysis/dim_spec.cc) ----------------


def fmt(d) -> str:
    if isinstance(d, V.Singleton):
        return "S"
    if isinstance(d, V.InputDim):
        return f"In{d.input_dim}"
    if isinstance(d, V.Broadcast):
        return f"Bc({fmt(d.dim)},{d.dim_size})"
    if isinstance(d, V.NewDim):
        return f"New({d.size})"
    if isinstance(d, V.Repeat):
        return f"Rep({fmt(d.input_dim)},{d.times})"
    if isinstance(d, V.Flatten):
        return "Fl(" + ",".join(fmt(x) for x in d.input_dims) + ")"
    if isinstance(d, V.Split):
        return f"Sp({fmt(d.input_dim)},({','.join(str(g) for g in d.group_shape)}),{d.split_id})"
    raise TypeError(d)


def fmt_map(m) -> str:
    return "(" + ", ".join(fmt(d) for d in m) + ")"


# ---- torch's rules, called the way DTensor calls them --------------------------------------


class _Arg:
    """Stands in for the OpStrategy DTensor passes as args_schema[0]: only .shape and .ndim."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        self.ndim = len(shape)


M = V.dim_maps
# aten op -> torch rule taking (input, *aten args, eager output shape).
RULES = {
    "aten::_unsafe_view": lambda x, size, out: M[torch.Tensor.view](x, size),
    "aten::atleast_1d": lambda x, out: M[torch.atleast_1d](x),
    "aten::atleast_2d": lambda x, out: M[torch.atleast_2d](x),
    "aten::atleast_3d": lambda x, out: M[torch.atleast_3d](x),
    "aten::broadcast_to": lambda x, size, out: M[torch.broadcast_to](x, size),
    "aten::expand": lambda x, size, out: M[torch.Tensor.expand](x, size),
    "aten::expand_copy": lambda x, size, out: M[torch.Tensor.expand](x, size),
    "aten::flatten.using_ints": lambda x, s, e, out: V.dim_flatten(
        x.ndim, s % max(x.ndim, 1), e % max(x.ndim, 1)
    ),
    "aten::movedim.int": lambda x, s, d, out: M[torch.movedim](x, s, d),
    "aten::movedim.intlist": lambda x, s, d, out: M[torch.movedim](x, s, d),
    "aten::permute": lambda x, dims, out: M[torch.permute](x, dims),
    "aten::ravel": lambda x, out: M[torch.ravel](x),
    "aten::repeat": lambda x, reps, out: M[torch.Tensor.repeat](x, reps),
    "aten::reshape": lambda x, shape, out: M[torch.reshape](x, shape),
    "aten::squeeze": lambda x, out: M[torch.squeeze](x),
    "aten::squeeze.dim": lambda x, dim, out: M[torch.squeeze](x, dim),
    "aten::squeeze.dims": lambda x, dims, out: M[torch.squeeze](x, dims),
    "aten::squeeze_": lambda x, out: M[torch.squeeze](x),
    "aten::squeeze_.dim": lambda x, dim, out: M[torch.squeeze](x, dim),
    "aten::squeeze_.dims": lambda x, dims, out: M[torch.squeeze](x, dims),
    "aten::t": lambda x, out: V.dim_transpose(x.ndim, 0, 0 if x.ndim < 2 else 1),  # torch._refs.t
    "aten::tile": lambda x, dims, out: M[torch.tile](x, tuple(dims)),  # Python-level dims tuple
    "aten::transpose.int": lambda x, a, b, out: M[torch.transpose](x, a, b),
    "aten::unflatten.int": lambda x, dim, sizes, out: M[torch.Tensor.view](x, list(out)),
    "aten::unsqueeze": lambda x, dim, out: M[torch.unsqueeze](x, dim),
    "aten::view": lambda x, size, out: M[torch.Tensor.view](x, size),
    "aten::view_as_complex": lambda x, out: M[torch.view_as_complex](x),
    "aten::view_as_real": lambda x, out: M[torch.view_as_real](x),
    "aten::view_copy": lambda x, size, out: M[torch.Tensor.view](x, size),
}


# [View Rule Divergences]: where torch's map has a different rank from the op's output, each
# function returns the map the C++ side gives instead (text form), or None when it does not apply.


def squeeze_keeps_size0_dims(op, shape, args):
    """torch's squeeze rule drops targeted dims of size <= 1; the op drops only size-1 dims."""
    if not op.startswith("aten::squeeze"):
        return None
    n = max(len(shape), 1)
    dims = args[0] if args and isinstance(args[0], list) else args
    targets = {d % n for d in dims} if args else set(range(len(shape)))
    return (
        "(" + ", ".join(f"In{i}" for i, s in enumerate(shape) if s != 1 or i not in targets) + ")"
    )


def view_as_complex_1d_is_0d(op, shape, args):
    """view_as_complex of shape [2] is 0-d; torch's rule gives (In0)."""
    return "()" if op == "aten::view_as_complex" and len(shape) == 1 else None


_DIVERGENCES = [squeeze_keeps_size0_dims, view_as_complex_1d_is_0d]


class _NoProgress(Exception):
    pass


def _bounded(f, budget=100_000):
    """f(), or _NoProgress once it has run `budget` lines (view_groups loops forever on some
    zero-size reshapes). Deterministic, unlike a timer."""
    lines = 0

    def trace(frame, event, arg):
        nonlocal lines
        lines += 1
        if lines > budget:
            raise _NoProgress()
        return trace

    sys.settrace(trace)
    try:
        return f()
    finally:
        sys.settrace(None)


def _dim_size(d, shape):
    if isinstance(d, V.Singleton):
        return 1
    if isinstance(d, V.InputDim):
        return shape[d.input_dim]
    if isinstance(d, (V.Broadcast, V.NewDim)):
        return d.dim_size if isinstance(d, V.Broadcast) else d.size
    if isinstance(d, V.Repeat):
        return _dim_size(d.input_dim, shape) * d.times
    if isinstance(d, V.Flatten):
        p = 1
        for x in d.input_dims:
            p *= _dim_size(x, shape)
        return p
    return d.group_shape[d.split_id]


def expected(op, shape, args, stats):
    """torch's answer: "OK <map>" or "ERR"."""
    name, _, overload = op.partition(".")
    packet = getattr(aten, name.split("::")[1])
    fn = getattr(packet, overload or "default")
    dtype = torch.complex64 if op == "aten::view_as_real" else torch.float32
    try:
        out = tuple(fn(torch.empty(shape, dtype=dtype, device="meta"), *args).shape)
    except Exception:  # the aten op rejects the arguments
        stats["eager_error"] += 1
        return "ERR"
    if any(s < 0 for s in out):  # expand(0, -2) of a [1, 1] tensor: a torch bug, not a shape
        stats["eager_negative_size"] += 1
        return "ERR"
    try:
        dim_map = _bounded(lambda: RULES[op](_Arg(shape), *args, out))
    except _NoProgress:
        stats["rule_hang"] += 1
        return "ERR"
    except Exception:  # torch's rule raises where the op works
        stats["rule_error"] += 1
        return "ERR"
    if len(dim_map) != len(out):
        for divergence in _DIVERGENCES:
            corrected = divergence(op, shape, args)
            if corrected is not None:
                assert corrected.count("In") + corrected.count("S") == len(out), corrected
                stats["divergence: " + divergence.__name__] += 1
                return "OK " + corrected
        raise AssertionError(
            f"unexplained rank mismatch: {op}{shape} {args}: {fmt_map(dim_map)} vs {out}"
        )
    if op != "aten::view_as_complex" and 0 not in shape:  # the oracle itself is sane
        sizes = tuple(_dim_size(d, shape) for d in dim_map)
        assert sizes == out, f"{op}{shape} {args}: {fmt_map(dim_map)} sizes {sizes} vs {out}"
    return "OK " + fmt_map(dim_map)


# ---- case generation ---------------------------------------------------------------------


def _shape(rng, max_rank=6):
    return [
        rng.choice([0, 1, 1, 1, 2, 2, 3, 4, 5, 6]) if rng.random() > 0.03 else 0
        for _ in range(rng.randint(0, max_rank))
    ]


def _dim(rng, ndim, extra=0):
    n = max(ndim + extra, 1)
    return rng.randint(-n - 1, n) if rng.random() < 0.1 else rng.randint(-n, n - 1)


def _factors(rng, n):
    """A random list of sizes whose product is n (1s included now and then)."""
    if n == 0:
        out = [0] + [rng.choice([1, 2, 3, 0]) for _ in range(rng.randint(0, 2))]
        rng.shuffle(out)
        return out
    out = []
    while n > 1:
        divs = [d for d in range(2, n + 1) if n % d == 0]
        d = rng.choice(divs)
        out.append(d)
        n //= d
    for _ in range(rng.randint(0, 2)):
        out.insert(rng.randint(0, len(out)), 1)
    return out


def _target_shape(rng, shape):
    """A reshape target for shape: mostly valid (regrouped factors), with -1 and invalid ones."""
    r = rng.random()
    if r < 0.08:
        return [rng.choice([-1, -2, 0, 1, 2, 3, 5, 7]) for _ in range(rng.randint(0, 4))]
    out = []
    i = 0
    while i < len(shape):  # regroup runs of adjacent dims
        k = rng.choice([1, 1, 1, 2, 3])
        prod = 1
        for s in shape[i : i + k]:
            prod *= s
        out += _factors(rng, prod) if rng.random() < 0.6 else [prod]
        i += k
    if rng.random() < 0.2 and len(out) >= 2:  # mixed groups: Split(Flatten(...))
        j = rng.randrange(len(out) - 1)
        out[j], out[j + 1] = out[j + 1], out[j]
    if out and rng.random() < 0.35:
        out[rng.randrange(len(out))] = -1
    if out and rng.random() < 0.04:
        out[rng.randrange(len(out))] = -1
    return out


def _expand_sizes(rng, shape):
    out = [rng.choice([1, 2, 3, 0, -1]) for _ in range(rng.randint(0, 2))]
    for s in shape:
        if s == 1:
            out.append(rng.choice([1, 3, 4, 0, -1, -2]) if rng.random() < 0.98 else -2)
        else:
            out.append(rng.choice([s, s, -1, s + 1, 1]))
    if shape and rng.random() < 0.05:
        out.pop(0)
    return out


def _permutation(rng, ndim):
    p = list(range(ndim))
    rng.shuffle(p)
    p = [d - ndim if rng.random() < 0.3 else d for d in p]
    if rng.random() < 0.1:
        p = p[:-1] if p and rng.random() < 0.5 else p + [rng.randint(-ndim - 1, ndim)]
    return p


def _repeats(rng, ndim, extra_max=2):
    n = ndim + rng.randint(-1 if ndim else 0, extra_max)
    out = [rng.choice([1, 1, 2, 3, 0]) for _ in range(n)]
    if out and rng.random() < 0.05:
        out[rng.randrange(len(out))] = -1
    return out


def _dims_list(rng, ndim, k_max):
    return [_dim(rng, ndim) for _ in range(rng.randint(0, k_max))]


def _movedim_lists(rng, ndim):
    k = rng.randint(0, max(ndim, 1))
    src = rng.sample(range(ndim), min(k, ndim)) if ndim else [0] * min(k, 1)
    dst = rng.sample(range(ndim), len(src)) if ndim else list(src)
    if rng.random() < 0.1:
        dst = dst + [0]
    if rng.random() < 0.1 and src:
        src[0] = src[-1]
    return [d - ndim if rng.random() < 0.3 and ndim else d for d in src], dst


def _unflatten_args(rng, shape):
    d = _dim(rng, len(shape))
    n = shape[d] if -len(shape) <= d < len(shape) and shape else 1
    sizes = _factors(rng, n) or [1]
    if rng.random() < 0.3:
        sizes[rng.randrange(len(sizes))] = -1
    if rng.random() < 0.08:
        sizes = [rng.choice([2, 3, -1]) for _ in range(rng.randint(0, 2))]
    return [d, sizes]


GENERATORS = {
    "aten::_unsafe_view": lambda rng, s: [_target_shape(rng, s)],
    "aten::atleast_1d": lambda rng, s: [],
    "aten::atleast_2d": lambda rng, s: [],
    "aten::atleast_3d": lambda rng, s: [],
    "aten::broadcast_to": lambda rng, s: [_expand_sizes(rng, s)],
    "aten::expand": lambda rng, s: [_expand_sizes(rng, s)],
    "aten::expand_copy": lambda rng, s: [_expand_sizes(rng, s)],
    "aten::flatten.using_ints": lambda rng, s: [_dim(rng, len(s)), _dim(rng, len(s))],
    "aten::movedim.int": lambda rng, s: [_dim(rng, len(s)), _dim(rng, len(s))],
    "aten::movedim.intlist": lambda rng, s: list(_movedim_lists(rng, len(s))),
    "aten::permute": lambda rng, s: [_permutation(rng, len(s))],
    "aten::ravel": lambda rng, s: [],
    "aten::repeat": lambda rng, s: [_repeats(rng, len(s))],
    "aten::reshape": lambda rng, s: [_target_shape(rng, s)],
    "aten::squeeze": lambda rng, s: [],
    "aten::squeeze.dim": lambda rng, s: [_dim(rng, len(s))],
    "aten::squeeze.dims": lambda rng, s: [_dims_list(rng, len(s), 3)],
    "aten::squeeze_": lambda rng, s: [],
    "aten::squeeze_.dim": lambda rng, s: [_dim(rng, len(s))],
    "aten::squeeze_.dims": lambda rng, s: [_dims_list(rng, len(s), 3)],
    "aten::t": lambda rng, s: [],
    "aten::tile": lambda rng, s: [_repeats(rng, rng.randint(0, len(s) + 1), 1)],
    "aten::transpose.int": lambda rng, s: [_dim(rng, len(s)), _dim(rng, len(s))],
    "aten::unflatten.int": _unflatten_args,
    "aten::unsqueeze": lambda rng, s: [_dim(rng, len(s), extra=1)],
    "aten::view": lambda rng, s: [_target_shape(rng, s)],
    "aten::view_as_complex": lambda rng, s: [],
    "aten::view_as_real": lambda rng, s: [],
    "aten::view_copy": lambda rng, s: [_target_shape(rng, s)],
}


def _input_shape(rng, op):
    if op == "aten::t":
        return _shape(rng, max_rank=3)
    s = _shape(rng)
    if op == "aten::view_as_complex" and rng.random() < 0.85:
        s = s[:5] + [2]
    return s


def _request(rng, op, shape, args):
    """The C++ request: like DTensor's positional args, some moved to kwargs or left to defaults."""
    name, _, overload = op.partition(".")
    schema = getattr(getattr(aten, name.split("::")[1]), overload or "default")._schema
    names = [a.name for a in schema.arguments[1:]]
    defaults = [a.default_value if a.has_default_value() else None for a in schema.arguments[1:]]
    pos, kw = list(args), {}
    if op == "aten::flatten.using_ints":
        while pos and pos[-1] == defaults[len(pos) - 1] and rng.random() < 0.5:
            pos.pop()
    while pos and rng.random() < 0.2:
        key = names[len(pos) - 1]
        kw[key] = pos.pop()
    if op in ("aten::expand", "aten::expand_copy") and rng.random() < 0.2:
        kw["implicit"] = False
    return {"op": name, "overload": overload, "shape": shape, "args": pos, "kwargs": kw}


def generate(seed=SEED, per_op=CASES_PER_OP):
    rng = random.Random(seed)
    stats = {k: 0 for k in ("eager_error", "eager_negative_size", "rule_error", "rule_hang")}
    stats.update({"divergence: " + d.__name__: 0 for d in _DIVERGENCES})
    cases = []
    for op in sorted(GENERATORS):
        for _ in range(per_op):
            shape = _input_shape(rng, op)
            args = GENERATORS[op](rng, shape)
            cases.append((_request(rng, op, shape, args), expected(op, shape, args, stats)))
    return cases, stats


def test_view_rules_match_torch(record_property):
    if not DRIVER.exists():
        pytest.fail(f"{DRIVER} is missing: build it with `ninja -C {BUILD} view_rules_driver`")
    ops = subprocess.run([str(DRIVER), "--list-ops"], check=True, capture_output=True, text=True)
    assert sorted(ops.stdout.split()) == sorted(GENERATORS), "generate cases for every C++ rule"

    start = time.perf_counter()
    cases, stats = generate()
    lines = "".join(json.dumps(req) + "\n" for req, _ in cases)
    run = subprocess.run([str(DRIVER)], input=lines, check=True, capture_output=True, text=True)
    got = run.stdout.splitlines()
    assert len(got) == len(cases)

    mismatches = []
    for (req, want), have in zip(cases, got):
        status = have if have.startswith("OK") else "ERR"
        if status != want:
            mismatches.append(f"{req}: torch {want!r}, fxdp {have!r}")
    n, ok = len(cases), sum(want != "ERR" for _, want in cases)
    summary = (
        f"{n} cases ({ok} maps, {n - ok} errors) in {time.perf_counter() - start:.1f}s; "
        + ", ".join(f"{k} {v}" for k, v in stats.items())
    )
    print(summary)
    record_property("cases", n)
    record_property("summary", summary)
    assert not mismatches, f"{len(mismatches)} of {n} differ:\n" + "\n".join(mismatches[:40])
    assert n >= 10_000
