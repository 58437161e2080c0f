"""The user's training step as a function of flat tensors (step 1 of :mod:`fxdp.tracer`).

:func:`flat_step` swaps the model's parameters and buffers for traced tensors, re-points the
user's optimizer at traced parameters, state and hyper-parameter tensors, takes each gradient as
the user's backward(s) leave it (:class:`GradientTaps`), and runs ``train_step`` as written.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any, Callable, Dict, Tuple

import torch
import torch.nn as nn

from . import optimizers as optim_table
from .errors import TraceError
from .hyperparameter_mode import SCALAR_STATE_KEYS, HyperparameterMode
from .step_signature import Signature
from .trace_errors import DataDependenceGuard


@contextlib.contextmanager
def compiling():
    """Make torch.optim take its compile-friendly (tensor step, no .item()) path."""
    orig = torch.compiler.is_compiling
    torch.compiler.is_compiling = lambda: True
    try:
        yield
    finally:
        torch.compiler.is_compiling = orig


class GradientTaps:
    """Takes each trained parameter's gradient as the user's backward(s) leave it (fxdp.tracer's
    docstring, "Gradients")."""

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


class StepHook:
    """Wraps ``optimizer.step`` on the instance: takes the gradients, counts calls, and runs torch's
    code in its compile-friendly path with hyper-parameter tensors."""

    def __init__(self, optimizer, taps: GradientTaps, hmode: HyperparameterMode):
        self.opt, self.taps, self.hmode = optimizer, taps, hmode
        self.calls = 0

    def __enter__(self):
        self.had_own = "step" in self.opt.__dict__
        self.own = self.opt.__dict__.get("step")
        orig = self.opt.step

        def step(*args, **kwargs):
            self.calls += 1
            if self.calls > 1:
                raise TraceError(
                    f"train_step calls optimizer.step() more than once (again at {self._caller()}); "
                    "one traced step is one optimizer update"
                )
            self.taps.at_step()
            with torch.no_grad(), compiling(), self.hmode:
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


def split_result(result) -> Tuple[torch.Tensor, "OrderedDict[str, torch.Tensor]"]:
    """train_step returns the loss, (loss, {name: tensor}), (loss, t1, t2...), or {"loss": ..., name: ...}."""
    extras: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    if isinstance(result, dict):
        if "loss" not in result:
            raise TraceError(
                f"train_step returned a dict without a 'loss' entry (keys {list(result)})"
            )
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


def flat_step(
    sig: Signature, train_step, model: nn.Module, optimizer, report: Dict[str, Any]
) -> Callable:
    """The user's step as a function of flat tensors (fxdp.tracer's docstring, step 1). Returns
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
        st_tensors = OrderedDict(
            (pn, OrderedDict((k, next(it).clone()) for k in st)) for pn, st in sig.ostate.items()
        )
        htensors = OrderedDict(zip(sig.hnames, h_in))
        hmode = HyperparameterMode(
            htensors,
            sig.hvalues,
            [t for st in st_tensors.values() for k, t in st.items() if k in SCALAR_STATE_KEYS],
        )
        taps = GradientTaps(OrderedDict((n, leaves[n]) for n in sig.trainable))
        bound = optim_table.BoundOptimizer(
            optimizer, leaves, sig.pname_of, st_tensors, htensors, sig.foreach
        )
        hook = StepHook(optimizer, taps, hmode)
        with (
            _reparametrize_module(model, {**leaves, **bufs}, tie_weights=True),
            bound,
            taps,
            hook,
            torch.enable_grad(),
        ):
            result = train_step(model, optimizer, sig.batch.rebuild(list(x_in)))
            if hook.calls == 0:
                raise TraceError(
                    "train_step never calls optimizer.step(): fxdp traces one optimizer update per step"
                )
            final_state = [bound.final_state(pn, k) for pn, k in sig.state_names]
            new_bufs = [bufs[n] for n in sig.bnames]
        loss, extras = split_result(result)
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
