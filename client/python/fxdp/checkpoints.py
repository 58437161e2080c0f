"""A job's initial state read by the workers from a checkpoint on their filesystem (issue 27,
docs/checkpoints.md): the client sends the graph, the checkpoint's path, which state tensor is which
checkpoint tensor, the optimizer state the workers create (a constant each: zeros, ``step`` 0, ...)
and only the few tensors a checkpoint does not hold (hyper-parameters, the graph's constants,
non-persistent buffers such as Llama's rotary ``inv_freq``). Never the weights.

:func:`initial_checkpoint` builds that plan; ``Client.train(initial_checkpoint=...)`` takes it or
a path (then built from the step alone). :class:`CheckpointState` reads a checkpoint the workers
wrote one tensor at a time (``TrainResult.state`` of a job that wrote its last step's).
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections import OrderedDict, abc
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Set, Union

import torch

from . import optimizers as optim_table
from .v1 import checkpoint_pb2 as cpb
from .v1 import graph_pb2 as gpb

__all__ = ["CheckpointState", "InitialCheckpoint", "initial_checkpoint"]

_HF_INDEX = "model.safetensors.index.json"
_HF_SINGLE = "model.safetensors"


@dataclass
class InitialCheckpoint:
    """What a job reads from a checkpoint: ``path`` on the workers' filesystem, ``tensors``
    (graph state name -> checkpoint tensor name), ``fills`` (state name -> the constant the workers
    fill it with) and ``sent`` (the state tensors the client still sends)."""

    path: str
    tensors: "OrderedDict[str, str]" = field(default_factory=OrderedDict)
    fills: "OrderedDict[str, float]" = field(default_factory=OrderedDict)
    sent: "OrderedDict[str, torch.Tensor]" = field(default_factory=OrderedDict)


def _safetensors_names(path: str) -> Set[str]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k for k in header if k != "__metadata__"}


def local_checkpoint_names(path: str) -> Optional[Set[str]]:
    """The tensor names of the checkpoint at ``path`` when this machine can read it (the client
    and the workers share a filesystem), else None."""
    try:
        if os.path.isdir(path):
            index = os.path.join(path, _HF_INDEX)
            path = index if os.path.exists(index) else os.path.join(path, _HF_SINGLE)
        if path.endswith(".json"):
            with open(path) as f:
                return set(json.load(f)["weight_map"])
        return _safetensors_names(path)
    except (OSError, ValueError, KeyError, struct.error):
        return None


_FXDP_INDEX = "fxdp-checkpoint.json"


_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class CheckpointState(abc.Mapping):
    """The state in a checkpoint the workers wrote (``path``: its ``step-K`` directory or its
    ``fxdp-checkpoint.json``), every tensor whole, read when it is looked up (one at a time, from
    the parts its index lists: any world size and style) and not kept: iterating holds one tensor
    at a time. This machine must see the workers' filesystem; where it cannot, the first look-up
    raises FileNotFoundError naming the path. ``TrainResult.state`` of a job whose workers wrote
    its last step's checkpoint (the server collects no state then, docs/checkpoints.md)."""

    def __init__(self, path: Union[str, os.PathLike]):
        path = os.fspath(path)
        self.path = os.path.dirname(path) if os.path.basename(path) == _FXDP_INDEX else path
        self._index: Optional[dict] = None

    def index(self) -> dict:
        """The checkpoint's index (fxdp-checkpoint.json), read once."""
        if self._index is None:
            where = os.path.join(self.path, _FXDP_INDEX)
            try:
                with open(where) as f:
                    self._index = json.load(f)
            except OSError as e:
                raise FileNotFoundError(
                    f"the state is the checkpoint the workers wrote, '{self.path}', and this "
                    f"machine cannot read its index '{where}' ({e.strerror}): read it where the "
                    "workers' filesystem is, export it (fxdp export DIR --hf OUT) or start a "
                    "job from it (initial_checkpoint=)"
                ) from None
        return self._index

    def __iter__(self):
        return iter(self.index()["tensors"])

    def __len__(self) -> int:
        return len(self.index()["tensors"])

    def __contains__(self, name) -> bool:
        return name in self.index()["tensors"]

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        index = self.index()
        entry = index["tensors"][name]
        out = torch.empty(math.prod(entry["shape"]), dtype=_DTYPES[entry["dtype"]])
        for f, begin, end in entry["parts"]:
            with safe_open(os.path.join(self.path, index["files"][f]), framework="pt") as part:
                out[begin:end] = part.get_tensor(name).reshape(-1)
        return out.reshape(entry["shape"])

    def __repr__(self) -> str:
        return f"CheckpointState({self.path!r})"


def _is_fxdp_checkpoint(path: str) -> bool:
    """A checkpoint the workers wrote (docs/checkpoints.md): its index, or its directory when this
    machine sees the index in it."""
    return os.path.basename(path) == _FXDP_INDEX or os.path.exists(os.path.join(path, _FXDP_INDEX))


def _fxdp_plan(step, path: str, given, own) -> InitialCheckpoint:
    """Every state tensor read under its own name (a checkpoint the workers wrote holds the whole
    state: optimizer state, hyper-parameters and constants too), but those in ``state=``; when this
    machine can read the index, the ones it lacks are sent from the step's own state."""
    index = path if os.path.basename(path) == _FXDP_INDEX else os.path.join(path, _FXDP_INDEX)
    try:
        with open(index) as f:
            listed = set(json.load(f)["tensors"])
    except (OSError, ValueError, KeyError):
        listed = None

    def place(plan, role, sn):
        if listed is None or sn in listed:
            plan.tensors[sn] = sn
        elif sn in own:
            plan.sent[sn] = own[sn]
        else:
            raise ValueError(
                f"initial_checkpoint: '{path}' has no state '{sn}' and the step none to send: "
                "pass it in state="
            )

    return _plan(step, path, given, place)


def _plan(step, path: str, given, place) -> InitialCheckpoint:
    """The plan of ``step``'s state placeholders: each one in ``given`` (``state=``) is sent, every
    other one is placed by ``place(plan, role, state name)`` (read, filled or sent; a ValueError
    when it has no value)."""
    plan = InitialCheckpoint(path)
    for ph in step.placeholders:
        role, sn = ph.placeholder.role, ph.placeholder.state_name
        if role == gpb.INPUT:
            continue
        if sn in given:
            plan.sent[sn] = given[sn]
        else:
            place(plan, role, sn)
    return plan


def _constant(t: torch.Tensor, name: str) -> float:
    if t.device.type == "meta":
        raise ValueError(
            f"initial_checkpoint: optimizer state '{name}' is on meta (no values): pass the "
            "optimizer (fxdp.initial_checkpoint(step, path, optimizer=...)) so that the workers "
            "create it as its first step does"
        )
    flat = t.detach().reshape(-1)
    v = float(flat[0]) if flat.numel() else 0.0
    if flat.numel() and not bool((flat == flat[0]).all()):
        raise ValueError(
            f"initial_checkpoint: optimizer state '{name}' is not one value throughout (the "
            "step was traced after optimizer steps): a checkpoint gives the parameters only; "
            "trace with a fresh optimizer, or send the whole state"
        )
    return v


def _optimizer_fills(model, optimizer) -> Dict[str, float]:
    """Every fresh optimizer state entry as its constant, from the optimizer table on a 2-element
    tensor of each parameter's dtype (no memory of the parameter's size)."""
    spec = optim_table.spec_of(optimizer)
    pname = {id(p): n for n, p in model.named_parameters()}
    out: Dict[str, float] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not p.requires_grad:
                continue
            name = pname[id(p)]
            for k, v in spec.state(torch.zeros(2, dtype=p.dtype), group, name).items():
                out[f"optim.{name}.{k}"] = _constant(v, f"optim.{name}.{k}")
    return out


def _aliases(model) -> Dict[str, list]:
    """Each parameter's names (a tied weight has several), first name first."""
    out: Dict[str, list] = OrderedDict()
    first = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        out.setdefault(first.setdefault(id(p), n), []).append(n)
    return out


def _checkpoint_name(sn: str, names: Mapping[str, str], aliases, listed) -> str:
    if sn in names:
        return names[sn]
    if listed is None or sn in listed:
        return sn
    for a in aliases.get(sn, []):
        if a in listed:
            return a
    return sn  # the workers name what is missing


def initial_checkpoint(
    step,
    path: Union[str, os.PathLike],
    model=None,
    optimizer=None,
    state: Optional[Mapping[str, torch.Tensor]] = None,
    names: Optional[Mapping[str, str]] = None,
) -> InitialCheckpoint:
    """The plan of a job whose state comes from the checkpoint at ``path`` (on the workers'
    filesystem: a Hugging Face ``save_pretrained`` directory, ``model.safetensors`` or
    ``model.safetensors.index.json``; or the ``fxdp-checkpoint.json`` of one the workers wrote,
    whose every state tensor is read, on any world size and style) for ``step`` (a
    :class:`fxdp.TracedStep`).

    Parameters and buffers are read from the checkpoint, under their own names or ``names[state
    name]``; a tied weight under whichever of its names (``model``) the checkpoint lists when this
    machine can read the checkpoint. Non-persistent buffers (not in ``model.state_dict()``; the
    step records them, so ``model`` is not needed for that), the hyper-parameters and the graph's constants are sent (from ``state``, else the step's own state);
    so is anything in ``state``. Optimizer state is created by the workers: its constant comes from
    the step's state, or from ``optimizer`` for a step traced on ``meta``. A sent tensor on
    ``meta`` is a ValueError naming it."""
    path = os.fspath(path)
    names = dict(names or {})
    given = OrderedDict(state or {})
    own = step._state or OrderedDict()
    if _is_fxdp_checkpoint(path):
        return _fxdp_plan(step, path, given, own)
    persistent = set(model.state_dict()) if model is not None else None
    non_persistent = set(step.non_persistent_buffers())
    aliases = _aliases(model) if model is not None else {}
    listed = local_checkpoint_names(path)
    fills = _optimizer_fills(model, optimizer) if model is not None and optimizer else {}

    def place(plan, role, sn):
        if role == gpb.PARAMETER or (
            role == gpb.BUFFER
            and sn not in non_persistent
            and (persistent is None or sn in persistent)
            and (listed is None or sn in listed or sn in names)
        ):
            plan.tensors[sn] = _checkpoint_name(sn, names, aliases, listed)
        elif role == gpb.OPTIMIZER_STATE:
            plan.fills[sn] = fills[sn] if sn in fills else _constant(own[sn], sn)
        elif sn in own:
            plan.sent[sn] = own[sn]
        else:
            raise ValueError(f"initial_checkpoint: no value for state '{sn}': pass it in state=")

    plan = _plan(step, path, given, place)
    on_meta = [n for n, t in plan.sent.items() if t.device.type == "meta"]
    if on_meta:
        raise ValueError(
            f"initial_checkpoint: {len(on_meta)} state tensors the checkpoint does not give are on "
            f"meta (no values): {', '.join(on_meta)}; pass them in state= (e.g. a rotary "
            "embedding's inv_freq from the module built on the CPU)"
        )
    return plan


def plan_for_train(step, given, state, resume) -> Optional[InitialCheckpoint]:
    """``Client.train``'s ``initial_checkpoint`` (a path or a plan) as a plan; None without one."""
    if given is None:
        return None
    if resume:
        raise ValueError("train: initial_checkpoint= and resume= exclude each other")
    if isinstance(given, InitialCheckpoint):
        return given
    return initial_checkpoint(step, given, state=state)


def add_to_spec(spec, plan: Optional[InitialCheckpoint]) -> None:
    """``plan`` into ``spec`` (a JobSpec) as its initial_checkpoint."""
    if plan is None:
        return
    c = spec.initial_checkpoint
    c.path = plan.path
    for sn, cn in plan.tensors.items():
        c.tensors.add(state_name=sn, checkpoint_name=cn)
    for sn, v in plan.fills.items():
        c.fills.add(state_name=sn, value=float(v))


def add_policy(spec, checkpoints) -> None:
    """``Client.train``'s ``checkpoints`` into ``spec`` (a JobSpec): a ``CheckpointPolicy``, or a
    dict ``{"dir": D, "every": K, "keep": N}`` (``every`` and ``keep`` default 0: after the last
    step only, all kept)."""
    if checkpoints is None:
        return
    if isinstance(checkpoints, cpb.CheckpointPolicy):
        spec.checkpoints.CopyFrom(checkpoints)
        return
    if not isinstance(checkpoints, Mapping) or "dir" not in checkpoints:
        raise ValueError(
            "train: checkpoints= is a fxdp.v1 CheckpointPolicy or a dict with 'dir' "
            f"(and 'every', 'keep'), got {checkpoints!r}"
        )
    unknown = set(checkpoints) - {"dir", "every", "keep"}
    if unknown:
        raise ValueError(f"train: checkpoints= has unknown keys {sorted(unknown)}")
    spec.checkpoints.dir = os.fspath(checkpoints["dir"])
    spec.checkpoints.every = int(checkpoints.get("every", 0))
    spec.checkpoints.keep = int(checkpoints.get("keep", 0))
