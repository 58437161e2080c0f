"""One training job on the wire (``Client.train``): the batches or data paths of its steps, the
state it starts from, each step's hyper-parameters, and the Submit stream that sends all of them
and reads the job's events back."""

from __future__ import annotations

import itertools
import os
import threading
from collections import OrderedDict
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import grpc
import torch

from .rpc_errors import server_error
from .traced import TracedStep
from .v1 import graph_pb2 as gpb
from .v1 import jobs_pb2 as jpb
from .v1 import worker_pb2 as wpb
from .wire_tensors import chunks

Batch = Union[Sequence[torch.Tensor], Mapping[str, torch.Tensor]]
DataPath = Union[None, str, os.PathLike, Sequence[Union[str, os.PathLike]]]


def with_seed(step: TracedStep, seed: int) -> TracedStep:
    """A copy of ``step`` whose graph records ``seed`` (the caller's step keeps its own)."""
    graph = gpb.GraphDef()
    graph.CopyFrom(step.graph)
    copy = TracedStep(graph, step._state)
    copy.set_seed(seed)
    return copy


def batch_source(
    batches: Optional[Iterable[Batch]], data_path: DataPath, steps: Optional[int]
) -> Tuple[Iterable[Batch], List[str], Optional[int]]:
    """(the batches to send, the workers' data paths, the number of steps) of a train call: a
    sequence is cycled through for ``steps`` (default: its length), an iterable consumed lazily;
    ``data_path`` jobs send no batches and need ``steps``."""
    if data_path is not None:
        paths = (
            [os.fspath(data_path)]
            if isinstance(data_path, (str, os.PathLike))
            else [os.fspath(p) for p in data_path]
        )
        if not paths or not steps:
            raise ValueError("train with data_path needs at least one path and steps >= 1")
        return (), paths, steps
    if isinstance(batches, Sequence):
        if not batches:
            raise ValueError("train needs at least one batch")
        steps = len(batches) if steps is None else steps
        return (batches[i % len(batches)] for i in range(steps)), [], steps
    return (itertools.islice(batches, steps) if steps else batches), [], steps


def traced_step(step) -> TracedStep:
    """The TracedStep a job sends: ``step`` itself, or an ``@fxdp.compile`` step's trace (its last
    call's symbolic variant: every batch shape runs from it). A symbolic graph is sent as it is;
    the server compiles each batch shape once (docs/shapes.md)."""
    from .compiled import CompiledStep

    if isinstance(step, CompiledStep):
        if step.variant is None:
            raise ValueError(
                "train: the @fxdp.compile step has not been called yet, so it has no trace: call it "
                "once on a batch (or pass fxdp.trace_step(...)'s TracedStep)"
            )
        return step.variant
    return step


def initial_state(
    step: TracedStep, state: Optional[Mapping[str, torch.Tensor]], resume: Optional[str]
) -> Mapping[str, torch.Tensor]:
    """The state the client sends: none for a resumed job (its state is its checkpoint's), else
    ``state`` or the step's own; a tensor on the meta device (no values) is a ValueError."""
    if resume and state is not None:
        raise ValueError(
            "train: state= and resume= exclude each other: a resumed job's state is "
            "its checkpoint's"
        )
    if resume:
        return OrderedDict()
    init = step.initial_state() if state is None else state
    on_meta = [n for n, t in init.items() if t.device.type == "meta"]
    if on_meta:
        raise ValueError(
            f"train: {len(on_meta)} state tensors are on the meta device (no values), e.g. "
            f"{', '.join(on_meta[:3])}: a model built on meta needs its state from elsewhere: "
            "state=fxdp.state_of(step, model, optimizer) of the model built with weights"
        )
    return init


def schedule_per_step(
    spec: "jpb.JobSpec", step: TracedStep, schedule, steps: Optional[int], paths: List[str]
) -> List[Dict[str, float]]:
    """Each step's hyper-parameter values from ``schedule`` (fxdp.schedule.schedule_values), to
    send with its batch; a data_path job gets the whole schedule in ``spec`` instead (and [])."""
    if schedule is None:
        return []
    if not steps:
        raise ValueError(
            "train with a schedule needs the number of steps: pass steps= (or a "
            "sequence of batches)"
        )
    from .schedule import hyperparameter_names, schedule_values

    known = hyperparameter_names(step)
    if not known:
        raise ValueError(
            "train got a schedule, but the graph has no HYPERPARAMETER placeholders "
            "(its lr and other hyper-parameters are constants): nothing to schedule"
        )
    per_step = schedule_values(schedule, steps, known)
    if not paths:
        return per_step
    for hp in sorted({k for d in per_step for k in d}):  # the workers read the batches
        missing = [i + 1 for i, d in enumerate(per_step) if hp not in d]
        if missing:
            raise ValueError(
                f"schedule: '{hp}' has no value for steps {missing[:5]}; a "
                "data_path job needs a value for every step"
            )
        spec.schedule.add(name=hp, values=[float(d[hp]) for d in per_step])
    return []


def _by_name(b: Batch, names: Sequence[str], step: int) -> Dict[str, torch.Tensor]:
    if isinstance(b, torch.Tensor):
        b = (b,)
    by_name = dict(b) if isinstance(b, Mapping) else dict(zip(names, b))
    missing = [n for n in names if n not in by_name]
    if missing:
        raise KeyError(f"the batch of step {step} lacks inputs {missing}")
    return by_name


class Submission:
    """One Submit call: the request stream (the spec, the initial state, then each step's batch
    with its hyper-parameters) and the events read back. A resumed job's stream waits for the
    first event, which says the step the job continues from, and skips the batches up to it."""

    def __init__(
        self,
        spec: "jpb.JobSpec",
        init: Mapping[str, torch.Tensor],
        source: Iterable[Batch],
        names: Sequence[str],
        per_step: List[Dict[str, float]],
        chunk_bytes: int,
    ):
        self.spec, self.init, self.source, self.names = spec, init, source, names
        self.per_step, self.chunk_bytes = per_step, chunk_bytes
        self.problem: List[BaseException] = []  # a bad batch or a failing generator
        self.call = None
        self.call_made = threading.Event()
        self.first_event, self.call_over = threading.Event(), threading.Event()
        self.first_step = 0  # resume: the step the job continues from, told by its first event
        self.evals: List["jpb.EvalMetrics"] = []  # JobSpec.eval: each evaluation's event

    def _hyper(self, i: int) -> List["wpb.HyperparameterValue"]:
        if i > len(self.per_step):
            return []
        return [
            wpb.HyperparameterValue(name=k, value=float(v))
            for k, v in sorted(self.per_step[i - 1].items())
        ]

    def _step_requests(self, i: int, b: Batch) -> Iterable["jpb.SubmitJobRequest"]:
        """Step ``i``'s batch, a chunk a message, ``more`` on all but the last and the
        hyper-parameters on the first."""
        by_name = _by_name(b, self.names, i)
        pieces = itertools.chain.from_iterable(
            chunks(n, by_name[n], self.chunk_bytes) for n in self.names
        )
        prev = next(pieces)
        values = self._hyper(i)
        for c in pieces:
            yield jpb.SubmitJobRequest(
                batch=jpb.StepBatch(step=i, tensors=[prev], more=True, hyperparameters=values)
            )
            values = []
            prev = c
        yield jpb.SubmitJobRequest(
            batch=jpb.StepBatch(step=i, tensors=[prev], hyperparameters=values)
        )

    def requests(self) -> Iterable["jpb.SubmitJobRequest"]:
        yield jpb.SubmitJobRequest(spec=self.spec)
        for k, v in self.init.items():
            for c in chunks(k, v, self.chunk_bytes):
                yield jpb.SubmitJobRequest(state=c)
        skip = 0
        if self.spec.resume_job and not self.spec.data_paths:
            while not self.first_event.wait(0.1):
                if self.call_over.is_set():
                    return
            skip = self.first_step
        try:
            for i, b in enumerate(itertools.islice(self.source, skip, None), skip + 1):
                yield from self._step_requests(i, b)
        # a bad batch or a failing generator: stop the job, raise it in run()
        except Exception as e:
            self.problem.append(e)
            self.call_made.wait()
            self.call.cancel()

    def run(
        self,
        submit,
        timeout: Optional[float],
        address: str,
        on_event: Optional[Callable[["jpb.JobEvent"], None]],
        on_step: Optional[Callable[[int, float, Dict[str, float], str], None]],
    ) -> Tuple[str, List[float], List[Dict[str, float]]]:
        """Makes the call (``submit``: the JobService stub's Submit) and follows the job to its
        end: (its id, the global loss of every step run, each step's named outputs)."""
        job_id, losses, outputs = "", [], []
        self.call = submit(self.requests(), timeout=timeout)
        self.call_made.set()
        try:
            for ev in self.call:
                job_id = ev.job_id or job_id
                if not self.first_event.is_set():
                    self.first_step = ev.first_step
                    self.first_event.set()
                if on_event is not None:
                    on_event(ev)
                if ev.HasField("eval"):
                    self.evals.append(ev.eval)
                elif ev.state == jpb.JOB_STATE_RUNNING and ev.step > self.first_step + len(losses):
                    losses.append(ev.loss)
                    outputs.append({v.name: v.value for v in ev.outputs})
                    if on_step is not None:
                        on_step(ev.step, ev.loss, outputs[-1], ev.shape)
        except grpc.RpcError as e:
            if self.problem:
                raise self.problem[0]
            raise server_error(e, address) from None
        finally:
            self.call_over.set()
        return job_id, losses, outputs
