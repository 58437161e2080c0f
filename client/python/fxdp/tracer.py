"""Tracing the user's training step (forward, loss, backward(s), clipping, optimizer update) into
one functional aten graph.

``fxdp.trace_step(train_step, model, optimizer, example_batch)`` traces an ordinary eager step
function ``train_step(model, optimizer, batch)``; ``fxdp.trace(model, optimizer, loss_fn, batch)``
is the shortcut for ``loss_fn(model(*x), y).backward(); optimizer.step()``.

How it works
------------
1. The step becomes a function of flat tensors
   ``step(*params, *buffers, *optimizer_state, *hyperparameters, *inputs)``. Inside it, the model's
   parameters and buffers are swapped for traced tensors (``torch.nn.utils.stateless``), and the
   user's own ``torch.optim`` object is re-pointed at the traced parameters, state and
   hyper-parameter tensors (:class:`fxdp.optimizers.BoundOptimizer`); then ``train_step`` runs as
   written: ``loss.backward()`` fills ``.grad``, ``clip_grad_norm_`` scales it in place,
   ``optimizer.step()`` updates, ``zero_grad()`` clears, a Python loop over micro-batches unrolls.
2. Pass 1: ``make_fx(step, tracing_mode=..., decomposition_table=...)`` records every aten op
   below autograd (so the backward ops are explicit nodes). The default ``"real"`` mode runs the
   step once on the real example tensors, so layouts and view decisions are exactly those of the
   real kernels; :class:`fxdp.trace_errors.DataDependenceGuard` turns data-dependent ops
   (``.item()``/``bool()`` on tensors, ``nonzero``, boolean masks...) into TraceErrors naming the
   user's file:line. ``"fake"`` traces on FakeTensors.
3. Pass 2: the pass-1 graph is re-traced under ``torch.func.functionalize(remove="mutations")``,
   which turns every in-place op (gradient accumulation, clipping's ``mul_``, the optimizer's
   ``_foreach_*_``, BatchNorm running-stat updates) into its functional variant. Views stay views.
4. :mod:`fxdp.graph_passes`: identity ops, profiler ops and input clones are removed; gradients
   are marked with ``grad_of``; tensor constants become CONSTANT placeholders; outputs that did
   not change are dropped; in real mode the graph runs once more to record exact layouts.

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
    optim_table.spec_of(optimizer)
    optim_table.check_options(optimizer)
    batch = _Batch(example_batch, input_names)
    bdims = batch.batch_dims(batch_dim)

    params: "OrderedDict[str, torch.Tensor]" = OrderedDict(model.named_parameters())
    buffers: "OrderedDict[str, torch.Tensor]" = OrderedDict(model.named_buffers())
    pname_of = {id(p): n for n, p in params.items()}
    group_params: List[List[torch.Tensor]] = []
    for gi, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            if id(p) not in pname_of:
                raise TraceError(
                    f"optimizer param group {gi} holds a tensor of shape {tuple(p.shape)} that is not a "
                    "parameter of the model"
                )
        group_params.append(list(group["params"]))
    device = _check_devices(model, params, buffers, batch)
    foreach = optim_table.resolve_foreach(optimizer, group_params)
    ostate = optim_table.initial_state(optimizer, pname_of)
    for pn, st in ostate.items():
        for k, t in st.items():
            if t.device != device and not (t.dim() == 0 and t.device.type == "cpu"):
                raise TraceError(f"tensors on mixed devices: optimizer state '{k}' of parameter '{pn}' is on "
                                 f"{t.device}, the model on {device}")
    hvalues = optim_table.optimizer_hyperparameters(optimizer)
    hyper = optim_table.hyperparameter_tensors(optimizer, device)

    pnames, bnames, hnames = list(params), list(buffers), list(hyper)
    state_names = [(pn, k) for pn, st in ostate.items() for k in st]
    in_optimizer = {pname_of[id(p)] for ps in group_params for p in ps}
    # the graph differentiates w.r.t. the parameters the optimizer updates
    trainable = [n for n in pnames if params[n].requires_grad and n in in_optimizer]
    trainable_set = set(trainable)
    n_p, n_b, n_s, n_h, n_x = len(pnames), len(bnames), len(state_names), len(hnames), len(batch.values)
    mstack = ModuleStack(model)
    report: Dict[str, Any] = {}

    def flat_step(*flat):
        with DataDependenceGuard():
            return _flat_step(*flat)

    def _flat_step(*flat):
        from torch.nn.utils.stateless import _reparametrize_module

        o = 0
        p_in, o = flat[o:o + n_p], o + n_p
        b_in, o = flat[o:o + n_b], o + n_b
        s_in, o = flat[o:o + n_s], o + n_s
        h_in, o = flat[o:o + n_h], o + n_h
        x_in = flat[o:]
        leaves = OrderedDict()
        for n, t in zip(pnames, p_in):
            leaf = t.clone()
            if n in trainable_set:
                leaf.requires_grad_(True)
            leaves[n] = leaf
        bufs = OrderedDict((n, t.clone()) for n, t in zip(bnames, b_in))
        it = iter(s_in)
        st_tensors = OrderedDict((pn, OrderedDict((k, next(it).clone()) for k in st)) for pn, st in ostate.items())
        htensors = OrderedDict(zip(hnames, h_in))
        hmode = optim_table.HyperparameterMode(htensors, hvalues)
        taps = _GradientTaps(OrderedDict((n, leaves[n]) for n in trainable))
        bound = optim_table.BoundOptimizer(optimizer, leaves, pname_of, st_tensors, htensors, foreach)
        hook = _StepHook(optimizer, taps, hmode)
        with _reparametrize_module(model, {**leaves, **bufs}, tie_weights=True), bound, taps, hook, \
                torch.enable_grad():
            result = train_step(model, optimizer, batch.rebuild(list(x_in)))
            if hook.calls == 0:
                raise TraceError("train_step never calls optimizer.step(): fxdp traces one optimizer update per step")
            final_state = [bound.final_state(pn, k) for pn, k in state_names]
            new_bufs = [bufs[n] for n in bnames]
        loss, extras = _split_result(result)
        report["extras"] = list(extras)
        report["guards"] = dict(hmode.guards)
        snaps = [taps.snap.get(n) for n in trainable]
        for leaf in leaves.values():
            leaf.grad = None
        outs = [leaf.detach() for leaf in leaves.values()] + new_bufs + final_state
        return outs + [loss.detach()] + [v.detach() for v in extras.values()] + snaps

    flat_real = (
        [params[n].detach() for n in pnames]
        + [buffers[n] for n in bnames]
        + [ostate[pn][k] for pn, k in state_names]
        + [hyper[n] for n in hnames]
        + list(batch.values)
    )
    table = dict(DEFAULT_DECOMPOSITIONS)
    if decompositions:
        table.update(decompositions)
    try:
        with mstack:
            gm1 = make_fx(flat_step, tracing_mode=tracing_mode, decomposition_table=table,
                          _allow_non_fake_inputs=True)(*flat_real)
        gm = make_fx(
            torch.func.functionalize(gm1, remove="mutations"), tracing_mode=tracing_mode, _allow_non_fake_inputs=True
        )(*flat_real)
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

    graph_passes.cleanup(gm)
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(flat_real), (len(placeholders), len(flat_real))
    out_node = next(n for n in graph.nodes if n.op == "output")
    ret = list(out_node.args[0])

    # --- placeholder roles and names
    roles = (
        [(pb.PARAMETER, n, 0) for n in pnames]
        + [(pb.BUFFER, n, 0) for n in bnames]
        + [(pb.OPTIMIZER_STATE, f"optim.{pn}.{k}", 0) for pn, k in state_names]
        + [(pb.HYPERPARAMETER, n, 0) for n in hnames]
        + [(pb.INPUT, n, d) for n, d in zip(batch.names, bdims)]
    )
    for ph, spec in zip(placeholders, roles):
        ph.meta["fxdp_placeholder"] = spec
        # requires_grad is True exactly for the parameters whose gradient the graph computes
        ph.meta["fxdp_requires_grad"] = False

    # --- outputs: changed state, loss, extras; gradient marks
    n_state_out = n_p + n_b + n_s
    n_e = len(report["extras"])
    snaps = ret[n_state_out + 1 + n_e:]
    extra_grads = graph_passes.mark_gradients(graph, snaps, trainable, dict(zip(pnames, placeholders[:n_p])))
    kept = ret[: n_state_out + 1 + n_e]
    out_roles = (
        [(pb.UPDATED_PARAMETER, n) for n in pnames]
        + [(pb.UPDATED_BUFFER, n) for n in bnames]
        + [(pb.UPDATED_OPTIMIZER_STATE, f"optim.{pn}.{k}") for pn, k in state_names]
        + [(pb.LOSS, "")]
        + [(pb.OTHER, "")] * n_e
    )
    final_ret, final_roles = [], []
    for i, (v, r) in enumerate(zip(kept, out_roles)):
        if i < n_state_out and v is placeholders[i]:
            continue  # unchanged state
        final_ret.append(v)
        final_roles.append(r)
    for n in extra_grads:
        final_ret.append(n)
        final_roles.append((pb.OTHER, ""))
    out_node.args = (final_ret,)
    graph.eliminate_dead_code()

    consts = graph_passes.lift_constants(gm, placeholders[n_state_out + n_h] if n_x else None)
    graph_passes.validate_ops(gm)
    final_gm = graph_passes.renamed(graph, final_roles)

    if tracing_mode == "real":
        by_role = {}
        for n, t in zip(pnames, flat_real[:n_p]):
            by_role[(pb.PARAMETER, n)] = t
        for n in bnames:
            by_role[(pb.BUFFER, n)] = buffers[n]
        for pn, k in state_names:
            by_role[(pb.OPTIMIZER_STATE, f"optim.{pn}.{k}")] = ostate[pn][k]
        for n in hnames:
            by_role[(pb.HYPERPARAMETER, n)] = hyper[n]
        for n, t in zip(batch.names, batch.values):
            by_role[(pb.INPUT, n)] = t
        for n, t in consts.items():
            by_role[(pb.CONSTANT, n)] = t
        args = [by_role[n.meta["fxdp_placeholder"][:2]] for n in final_gm.graph.nodes if n.op == "placeholder"]
        try:
            graph_passes.record_real_meta(final_gm, args)
        except Exception as e:  # noqa: BLE001
            raise TraceError(f"the traced graph does not run on the example tensors: {type(e).__name__}: {e}") from e

    meta = [
        ("model", type(model).__name__),
        ("optimizer", type(optimizer).__name__),
        ("optimizer.foreach", ",".join("true" if f else "false" for f in foreach)),
        ("loss_reduction", str(loss_reduction or "mean")),
        ("batch_size", str(next((x.shape[d] for x, d in zip(batch.values, bdims) if d >= 0), -1))),
        ("decompositions", "fxdp-default-v1:native_batch_norm"),
        ("device", str(device)),
        ("train_step", getattr(train_step, "__qualname__", type(train_step).__name__)),
    ]
    if report["extras"]:
        meta.append(("extra_outputs", json.dumps(report["extras"])))
    if report["guards"]:
        meta.append(("hyperparameter_guards", json.dumps(report["guards"])))
    graph_def = convert.fx_to_graphdef(final_gm, meta)

    init = OrderedDict()
    for n in pnames:
        init[n] = params[n].detach().clone()
    for n in bnames:
        init[n] = buffers[n].detach().clone()
    for pn, k in state_names:
        init[f"optim.{pn}.{k}"] = ostate[pn][k].detach().clone()
    for n in hnames:
        init[n] = hyper[n].detach().clone()
    init.update(consts)
    return TracedStep(graph_def, init)


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
