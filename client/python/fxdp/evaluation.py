"""Evaluation steps (docs/evaluation.md): ``fxdp.trace_eval(eval_step, model, example_batch)``
traces the forward pass and metrics without an optimizer into a graph with no UPDATED_* output,
which runs data-parallel like a training step (``run_local``, ``fxdp-worker run``,
``Client.train``) against a given state and leaves it unchanged."""

from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict
from typing import Any, Callable, Dict, Mapping, Sequence, Union

import torch
from torch import nn

from .errors import TraceError
from .v1 import graph_pb2 as gpb

_UPDATED = (gpb.UPDATED_PARAMETER, gpb.UPDATED_BUFFER, gpb.UPDATED_OPTIMIZER_STATE)
# Metadata of the training step that an evaluation graph does not have.
_TRAINING_METADATA = ("optimizer", "optimizer.foreach", "hyperparameter_guards")


def trace_eval(
    eval_step: Callable[..., Any],
    model: nn.Module,
    example_batch: Union[torch.Tensor, Sequence[torch.Tensor], Dict[str, torch.Tensor]],
    **kwargs,
):
    """Trace ``eval_step(model, batch)`` (forward and metrics, no ``backward``, no optimizer)
    into a :class:`fxdp.TracedStep`. It returns what a training step returns: the loss (the
    metric the job reports per step), ``(loss, {name: metric})`` or ``{"loss": ..., name: ...}``.

    Data-parallel, every rank evaluates its slice of the batch and each output is combined as
    one device would compute it: a mean over the batch is the rows-weighted mean of the ranks'
    means (exact for uneven splits, B_r/B), a sum the sum (the analysis' P(avg) and P(sum)).
    The graph has no UPDATED_* output: running it leaves the state as it is. Its state is the
    model's parameters and buffers, by the same names as a training step's: ``run_local`` takes a
    trained state (``TrainResult.state``) as it is (its optimizer entries kept, unchanged); a job
    takes exactly the graph's entries (``{k: trained[k] for k in step.initial_state()}``).

    ``kwargs`` are ``fxdp.trace_step``'s (``batch_dim``, ``input_names``, ``loss_reduction``,
    ``tracing_mode``, ...). A step that would change the state (a BatchNorm in training mode
    updates its running statistics) is a :class:`fxdp.TraceError` naming the state: call
    ``model.eval()`` first."""
    from .tracer import trace_step

    # A stand-in the tracer requires: no gradient exists under no_grad, so its step updates
    # nothing and the graph gets no UPDATED_* output for it.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

    def step(model, optimizer, batch):
        with torch.no_grad():
            result = eval_step(model, batch)
        optimizer.step()
        return result

    step.__name__ = getattr(eval_step, "__name__", "eval_step")
    traced = trace_step(step, model, optimizer, example_batch, **kwargs)
    return _evaluation_graph(traced)


def _evaluation_graph(traced):
    from .traced import TracedStep

    g = gpb.GraphDef()
    g.CopyFrom(traced.graph)
    out = g.nodes[len(g.nodes) - 1]
    updated = [s.state_name for s in out.output_specs if s.role in _UPDATED]
    if updated:
        raise TraceError(
            f"trace_eval: the evaluation step changes the state ({', '.join(updated)}): a module "
            "in training mode (BatchNorm updates its running statistics); call model.eval() "
            "before trace_eval"
        )
    drop = {
        i
        for i, n in enumerate(g.nodes)
        if n.kind == gpb.PLACEHOLDER and n.placeholder.role == gpb.HYPERPARAMETER
    }
    dropped = {g.nodes[i].placeholder.state_name for i in drop}
    _remove_nodes(g, drop)
    kept = [kv for kv in g.metadata if kv.key not in _TRAINING_METADATA]
    del g.metadata[:]
    g.metadata.extend(kept)
    g.metadata.add(key="step_kind", value="evaluation")
    state = OrderedDict((k, v) for k, v in traced.initial_state().items() if k not in dropped)
    return TracedStep(g, state)


def _remove_nodes(g: "gpb.GraphDef", drop) -> None:
    """Removes the nodes at indices ``drop`` (nothing may use them) and renumbers every
    reference to a later node (ValueRef.node, Symbol.input_node)."""
    new_index, k = {}, 0
    for i in range(len(g.nodes)):
        if i not in drop:
            new_index[i] = k
            k += 1
    nodes = [n for i, n in enumerate(g.nodes) if i not in drop]

    def fix(msg) -> None:
        for field, value in msg.ListFields():
            if field.type != field.TYPE_MESSAGE:
                continue
            for m in value if field.is_repeated else [value]:
                if m.DESCRIPTOR.full_name == "fxdp.v1.ValueRef":
                    if m.node in drop:
                        raise TraceError(f"trace_eval: node {m.node} is used; it cannot be removed")
                    m.node = new_index[m.node]
                else:
                    fix(m)

    for n in nodes:
        fix(n)
    for s in g.symbols:
        s.input_node = new_index[s.input_node]
    kept = [gpb.Node() for _ in nodes]
    for dst, src in zip(kept, nodes):
        dst.CopyFrom(src)
    del g.nodes[:]
    g.nodes.extend(kept)


@dataclasses.dataclass
class Evaluated:
    """One evaluation of a job's state (``Client.train(eval=...)``; JobEvent.eval): after job
    step ``step``, each metric (``"loss"`` for the loss, then the step's named outputs) summed
    over the ``batches`` evaluation batches, each batch's as one device computes it."""

    step: int
    metrics: Dict[str, float]
    batches: int
    eval_ms: float = 0.0

    @property
    def means(self) -> Dict[str, float]:
        """Each metric's mean over the evaluation batches (a per-batch mean stays a mean)."""
        return {k: v / self.batches for k, v in self.metrics.items()} if self.batches else {}

    @staticmethod
    def of(m) -> "Evaluated":
        return Evaluated(m.step, {v.name: v.value for v in m.metrics}, m.batches, m.eval_ms)


def eval_policy(step, train_state: Mapping[str, torch.Tensor], every: int, data):
    """The ``EvalPolicy`` of ``Client.train(eval=step, eval_data=data, eval_every=every)``. The
    server checks that the evaluation graph reads only the training state (names, dtypes,
    shapes); what it cannot see are values: each constant the evaluation graph lifted (a tensor
    built in ``forward``) must equal the training state's of that name, else a ValueError."""
    from .v1 import worker_pb2 as wpb

    if isinstance(data, (str, os.PathLike)):
        data = [data]
    paths = [os.fspath(p) for p in data or ()]
    if not paths:
        raise ValueError("train(eval=...) needs eval_data: the evaluation batches on the workers")
    if every is None or int(every) < 0:
        raise ValueError(
            f"train(eval=...): eval_every must be >= 0 (0: after the last step), got {every}"
        )
    consts = {
        n.placeholder.state_name
        for n in step.graph.nodes
        if n.kind == gpb.PLACEHOLDER and n.placeholder.role == gpb.CONSTANT
    }
    mine = step.initial_state()
    for name in sorted(consts):
        theirs = train_state.get(name)
        if theirs is None or not torch.equal(theirs.cpu(), mine[name].cpu()):
            raise ValueError(
                f"train(eval=...): the evaluation graph's constant '{name}' "
                + (
                    "is not in the training state"
                    if theirs is None
                    else "differs from the training state's"
                )
                + ": a job's evaluation reads the training state only; make the tensor a buffer of the model"
            )
    return wpb.EvalPolicy(graph=step.graph, data_paths=paths, every=int(every))
