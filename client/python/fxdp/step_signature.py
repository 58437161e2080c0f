"""The flat step's signature: what each position of ``step(*params, *buffers, *optimizer_state,
*hyperparameters, *inputs)`` holds, the example tensors that feed it, and every check on the
model, the optimizer and the example batch that tracing needs (:class:`Signature`)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Tuple

import torch
import torch.nn as nn

from . import optimizers as optim_table
from .errors import TraceError
from .v1 import graph_pb2 as pb


class Batch:
    """The example batch: its tensors in order, their names, and how to rebuild its structure."""

    def __init__(self, example, input_names):
        self.kind = (
            "tensor"
            if isinstance(example, torch.Tensor)
            else "dict"
            if isinstance(example, dict)
            else "seq"
        )
        if self.kind == "tensor":
            values = [example]
        elif self.kind == "dict":
            values = list(example.values())
        else:
            if not isinstance(example, (tuple, list)):
                raise TraceError(
                    f"the example batch must be a tensor, a tuple/list or a dict of tensors, got "
                    f"{type(example).__name__}"
                )
            values = list(example)
            self.seq_type = type(example)
        if self.kind == "dict":
            names = [str(k) for k in example]
            self.keys = list(example)
        elif input_names is not None:
            names = list(input_names)
        else:
            names = [f"input.{i}" for i in range(len(values))]
        if len(names) != len(values):
            raise TraceError(f"{len(names)} input names for {len(values)} inputs")
        if len(set(names)) != len(names):
            raise TraceError(f"input names are not unique: {names}")
        for n, v in zip(names, values):
            if not isinstance(v, torch.Tensor):
                raise TraceError(f"input '{n}' is a {type(v).__name__}, not a tensor")
        self.values, self.names = values, names

    def rebuild(self, tensors):
        if self.kind == "tensor":
            return tensors[0]
        if self.kind == "dict":
            return dict(zip(self.keys, tensors))
        return self.seq_type(tensors)

    def batch_dims(self, batch_dim) -> List[int]:
        inputs, names = self.values, self.names
        if isinstance(batch_dim, int):
            dims = [batch_dim] * len(inputs)
        elif isinstance(batch_dim, dict):
            dims = [batch_dim.get(k, 0) for k in (self.keys if self.kind == "dict" else names)]
        else:
            dims = [int(d) for d in batch_dim]
            if len(dims) != len(inputs):
                raise TraceError(f"batch_dim has {len(dims)} entries for {len(inputs)} inputs")
        out = []
        sizes: Dict[int, List[str]] = {}
        for d, x, n in zip(dims, inputs, names):
            if d is None or d == -1:
                out.append(-1)
                continue
            if d < -1:
                d += x.dim()
            if not 0 <= d < x.dim():
                raise TraceError(
                    f"batch_dim {d} is out of range for input '{n}' of shape {tuple(x.shape)}"
                )
            sizes.setdefault(x.shape[d], []).append(f"'{n}' {tuple(x.shape)} dim {d}")
            out.append(d)
        if len(sizes) > 1:
            told = "; ".join(f"{s}: {', '.join(ins)}" for s, ins in sorted(sizes.items()))
            raise TraceError(
                f"inputs disagree on the batch size along their batch dims ({told}); give batch_dim=-1 "
                "to an input without a batch dim, or one batch_dim per input"
            )
        return out


def _module_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else "<root>"


def check_devices(model, params, buffers, batch: Batch) -> torch.device:
    """The one device of the model, its buffers and the batch (a TraceError names a tensor elsewhere).
    The batch of a model on ``meta`` may be on any device: only its shapes are read."""
    mods = dict(model.named_modules())
    items = [(f"parameter '{n}'", n, t) for n, t in params.items()]
    items += [(f"buffer '{n}'", n, t) for n, t in buffers.items()]
    if not (items and items[0][2].device.type == "meta"):
        items += [(f"input '{n}'", None, t) for n, t in zip(batch.names, batch.values)]
    if not items:
        raise TraceError("nothing to trace: the model has no parameters and there are no inputs")
    ref_desc, _, ref_t = items[0]
    ref = ref_t.device
    for desc, n, t in items[1:]:
        if t.device != ref:
            owner = ""
            if n is not None:
                m = _module_of(n)
                owner = f" of module '{m}' ({type(mods.get(m if m != '<root>' else '', model)).__name__})"
            raise TraceError(
                f"tensors on mixed devices: {desc}{owner} is on {t.device}, but {ref_desc} is on {ref}; "
                "move the model, optimizer state and batch to one device before tracing"
            )
    return ref


def _trace_device(model_device: torch.device, device) -> torch.device:
    """The device the graph is traced as: the model's, or for a model on ``meta`` ``device``
    (default cpu). Workers run it on theirs either way (executor/arg_binding.cc, MapDevice)."""
    if model_device.type != "meta":
        if device is not None and torch.device(device) != model_device:
            raise TraceError(
                f"device={str(device)!r} is for a model on the meta device; this one is on "
                f"{model_device} and is traced there"
            )
        return model_device
    out = torch.device("cpu" if device is None else device)
    if out.type not in ("cpu", "cuda"):
        raise TraceError(f"device={str(device)!r}: a model on meta is traced as cpu or cuda")
    return out


def non_persistent_buffers(model: nn.Module, names: List[str]) -> List[str]:
    """The buffers among ``names`` (``named_buffers()`` names) registered with
    ``persistent=False``: not in ``model.state_dict()`` (a rotary embedding's ``inv_freq``)."""
    out = []
    for n in names:
        owner, _, leaf = n.rpartition(".")
        if leaf in model.get_submodule(owner)._non_persistent_buffers_set:
            out.append(n)
    return out


class Signature:
    """What each position of the flat step ``step(*params, *buffers, *optimizer_state,
    *hyperparameters, *inputs)`` holds, and the example tensors that feed it. Built from the model,
    the optimizer and the example batch, with every argument check the trace needs."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        example_batch,
        batch_dim,
        input_names,
        device=None,
    ):
        optim_table.spec_of(optimizer)
        optim_table.check_options(optimizer)
        self.batch = Batch(example_batch, input_names)
        self.bdims = self.batch.batch_dims(batch_dim)

        self.params: "OrderedDict[str, torch.Tensor]" = OrderedDict(model.named_parameters())
        self.buffers: "OrderedDict[str, torch.Tensor]" = OrderedDict(model.named_buffers())
        self.pname_of = {id(p): n for n, p in self.params.items()}
        group_params: List[List[torch.Tensor]] = []
        for gi, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                if id(p) not in self.pname_of:
                    raise TraceError(
                        f"optimizer param group {gi} holds a tensor of shape {tuple(p.shape)} that is not a "
                        "parameter of the model"
                    )
            group_params.append(list(group["params"]))
        self.device = check_devices(model, self.params, self.buffers, self.batch)
        self.foreach = optim_table.resolve_foreach(optimizer, group_params)
        self.ostate = optim_table.initial_state(optimizer, self.pname_of)
        for pn, st in self.ostate.items():
            for k, t in st.items():
                if t.device != self.device and not (t.dim() == 0 and t.device.type == "cpu"):
                    raise TraceError(
                        f"tensors on mixed devices: optimizer state '{k}' of parameter '{pn}' is on "
                        f"{t.device}, the model on {self.device}"
                    )
        self.trace_device = _trace_device(self.device, device)
        self.hvalues = optim_table.optimizer_hyperparameters(optimizer)
        # on `meta` their values would be lost: they are real CPU tensors in the initial state
        self.hyper = optim_table.hyperparameter_tensors(
            optimizer, "cpu" if self.device.type == "meta" else self.device
        )

        self.pnames, self.bnames, self.hnames = (
            list(self.params),
            list(self.buffers),
            list(self.hyper),
        )
        self.non_persistent = non_persistent_buffers(model, self.bnames)
        self.state_names = [(pn, k) for pn, st in self.ostate.items() for k in st]
        in_optimizer = {self.pname_of[id(p)] for ps in group_params for p in ps}
        # the graph differentiates w.r.t. the parameters the optimizer updates
        self.trainable = [
            n for n in self.pnames if self.params[n].requires_grad and n in in_optimizer
        ]

    @property
    def n_state(self) -> int:
        """Parameters + buffers + optimizer state: the state the step may update."""
        return len(self.pnames) + len(self.bnames) + len(self.state_names)

    def split(self, flat):
        """The flat step's arguments as (params, buffers, optimizer state, hyper-parameters, inputs)."""
        cuts = [0]
        for n in (len(self.pnames), len(self.bnames), len(self.state_names), len(self.hnames)):
            cuts.append(cuts[-1] + n)
        return [flat[a:b] for a, b in zip(cuts, cuts[1:])] + [flat[cuts[-1] :]]

    def example_args(self) -> List[torch.Tensor]:
        """The flat step's example arguments; for a model on ``meta``, FakeTensors on the trace
        device (one FakeTensorMode, which ``make_fx(tracing_mode="fake")`` adopts): the graph is
        traced as on that device (its kernels' choices, e.g. SDPA's CPU flash attention, and its
        factory ops' device), with no memory behind any tensor."""
        args = (
            [self.params[n].detach() for n in self.pnames]
            + [self.buffers[n] for n in self.bnames]
            + [self.ostate[pn][k] for pn, k in self.state_names]
            + [self.hyper[n] for n in self.hnames]
            + list(self.batch.values)
        )
        if self.device.type != "meta":
            return args
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=True)
        return [FakeTensor(mode, t.detach().to("meta"), self.trace_device) for t in args]

    def placeholder_specs(self) -> List[Tuple[int, str, int]]:
        """(role, state name, batch dim) of each flat argument."""
        return (
            [(pb.PARAMETER, n, 0) for n in self.pnames]
            + [(pb.BUFFER, n, 0) for n in self.bnames]
            + [(pb.OPTIMIZER_STATE, f"optim.{pn}.{k}", 0) for pn, k in self.state_names]
            + [(pb.HYPERPARAMETER, n, 0) for n in self.hnames]
            + [(pb.INPUT, n, d) for n, d in zip(self.batch.names, self.bdims)]
        )

    def output_specs(self, n_extras: int) -> List[Tuple[int, str]]:
        """(role, state name) of each output the flat step returns before its gradient snapshots."""
        return (
            [(pb.UPDATED_PARAMETER, n) for n in self.pnames]
            + [(pb.UPDATED_BUFFER, n) for n in self.bnames]
            + [(pb.UPDATED_OPTIMIZER_STATE, f"optim.{pn}.{k}") for pn, k in self.state_names]
            + [(pb.LOSS, "")]
            + [(pb.OTHER, "")] * n_extras
        )

    def state_tensors(self) -> "OrderedDict[str, torch.Tensor]":
        """Every state entry by state name (parameters, buffers, optimizer state, hyper-parameters)."""
        out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
        for n in self.pnames:
            out[n] = self.params[n].detach()
        for n in self.bnames:
            out[n] = self.buffers[n]
        for pn, k in self.state_names:
            out[f"optim.{pn}.{k}"] = self.ostate[pn][k]
        for n in self.hnames:
            out[n] = self.hyper[n]
        return out
