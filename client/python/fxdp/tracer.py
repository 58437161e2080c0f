"""Tracing the user's training step (forward, loss, backward(s), clipping, optimizer update) into
one functional aten graph.

``fxdp.trace_step(train_step, model, optimizer, example_batch)`` traces an ordinary eager step
function ``train_step(model, optimizer, batch)``; ``fxdp.trace(model, optimizer, loss_fn, batch)``
is the shortcut for ``loss_fn(model(*x), y).backward(); optimizer.step()``.

How it works
------------
``trace_step`` is a short orchestrator over these named steps:

1. (:class:`fxdp.step_signature.Signature`, :func:`fxdp.flat_step.flat_step`) The step becomes a
   function of flat tensors ``step(*params, *buffers, *optimizer_state, *hyperparameters, *inputs)``
   (the signature also checks the model, optimizer and batch). Inside it, the model's
   parameters and buffers are swapped for traced tensors (``torch.nn.utils.stateless``), and the
   user's own ``torch.optim`` object is re-pointed at the traced parameters, state and
   hyper-parameter tensors (:class:`fxdp.optimizers.BoundOptimizer`); then ``train_step`` runs as
   written: ``loss.backward()`` fills ``.grad``, ``clip_grad_norm_`` scales it in place,
   ``optimizer.step()`` updates, ``zero_grad()`` clears, a Python loop over micro-batches unrolls.
2. (``_make_graph``) Pass 1: ``make_fx(step, tracing_mode=..., decomposition_table=...)`` records every aten op
   below autograd (so the backward ops are explicit nodes); :class:`fxdp.trace_errors.SourceRecorder` gives
   each node the user's line that produced it (``Node.source``: file:line, submodule, code; a backward op
   its forward op's line), which every compile error quotes. The default ``"auto"`` mode traces
   on FakeTensors (nothing runs; a model on ``meta`` traces) and checks the layouts FakeTensors may
   get wrong (:mod:`fxdp.layouts`), tracing again in ``"real"`` mode where one differs (or
   where the fake trace fails); ``"real"``
   runs the step on the real example tensors, so layouts and view decisions are exactly those of
   the real kernels; ``"fake"`` traces on FakeTensors without the check.
   :class:`fxdp.trace_errors.DataDependenceGuard` turns data-dependent ops
   (``.item()``/``bool()`` on tensors, ``nonzero``, boolean masks...) into TraceErrors naming the
   user's file:line. Hugging Face models build their attention
   masks from a 2-D ``attention_mask`` on the path that is right for every batch
   (:mod:`fxdp.hf_masks`).
3. Pass 2: the pass-1 graph is re-traced (node by node, keeping each node's source) under
   ``torch.func.functionalize(remove="mutations")``,
   which turns every in-place op (gradient accumulation, clipping's ``mul_``, the optimizer's
   ``_foreach_*_``, BatchNorm running-stat updates) into its functional variant. Views stay views.
4. Graph passes (:mod:`fxdp.graph_passes`): identity ops, profiler ops and input clones are
   removed (``cleanup``); placeholders get roles, gradients are marked with ``grad_of`` and
   outputs that did not change are dropped (``assign_roles``); tensor constants become CONSTANT
   placeholders (``lift_constants``); every op is checked (``validate_ops``) and placeholders are
   named after their state (``renamed``); in real mode the graph runs once more to record exact
   layouts (``record_layouts``). ``_metadata`` and ``_initial_state`` give the TracedStep its
   metadata and state.

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
has) is a HYPERPARAMETER placeholder, a 0-d float64 tensor named ``optim.group<g>.<key>``; the
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
``DEFAULT_DECOMPOSITIONS`` (:mod:`fxdp.decompositions`): ``aten.native_batch_norm.default`` is
rewritten to ``aten._native_batch_norm_legit`` (PyTorch's own decomposition), whose schema declares
the running-stat mutation so functionalization sees it; mean-reduced ``nll_loss`` becomes the sum
divided by its total weight, a value the data-parallel analysis all-reduces (a mean over counted
targets, e.g. with ``ignore_index``, is then exact on N ranks). Nothing else is decomposed: the graph stays at
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
import os
import sys
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.fx.traceback as fx_traceback
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

from . import convert, graph_passes, hf_masks, layouts
from . import decompositions as decompositions_table
from . import dynamic as dyn
from .errors import TraceError
from .flat_step import flat_step
from .optimizers import SUPPORTED_OPTIMIZERS
from .step_signature import Signature
from .trace_errors import ModuleStack, SourceRecorder, as_trace_error, node_source, user_frame

aten = torch.ops.aten

__all__ = ["trace", "trace_step", "DEFAULT_DECOMPOSITIONS", "SUPPORTED_OPTIMIZERS"]


DEFAULT_DECOMPOSITIONS = decompositions_table.default_decompositions()


def _gradscaler_in(tb) -> bool:
    import traceback

    return any("grad_scaler" in fr.filename for fr in traceback.extract_tb(tb))


# --------------------------------------------------------------------------- the steps of trace_step


@contextlib.contextmanager
def _onednn_off():
    """oneDNN off while tracing (only that flag; torch.backends.mkldnn.flags also resets others):
    on CPU, nn.LSTM's oneDNN kernel records mkldnn_rnn_layer_backward, whose `workspace` make_fx
    leaves undefined, so the graph cannot run; with it off LSTM traces to plain aten ops."""
    was = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(was)


def _make_graph(
    step: Callable,
    args: List[torch.Tensor],
    mstack: ModuleStack,
    tracing_mode: str,
    decompositions: Optional[Dict[Any, Callable]],
) -> torch.fx.GraphModule:
    """Passes 1 and 2 of the module docstring: ``make_fx`` records the aten ops, then
    functionalization removes every mutation. Every failure becomes a TraceError naming what it can."""
    table = dict(DEFAULT_DECOMPOSITIONS)
    if decompositions:
        table.update(decompositions)
    recorder = SourceRecorder(mstack)

    def recorded(*flat):
        with recorder:
            return step(*flat)

    def replay(*flat):  # runs gm1 node by node, so pass 2's nodes inherit each node's source
        return torch.fx.Interpreter(gm1).run(*flat)

    try:
        with (
            mstack,
            hf_masks.explicit_attention_masks(),
            _onednn_off(),
            fx_traceback.preserve_node_meta(),
        ):
            gm1 = make_fx(
                recorded,
                tracing_mode=tracing_mode,
                decomposition_table=table,
                _allow_non_fake_inputs=True,
            )(*args)
        with _onednn_off(), fx_traceback.preserve_node_meta():
            return make_fx(
                torch.func.functionalize(replay, remove="mutations"),
                tracing_mode=tracing_mode,
                _allow_non_fake_inputs=True,
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


class _Progress:
    """One line on stderr while tracing ("fxdp: tracing GPT2LMHeadModel (124,439,808 parameters) on
    fake tensors ... 4013 nodes in 9.8 s"), when stderr is a terminal or $FXDP_PROGRESS is 1."""

    def __init__(self, model, sig: Signature, mode: str):
        self.t0 = time.monotonic()
        self.on = os.environ.get("FXDP_PROGRESS", "1" if sys.stderr.isatty() else "0") == "1"
        n = sum(p.numel() for p in sig.params.values())
        on = "real tensors" if mode == "real" else "fake tensors"
        self.say(f"fxdp: tracing {type(model).__name__} ({n:,} parameters) on {on} ...")

    def say(self, text: str, end: str = " ") -> None:
        if self.on:
            sys.stderr.write(text + end)
            sys.stderr.flush()

    def done(self, nodes: int) -> None:
        self.say(f"{nodes} nodes in {time.monotonic() - self.t0:.1f} s", "\n")


@contextlib.contextmanager
def _fake_cache_off():
    """FakeTensor's dispatch cache off while tracing: it answered an op with the layout of an earlier
    call in the process (HF BART's ``shift_tokens_right`` ``copy``: storage offset 1 or 0 depending
    on what was traced before), so a graph depended on the traces before it."""
    import torch._dynamo.config as dynamo_config

    with dynamo_config.patch(fake_tensor_cache_enabled=False):
        yield


def _traced(step, sig: Signature, model, mode: str, decompositions, progress: _Progress):
    """``_make_graph`` in ``mode``; "auto" traces on FakeTensors and checks the layouts FakeTensors
    may get wrong (fxdp.layouts): where one differs, it traces again on real tensors (a model on
    meta: TraceError). Returns the graph and the mode that made it."""
    fake_mode = "fake" if mode == "auto" else mode
    try:
        with _fake_cache_off():
            gm = _make_graph(
                step, sig.example_args(), ModuleStack(model), fake_mode, decompositions
            )
    except TraceError as e:
        if mode != "auto" or sig.device.type == "meta":
            raise
        # a meta kernel stricter than the real one (_grouped_mm's refuses float32), or the user's
        # error, which real mode raises as it always did
        progress.say(f"\n  on fake tensors: {str(e)[:300]}: tracing again on real tensors ...")
        return _make_graph(
            step, sig.example_args(), ModuleStack(model), "real", decompositions
        ), "real"
    if mode != "auto":
        return gm, mode
    bad = layouts.check(gm, sig.trace_device)
    if not bad:
        return gm, "fake"
    n, fake, real = bad[0]
    what = (
        f"node '{n.name}' ({layouts._op_name(n)}) at {node_source(n) or 'an unknown line'} lays out "
        f"its output as {real} on {sig.trace_device}, FakeTensor says {fake}"
    )
    if sig.device.type == "meta":
        raise TraceError(
            f"{what}: the graph traced on fake tensors would not be exact, and a model on meta "
            "cannot be traced on real ones; build it with weights, or pass tracing_mode='fake' to "
            "accept FakeTensor's layouts (a view they allow that the kernel's do not fails at run time)"
        )
    progress.say(f"\n  {what}: tracing again on real tensors ...")
    return _make_graph(step, sig.example_args(), ModuleStack(model), "real", decompositions), "real"


def _traced_symbolic(step, sig: Signature, model, mode: str, decompositions, dims):
    """``_make_graph`` with symbolic input dims (fxdp.dynamic); "auto" checks the layouts at the
    example's sizes. Returns the graph and its ShapeEnv."""
    if mode == "real":
        raise TraceError(
            "dynamic=True traces on FakeTensors (tracing_mode 'auto', the default, checks their "
            "layouts at the example's sizes); tracing_mode='real' runs one shape: use dynamic=False"
        )
    args, env = dyn.symbolic_args(sig, dims)
    with _fake_cache_off():
        gm = _make_graph(step, args, ModuleStack(model), "symbolic", decompositions)
    if mode == "auto":
        with dyn.frozen(env):
            dyn.check_layouts(gm, sig.trace_device)
    return gm, env, args[len(args) - len(sig.batch.values) :]


def _metadata(
    sig: Signature, model, optimizer, train_step, loss_reduction, report
) -> List[Tuple[str, str]]:
    meta = [
        ("model", type(model).__name__),
        ("optimizer", type(optimizer).__name__),
        ("optimizer.foreach", ",".join("true" if f else "false" for f in sig.foreach)),
        ("loss_reduction", str(loss_reduction or "mean")),
        (
            "batch_size",
            str(next((x.shape[d] for x, d in zip(sig.batch.values, sig.bdims) if d >= 0), -1)),
        ),
        ("decompositions", decompositions_table.NAME),
        ("device", str(sig.trace_device)),
        ("train_step", getattr(train_step, "__qualname__", type(train_step).__name__)),
    ]
    if sig.non_persistent:  # not in model.state_dict(): fxdp export leaves them out
        meta.append(("fxdp.non_persistent_buffers", "\n".join(sig.non_persistent)))
    if report["extras"]:
        meta.append(("extra_outputs", json.dumps(report["extras"])))
    if report["guards"]:
        meta.append(("hyperparameter_guards", json.dumps(report["guards"])))
    return meta


def _specialized(env, sig: Signature, fakes, dims, dynamic) -> List[Tuple[str, str]]:
    """Metadata ``fxdp.specialized`` (and a warning) for the dims ``dynamic`` asked for that the
    step made static (fxdp.dynamic.specialized)."""
    import warnings

    found = dyn.specialized(env, sig.batch.names, fakes, dims)
    if not found:
        return []
    if isinstance(dynamic, dict):  # dims the caller named (dynamic=True: models pin feature dims)
        text = "; ".join(
            f"input '{s['input']}' dim {s['dim']} = {s['value']}: {s['why']}" for s in found
        )
        warnings.warn(f"fxdp: dynamic dims traced as static ({text})", stacklevel=3)
    return [("fxdp.specialized", json.dumps(found))]


def _initial_state(
    sig: Signature, consts: "OrderedDict[str, torch.Tensor]"
) -> "OrderedDict[str, torch.Tensor]":
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
    tracing_mode: str = "auto",
    device: Union[None, str, torch.device] = None,
    seed: Optional[int] = None,
    dynamic: Union[bool, Dict[str, Sequence[int]]] = False,
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

    ``tracing_mode``: ``"auto"`` (default: FakeTensors, checked, see the module docstring),
    ``"real"`` or ``"fake"``. A model built on the ``meta`` device (no memory behind its weights)
    traces in auto or fake mode as if it were on ``device`` (``"cpu"`` by default, or ``"cuda"``); its
    batch may be on ``meta`` or any device (only shapes are read). Its ``initial_state()`` holds
    meta tensors but for the hyper-parameters: a job's state comes from elsewhere
    (``Client.train(state=fxdp.state_of(step, model, optimizer))`` of the same model built with
    weights). Workers run any graph on their own device, whatever it was traced on.

    A step with random ops (dropout...) records ``seed`` in the graph (metadata ``fxdp.seed``;
    default: a number drawn from torch's default generator, so ``torch.manual_seed`` before tracing
    makes runs reproducible): the workers and ``run_local`` draw every random value from fxdp's
    generator keyed by it, the step number and the node (docs/randomness.md).

    ``dynamic=True`` traces once for every batch shape (docs/shapes.md): each dim of each input is
    a symbol (``dynamic={"input_ids": [0, 1]}`` names the dims; the others stay static), the graph
    carries its sizes as expressions of them and the guards the step assumed (each with the user's
    line), and ``TracedStep.instantiate(batch)`` (``run_local``) makes the static graph of a batch.
    Dims the step forced to one value (or of size 0 or 1 in the example) stay static; they are
    listed in the metadata ``fxdp.specialized`` (and warned about when the dict named them).

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
    if tracing_mode not in ("auto", "real", "fake"):
        raise TraceError(f"tracing_mode must be 'auto', 'real' or 'fake', got {tracing_mode!r}")
    sig = Signature(model, optimizer, example_batch, batch_dim, input_names, device)
    if sig.device.type == "meta" and tracing_mode == "real":
        raise TraceError(
            "the model is on the meta device (no values to run): trace it with tracing_mode='auto' (the default) or 'fake'"
        )

    report: Dict[str, Any] = {}
    step = flat_step(sig, train_step, model, optimizer, report)
    progress = _Progress(model, sig, tracing_mode)
    env = None
    if dynamic:
        dims = dyn.dynamic_dims(dynamic, sig.batch.names, sig.batch.values)
        gm, env, fakes = _traced_symbolic(step, sig, model, tracing_mode, decompositions, dims)
    else:
        gm, tracing_mode = _traced(step, sig, model, tracing_mode, decompositions, progress)
    with dyn.frozen(env) if env is not None else contextlib.nullcontext():
        graph_passes.cleanup(gm, dynamic=env is not None)
        first_input = graph_passes.first_input(gm.graph, sig)
        output_roles = graph_passes.assign_roles(gm.graph, sig, len(report["extras"]))
        consts = graph_passes.lift_constants(gm, first_input)
        if env is not None:
            graph_passes.fold_sizes(gm)
        graph_passes.validate_ops(gm)
        final_gm = graph_passes.renamed(gm.graph, output_roles)
        if tracing_mode == "real":
            graph_passes.record_layouts(final_gm, sig, consts)
        progress.done(len(gm.graph.nodes))
        meta = _metadata(sig, model, optimizer, train_step, loss_reduction, report)
        if env is not None:
            meta += _specialized(env, sig, fakes, dims, dynamic)
        graph_def = convert.fx_to_graphdef(final_gm, meta, shape_env=env)
    traced = TracedStep(graph_def, _initial_state(sig, consts))
    if traced.random_nodes():
        traced.set_seed(int(torch.randint(0, 2**63 - 1, ()).item()) if seed is None else seed)
    return traced


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
    tracing_mode: str = "auto",
    device: Union[None, str, torch.device] = None,
    seed: Optional[int] = None,
    dynamic: Union[bool, Dict[str, Sequence[int]]] = False,
):
    """Trace the step ``loss_fn(model(*inputs[:n]), *inputs[n:]).backward(); optimizer.step()``.

    A shortcut over :func:`trace_step`. ``n = num_model_inputs`` defaults to all inputs but the
    last (the target) when a ``loss_fn`` is given, and to all inputs when ``loss_fn`` is None (the
    model returns the loss). ``loss_reduction`` defaults to ``loss_fn.reduction`` or ``"mean"``.
    ``seed``, ``dynamic``: as :func:`trace_step`'s.
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
    return trace_step(
        train_step,
        model,
        optimizer,
        example_inputs,
        batch_dim=batch_dim,
        input_names=input_names,
        loss_reduction=red,
        decompositions=decompositions,
        tracing_mode=tracing_mode,
        device=device,
        seed=seed,
        dynamic=dynamic,
    )
