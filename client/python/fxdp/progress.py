"""Throughput of a job as its steps come in (issue 26): steps/s and samples/s (tokens/s for a batch
of token ids) over the last steps, and one line per step for ``Client.train(progress=True)``.
``fxdp run`` shows the same (client/cli/run_command.cc, StepRate)."""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from typing import Dict, Optional, TextIO, Tuple

from .v1 import graph_pb2 as gpb


def _count_inputs(graph: "gpb.GraphDef") -> Tuple[Optional[Tuple[str, int]], Optional[str]]:
    """The INPUT whose batch dim counts samples (its name and batch dim: the graph's first INPUT
    with a batch dim) and the one whose elements count tokens (its first integer INPUT of 2+ dims
    with a batch dim: token ids), with their placeholders."""
    samples = tokens = None
    for n in graph.nodes:
        if n.kind != gpb.PLACEHOLDER or n.placeholder.role != gpb.INPUT or not n.outputs:
            continue
        t, d = n.outputs[0].tensor, n.placeholder.batch_dim
        if not 0 <= d < len(t.shape):
            continue
        samples = samples or (n, d)
        if tokens is None and t.dtype in (gpb.INT64, gpb.INT32) and len(t.shape) >= 2:
            tokens = n
    return samples, tokens


def batch_counts(graph: "gpb.GraphDef", shape: str = "") -> Tuple[int, int]:
    """``(samples, tokens)`` of one step's global batch: the batch dim's size of the graph's first
    INPUT that has one, and the element count of its first integer INPUT of 2+ dims with a batch
    dim (token ids; 0 when there is none). ``shape``: the step's global batch shape
    (``JobEvent.shape``, ``"input_ids=8x60 labels=8x60"``) when the graph has symbolic sizes;
    without it a size that varies per batch is not known: 0."""
    given = {}
    for part in shape.split():
        name, _, dims = part.rpartition("=")
        if name and all(x.isdigit() for x in dims.split("x")):
            given[name] = [int(x) for x in dims.split("x")]
    first, token_node = _count_inputs(graph)
    samples = tokens = 0
    if first is not None:
        n, d = first
        t = n.outputs[0].tensor
        dims = given.get(n.placeholder.state_name)
        varies = bool(t.shape_expr) and bool(t.shape_expr[d])
        samples = dims[d] if dims is not None and d < len(dims) else 0 if varies else t.shape[d]
    if token_node is not None:
        t = token_node.outputs[0].tensor
        dims = given.get(token_node.placeholder.state_name)
        tokens = (
            math.prod(dims) if dims is not None else 0 if any(t.shape_expr) else math.prod(t.shape)
        )
    return samples, tokens


class StepRate:
    """Steps per second over the last ``window`` steps seen (by the time each came in), and the
    samples and tokens per second of those steps (each step's own counts: batches of several
    sizes count what each step held)."""

    def __init__(self, window: int = 20):
        self._seen: deque = deque(maxlen=window)

    def add(
        self, step: int, now: Optional[float] = None, samples: int = 0, tokens: int = 0
    ) -> Optional[float]:
        """Records ``step`` done at ``now`` (default: the monotonic clock) with its batch's
        ``samples`` and ``tokens``; the steps/s, None until two steps were seen."""
        self._seen.append((step, time.monotonic() if now is None else now, samples, tokens))
        (s0, t0, _, _), (s1, t1, _, _) = self._seen[0], self._seen[-1]
        return (s1 - s0) / (t1 - t0) if s1 > s0 and t1 > t0 else None

    def per_second(self) -> Tuple[float, float]:
        """``(samples/s, tokens/s)`` of the steps after the window's first (0 when a step's count
        is not known, or before two steps)."""
        seen = list(self._seen)
        dt = seen[-1][1] - seen[0][1] if len(seen) > 1 else 0
        if dt <= 0:
            return 0.0, 0.0
        rates = []
        for k in (2, 3):
            counts = [x[k] for x in seen[1:]]
            rates.append(sum(counts) / dt if all(counts) else 0.0)
        return rates[0], rates[1]


class Progress:
    """``on_step`` of ``Client.train``: with ``out`` (``progress=True``: stderr) prints ``step
    3/10  loss 0.123456  correct 5  12.5 steps/s  150 samples/s`` (the step's named outputs after
    the loss; tokens/s for token ids) for every step;
    ``overall`` is the steps/s of all the steps seen."""

    def __init__(self, graph: "gpb.GraphDef", steps: int = 0, out: Optional[TextIO] = sys.stderr):
        self.graph = graph
        self.samples, self.tokens = batch_counts(graph)  # a graph of symbolic sizes: per step
        self.steps, self.out = steps, out
        self.rate = StepRate()
        self.last: Optional[float] = None  # steps/s at the last step
        self.samples_per_s = self.tokens_per_s = 0.0  # at the last step (0: not known)
        self._first: Optional[Tuple[int, float]] = None
        self._latest: Optional[Tuple[int, float]] = None

    @property
    def overall(self) -> float:
        if self._first is None or self._latest is None or self._latest[1] <= self._first[1]:
            return 0.0
        return (self._latest[0] - self._first[0]) / (self._latest[1] - self._first[1])

    def __call__(
        self, step: int, loss: float, outputs: Optional[Dict[str, float]] = None, shape: str = ""
    ) -> None:
        now = time.monotonic()
        self._latest = (step, now)
        self._first = self._first or self._latest
        samples, tokens = batch_counts(self.graph, shape) if shape else (self.samples, self.tokens)
        self.last = self.rate.add(step, now, samples, tokens)
        self.samples_per_s, self.tokens_per_s = self.rate.per_second()
        if self.out is None:
            return
        text = f"step {step}/{self.steps or '?'}  loss {loss:.6g}"
        text += "".join(f"  {k} {v:.6g}" for k, v in (outputs or {}).items())
        text += f"  [{shape}]" if shape else ""
        if self.last is not None:
            text += f"  {self.last:.3g} steps/s"
            if self.tokens_per_s:
                text += f"  {self.tokens_per_s:.4g} tokens/s"
            elif self.samples_per_s:
                text += f"  {self.samples_per_s:.4g} samples/s"
        print(text, file=self.out, flush=True)
