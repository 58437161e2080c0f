"""A step's state and PyTorch objects: :func:`load_into` puts a state (a job's ``TrainResult.state``,
``Client.fetch_state``, ``run_local``'s new state, ``initial_state()``) back into the user's model and
``torch.optim`` optimizer; :func:`state_of` takes a step's state from a model and optimizer (for a
step traced from a model on ``meta``, whose own state has no values).

A state is keyed by the names the tracer gives (:mod:`fxdp.tracer`): the model's parameters
(``named_parameters()``, so a tied weight appears once, under its first name: GPT-2's
``lm_head.weight`` is ``transformer.wte.weight``) and buffers, the optimizer state
``optim.<parameter>.<key>``, the hyper-parameters ``optim.group<g>.<component>`` and the graph's lifted
constants ``const.*`` (not PyTorch state: accepted and not loaded).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Mapping, Tuple

import torch
import torch.nn as nn

from . import optimizers as optim_table
from .errors import TraceError
from .step_signature import non_persistent_buffers

__all__ = ["load_into", "state_of"]

CONSTANT_PREFIX = "const."


def _fresh_state_keys(optimizer, group: dict, p: torch.Tensor, name: str) -> Tuple[str, ...]:
    """The state keys a step creates for ``p`` (from the optimizer table, on a meta tensor: no memory)."""
    spec = optim_table.spec_of(optimizer)
    existing = optimizer.state.get(p)
    if existing:
        return tuple(k for k in spec.state_keys if k in existing)
    try:
        return tuple(spec.state(torch.empty_like(p, device="meta"), group, name))
    except TraceError:  # SGD with dampening has no fresh state; a traced one had a momentum buffer
        return ("momentum_buffer",)


class _Targets:
    """Where each state name of ``model`` and ``optimizer`` goes."""

    def __init__(self, model: nn.Module, optimizer):
        self.params: "OrderedDict[str, torch.Tensor]" = OrderedDict(model.named_parameters())
        self.buffers: "OrderedDict[str, torch.Tensor]" = OrderedDict(model.named_buffers())
        # not in model.state_dict(): restored when the state has them, never missing
        self.non_persistent = set(non_persistent_buffers(model, list(self.buffers)))
        canonical = {id(p): n for n, p in self.params.items()}
        self.aliases = {
            n: canonical[id(p)]
            for n, p in model.named_parameters(remove_duplicate=False)
            if canonical[id(p)] != n
        }
        # optimizer state name -> (parameter, key, group)
        self.ostate: "OrderedDict[str, Tuple[torch.Tensor, str, dict]]" = OrderedDict()
        if optimizer is None:
            self.hyper: "OrderedDict[str, float]" = OrderedDict()
            return
        for gi, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                if id(p) not in canonical:
                    raise ValueError(
                        f"load_into: optimizer param group {gi} holds a tensor of shape "
                        f"{tuple(p.shape)} that is not a parameter of the model"
                    )
                if not p.requires_grad:
                    continue
                pn = canonical[id(p)]
                for k in _fresh_state_keys(optimizer, group, p, pn):
                    self.ostate[f"optim.{pn}.{k}"] = (p, k, group)
        self.hyper = optim_table.optimizer_hyperparameters(optimizer)

    def names(self) -> List[str]:
        return [*self.params, *self.buffers, *self.ostate, *self.hyper]


def _check_names(targets: _Targets, state: Mapping[str, torch.Tensor]) -> None:
    want = targets.names()
    want_set = set(want)
    missing = [n for n in want if n not in state and n not in targets.non_persistent]
    unexpected = [n for n in state if n not in want_set and not n.startswith(CONSTANT_PREFIX)]
    if not missing and not unexpected:
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing from the state: {', '.join(missing)}")
    if unexpected:
        told = [
            n
            + (
                f" (tied to '{targets.aliases[n]}', which the state holds once)"
                if n in targets.aliases
                else ""
            )
            for n in unexpected
        ]
        parts.append(
            f"{len(unexpected)} unexpected (not of this model and optimizer): {', '.join(told)}"
        )
    raise ValueError(
        "load_into: the state does not match the model and optimizer: " + "; ".join(parts)
    )


def _check_shapes(targets: _Targets, state: Mapping[str, torch.Tensor]) -> None:
    bad = []
    pairs = [(n, t) for n, t in targets.params.items()] + [
        (n, t) for n, t in targets.buffers.items()
    ]
    pairs += [(n, p) for n, (p, _, _) in targets.ostate.items()]
    for n, ref in pairs:
        if n not in state:  # a non-persistent buffer (_check_names)
            continue
        t = state[n]
        if not isinstance(t, torch.Tensor):
            bad.append(f"'{n}' is a {type(t).__name__}, not a tensor")
        elif n in targets.ostate and t.dim() == 0:
            continue  # a per-parameter scalar (step, NAdam's mu_product...)
        elif tuple(t.shape) != tuple(ref.shape):
            bad.append(f"'{n}' has shape {list(t.shape)}, the model's {list(ref.shape)}")
    if bad:
        raise ValueError(f"load_into: {len(bad)} state entries do not fit: " + "; ".join(bad))


def _state_tensor(
    t: torch.Tensor, p: torch.Tensor, key: str, group: dict, existing
) -> torch.Tensor:
    """``t`` on the device eager torch keeps this state entry on: an existing entry's, else the
    parameter's, except a 0-d entry of a non-capturable, non-fused group (on the CPU, as torch.optim
    creates its ``step``)."""
    if isinstance(existing, torch.Tensor):
        device = existing.device
    elif t.dim() == 0 and not (group.get("capturable") or group.get("fused")):
        device = torch.device("cpu")
    else:
        device = p.device
    return t.detach().to(device=device, copy=True)


def _as_fed(v) -> float:
    return float(torch.tensor(float(v), dtype=optim_table.HYPERPARAMETER_DTYPE))


def _set_hyperparameters(optimizer, state: Mapping[str, torch.Tensor]) -> None:
    for gi, group in enumerate(optimizer.param_groups):
        for key, comps in optim_table.HYPERPARAMETER_KEYS.items():
            names = [optim_table.hyperparameter_name(gi, c) for c in comps]
            if names[0] not in state:
                continue
            vals = [float(state[n]) for n in names]
            old = group[key]
            olds = list(old) if isinstance(old, (tuple, list)) else [old]
            new = []
            for o, v in zip(olds, vals):
                if isinstance(o, torch.Tensor):
                    o.fill_(v)
                    new.append(o)
                elif _as_fed(o) == v:
                    new.append(o)  # the group's own value, as the graph holds it
                else:
                    new.append(v)
            group[key] = type(old)(new) if isinstance(old, (tuple, list)) else new[0]


def load_into(model: nn.Module, optimizer, state: Mapping[str, torch.Tensor]) -> None:
    """Put ``state`` into ``model`` (parameters and buffers, copied in place: their devices, dtypes and
    ties stay) and ``optimizer`` (its per-parameter state and each group's hyper-parameters), so
    that the next eager step is the next fxdp step. ``optimizer`` may be None (the model only; the
    state's ``optim.*`` entries are then unexpected).

    Every name the model and optimizer need must be in ``state`` and every name in ``state`` must be
    theirs (``const.*`` aside); a non-persistent buffer (not in ``model.state_dict()``, e.g. a
    rotary ``inv_freq``) is restored when ``state`` holds it (a job's state does) and left as the
    model has it when it does not (as ``load_state_dict`` does); otherwise nothing is changed and a ValueError lists the missing and
    the unexpected names. A shape that differs is a ValueError naming both shapes.
    """
    targets = _Targets(model, optimizer)
    _check_names(targets, state)
    _check_shapes(targets, state)
    with torch.no_grad():
        for n, p in targets.params.items():
            p.copy_(state[n])
        for n, b in targets.buffers.items():
            if n in state:  # else a non-persistent buffer the state does not hold
                b.copy_(state[n])
        if optimizer is None:
            return
        new: Dict[torch.Tensor, "OrderedDict[str, torch.Tensor]"] = {}
        for n, (p, k, group) in targets.ostate.items():
            existing = optimizer.state.get(p, {}).get(k)
            new.setdefault(p, OrderedDict())[k] = _state_tensor(state[n], p, k, group, existing)
        for p, st in new.items():
            optimizer.state[p] = st
        _set_hyperparameters(optimizer, state)


def state_of(step, model: nn.Module, optimizer) -> "OrderedDict[str, torch.Tensor]":
    """The state ``step`` (a :class:`fxdp.TracedStep`) reads, from ``model`` and ``optimizer``: e.g.
    a step traced from a model built on ``meta`` and the same model built with weights. Parameters
    and buffers as they are (not copied), the optimizer's state (as its first step creates it where it
    has none), each group's hyper-parameters and the step's constants, in the step's order. A
    ValueError lists every name the step reads that they lack and every name they have that the
    step does not read.
    """
    pname_of = {id(p): n for n, p in model.named_parameters()}
    have: "OrderedDict[str, torch.Tensor]" = OrderedDict(
        (n, p.detach()) for n, p in model.named_parameters()
    )
    have.update(model.named_buffers())
    for pn, st in optim_table.initial_state(optimizer, pname_of).items():
        have.update((f"optim.{pn}.{k}", t) for k, t in st.items())
    have.update(optim_table.hyperparameter_tensors(optimizer, "cpu"))
    have.update((n, t) for n, t in (step._state or {}).items() if n.startswith(CONSTANT_PREFIX))
    want = step.state_names()
    missing = [n for n in want if n not in have]
    extra = [n for n in have if n not in set(want)]
    if missing or extra:
        raise ValueError(
            f"state_of: the model and optimizer do not give the step's state: {len(missing)} "
            f"missing ({', '.join(missing)}), {len(extra)} not read by the step ({', '.join(extra)})"
        )
    return OrderedDict((n, have[n]) for n in want)
