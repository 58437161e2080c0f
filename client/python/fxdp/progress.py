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


def batch_counts(graph: "gpb.GraphDef") -> Tuple[int, int]:
    """``(samples, tokens)`` of one step's global batch: the batch dim's size of the graph's first
    INPUT that has one, and the element count of its first integer INPUT of 2+ dims with a batch
    dim (token ids; 0 when there is none). A size that varies per batch (a graph with symbolic
    sizes: docs/shapes.md) is not known: 0."""
    samples = tokens = 0
    for n in graph.nodes:
        if n.kind != gpb.PLACEHOLDER or n.placeholder.role != gpb.INPUT or not n.outputs:
            continue
        t, d = n.outputs[0].tensor, n.placeholder.batch_dim
        if not 0 <= d < len(t.shape):
            continue
        varies = [bool(e) for e in t.shape_expr] or [False] * len(t.shape)
        samples = samples or (0 if varies[d] else t.shape[d])
        if not tokens and t.dtype in (gpb.INT64, gpb.INT32) and len(t.shape) >= 2:
            tokens = 0 if any(varies) else math.prod(t.shape)
    return samples, tokens


class StepRate:
    """Steps per second over the last ``window`` steps seen (by the time each came in)."""

    def __init__(self, window: int = 20):
        self._seen: deque = deque(maxlen=window)

    def add(self, step: int, now: Optional[float] = None) -> Optional[float]:
        """Records ``step`` done at ``now`` (default: the monotonic clock); the rate, None until
        two steps were seen."""
        self._seen.append((step, time.monotonic() if now is None else now))
        (s0, t0), (s1, t1) = self._seen[0], self._seen[-1]
        return (s1 - s0) / (t1 - t0) if s1 > s0 and t1 > t0 else None


class Progress:
    """``on_step`` of ``Client.train``: with ``out`` (``progress=True``: stderr) prints ``step
    3/10  loss 0.123456  correct 5  12.5 steps/s  150 samples/s`` (the step's named outputs after
    the loss; tokens/s for token ids) for every step;
    ``overall`` is the steps/s of all the steps seen."""

    def __init__(self, graph: "gpb.GraphDef", steps: int = 0, out: Optional[TextIO] = sys.stderr):
        self.samples, self.tokens = batch_counts(graph)
        self.steps, self.out = steps, out
        self.rate = StepRate()
        self.last: Optional[float] = None  # steps/s at the last step
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
        self.last = self.rate.add(step, now)
        if self.out is None:
            return
        text = f"step {step}/{self.steps or '?'}  loss {loss:.6g}"
        text += "".join(f"  {k} {v:.6g}" for k, v in (outputs or {}).items())
        text += f"  [{shape}]" if shape else ""
        if self.last is not None:
            per, unit = (self.tokens, "tokens") if self.tokens else (self.samples, "samples")
            text += f"  {self.last:.3g} steps/s"
            if per:
                text += f"  {self.last * per:.4g} {unit}/s"
        print(text, file=self.out, flush=True)
