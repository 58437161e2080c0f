"""Tracing torch.optim code written for Python-number hyper-parameters on hyper-parameter tensors.

torch.optim code was written for Python-number hyper-parameters in places (``alpha=lr`` in
``add_``, ``value=1 - beta2`` in ``addcmul_``, ``if weight_decay != 0:``).
:class:`HyperparameterMode` (a TorchFunctionMode active during ``step()``) rewrites the first
kind into the tensor form, and answers the second from the trace-time value:
such a comparison fixes the graph's structure, so it is recorded as a *guard*
(``optim.group0.weight_decay != 0``) that every fed value must keep (checked by
:mod:`fxdp.schedule` and ``run_local``).

Exactness: the step computes what eager computes. Eager's non-capturable single-tensor code computes
``1 - lr * weight_decay``, ``1 - beta1``, ``lr / (1 - beta1 ** step)``, ``(1 - beta2 ** step) ** 0.5``
in Python doubles (``step`` = ``step_t.item()``) and hands the result to a float32 kernel, which
rounds it once. So the hyper-parameters are float64 and the mode keeps every 0-d tensor computed
from them (its *scalars*) float64; an out-of-place op of numbers and 0-d tensors reading a
``SCALAR_STATE_KEYS`` entry (``step``, NAdam's ``mu_product``; eager: ``_get_value(t)``, that is
``t.item()``) reads it as float64 (exact) and gives a scalar. ``Tensor.to(dtype=...)`` of a scalar
keeps the dtype (Adam's ``beta1.to(param.dtype)`` before ``1 - beta1``), ``scalar ** 0.5`` is
``pow`` as Python's (not torch's ``sqrt``, 1 ulp apart in double), ``lerp``'s weight is rounded to
``self``'s dtype, a binary op on a float32 tensor rounds the scalar as the kernel rounds a Python
number, and so does one on a 0-d tensor (a 0-d parameter's update, ``mu_product *= mu``), where
type promotion would otherwise give float64: the scalar is rounded to the tensor's dtype first.
A scalar in a Scalar slot: ``add(a, b, alpha=t)`` becomes ``addcmul(a, b, t)`` (eager's
``a + alpha * b`` is one fused multiply-add, as addcmul's ``a + b * t``; ``sub``: ``-t``),
``addcmul``/``addcdiv``'s ``value=t`` multiplies ``tensor1`` (``self + (value * t1) * t2``, the
same products). With this a
single-tensor SGD, Adam, AdamW, Adamax, NAdam, RAdam, RMSprop, Adagrad or Rprop step on the CPU
equals eager's bit for bit (tests/python/test_optimizer_bits.py). Agreeing to rounding only:
foreach groups (the capturable path: other operations than eager's non-capturable foreach code;
on the CPU eager's foreach equals its single-tensor code for SGD, Adam, AdamW, Adamax), ASGD
(capturable path: its default one reads values with ``.item()``), and parameters in bf16/fp16
(eager's kernels take a number in float32, the trace rounds ``lerp``'s weight and the
``value=``/``alpha=`` products to the parameter's dtype).
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from typing import Dict, Mapping, Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode

from .errors import TraceError

# state entries torch.optim keeps as one 0-d tensor per parameter and reads with _get_value (eager:
# .item(), a double): the step counter, NAdam's mu_product, ASGD's eta and mu
SCALAR_STATE_KEYS = ("step", "mu_product", "eta", "mu")

_COMPARE = {
    "__eq__": operator.eq,
    "eq": operator.eq,
    "__ne__": operator.ne,
    "ne": operator.ne,
    "__lt__": operator.lt,
    "lt": operator.lt,
    "__le__": operator.le,
    "le": operator.le,
    "__gt__": operator.gt,
    "gt": operator.gt,
    "__ge__": operator.ge,
    "ge": operator.ge,
}
_SYMBOL = {
    operator.eq: "==",
    operator.ne: "!=",
    operator.lt: "<",
    operator.le: "<=",
    operator.gt: ">",
    operator.ge: ">=",
}
_FLIP = {
    operator.lt: operator.gt,
    operator.le: operator.ge,
    operator.gt: operator.lt,
    operator.ge: operator.le,
    operator.eq: operator.eq,
    operator.ne: operator.ne,
}
# per-tensor ops whose Scalar argument (alpha= / value=) torch.optim fills with a hyper-parameter:
# the tensor form scales the argument it multiplies (position 1) instead
_SCALED_BY = {
    "add": "alpha",
    "add_": "alpha",
    "sub": "alpha",
    "sub_": "alpha",
    "addcmul": "value",
    "addcmul_": "value",
    "addcdiv": "value",
    "addcdiv_": "value",
}
# foreach ops whose Tensor overload the Python binding picks for a 0-d tensor (for _foreach_add it picks
# the Scalar overload and calls .item())
_FOREACH_TENSOR_OK = {"_foreach_mul", "_foreach_mul_", "_foreach_div", "_foreach_div_"}
# the arithmetic torch.optim does on what _get_value returns (out-of-place: not `step_t += 1`)
_ARITHMETIC = {
    *("add", "sub", "rsub", "mul", "div", "true_divide", "pow", "neg"),
    *("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__"),
    *("__truediv__", "__rtruediv__", "__pow__", "__rpow__", "__neg__"),
}
# Tensor.pow with a Python exponent: on a float64 scalar it is computed as Python computes it
_POW = {"__pow__", "pow"}
# ops that take a 0-d weight of self's dtype only: a float64 scalar is rounded to it there
_WEIGHT_OF_SELF_DTYPE = {"lerp", "lerp_"}


def func_of(fname: str):
    return getattr(torch.Tensor, fname)


def _is_scalar_tensor(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dim() == 0


def _as_number(s: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Scalar ``s`` as an op on ``like`` takes a Python number: a 0-d ``like`` keeps its dtype (type
    promotion ignores a number), so ``s`` is rounded to it; a kernel on a larger one rounds ``s``
    itself."""
    return s.to(like.dtype) if like.dim() == 0 and like.dtype != s.dtype else s


def _single(op: str, args: list, kwargs: dict):
    """Call the per-tensor op ``op``, moving a tensor alpha=/value= onto the argument it scales."""
    key = _SCALED_BY.get(op)
    n_pos = 3 if op.startswith("addc") else 2
    if key is not None and len(args) > n_pos:  # foreach ops take alpha/value positionally
        kwargs = {**kwargs, key: args[n_pos]}
        args = list(args[:n_pos])
    if key is not None and _is_scalar_tensor(kwargs.get(key)):
        kwargs = dict(kwargs)
        s = _as_number(kwargs.pop(key), args[0])
        args = list(args)
        if (
            key == "alpha"
        ):  # eager's a + alpha * b is one fused multiply-add, as addcmul's a + b * t
            name = "addcmul_" if op.endswith("_") else "addcmul"
            return getattr(torch.Tensor, name)(
                args[0], args[1], -s if op.startswith("sub") else s, **kwargs
            )
        args[1] = args[1] * s
    return getattr(torch.Tensor, op)(*args, **kwargs)


def _needs_rewrite(fname: str, args, kwargs) -> bool:
    if fname in _SCALED_BY:
        return _is_scalar_tensor(kwargs.get(_SCALED_BY[fname]))
    if not fname.startswith("_foreach_"):
        return False
    scalars = [a for a in list(args) + list(kwargs.values()) if _is_scalar_tensor(a)]
    if not scalars:
        return False
    return fname not in _FOREACH_TENSOR_OK


def _unrolled(fname: str, args, kwargs):
    """A foreach op with a 0-d tensor in a Scalar slot, as one per-tensor op per list element."""
    op = fname[len("_foreach_") :]
    n = next(len(a) for a in args if isinstance(a, (list, tuple)))
    pick = lambda v, i: v[i] if isinstance(v, (list, tuple)) else v  # noqa: E731
    outs = [
        _single(op, [pick(a, i) for a in args], {k: pick(v, i) for k, v in kwargs.items()})
        for i in range(n)
    ]
    return None if op.endswith("_") else outs


def _to_keeping_dtype(args, kwargs):
    """``Tensor.to(...)`` of a scalar without its dtype change (a device move stays)."""
    rest = [a.device if isinstance(a, torch.Tensor) else a for a in args[1:]]
    rest = [a for a in rest if not isinstance(a, torch.dtype)]
    return args[0].to(*rest, **{k: v for k, v in kwargs.items() if k != "dtype"})


class HyperparameterMode(TorchFunctionMode):
    """Lets torch.optim code written for Python numbers run on hyper-parameter tensors (see module doc)."""

    def __init__(
        self,
        tensors: Mapping[str, torch.Tensor],
        values: Mapping[str, float],
        state_scalars: Sequence[torch.Tensor] = (),
    ):
        super().__init__()
        self.name_of = {id(t): n for n, t in tensors.items()}
        # 0-d optimizer state (step, mu_product...): eager reads them as t.item(), a double
        self.state_scalars = {id(t): t for t in state_scalars}
        self.values = dict(values)
        self.guards: "OrderedDict[str, bool]" = OrderedDict()
        # the hyper-parameters and the 0-d tensors computed from them (kept alive: ids stay unique)
        self.scalars: Dict[int, torch.Tensor] = {id(t): t for t in tensors.values()}

    def _hyper(self, x) -> Optional[str]:
        return self.name_of.get(id(x)) if isinstance(x, torch.Tensor) else None

    def _is_scalar(self, x) -> bool:
        return isinstance(x, torch.Tensor) and self.scalars.get(id(x)) is x

    def _is_state(self, x) -> bool:
        return isinstance(x, torch.Tensor) and self.state_scalars.get(id(x)) is x

    def _reads_state(self, fname: str, args, kwargs) -> bool:
        """Arithmetic of 0-d tensors and numbers reading a 0-d state entry."""
        if fname not in _ARITHMETIC:
            return False
        vals = list(args) + list(kwargs.values())
        if any(
            isinstance(a, (list, tuple)) or (isinstance(a, torch.Tensor) and a.dim()) for a in vals
        ):
            return False
        return any(self._is_state(a) for a in vals)

    def _scalar_math(self, func, fname: str, args, kwargs):
        """The float64 forms of what torch.optim computes on a scalar (module doc), or None."""
        if self._reads_state(fname, args, kwargs):
            up = lambda a: a.double() if self._is_state(a) else a  # noqa: E731 (exact)
            return func(*map(up, args), **{k: up(v) for k, v in kwargs.items()})
        if fname == "to" and self._is_scalar(args[0]):
            return _to_keeping_dtype(args, kwargs)
        if fname in _POW and len(args) == 2 and self._is_scalar(args[0]):
            if isinstance(args[1], float):  # Python's x ** 0.5 is pow(), not torch's sqrt()
                return torch.pow(args[0], torch.full_like(args[0], args[1]))
        if fname in _WEIGHT_OF_SELF_DTYPE and len(args) == 3 and self._is_scalar(args[2]):
            return func_of(fname)(args[0], args[1], args[2].to(args[0].dtype), **kwargs)
        vals = list(args) + list(kwargs.values())
        plain = [a for a in vals if isinstance(a, torch.Tensor) and not self._is_scalar(a)]
        if (
            not fname.startswith("_foreach_")
            and not _needs_rewrite(fname, args, kwargs)
            and plain
            and plain[0].dim() == 0
            and any(self._is_scalar(a) and a.dtype != plain[0].dtype for a in vals)
        ):  # a 0-d tensor with a number: the number is rounded to the tensor's dtype
            down = lambda a: _as_number(a, plain[0]) if self._is_scalar(a) else a  # noqa: E731
            return func(*map(down, args), **{k: down(v) for k, v in kwargs.items()})
        return None

    def _tracked(self, out, args, kwargs):
        """``out`` recorded as a scalar when computed from scalars or state scalars (float64: a
        0-d tensor an in-place op or a number rounded to its dtype returns is not one)."""
        if (
            _is_scalar_tensor(out)
            and out.dtype == torch.float64
            and not self._is_state(out)
            and not (args and out is args[0] and not self._is_scalar(out))
            and any(
                self._is_scalar(a) or self._is_state(a) for a in list(args) + list(kwargs.values())
            )
        ):
            self.scalars[id(out)] = out
        return out

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        fname = getattr(func, "__name__", "")
        if fname in _COMPARE and len(args) == 2:
            a, b = args
            op = _COMPARE[fname]
            if self._hyper(a) and isinstance(b, (int, float)) and not isinstance(b, bool):
                return self._guard(self._hyper(a), op, b)
            if self._hyper(b) and isinstance(a, (int, float)) and not isinstance(a, bool):
                return self._guard(self._hyper(b), _FLIP[op], a)
        if fname == "__bool__" and args and self._hyper(args[0]):
            return self._guard(self._hyper(args[0]), operator.ne, 0)
        if fname in ("__float__", "__int__", "item") and args and self._hyper(args[0]):
            raise TraceError(
                f"the optimizer uses hyper-parameter '{self._hyper(args[0])}' as a Python number ({fname}): it "
                "would be a constant of the graph"
            )
        if args:
            out = self._scalar_math(func, fname, args, kwargs)
            if out is not None:
                return self._tracked(out, args, kwargs)
        if _needs_rewrite(fname, args, kwargs):
            if fname.startswith("_foreach_"):
                return _unrolled(fname, args, kwargs)
            return _single(fname, list(args), kwargs)
        return self._tracked(func(*args, **kwargs), args, kwargs)

    def _guard(self, name: str, op, other) -> bool:
        res = bool(op(self.values[name], other))
        key = f"{name} {_SYMBOL[op]} {other!r}"
        self.guards[key] = res
        return res


def check_guards(guards: Mapping[str, bool], values: Mapping[str, float], where: str = "") -> None:
    """Raise ValueError when a fed value flips a comparison the graph's structure depends on."""
    for expr, expected in guards.items():
        name, sym, other = expr.split(" ", 2)
        if name not in values:
            continue
        op = next(o for o, s in _SYMBOL.items() if s == sym)
        if bool(op(float(values[name]), float(other))) != expected:
            raise ValueError(
                f"{where}{name} = {values[name]} makes '{expr}' {not expected}: the graph was traced with it "
                f"{expected} (torch.optim takes a different code path); trace with a value on the same side"
            )
