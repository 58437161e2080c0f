"""The random ops of a traced step, drawn from fxdp's Philox stream (docs/randomness.md).

The workers draw every random op of the graph themselves (executor/random_ops.cc), each value at
its GLOBAL element index from the stream keyed by (seed, step, node id), so N ranks draw exactly
what one device draws. ``TracedStep.run_local`` runs its graph through :class:`RandomInterpreter`,
which draws the same values the same way here. ``TABLE`` is analysis/ir/random_ops.cc's table
(tests/testdata/random_ops.txt holds both to one text).

Values agree bit for bit with the workers' for bernoulli, dropout, uniform and randint (integer
and power-of-two arithmetic only); normal and exponential draws go through ``log``/``cos`` in
float64, where torch's vectorised kernels and the C library may differ in the last bit of a
float64, so a float32 result may differ in its last bit with a probability of about 1e-8.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from . import philox

# (op name, overload) -> (kind, parameter names), as analysis/ir/random_ops.cc.
TABLE: Dict[Tuple[str, str], Tuple[str, Tuple[str, ...]]] = {
    ("aten::bernoulli", ""): ("bernoulli_probs", ("self",)),
    ("aten::bernoulli", "p"): ("bernoulli", ("p",)),
    ("aten::exponential", ""): ("exponential", ("lambd",)),
    ("aten::native_dropout", ""): ("dropout", ("input", "p", "train")),
    ("aten::normal", "float_float"): ("normal", ("mean", "std")),
    ("aten::normal_functional", ""): ("normal", ("mean", "std")),
    ("aten::rand", ""): ("uniform", ()),
    ("aten::rand", "generator"): ("uniform", ()),
    ("aten::rand_like", ""): ("uniform", ()),
    ("aten::rand_like", "generator"): ("uniform", ()),
    ("aten::randint", ""): ("randint", ("high",)),
    ("aten::randint", "generator"): ("randint", ("high",)),
    ("aten::randint", "low"): ("randint", ("low", "high")),
    ("aten::randint", "low_generator"): ("randint", ("low", "high")),
    ("aten::randint_like", ""): ("randint", ("high",)),
    ("aten::randint_like", "generator"): ("randint", ("high",)),
    ("aten::randint_like", "low_dtype"): ("randint", ("low", "high")),
    ("aten::randint_like", "low_generator_dtype"): ("randint", ("low", "high")),
    ("aten::randn", ""): ("normal", ()),
    ("aten::randn", "generator"): ("normal", ()),
    ("aten::randn_like", ""): ("normal", ()),
    ("aten::randn_like", "generator"): ("normal", ()),
    ("aten::uniform", ""): ("uniform", ("from", "to")),
}


def table_text() -> str:
    """The table as analysis/ir/random_ops.cc's RandomOpsText() prints it."""
    lines = []
    for (name, overload), (kind, params) in sorted(TABLE.items()):
        target = f"{name}.{overload}" if overload else name
        lines.append(" ".join([target, kind, *params]))
    return "\n".join(lines) + "\n"


def _key(target) -> Optional[Tuple[str, str]]:
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    return schema.name, schema.overload_name


def is_random(target) -> bool:
    return _key(target) in TABLE


def threshold(p: float) -> int:
    """How many 24-bit draws fall below p * 2**24 (util: executor/random_ops.cc Threshold)."""
    if not p > 0:
        return 0
    if p >= 1:
        return 1 << 24
    return math.ceil(p * 16777216.0)


_BITS = {torch.float16: 11, torch.bfloat16: 8}


def _bind(target, args, kwargs) -> Dict[str, Any]:
    """The op's arguments by schema name (positional, keyword, then defaults)."""
    out: Dict[str, Any] = {}
    for i, a in enumerate(target._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def draw(target, args, kwargs, name: str, shape, dtype, seed: int, step: int):
    """The values node ``name`` (op ``target``, output ``dtype[shape]``) draws on one device."""
    kind, params = TABLE[_key(target)]
    a = _bind(target, args, kwargs)
    values = [a[p] for p in params]
    n = math.prod(shape)
    node = philox.node_id(name)
    k = 2 if kind == "normal" or (kind == "uniform" and dtype == torch.float64) else 1
    w = philox.words(seed, step, node, 0, n * k)
    if kind == "bernoulli":
        return ((w >> 8) < threshold(values[0])).reshape(shape).to(dtype)
    if kind == "bernoulli_probs":
        u = (w >> 8).double() * 2.0**-24
        return (u.reshape(shape) < values[0].double()).to(dtype)
    if kind == "dropout":
        x, p, train = values
        if train is False:
            return x.clone(), torch.ones_like(x, dtype=torch.bool)
        q = 1.0 - p
        mask = ((w >> 8) < threshold(q)).reshape(shape)
        return x.mul(mask).mul_(0.0 if q == 0 else 1.0 / q), mask
    if kind == "uniform":
        if k == 2:
            w2 = w.view(n, 2)
            u = ((w2[:, 0] >> 5).double() * 67108864.0 + (w2[:, 1] >> 6).double()) * 2.0**-53
        else:
            bits = _BITS.get(dtype, 24)
            u = (w >> (32 - bits)).double() * 2.0**-bits
        u = u.reshape(shape).to(dtype)
        return u.mul(values[1] - values[0]).add_(values[0]) if values else u
    if kind == "normal":
        w2 = w.view(n, 2)
        u1 = (w2[:, 0].double() + 1.0) * 2.0**-32
        u2 = w2[:, 1].double() * 2.0**-32
        z = (torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(6.283185307179586 * u2)).reshape(shape)
        z = z.to(dtype)
        return z.mul_(values[1]).add_(values[0]) if values else z
    if kind == "randint":
        low, high = (values[0], values[1]) if len(values) == 2 else (0, values[0])
        if not 1 <= high - low <= 2**32:
            raise ValueError(f"randint over [{low}, {high}): fxdp draws ranges of 1 to 2^32 values")
        return (low + w % (high - low)).reshape(shape).to(dtype)
    if kind == "exponential":
        u1 = (w.double() + 1.0) * 2.0**-32
        return (-torch.log(u1) / values[0]).reshape(shape).to(dtype)
    raise AssertionError(kind)


class RandomInterpreter(torch.fx.Interpreter):
    """Runs a traced step's GraphModule with its random ops drawn from fxdp's stream.

    ``outputs``: node name -> (shape, dtype) of output 0 (the GraphDef's metadata)."""

    def __init__(
        self, gm, outputs: Mapping[str, Tuple[Tuple[int, ...], torch.dtype]], seed: int, step: int
    ):
        super().__init__(gm)
        philox.check_key(seed, step)
        self.outputs, self.seed, self.step_number = outputs, seed, step

    def run_node(self, n):
        if n.op == "call_function" and is_random(n.target):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            name = n.meta.get("fxdp_name", n.name)  # the GraphDef's (and the workers') name
            shape, dtype = self.outputs[name]
            return draw(n.target, args, kwargs, name, shape, dtype, self.seed, self.step_number)
        return super().run_node(n)
