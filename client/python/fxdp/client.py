"""``fxdp.Client``: talk to an ``fxdp-server`` from Python.

    client = fxdp.Client("127.0.0.1:50051")
    placements = client.analyze(step, world_size=2)        # DESIGN.md's analyze JSON, as a dict
    expanded = client.expand(step, world_size=4)            # per-rank graphs + the report
    result = client.train(step, world_size=2, batches=batches, steps=3)
    result.losses, result.state                              # per-step global loss, final state

``train`` sends the traced step, its initial state (``step.initial_state()`` unless ``state`` is
given) and one global batch per step (each a sequence of tensors in the step's input order, or a
mapping by input name); the server analyses and expands the graph, runs it on ``world_size`` of its
workers and streams back each step's global loss; the final state comes back as tensors. Server
errors raise :class:`fxdp.ServerError` with the gRPC status code and the server's message (which
names the node or the rank).
"""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import grpc
import torch

from .traced import TracedStep
from .v1 import compile_pb2 as cpb
from .v1 import compile_pb2_grpc as cgrpc
from .v1 import graph_pb2 as gpb
from .v1 import jobs_pb2 as jpb
from .v1 import jobs_pb2_grpc as jgrpc
from .v1 import worker_pb2 as wpb
from .v1 import worker_pb2_grpc as wgrpc

_TO_WIRE = {torch.float32: gpb.FLOAT32, torch.float64: gpb.FLOAT64, torch.float16: gpb.FLOAT16,
            torch.bfloat16: gpb.BFLOAT16, torch.int64: gpb.INT64, torch.int32: gpb.INT32,
            torch.int16: gpb.INT16, torch.int8: gpb.INT8, torch.uint8: gpb.UINT8, torch.bool: gpb.BOOL}
_FROM_WIRE = {v: k for k, v in _TO_WIRE.items()}

Graphish = Union[TracedStep, "gpb.GraphDef"]
Batch = Union[Sequence[torch.Tensor], Mapping[str, torch.Tensor]]


class ServerError(RuntimeError):
    """An RPC failed: ``code`` is the grpc.StatusCode, the message is the server's."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code


@dataclasses.dataclass
class Expanded:
    graphs: List["gpb.GraphDef"]   # one per rank (one when ``identical``)
    identical: bool
    report: dict                   # slices, buckets, collectives, bytes_per_step


@dataclasses.dataclass
class TrainResult:
    job_id: str
    losses: List[float]            # the global loss of every step
    state: "OrderedDict[str, torch.Tensor]"


def _graph(g: Graphish) -> "gpb.GraphDef":
    return g.graph if isinstance(g, TracedStep) else g


def _chunk(name: str, t: torch.Tensor) -> "wpb.TensorChunk":
    t = t.detach().to("cpu").contiguous()
    if t.dtype not in _TO_WIRE:
        raise TypeError(f"tensor '{name}' has dtype {t.dtype}, which the wire format does not carry")
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return wpb.TensorChunk(name=name, dtype=_TO_WIRE[t.dtype], shape=list(t.shape), offset=0, data=data)


def _assemble(chunks: Iterable["wpb.StateChunk"]) -> "OrderedDict[str, torch.Tensor]":
    bufs: Dict[str, bytearray] = OrderedDict()
    metas = {}
    for c in chunks:
        if not c.HasField("tensor"):
            continue
        t = c.tensor
        buf = bufs.setdefault(t.name, bytearray())
        if t.offset != len(buf):
            raise ServerError(grpc.StatusCode.DATA_LOSS,
                              f"state chunk of '{t.name}' at offset {t.offset}, expected {len(buf)}")
        buf += t.data
        metas[t.name] = (_FROM_WIRE[t.dtype], tuple(t.shape))
    out = OrderedDict()
    for name, buf in bufs.items():
        dtype, shape = metas[name]
        out[name] = (torch.frombuffer(buf, dtype=dtype).reshape(shape).clone() if len(buf)
                     else torch.empty(shape, dtype=dtype))
    return out


class Client:
    """A connection to one fxdp-server (``address`` is ``host:port``)."""

    def __init__(self, address: str = "127.0.0.1:50051", max_message_mb: int = 1024):
        limit = max_message_mb * 1024 * 1024
        self._channel = grpc.insecure_channel(address, options=[
            ("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)])
        self._compile = cgrpc.CompileServiceStub(self._channel)
        self._jobs = jgrpc.JobServiceStub(self._channel)
        self._workers = wgrpc.WorkerServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def _call(fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except grpc.RpcError as e:  # pragma: no cover - exercised through the tests' error cases
            raise ServerError(e.code(), e.details()) from None

    def analyze(self, step: Graphish, world_size: int = 2) -> dict:
        """Placements of every node (the JSON of ``fxdp analyze --json``, as a dict)."""
        r = self._call(self._compile.Analyze,
                       cpb.AnalyzeRequest(graph=_graph(step), world_size=world_size, include_json=True))
        return json.loads(r.json)

    def expand(self, step: Graphish, world_size: int, bucket_mb: float = 25.0,
               first_bucket_mb: float = 1.0) -> Expanded:
        """The per-rank graphs and the expansion report (``fxdp expand``)."""
        r = self._call(self._compile.Expand, cpb.ExpandRequest(
            graph=_graph(step), world_size=world_size, bucket_cap_mb=bucket_mb,
            first_bucket_mb=first_bucket_mb))
        return Expanded(list(r.graphs), r.identical, json.loads(r.report_json))

    def train(self, step: TracedStep, world_size: int, batches: Iterable[Batch],
              steps: Optional[int] = None, state: Optional[Mapping[str, torch.Tensor]] = None,
              bucket_mb: float = 25.0, collective_timeout_s: float = 10.0, name: str = "",
              on_step: Optional[Callable[[int, float], None]] = None) -> TrainResult:
        """Train ``steps`` steps on ``world_size`` of the server's workers (one global batch per
        step, cycling through ``batches``); returns the per-step global losses and the final
        state. ``on_step(step, loss)`` is called as each step's result arrives."""
        batches = list(batches)
        if not batches:
            raise ValueError("train needs at least one batch")
        steps = len(batches) if steps is None else steps
        names = step.input_names()
        wire_batches = []
        for i in range(steps):
            b = batches[i % len(batches)]
            if isinstance(b, torch.Tensor):
                b = (b,)
            by_name = dict(b) if isinstance(b, Mapping) else dict(zip(names, b))
            missing = [n for n in names if n not in by_name]
            if missing:
                raise KeyError(f"batch {i} lacks inputs {missing}")
            wire_batches.append(jpb.StepBatch(tensors=[_chunk(n, by_name[n]) for n in names]))
        init = step.initial_state() if state is None else state
        req = jpb.SubmitJobRequest(
            graph=step.graph, world_size=world_size, steps=steps, bucket_cap_mb=bucket_mb,
            collective_timeout_s=collective_timeout_s, name=name,
            initial_state=[_chunk(k, v) for k, v in init.items()], batches=wire_batches)
        job_id, losses = "", []
        try:
            for ev in self._jobs.Submit(req):
                job_id = ev.job_id or job_id
                if ev.state == jpb.JOB_STATE_FAILED or ev.state == jpb.JOB_STATE_CANCELLED:
                    raise ServerError(grpc.StatusCode.ABORTED, ev.error or jpb.JobState.Name(ev.state))
                if ev.step > len(losses):
                    losses.append(ev.loss)
                    if on_step is not None:
                        on_step(ev.step, ev.loss)
        except grpc.RpcError as e:
            raise ServerError(e.code(), e.details()) from None
        final = OrderedDict(init.items())
        final.update(self._call(lambda: _assemble(
            self._jobs.FetchState(jpb.FetchJobStateRequest(job_id=job_id)))))
        return TrainResult(job_id, losses, final)

    def workers(self) -> List[dict]:
        """The workers attached to the server (id, state, device, host, pid, job, step)."""
        from google.protobuf.json_format import MessageToDict
        r = self._call(self._workers.ListWorkers, wpb.ListWorkersRequest())
        return [MessageToDict(w, preserving_proto_field_name=True) for w in r.workers]

    def jobs(self) -> List["jpb.JobInfo"]:
        return list(self._call(self._jobs.ListJobs, jpb.ListJobsRequest()).jobs)

    def job(self, job_id: str) -> "jpb.JobInfo":
        return self._call(self._jobs.GetJob, jpb.GetJobRequest(job_id=job_id))

    def cancel(self, job_id: str, reason: str = "") -> "jpb.JobInfo":
        return self._call(self._jobs.CancelJob, jpb.CancelJobRequest(job_id=job_id, reason=reason))
