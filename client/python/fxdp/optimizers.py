"""Per-optimizer knowledge for tracing ``optimizer.step()``: one table, one entry per torch.optim class.

fxdp does not re-implement any optimizer: the user's own ``torch.optim`` object runs inside the
trace, re-pointed at the traced parameters, state tensors and hyper-parameter tensors
(:class:`BoundOptimizer`). What the tracer needs to know per class is in ``OPTIMIZERS``:

* ``state``: how a parameter's state looks before its first step, so one graph serves step 1
  and step k (the steady-state update applied to this state *is* step 1). For every class but SGD
  this is exactly what torch creates lazily (zeros, ``step = 0``, NAdam's ``mu_product = 1``,
  ASGD's ``eta = lr``, Rprop's ``step_size = lr``, Adagrad's ``initial_accumulator_value``). SGD
  creates its momentum buffer as ``grad.clone()`` on step 1; with ``dampening == 0``,
  ``0 * momentum + grad`` equals that bit for bit, otherwise a fresh SGD is refused.
* ``capturable``: the class has torch's ``capturable`` code path (the step counter stays a tensor,
  no ``.item()``); it is switched on for the trace. With ``torch.compiler.is_compiling()``
  reporting True during ``step()``, every class takes its compile-friendly path (tensor ``lr``,
  ``_get_value`` keeping tensors), so no step-dependent number is baked into the graph.
  Adam/AdamW's single-tensor groups are the exception (``capturable_single_tensor=False``): their
  capturable path divides by ``lr`` (``exp_avg_sq.sqrt() / (bias_correction2_sqrt * -step_size)``),
  which is 0/0 = NaN at ``lr = 0`` (a warmup's first step) wherever ``exp_avg_sq`` is 0; the default
  path multiplies by ``lr``, as eager does. Their foreach path needs capturable for a tensor ``lr``
  and is finite at ``lr = 0``. Adamax's and NAdam's single-tensor groups keep the default path too
  (finite at ``lr = 0``): it is eager's on the CPU, operation for operation
  (:mod:`fxdp.hyperparameter_mode`, "Exactness").

Hyper-parameters
----------------
``HYPERPARAMETER_KEYS`` lists the param-group entries that become HYPERPARAMETER placeholders
(0-d float64 tensors on the parameters' device, fed per step) and the names of their scalar
components: group ``g``'s ``lr`` is ``optim.group<g>.lr``, its ``betas`` are
``optim.group<g>.beta1``/``beta2``. These are what schedulers change (``LRScheduler`` subclasses
change ``lr``; ``OneCycleLR``/``CyclicLR`` change ``momentum`` or ``betas[0]``; weight-decay
schedules change ``weight_decay``). Every other group entry (``eps``, ``dampening``,
``alpha``...) is a trace-time constant.

The tracer runs ``step()`` under :class:`fxdp.hyperparameter_mode.HyperparameterMode`, which lets
torch.optim's code written for Python numbers run on these tensors and compute what eager computes
(its module docstring: guards, exactness).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Sequence, Tuple

import torch

from .errors import TraceError

O = torch.optim

# group key -> names of its scalar components, in placeholder order
HYPERPARAMETER_KEYS: Dict[str, Tuple[str, ...]] = {
    "lr": ("lr",),
    "momentum": ("momentum",),
    "betas": ("beta1", "beta2"),
    "weight_decay": ("weight_decay",),
}

HYPERPARAMETER_DTYPE = torch.float64


def hyperparameter_name(group_index: int, component: str) -> str:
    return f"optim.group{group_index}.{component}"


def _as_float(v) -> float:
    if isinstance(v, torch.Tensor):
        return float(v.detach().reshape(()).item())
    return float(v)


def group_hyperparameters(group_index: int, group: dict) -> "OrderedDict[str, float]":
    """The current values of one param group's hyper-parameters, by placeholder name."""
    out: "OrderedDict[str, float]" = OrderedDict()
    for key, comps in HYPERPARAMETER_KEYS.items():
        v = group.get(key)
        if v is None or isinstance(v, bool):
            continue
        vals = tuple(v) if isinstance(v, (tuple, list)) else (v,)
        if len(vals) != len(comps):
            raise ValueError(
                f"param group {group_index}: '{key}' has {len(vals)} entries, expected {len(comps)}"
            )
        for c, x in zip(comps, vals):
            out[hyperparameter_name(group_index, c)] = _as_float(x)
    return out


def optimizer_hyperparameters(optimizer: torch.optim.Optimizer) -> "OrderedDict[str, float]":
    """Every param group's hyper-parameter values, by placeholder name (``optim.group0.lr``...)."""
    out: "OrderedDict[str, float]" = OrderedDict()
    for gi, g in enumerate(optimizer.param_groups):
        out.update(group_hyperparameters(gi, g))
    return out


# --------------------------------------------------------------------------- the table


def _scalar(v, p):
    from torch.optim.optimizer import _get_scalar_dtype

    return torch.full((), _as_float(v), dtype=_get_scalar_dtype(), device=p.device)


def _zeros(p):
    return torch.zeros_like(p, memory_format=torch.preserve_format)


def _sgd_state(p, g, name):
    if g["momentum"] == 0:
        return {}
    if g["dampening"] != 0:
        raise TraceError(
            f"SGD with momentum and dampening={g['dampening']} has no momentum_buffer yet for parameter "
            f"'{name}': torch creates it as grad.clone() on the first step, which a steady-state graph cannot "
            "reproduce when dampening != 0. Take one eager optimizer step before tracing (existing state is "
            "traced as it is)."
        )
    return {"momentum_buffer": _zeros(p)}


def _adam_state(p, g, name):
    st = {"step": _scalar(0, p), "exp_avg": _zeros(p), "exp_avg_sq": _zeros(p)}
    if g["amsgrad"]:
        st["max_exp_avg_sq"] = _zeros(p)
    return st


def _rmsprop_state(p, g, name):
    st = {"step": _scalar(0, p), "square_avg": _zeros(p)}
    if g["momentum"] > 0:
        st["momentum_buffer"] = _zeros(p)
    if g["centered"]:
        st["grad_avg"] = _zeros(p)
    return st


def _adagrad_state(p, g, name):
    iav = g["initial_accumulator_value"]
    return {
        "step": _scalar(0, p),
        "sum": torch.full_like(p, iav, memory_format=torch.preserve_format),
    }


@dataclass(frozen=True)
class OptimizerSpec:
    state: Callable[
        [torch.Tensor, dict, str], Dict[str, torch.Tensor]
    ]  # fresh state of one parameter
    state_keys: Tuple[str, ...]  # every key its state may hold
    capturable: bool  # has torch's capturable path (switched on while tracing)
    capturable_single_tensor: bool = (
        True  # False: single-tensor groups keep the default path (module doc)
    )


OPTIMIZERS: Dict[type, OptimizerSpec] = {
    O.SGD: OptimizerSpec(_sgd_state, ("momentum_buffer",), False),
    O.Adam: OptimizerSpec(
        _adam_state, ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), True, False
    ),
    O.AdamW: OptimizerSpec(
        _adam_state, ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), True, False
    ),
    O.RMSprop: OptimizerSpec(
        _rmsprop_state, ("step", "square_avg", "momentum_buffer", "grad_avg"), True
    ),
    O.Adagrad: OptimizerSpec(_adagrad_state, ("step", "sum"), False),
    O.Adadelta: OptimizerSpec(
        lambda p, g, n: {"step": _scalar(0, p), "square_avg": _zeros(p), "acc_delta": _zeros(p)},
        ("step", "square_avg", "acc_delta"),
        True,
    ),
    O.Adamax: OptimizerSpec(
        lambda p, g, n: {"step": _scalar(0, p), "exp_avg": _zeros(p), "exp_inf": _zeros(p)},
        ("step", "exp_avg", "exp_inf"),
        True,
        False,
    ),
    O.NAdam: OptimizerSpec(
        lambda p, g, n: {
            "step": _scalar(0, p),
            "mu_product": _scalar(1, p),
            "exp_avg": _zeros(p),
            "exp_avg_sq": _zeros(p),
        },
        ("step", "mu_product", "exp_avg", "exp_avg_sq"),
        True,
        False,
    ),
    O.RAdam: OptimizerSpec(
        lambda p, g, n: {"step": _scalar(0, p), "exp_avg": _zeros(p), "exp_avg_sq": _zeros(p)},
        ("step", "exp_avg", "exp_avg_sq"),
        True,
    ),
    O.ASGD: OptimizerSpec(
        lambda p, g, n: {
            "step": _scalar(0, p),
            "eta": _scalar(g["lr"], p),
            "mu": _scalar(1, p),
            "ax": _zeros(p),
        },
        ("step", "eta", "mu", "ax"),
        True,
    ),
    O.Rprop: OptimizerSpec(
        lambda p, g, n: {
            "step": _scalar(0, p),
            "prev": _zeros(p),
            "step_size": torch.full_like(
                p, _as_float(g["lr"]), memory_format=torch.preserve_format
            ),
        },
        ("step", "prev", "step_size"),
        True,
    ),
}

SUPPORTED_OPTIMIZERS = tuple(OPTIMIZERS)


def spec_of(optimizer) -> OptimizerSpec:
    spec = OPTIMIZERS.get(type(optimizer))
    if spec is None:
        extra = ""
        if isinstance(optimizer, O.LBFGS):
            extra = (
                " (LBFGS re-evaluates a closure a data-dependent number of times: no single graph)"
            )
        raise TraceError(
            f"unsupported optimizer {type(optimizer).__module__}.{type(optimizer).__name__}{extra}: fxdp traces "
            + ", ".join(f"torch.optim.{c.__name__}" for c in OPTIMIZERS)
        )
    return spec


def check_options(optimizer) -> None:
    for i, group in enumerate(optimizer.param_groups):
        if group.get("fused"):
            raise TraceError(
                f"optimizer param group {i}: fused=True is not supported; use foreach or single-tensor"
            )
        if group.get("differentiable"):
            raise TraceError(f"optimizer param group {i}: differentiable=True is not supported")
        for k, v in group.items():
            if k == "params" or k in HYPERPARAMETER_KEYS or k not in optimizer.defaults:
                continue  # scheduler bookkeeping (initial_lr, max_lr...) is not read by step()
            vals = v if isinstance(v, (tuple, list)) else (v,)
            if any(isinstance(x, torch.Tensor) for x in vals):
                raise TraceError(
                    f"optimizer param group {i}: tensor hyper-parameter '{k}' is not supported (tensors are "
                    f"accepted for {', '.join(HYPERPARAMETER_KEYS)})"
                )


def resolve_foreach(optimizer, params_of_group) -> List[bool]:
    """``foreach=None`` resolved the way eager resolves it for these tensors."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    out = []
    for group, ps in zip(optimizer.param_groups, params_of_group):
        fe = group.get("foreach")
        if fe is None:
            _, fe = _default_to_fused_or_foreach(
                ps, group.get("differentiable", False), use_fused=False
            )
        out.append(bool(fe))
    return out


def initial_state(
    optimizer, pname_of: Mapping[int, str]
) -> "OrderedDict[str, OrderedDict[str, torch.Tensor]]":
    """Per trained parameter name: the state tensors the traced step reads (existing or fresh)."""
    from torch.optim.optimizer import _get_scalar_dtype

    spec = spec_of(optimizer)
    out: "OrderedDict[str, OrderedDict[str, torch.Tensor]]" = OrderedDict()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not p.requires_grad:
                continue
            name = pname_of[id(p)]
            existing = optimizer.state.get(p, {})
            for k in existing:
                if k not in spec.state_keys:
                    raise TraceError(
                        f"unexpected {type(optimizer).__name__} state '{k}' for parameter '{name}'"
                    )
            if existing:
                st = OrderedDict()
                for k in spec.state_keys:
                    if k not in existing:
                        continue
                    v = existing[k]
                    if not isinstance(v, torch.Tensor) or v.dim() == 0:
                        v = torch.as_tensor(v, dtype=_get_scalar_dtype()).to(p.device)
                    st[k] = v.detach().clone()
            else:
                st = OrderedDict((k, v) for k, v in spec.state(p, group, name).items())
            if st:
                out[name] = st
    return out


def hyperparameter_tensors(optimizer, device) -> "OrderedDict[str, torch.Tensor]":
    """Each group's hyper-parameters as 0-d float64 tensors (trace-time values), by placeholder name."""
    return OrderedDict(
        (n, torch.full((), v, dtype=HYPERPARAMETER_DTYPE, device=device))
        for n, v in optimizer_hyperparameters(optimizer).items()
    )


class BoundOptimizer:
    """The user's optimizer re-pointed, for the duration of a trace, at traced tensors.

    Parameters become the traced leaves, state the traced state tensors, each hyper-parameter its
    placeholder tensor; ``foreach`` is resolved and ``capturable`` switched on. Everything is put
    back on exit.
    """

    def __init__(
        self,
        optimizer,
        leaves: Mapping[str, torch.Tensor],
        pname_of: Mapping[int, str],
        state: Mapping[str, Mapping[str, torch.Tensor]],
        hyper: Mapping[str, torch.Tensor],
        foreach: Sequence[bool],
    ):
        self.opt = optimizer
        self.spec = spec_of(optimizer)
        self.leaves, self.pname_of, self.state, self.hyper, self.foreach = (
            leaves,
            pname_of,
            state,
            hyper,
            foreach,
        )

    def __enter__(self):
        opt = self.opt
        self.saved_groups = [dict(g) for g in opt.param_groups]
        self.saved_state = opt.state
        new_state = defaultdict(dict)
        for gi, group in enumerate(opt.param_groups):
            group["params"] = [self.leaves[self.pname_of[id(p)]] for p in group["params"]]
            group["foreach"] = self.foreach[gi]
            if self.spec.capturable and (self.foreach[gi] or self.spec.capturable_single_tensor):
                group["capturable"] = True
            for key, comps in HYPERPARAMETER_KEYS.items():
                names = [hyperparameter_name(gi, c) for c in comps]
                if names[0] in self.hyper:
                    ts = [self.hyper[n] for n in names]
                    group[key] = tuple(ts) if len(ts) > 1 else ts[0]
        for pn, st in self.state.items():
            new_state[self.leaves[pn]] = dict(st)
        opt.state = new_state
        return self

    def final_state(self, pn: str, key: str) -> torch.Tensor:
        return self.opt.state[self.leaves[pn]][key]

    def __exit__(self, *exc):
        for group, saved in zip(self.opt.param_groups, self.saved_groups):
            group.clear()
            group.update(saved)
        self.opt.state = self.saved_state
        return False
