"""Tracing the user's training step (forward, loss, backward(s), clipping, optimizer update) into
one functional aten graph.

``fxdp.trace_step(train_step, model, optimizer, example_batch)`` traces an ordinary eager step
function ``train_step(model, optimizer, batch)``; ``fxdp.trace(model, optimizer, loss_fn, batch)``
is the shortcut for ``loss_fn(model(*x), y).backward(); optimizer.step()``.

How it works
------------
``trace_step`` is a short orchestrator over these named steps:

1. (``_Signature``, ``_flat_step``) The step becomes a function of flat tensors
   ``step(*params, *buffers, *optimizer_state, *hyperparameters, *inputs)``. Inside it, the model's
   parameters and buffers are swapped for traced tensors (``torch.nn.utils.stateless``), and the
   user's own ``torch.optim`` object is re-pointed at the traced parameters, state and
   hyper-parameter tensors (:class:`fxdp.optimizers.BoundOptimizer`); then ``train_step`` runs as
   written: ``loss.backward()`` fills ``.grad``, ``clip_grad_norm_`` scales it in place,
   ``optimizer.step()`` updates, ``zero_grad()`` clears, a Python loop over micro-batches unrolls.
2. (``_make_graph``) Pass 1: ``make_fx(step, tracing_mode=..., decomposition_table=...)`` records every aten op
   below autograd (so the backward ops are explicit nodes). The default ``"real"`` mode runs the
   step once on the real example tensors, so layouts and view decisions are exactly those of the
   real kernels; :class:`fxdp.trace_errors.DataDependenceGuard` turns data-dependent ops
   (``.item()``/``bool()`` on tensors, ``nonzero``, boolean masks...) into TraceErrors naming the
   user's file:line. ``"fake"`` traces on FakeTensors.
3. Pass 2: the pass-1 graph is re-traced under ``torch.func.functionalize(remove="mutations")``,
   which turns every in-place op (gradient accumulation, clipping's ``mul_``, the optimizer's
   ``_foreach_*_``, BatchNorm running-stat updates) into its functional variant. Views stay views.
4. Graph passes: identity ops, profiler ops and input clones are removed
   (``graph_passes.cleanup``); placeholders get roles, gradients are marked with ``grad_of`` and
   outputs that did not change are dropped (``_assign_roles``); tensor constants become CONSTANT
   placeholders (``graph_passes.lift_constants``); every op is checked (``validate_ops``) and
   placeholders are named after their state (``renamed``); in real mode the graph runs once more
   to record exact layouts (``_record_layouts``). ``_metadata`` and ``_initial_state`` give the
   TracedStep its metadata and state.

Gradients (``grad_of``) and data parallelism
--------------------------------------------
The node marked ``grad_of`` for a parameter is its gradient *as the user's backward(s) leave it*:
the value in ``.grad`` after the last accumulation into it (a post-accumulate-grad hook takes it),
so with micro-batches it is the sum over all of them, and it is taken before clipping or the
optimizer reads it. A gradient assigned to ``.grad`` by hand (``autograd.grad`` users) is taken
when ``optimizer.step()`` is called. The data-parallel expansion all-reduces exactly these values,
once per step, so everything after them (clipping's norm, the update) sees DDP's all-reduced
gradients and is identical on every rank.

Hyper-parameters
----------------
Each param group's ``lr``, ``momentum``, ``betas`` and ``weight_decay`` (whichever the optimizer
has) is a HYPERPARAMETER placeholder, a 0-d float32 tensor named ``optim.group<g>.<key>``; the
trace-time values are in ``initial_state()`` and a schedule feeds others per step
(:mod:`fxdp.schedule`). One graph serves every step.

Optimizers
----------
Every torch.optim class in :data:`fxdp.optimizers.OPTIMIZERS` (SGD, Adam, AdamW, RMSprop, Adagrad,
Adadelta, Adamax, NAdam, RAdam, ASGD, Rprop) with its options, foreach or single-tensor. Torch's
own code runs, through its ``capturable`` path where it has one (not for Adam/AdamW's single-tensor
form: :mod:`fxdp.optimizers`) and with
``torch.compiler.is_compiling()`` reporting True during ``step()``, so the step counter stays a
tensor and one graph reproduces step 1 and step k (fresh state is created as the table says).
``fused=True`` and ``differentiable=True`` are refused.

Decomposition table
-------------------
``DEFAULT_DECOMPOSITIONS`` holds a single entry: ``aten.native_batch_norm.default`` is rewritten
to ``aten._native_batch_norm_legit`` (PyTorch's own decomposition), whose schema declares the
running-stat mutation so functionalization sees it. Nothing else is decomposed: the graph stays at
the level autograd and the CompositeImplicitAutograd kernels produce, every op a dispatcher op
the C++ executor calls by schema name, views intact for the analyzer, no ``prims.*``.
``decompositions=...`` adds entries.

What cannot be one graph
------------------------
Python control flow on tensor values (``if loss > 0``, ``.item()``), ``GradScaler`` (it skips the
step when a gradient is inf/nan), ``LBFGS`` (re-evaluates a closure a data-dependent number of
times), a step that does not call ``optimizer.step()`` exactly once: each is a TraceError naming
the user's line where it can.
"""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

from . import convert, graph_passes
from . import optimizers as optim_table
from .errors import TraceError
from .optimizers import SUPPORTED_OPTIMIZERS
from .trace_errors import DataDependenceGuard, ModuleStack, as_trace_error, user_frame
from .v1 import graph_pb2 as pb

aten = torch.ops.aten

__all__ = ["trace", "trace_step", "DEFAULT_DECOMPOSITIONS", "SUPPORTED_OPTIMIZERS"]


def _default_decompositions() -> Dict[Any, Callable]:
    from torch._decomp.decompositions import native_batch_norm_decomposition

    return {aten.native_batch_norm.default: native_batch_norm_decomposition}


DEFAULT_DECOMPOSITIONS = _default_decompositions()


# --------------------------------------------------------------------------- the example batch


class _Batch:
    """The example batch: its tensors in order, their names, and how to rebuild its structure."""

    def __init__(self, example, input_names):
        self.kind = "tensor" if isinstance(example, torch.Tensor) else "dict" if isinstance(example, dict) else "seq"
        if self.kind == "tensor":
            values = [example]
        elif self.kind == "dict":
            values = list(example.values())
        else:
            if not isinstance(example, (tuple, list)):
                raise TraceError(f"the example batch must be a tensor, a tuple/list or a dict of tensors, got "
                                 f"{type(example).__name__}")
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
        sizes = set()
        for d, x, n in zip(dims, inputs, names):
            if d is None or d == -1:
                out.append(-1)
                continue
            if d < -1:
                d += x.dim()
            if not 0 <= d < x.dim():
                raise TraceError(f"batch_dim {d} is out of range for input '{n}' of shape {tuple(x.shape)}")
            sizes.add(x.shape[d])
            out.append(d)
        if len(sizes) > 1:
            raise TraceError(f"inputs disagree on the batch size along their batch dims: {sorted(sizes)}")
        return out


def _module_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else "<root>"


def _check_devices(model, params, buffers, batch: _Batch) -> torch.device:
    mods = dict(model.named_modules())
    items = [(f"parameter '{n}'", n, t) for n, t in params.items()]
    items += [(f"buffer '{n}'", n, t) for n, t in buffers.items()]
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


# --------------------------------------------------------------------------- inside the trace


@contextlib.contextmanager
def _compiling():
    """Make torch.optim take its compile-friendly (tensor step, no .item()) path."""
    orig = torch.compiler.is_compiling
    torch.compiler.is_compiling = lambda: True
    try:
        yield
    finally:
        torch.compiler.is_compiling = orig


class _GradientTaps:
    """Takes each trained parameter's gradient as the user's backward(s) leave it (see module doc)."""

    def __init__(self, leaves: Dict[str, torch.Tensor]):
        self.leaves = leaves
        self.snap: Dict[str, torch.Tensor] = {}
        self.seen: Dict[str, torch.Tensor] = {}
        self.handles = []

    def __enter__(self):
        for n, leaf in self.leaves.items():
            def hook(p, n=n):
                self.snap[n] = p.grad.clone()
                self.seen[n] = p.grad
            self.handles.append(leaf.register_post_accumulate_grad_hook(hook))
        return self

    def at_step(self):
        """Called when optimizer.step() starts: gradients assigned by hand are taken now."""
        for n, leaf in self.leaves.items():
            if leaf.grad is not None and self.seen.get(n) is not leaf.grad:
                self.snap[n] = leaf.grad.clone()
                self.seen[n] = leaf.grad

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        return False


class _StepHook:
    """Wraps ``optimizer.step`` on the instance: takes the gradients, counts calls, and runs torch's
    code in its compile-friendly path with hyper-parameter tensors."""

    def __init__(self, optimizer, taps: _GradientTaps, hmode: optim_table.HyperparameterMode):
        self.opt, self.taps, self.hmode = optimizer, taps, hmode
        self.calls = 0

    def __enter__(self):
        self.had_own = "step" in self.opt.__dict__
        self.own = self.opt.__dict__.get("step")
        orig = self.opt.step

        def step(*args, **kwargs):
            self.calls += 1
            if self.calls > 1:
                raise TraceError(f"train_step calls optimizer.step() more than once (again at {self._caller()}); "
                                 "one traced step is one optimizer update")
            self.taps.at_step()
            with torch.no_grad(), _compiling(), self.hmode:
                return orig(*args, **kwargs)

        self.opt.step = step
        return self

    @staticmethod
    def _caller() -> str:
        import sys

        f = sys._getframe(2)
        return f"{f.f_code.co_filename}:{f.f_lineno}"

    def __exit__(self, *exc):
        if self.had_own:
            self.opt.step = self.own
        else:
            del self.opt.__dict__["step"]
        return False


def _split_result(result) -> Tuple[torch.Tensor, "OrderedDict[str, torch.Tensor]"]:
    """train_step returns the loss, (loss, {name: tensor}), (loss, t1, t2...), or {"loss": ..., name: ...}."""
    extras: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    if isinstance(result, dict):
        if "loss" not in result:
            raise TraceError(f"train_step returned a dict without a 'loss' entry (keys {list(result)})")
        loss = result["loss"]
        extras.update((str(k), v) for k, v in result.items() if k != "loss")
    elif isinstance(result, (tuple, list)):
        if not result:
            raise TraceError("train_step returned an empty sequence; return the loss")
        loss = result[0]
        rest = list(result[1:])
        if len(rest) == 1 and isinstance(rest[0], dict):
            extras.update((str(k), v) for k, v in rest[0].items())
        else:
            extras.update((f"out.{i + 1}", v) for i, v in enumerate(rest))
    else:
        loss = result
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise TraceError(
            f"the loss must be a scalar tensor, got {type(loss).__name__}"
            + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else "")
        )
    for k, v in extras.items():
        if not isinstance(v, torch.Tensor):
            raise TraceError(f"train_step output '{k}' is a {type(v).__name__}, not a tensor")
    return loss, extras


def _gradscaler_in(tb) -> bool:
    import traceback

    return any("grad_scaler" in fr.filename for fr in traceback.extract_tb(tb))


# --------------------------------------------------------------------------- the flat step's signature


class _Signature:
    """What each position of the flat step ``step(*params, *buffers, *optimizer_state,
    *hyperparameters, *inputs)`` holds, and the example tensors that feed it. Built from the model,
    the optimizer and the example batch, with every argument check the trace needs."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, example_batch, batch_dim, input_names):
        optim_table.spec_of(optimizer)
        optim_table.check_options(optimizer)
        self.batch = _Batch(example_batch, input_names)
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
        self.device = _check_devices(model, self.params, self.buffers, self.batch)
        self.foreach = optim_table.resolve_foreach(optimizer, group_params)
        self.ostate = optim_table.initial_state(optimizer, self.pname_of)
        for pn, st in self.ostate.items():
            for k, t in st.items():
                if t.device != self.device and not (t.dim() == 0 and t.device.type == "cpu"):
                    raise TraceError(f"tensors on mixed devices: optimizer state '{k}' of parameter '{pn}' is on "
                                     f"{t.device}, the model on {self.device}")
        self.hvalues = optim_table.optimizer_hyperparameters(optimizer)
        self.hyper = optim_table.hyperparameter_tensors(optimizer, self.device)

        self.pnames, self.bnames, self.hnames = list(self.params), list(self.buffers), list(self.hyper)
        self.state_names = [(pn, k) for pn, st in self.ostate.items() for k in st]
        in_optimizer = {self.pname_of[id(p)] for ps in group_params for p in ps}
        # the graph differentiates w.r.t. the parameters the optimizer updates
        self.trainable = [n for n in self.pnames if self.params[n].requires_grad and n in in_optimizer]

    @property
    def n_state(self) -> int:
        """Parameters + buffers + optimizer state: the state the step may update."""
        return len(self.pnames) + len(self.bnames) + len(self.state_names)

    def split(self, flat):
        """The flat step's arguments as (params, buffers, optimizer state, hyper-parameters, inputs)."""
        cuts = [0]
        for n in (len(self.pnames), len(self.bnames), len(self.state_names), len(self.hnames)):
            cuts.append(cuts[-1] + n)
        return [flat[a:b] for a, b in zip(cuts, cuts[1:])] + [flat[cuts[-1]:]]

    def example_args(self) -> List[torch.Tensor]:
        return (
            [self.params[n].detach() for n in self.pnames]
            + [self.buffers[n] for n in self.bnames]
            + [self.ostate[pn][k] for pn, k in self.state_names]
            + [self.hyper[n] for n in self.hnames]
            + list(self.batch.values)
        )

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


# --------------------------------------------------------------------------- the steps of trace_step


def _flat_step(sig: _Signature, train_step, model: nn.Module, optimizer, report: Dict[str, Any]) -> Callable:
    """The user's step as a function of flat tensors (see the module docstring, step 1). Returns
    ``[*params, *buffers, *optimizer_state, loss, *extras, *gradient_snapshots]``; the names of the
    extras and the hyper-parameter guards go into ``report``."""
    from torch.nn.utils.stateless import _reparametrize_module

    trainable_set = set(sig.trainable)

    def run(*flat):
        p_in, b_in, s_in, h_in, x_in = sig.split(flat)
        leaves = OrderedDict()
        for n, t in zip(sig.pnames, p_in):
            leaf = t.clone()
            if n in trainable_set:
                leaf.requires_grad_(True)
            leaves[n] = leaf
        bufs = OrderedDict((n, t.clone()) for n, t in zip(sig.bnames, b_in))
        it = iter(s_in)
        st_tensors = OrderedDict((pn, OrderedDict((k, next(it).clone()) for k in st))
                                 for pn, st in sig.ostate.items())
        htensors = OrderedDict(zip(sig.hnames, h_in))
        hmode = optim_table.HyperparameterMode(htensors, sig.hvalues)
        taps = _GradientTaps(OrderedDict((n, leaves[n]) for n in sig.trainable))
        bound = optim_table.BoundOptimizer(optimizer, leaves, sig.pname_of, st_tensors, htensors, sig.foreach)
        hook = _StepHook(optimizer, taps, hmode)
        with _reparametrize_module(model, {**leaves, **bufs}, tie_weights=True), bound, taps, hook, \
                torch.enable_grad():
            result = train_step(model, optimizer, sig.batch.rebuild(list(x_in)))
            if hook.calls == 0:
                raise TraceError("train_step never calls optimizer.step(): fxdp traces one optimizer update per step")
            final_state = [bound.final_state(pn, k) for pn, k in sig.state_names]
            new_bufs = [bufs[n] for n in sig.bnames]
        loss, extras = _split_result(result)
        report["extras"] = list(extras)
        report["guards"] = dict(hmode.guards)
        snaps = [taps.snap.get(n) for n in sig.trainable]
        for leaf in leaves.values():
            leaf.grad = None
        outs = [leaf.detach() for leaf in leaves.values()] + new_bufs + final_state
        return outs + [loss.detach()] + [v.detach() for v in extras.values()] + snaps

    def guarded(*flat):
        with DataDependenceGuard():
            return run(*flat)

    return guarded


def _make_graph(step: Callable, args: List[torch.Tensor], mstack: ModuleStack, tracing_mode: str,
                decompositions: Optional[Dict[Any, Callable]]) -> torch.fx.GraphModule:
    """Passes 1 and 2 of the module docstring: ``make_fx`` records the aten ops, then
    functionalization removes every mutation. Every failure becomes a TraceError naming what it can."""
    table = dict(DEFAULT_DECOMPOSITIONS)
    if decompositions:
        table.update(decompositions)
    try:
        with mstack:
            gm1 = make_fx(step, tracing_mode=tracing_mode, decomposition_table=table,
                          _allow_non_fake_inputs=True)(*args)
        return make_fx(
            torch.func.functionalize(gm1, remove="mutations"), tracing_mode=tracing_mode, _allow_non_fake_inputs=True
        )(*args)
    except Exception as e:  # noqa: BLE001 - every failure becomes a TraceError naming what it can
        if _gradscaler_in(e.__traceback__):
            frame = user_frame(e.__traceback__)
            raise TraceError(
                "GradScaler cannot be traced: it skips the optimizer step when a gradient is inf/nan, a decision "
                f"on tensor values{f' (at {frame})' if frame else ''}; use bf16 autocast, which needs no scaler"
            ) from e
        if "does not require grad and does not have a grad_fn" in str(e):
            raise TraceError(
                f"the loss does not depend on any trainable parameter (backward at {user_frame(e.__traceback__)})"
            ) from e
        raise as_trace_error(e, mstack) from e


def _assign_roles(graph: torch.fx.Graph, sig: _Signature, n_extras: int) -> List[Tuple[int, str]]:
    """Give each placeholder its role and name, mark the gradients (``grad_of``), keep the state
    outputs that changed, the loss and the extras; returns the roles of the outputs kept."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    specs = sig.placeholder_specs()
    assert len(placeholders) == len(specs), (len(placeholders), len(specs))
    for ph, spec in zip(placeholders, specs):
        ph.meta["fxdp_placeholder"] = spec
        # requires_grad is True exactly for the parameters whose gradient the graph computes
        ph.meta["fxdp_requires_grad"] = False

    out_node = next(n for n in graph.nodes if n.op == "output")
    ret = list(out_node.args[0])
    n_kept = sig.n_state + 1 + n_extras
    n_p = len(sig.pnames)
    extra_grads = graph_passes.mark_gradients(graph, ret[n_kept:], sig.trainable,
                                              dict(zip(sig.pnames, placeholders[:n_p])))
    final_ret, final_roles = [], []
    for i, (v, r) in enumerate(zip(ret[:n_kept], sig.output_specs(n_extras))):
        if i < sig.n_state and v is placeholders[i]:
            continue  # unchanged state
        final_ret.append(v)
        final_roles.append(r)
    for n in extra_grads:
        final_ret.append(n)
        final_roles.append((pb.OTHER, ""))
    out_node.args = (final_ret,)
    graph.eliminate_dead_code()
    return final_roles


def _first_input(graph: torch.fx.Graph, sig: _Signature) -> Optional[torch.fx.Node]:
    """The first INPUT placeholder (lifted constants go before it), or None without inputs."""
    if not sig.batch.values:
        return None
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    return placeholders[sig.n_state + len(sig.hnames)]


def _record_layouts(gm: torch.fx.GraphModule, sig: _Signature, consts: "OrderedDict[str, torch.Tensor]") -> None:
    """Real mode: run the finished graph once on the example tensors to record exact layouts."""
    by_spec = {spec[:2]: t for spec, t in zip(sig.placeholder_specs(), sig.example_args())}
    by_spec.update(((pb.CONSTANT, n), t) for n, t in consts.items())
    args = [by_spec[n.meta["fxdp_placeholder"][:2]] for n in gm.graph.nodes if n.op == "placeholder"]
    try:
        graph_passes.record_real_meta(gm, args)
    except Exception as e:  # noqa: BLE001
        raise TraceError(f"the traced graph does not run on the example tensors: {type(e).__name__}: {e}") from e


def _metadata(sig: _Signature, model, optimizer, train_step, loss_reduction, report) -> List[Tuple[str, str]]:
    meta = [
        ("model", type(model).__name__),
        ("optimizer", type(optimizer).__name__),
        ("optimizer.foreach", ",".join("true" if f else "false" for f in sig.foreach)),
        ("loss_reduction", str(loss_reduction or "mean")),
        ("batch_size", str(next((x.shape[d] for x, d in zip(sig.batch.values, sig.bdims) if d >= 0), -1))),
        ("decompositions", "fxdp-default-v1:native_batch_norm"),
        ("device", str(sig.device)),
        ("train_step", getattr(train_step, "__qualname__", type(train_step).__name__)),
    ]
    if report["extras"]:
        meta.append(("extra_outputs", json.dumps(report["extras"])))
    if report["guards"]:
        meta.append(("hyperparameter_guards", json.dumps(report["guards"])))
    return meta


def _initial_state(sig: _Signature, consts: "OrderedDict[str, torch.Tensor]") -> "OrderedDict[str, torch.Tensor]":
    init = OrderedDict((n, t.detach().clone()) for n, t in sig.state_tensors().items())
    init.update(consts)
    return init


# --------------------------------------------------------------------------- trace_step


def trace_step(
    train_step: Callable[..., Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    example_batch: Union[torch.Tensor, Sequence[torch.Tensor], Dict[str, torch.Tensor]],
    *,
    batch_dim: Union[int, Sequence[int], Dict[str, int]] = 0,
    input_names: Optional[Sequence[str]] = None,
    loss_reduction: Optional[str] = "mean",
    decompositions: Optional[Dict[Any, Callable]] = None,
    tracing_mode: str = "real",
):
    """Trace ``train_step(model, optimizer, batch)`` (ordinary eager PyTorch) into a :class:`fxdp.TracedStep`.

    ``train_step`` runs forward passes, any loss, ``.backward()`` (or ``autograd.grad`` assigning
    ``.grad``), optionally ``clip_grad_norm_``/``clip_grad_value_``, exactly one
    ``optimizer.step()``, ``zero_grad()``, loops over micro-batches; it returns the loss, or
    ``(loss, {name: tensor})`` / ``{"loss": loss, name: tensor}`` for named extra outputs (OTHER
    outputs; ``run_local(..., outputs=True)`` returns them).

    ``example_batch`` is a tensor, a tuple/list of tensors (named ``input.0``... or by
    ``input_names``) or a dict (its keys name the inputs); ``train_step`` receives a batch of the same
    structure. ``batch_dim`` is one int for every input, one per input, or a dict by key; ``-1`` marks
    an input without a batch dim (replicated). ``loss_reduction`` (``"mean"`` or ``"sum"``) says how
    the returned loss combines the examples of the batch.

    The model, its buffers and the optimizer are left unchanged. Raises :class:`fxdp.TraceError`
    for what cannot be traced (see the module docstring).
    """
    from .traced import TracedStep
    from .versions import check_torch

    check_torch()
    if not isinstance(model, nn.Module):
        raise TraceError(f"model must be an nn.Module, got {type(model).__name__}")
    if not callable(train_step):
        raise TraceError(f"train_step must be callable, got {type(train_step).__name__}")
    if tracing_mode not in ("real", "fake"):
        raise TraceError(f"tracing_mode must be 'real' or 'fake', got {tracing_mode!r}")
    sig = _Signature(model, optimizer, example_batch, batch_dim, input_names)

    report: Dict[str, Any] = {}
    step = _flat_step(sig, train_step, model, optimizer, report)
    gm = _make_graph(step, sig.example_args(), ModuleStack(model), tracing_mode, decompositions)
    graph_passes.cleanup(gm)
    first_input = _first_input(gm.graph, sig)
    output_roles = _assign_roles(gm.graph, sig, len(report["extras"]))
    consts = graph_passes.lift_constants(gm, first_input)
    graph_passes.validate_ops(gm)
    final_gm = graph_passes.renamed(gm.graph, output_roles)
    if tracing_mode == "real":
        _record_layouts(final_gm, sig, consts)
    graph_def = convert.fx_to_graphdef(final_gm, _metadata(sig, model, optimizer, train_step, loss_reduction, report))
    return TracedStep(graph_def, _initial_state(sig, consts))


# --------------------------------------------------------------------------- trace (shortcut)


def trace(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Optional[Callable[..., torch.Tensor]],
    example_inputs: Union[Sequence[torch.Tensor], Dict[str, torch.Tensor], torch.Tensor],
    *,
    batch_dim: Union[int, Sequence[int]] = 0,
    num_model_inputs: Optional[int] = None,
    input_names: Optional[Sequence[str]] = None,
    loss_reduction: Optional[str] = None,
    decompositions: Optional[Dict[Any, Callable]] = None,
    tracing_mode: str = "real",
):
    """Trace the step ``loss_fn(model(*inputs[:n]), *inputs[n:]).backward(); optimizer.step()``.

    A shortcut over :func:`trace_step`. ``n = num_model_inputs`` defaults to all inputs but the
    last (the target) when a ``loss_fn`` is given, and to all inputs when ``loss_fn`` is None (the
    model returns the loss). ``loss_reduction`` defaults to ``loss_fn.reduction`` or ``"mean"``.
    """
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    n_in = len(example_inputs)
    if num_model_inputs is None:
        num_model_inputs = n_in - 1 if loss_fn is not None else n_in
    if not 0 <= num_model_inputs <= n_in:
        raise TraceError(f"num_model_inputs={num_model_inputs} out of range for {n_in} inputs")
    is_dict = isinstance(example_inputs, dict)

    def train_step(model, optimizer, batch):
        xs = list(batch.values()) if is_dict else list(batch)
        out = model(*xs[:num_model_inputs])
        loss = out if loss_fn is None else loss_fn(out, *xs[num_model_inputs:])
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise TraceError(
                f"the loss must be a scalar tensor, got {type(loss).__name__}"
                + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else "")
            )
        loss.backward()
        optimizer.step()
        return loss

    train_step.__qualname__ = "fxdp.trace"
    red = loss_reduction or getattr(loss_fn, "reduction", None) or "mean"
    return trace_step(train_step, model, optimizer, example_inputs, batch_dim=batch_dim, input_names=input_names,
                      loss_reduction=red, decompositions=decompositions, tracing_mode=tracing_mode)
