"""``@fxdp.compile``: a training step function that traces itself on first call (in the spirit of
``torch.distributed._spmd``'s ``@compile``).

    @fxdp.compile(batch_dim=0)
    def train_step(model, opt, batch):
        loss = loss_fn(model(batch[0]), batch[1])
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for batch in batches:
        loss = train_step(model, opt, batch)   # traced once, then the graph runs (torch.fx)
        sched.step()                           # an eager scheduler keeps working
    train_step.traced                          # the TracedStep, e.g. for fxdp.Client.train

Each call feeds the graph the live model's parameters and buffers, the optimizer's state and
its param groups' current hyper-parameters (so a scheduler stepped between calls takes effect),
and writes the updated tensors back in place, so eager code before, between and after the calls
sees the same model and optimizer as eager training would.

Shapes (docs/shapes.md): the step is traced once with symbolic sizes (``dynamic=True``, the
default: every dim of every input), and a batch of a new shape runs that trace's instance for its
shape (``TracedStep.instantiate``: a guard check and a substitution, no trace). A batch whose
shape breaks a guard the trace assumed (``if x.shape[0] < 6``, a micro-batch of one row) is traced
again with itself as the example: a second variant (the variants are tried in turn, the most
recently used first). The last ``max_shapes`` variants (default 8) are kept, each with its last
16 shapes' instances. A call with
another model or optimizer, or a batch of other dtypes or ranks, traces again. ``dynamic=False``
traces each shape (``max_shapes`` traces kept); bound the shapes a data loader yields anyway (pad
to a multiple: ``DataCollatorWithPadding(pad_to_multiple_of=64)``, or bucket by length): each
shape is a graph to build and run. ``traces`` counts the traces made.

On workers: ``Client.train(train_step, ...)`` (once called) sends ``train_step.variant``, the trace
of its last call, as it is: symbolic with ``dynamic=True``, so one job runs every batch shape, each
compiled once on the server (docs/shapes.md).
"""

from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from typing import Any, Callable, Dict, Tuple

import torch

from .optimizers import optimizer_hyperparameters

__all__ = ["compile", "CompiledStep"]


def _batch_key(batch, shapes: bool = True) -> Tuple:
    """The batch's structure, dtypes and shapes (``shapes=False``: ranks instead)."""
    if isinstance(batch, torch.Tensor):
        return (tuple(batch.shape) if shapes else batch.dim(), batch.dtype)
    if isinstance(batch, dict):
        return tuple((k, _batch_key(v, shapes)) for k, v in batch.items())
    return tuple(_batch_key(v, shapes) for v in batch)


class CompiledStep:
    """The callable ``@fxdp.compile`` returns (see the module docstring)."""

    def __init__(self, fn: Callable, trace_kwargs: Dict[str, Any], max_shapes: int = 8):
        if max_shapes < 1:
            raise ValueError(f"max_shapes must be at least 1, got {max_shapes}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.trace_kwargs = {"dynamic": True, **trace_kwargs}
        self.max_shapes = max_shapes
        self.traced = None  # the TracedStep of the last call
        self.variant = None  # the trace it is an instance of (symbolic with dynamic=True)
        self.traces = 0
        # (id(model), id(optimizer), batch key) -> (model ref, optimizer ref, TracedStep), most
        # recently used last; the refs tell a live object from a new one that reuses a dead id.
        self._cache: "OrderedDict[Tuple, Tuple[Any, Any, Any]]" = OrderedDict()
        self.step = 0  # calls so far (every shape): the step number random ops draw for

    def _step_for(self, model, optimizer, batch):
        """The static TracedStep for this batch: a kept trace's (a symbolic one's instance for
        the batch's shape, the first variant whose guards hold), else a new trace's."""
        from .errors import ShapeError
        from .tracer import trace_step

        dynamic = bool(self.trace_kwargs["dynamic"])
        structure = _batch_key(batch, shapes=not dynamic)
        for key in [
            k for k in reversed(self._cache) if k[:3] == (id(model), id(optimizer), structure)
        ]:
            m, o, variant = self._cache[key]
            if m() is not model or o() is not optimizer:
                continue
            try:
                step = variant.instantiate(batch)
            except ShapeError:
                continue  # its guards do not hold: the next variant, or a new trace
            self._cache.move_to_end(key)
            self.variant = variant
            return step
        variant = trace_step(self.fn, model, optimizer, batch, **self.trace_kwargs)
        self.traces += 1
        key = (id(model), id(optimizer), structure, self.traces)
        self._cache[key] = (weakref.ref(model), weakref.ref(optimizer), variant)
        while len(self._cache) > self.max_shapes:
            self._cache.popitem(last=False)
        self.variant = variant
        return variant.instantiate(batch)

    def __call__(self, model, optimizer, batch):
        step = self.traced = self._step_for(model, optimizer, batch)
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())
        init = step.initial_state()
        state = {}
        for name in step.state_names():
            if name in params:
                state[name] = params[name].detach()
            elif name in buffers:
                state[name] = buffers[name]
            else:
                state[name] = self._optimizer_tensor(optimizer, params, name, init)
        state.update(
            {
                n: torch.tensor(v, dtype=init[n].dtype, device=init[n].device)
                for n, v in optimizer_hyperparameters(optimizer).items()
                if n in init
            }
        )
        self.step += 1
        new, loss, outs = step.run_local(state, batch, outputs=True, step=self.step)
        with torch.no_grad():
            for name, t in new.items():
                if name in params:
                    params[name].copy_(t)
                elif name in buffers:
                    buffers[name].copy_(t)
                elif name.startswith("optim."):  # hyper-parameters and constants are not written
                    self._write_optimizer_tensor(optimizer, params, name, t)
        return (loss, dict(outs)) if outs else loss

    @staticmethod
    def _split(params, name: str):
        """'optim.<param>.<key>' -> (parameter, key), or None for hyper-parameters/constants."""
        body = name[len("optim.") :]
        for pn in sorted(params, key=len, reverse=True):
            if body.startswith(pn + "."):
                return params[pn], body[len(pn) + 1 :]
        return None

    def _optimizer_tensor(self, optimizer, params, name: str, init) -> torch.Tensor:
        hit = self._split(params, name) if name.startswith("optim.") else None
        if hit is not None:
            p, k = hit
            v = optimizer.state.get(p, {}).get(k)
            if isinstance(v, torch.Tensor):
                return v if v.dim() > 0 else v.to(init[name].dtype)
        return init[name]

    def _write_optimizer_tensor(self, optimizer, params, name: str, t: torch.Tensor) -> None:
        hit = self._split(params, name)
        if hit is None:
            return
        p, k = hit
        st = optimizer.state[p]
        cur = st.get(k)
        if isinstance(cur, torch.Tensor) and cur.shape == t.shape and cur.dtype == t.dtype:
            cur.copy_(t)
        else:
            st[k] = t.clone()


def compile(max_shapes: int = 8, **trace_kwargs) -> Callable[[Callable], CompiledStep]:  # noqa: A001
    """Decorator: ``@fxdp.compile(batch_dim=0)`` over ``train_step(model, optimizer, batch)``;
    ``max_shapes``: how many traces are kept (symbolic variants; with ``dynamic=False`` one per
    shape); the other keyword arguments are :func:`fxdp.trace_step`'s (``dynamic`` defaults to
    True here)."""

    def wrap(fn: Callable) -> CompiledStep:
        return CompiledStep(fn, trace_kwargs, max_shapes)

    return wrap
