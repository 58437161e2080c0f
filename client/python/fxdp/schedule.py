"""Per-step hyper-parameter values for a traced step (learning-rate schedules and the like).

A traced step takes each optimizer hyper-parameter that a schedule may change (``lr``,
``momentum``, ``betas``, ``weight_decay``... see :data:`fxdp.optimizers.HYPERPARAMETER_KEYS`) as a
HYPERPARAMETER placeholder: a 0-d float64 tensor (on the parameters' device) named ``optim.group<g>.<key>`` (``optim.group0.lr``,
``optim.group0.beta1``) whose trace-time value is in ``TracedStep.initial_state()``. One graph
serves every step; a schedule only changes what is fed.

A *schedule* is one of:

* ``None``: constant; every placeholder keeps the value in the state;
* a ``torch.optim.lr_scheduler.LRScheduler``: step 1 uses its optimizer's current
  ``param_groups``, and ``scheduler.step()`` is called after each step, exactly as an eager loop
  ``for ...: train_step(); scheduler.step()`` does. The scheduler and its optimizer are restored
  afterwards (their ``state_dict`` and group values), so computing values has no side effect;
* a callable ``step (1-based int) -> dict``;
* a list of dicts, one per step (at least ``steps`` of them).

The values of one step form a dict ``{name: float}``; a name left out keeps the value it has in the
state. ``save_schedule`` writes the file form read by ``fxdp-worker run --schedule FILE`` and
``fxdp run --schedule FILE``: a JSON object mapping each name to its list of per-step values,
``{"optim.group0.lr": [v_step1, v_step2, ...], ...}`` (every list as long as the run).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Sequence, Union

from .hyperparameter_mode import check_guards
from .optimizers import optimizer_hyperparameters
from .v1 import graph_pb2 as pb

__all__ = [
    "hyperparameter_names",
    "hyperparameter_guards",
    "schedule_values",
    "save_schedule",
    "load_schedule",
]

Values = Dict[str, float]


def _graph_of(traced_or_graphdef: Any) -> "pb.GraphDef":
    g = getattr(traced_or_graphdef, "graph", traced_or_graphdef)
    if not isinstance(g, pb.GraphDef):
        raise TypeError(
            f"expected a TracedStep or fxdp.v1.GraphDef, got {type(traced_or_graphdef).__name__}"
        )
    return g


def hyperparameter_names(traced_or_graphdef: Any) -> List[str]:
    """Names of the HYPERPARAMETER placeholders of a TracedStep or GraphDef, in graph order."""
    g = _graph_of(traced_or_graphdef)
    return [
        n.placeholder.state_name
        for n in g.nodes
        if n.kind == pb.PLACEHOLDER and n.placeholder.role == pb.HYPERPARAMETER
    ]


def hyperparameter_guards(traced_or_graphdef: Any) -> Dict[str, bool]:
    """The comparisons on hyper-parameters that fixed the graph's structure when it was traced
    (``{"optim.group0.weight_decay != 0": True}``): a fed value must keep each one's outcome."""
    g = _graph_of(traced_or_graphdef)
    meta = {kv.key: kv.value for kv in g.metadata}
    return json.loads(meta.get("hyperparameter_guards", "{}"))


def _check_values(step: int, values: Any, known: Sequence[str]) -> Values:
    if not isinstance(values, Mapping):
        raise TypeError(
            f"schedule step {step}: expected a dict of hyper-parameter values, got {type(values).__name__}"
        )
    known_set = set(known)
    out: Values = OrderedDict()
    for k, v in values.items():
        if k not in known_set:
            raise ValueError(
                f"schedule step {step}: '{k}' is not a hyper-parameter of the graph (it has {list(known)})"
            )
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise TypeError(
                f"schedule step {step}: value of '{k}' is a {type(v).__name__}, not a number"
            ) from None
        if not math.isfinite(f):
            raise ValueError(f"schedule step {step}: value of '{k}' is {f}")
        out[k] = f
    return out


def _scheduler_values(scheduler: Any, steps: int, names: Sequence[str]) -> List[Values]:
    from torch.optim.lr_scheduler import ReduceLROnPlateau

    if isinstance(scheduler, ReduceLROnPlateau):
        raise TypeError(
            "ReduceLROnPlateau depends on a metric measured during training; pass the values per step"
        )
    opt = scheduler.optimizer
    saved_sched = scheduler.state_dict()
    saved_groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    out: List[Values] = []
    try:
        for i in range(1, steps + 1):
            now = optimizer_hyperparameters(opt)
            missing = [n for n in names if n not in now]
            if missing:
                raise ValueError(f"the scheduler's optimizer has no hyper-parameters {missing}")
            out.append(_check_values(i, {n: now[n] for n in names}, names))
            if i < steps:
                with warnings.catch_warnings():
                    # the scheduler warns that it steps before its optimizer: here nothing trains
                    warnings.filterwarnings(
                        "ignore", message="Detected call of `lr_scheduler.step\\(\\)`"
                    )
                    scheduler.step()
    finally:
        scheduler.load_state_dict(saved_sched)
        for g, saved in zip(opt.param_groups, saved_groups):
            g.update(saved)
    return out


def schedule_values(schedule: Any, steps: int, names: Union[Sequence[str], Any]) -> List[Values]:
    """The hyper-parameter values of steps 1..``steps`` (see the module docstring).

    ``names`` are the graph's hyper-parameter names (``hyperparameter_names(step)``), or the
    TracedStep / GraphDef itself; then each step's values are also checked against the graph's
    :func:`hyperparameter_guards` (ValueError naming the step and the comparison).
    """
    guards: Dict[str, bool] = {}
    if not isinstance(names, (list, tuple)):
        guards = hyperparameter_guards(names)
        names = hyperparameter_names(names)
    names = list(names)
    out = _values(schedule, steps, names)
    for i, v in enumerate(out):
        check_guards(guards, v, where=f"schedule step {i + 1}: ")
    return out


def _values(schedule: Any, steps: int, names: List[str]) -> List[Values]:
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    if schedule is None:
        return [OrderedDict() for _ in range(steps)]
    from torch.optim.lr_scheduler import LRScheduler

    if isinstance(schedule, LRScheduler):
        return _scheduler_values(schedule, steps, names)
    if isinstance(schedule, (list, tuple)):
        if len(schedule) < steps:
            raise ValueError(f"the schedule lists {len(schedule)} steps, the run has {steps}")
        return [_check_values(i + 1, v, names) for i, v in enumerate(schedule[:steps])]
    if callable(schedule):
        return [_check_values(i, schedule(i), names) for i in range(1, steps + 1)]
    raise TypeError(
        f"schedule must be None, a torch.optim.lr_scheduler.LRScheduler, a callable step -> dict or a list "
        f"of dicts, got {type(schedule).__name__}"
    )


def save_schedule(path: Union[str, os.PathLike], values: Sequence[Mapping[str, float]]) -> None:
    """Write per-step values as ``{"name": [v_step1, v_step2, ...]}`` JSON (the ``--schedule`` file)."""
    keys: List[str] = list(values[0]) if values else []
    for i, v in enumerate(values):
        if set(v) != set(keys):
            raise ValueError(
                f"schedule step {i + 1} sets {sorted(v)}, step 1 sets {sorted(keys)}: the file form needs the "
                "same names on every step"
            )
    lines = [f"  {json.dumps(k)}: {json.dumps([float(v[k]) for v in values])}" for k in keys]
    with open(path, "w") as f:
        f.write("{\n" + ",\n".join(lines) + "\n}\n")


def load_schedule(path: Union[str, os.PathLike]) -> List[Values]:
    """Read a file written by :func:`save_schedule` back into per-step dicts."""
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not all(isinstance(v, list) for v in doc.values()):
        raise ValueError(f"{path}: expected a JSON object of name -> list of per-step values")
    lengths = {k: len(v) for k, v in doc.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{path}: the per-step lists differ in length: {lengths}")
    steps = next(iter(lengths.values()), 0)
    return [OrderedDict((k, float(v[i])) for k, v in doc.items()) for i in range(steps)]
