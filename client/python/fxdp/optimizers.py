"""Per-optimizer knowledge for tracing ``optimizer.step()``: one table, one entry per torch.optim class.

Hyper-parameters
----------------
``HYPERPARAMETER_KEYS`` lists the param-group entries that become HYPERPARAMETER placeholders
(0-d tensors fed per step) and the names of their scalar components: group ``g``'s ``lr`` is
``optim.group<g>.lr``, its ``betas`` are ``optim.group<g>.beta1`` and ``optim.group<g>.beta2``.
These are the values schedulers change (``LRScheduler`` subclasses change ``lr``;
``OneCycleLR``/``CyclicLR`` change ``momentum`` or ``betas[0]``; weight-decay schedules change
``weight_decay``). Every other group entry (``eps``, ``dampening``, ``nesterov``...) is a
trace-time constant.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Tuple

import torch

# group key -> names of its scalar components, in placeholder order
HYPERPARAMETER_KEYS: Dict[str, Tuple[str, ...]] = {
    "lr": ("lr",),
    "momentum": ("momentum",),
    "betas": ("beta1", "beta2"),
    "weight_decay": ("weight_decay",),
}


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
            raise ValueError(f"param group {group_index}: '{key}' has {len(vals)} entries, expected {len(comps)}")
        for c, x in zip(comps, vals):
            out[hyperparameter_name(group_index, c)] = _as_float(x)
    return out


def optimizer_hyperparameters(optimizer: torch.optim.Optimizer) -> "OrderedDict[str, float]":
    """Every param group's hyper-parameter values, by placeholder name (``optim.group0.lr``...)."""
    out: "OrderedDict[str, float]" = OrderedDict()
    for gi, g in enumerate(optimizer.param_groups):
        out.update(group_hyperparameters(gi, g))
    return out
