"""``fxdp.Client``: talk to an ``fxdp-server`` from Python.

    client = fxdp.Client("127.0.0.1:50051")
    placements = client.analyze(step, world_size=2)        # the JSON of `fxdp analyze --json`, as a dict
    expanded = client.expand(step, world_size=4)            # per-rank graphs + the report
    result = client.train(step, world_size=2, batches=batches, steps=3)
    result.losses, result.state                              # per-step global loss, final state

``train`` streams the traced step, its initial state (``step.initial_state()`` unless ``state`` is
given) and one global batch per step (each a sequence of tensors in the step's input order, or a
mapping by input name) to the server in 1 MiB chunks; ``batches`` may be a generator, consumed
lazily as the job runs (the server reads at most two steps ahead). With ``data_path`` the workers
read the batches from a safetensors file on their own filesystem instead. The server queues the
job until ``world_size`` workers are idle, analyses and expands the graph, sends each worker its
shard of every batch and streams back each step's global loss; the final state comes back as
tensors. Server errors raise :class:`fxdp.ServerError` with the gRPC status code and the server's
message (which names the node, the rank or the tensor).

``schedule`` feeds the step's hyper-parameters (its HYPERPARAMETER placeholders, ``optim.group0.lr``,
...) a value per step: a ``torch.optim.lr_scheduler`` on the optimizer that was traced, a callable
``step -> {name: value}``, or a list of per-step dicts (``fxdp.schedule.schedule_values``). Each
step's values travel with its batch (in the JobSpec for ``data_path`` jobs); the server compiles the
graph once for the whole run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections import OrderedDict
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import grpc
import torch

from . import checkpoints as worker_checkpoints
from . import evaluation, train_job
from .credentials import channel_credentials
from .progress import Progress
from .rpc_errors import ServerError, server_error  # noqa: F401 - fxdp.ServerError
from .traced import TracedStep
from .train_job import Batch
from .v1 import compile_pb2 as cpb
from .v1 import compile_pb2_grpc as cgrpc
from .v1 import graph_pb2 as gpb
from .v1 import jobs_pb2 as jpb
from .v1 import jobs_pb2_grpc as jgrpc
from .v1 import worker_pb2 as wpb
from .v1 import worker_pb2_grpc as wgrpc
from .wire_tensors import CHUNK_BYTES, FROM_WIRE, MESSAGE_HEADROOM, assemble

Graphish = Union[TracedStep, "gpb.GraphDef"]


# The data-parallel styles by the name ``style=`` takes (compile.proto's DataParallelStyle).
STYLES = {
    "replicate": cpb.DATA_PARALLEL_STYLE_REPLICATE,
    "fully_shard": cpb.DATA_PARALLEL_STYLE_FULLY_SHARD,
}
_STYLE_NAMES = {v: k for k, v in STYLES.items()}


def _style(style: str) -> int:
    """The wire value of ``style`` ("replicate" or "fully_shard"); ValueError naming the accepted
    ones otherwise."""
    key = style.lower() if isinstance(style, str) else style
    if key not in STYLES:
        raise ValueError(f"unknown data-parallel style {style!r}; accepted: {', '.join(STYLES)}")
    return STYLES[key]


@dataclasses.dataclass
class ShardedState:
    """A state tensor ``fully_shard`` keeps as flat per-rank shards (``shard_numel`` elements
    each); ``shape`` and ``dtype`` are the whole tensor's."""

    name: str
    shape: List[int]
    dtype: torch.dtype
    shard_numel: int


@dataclasses.dataclass
class Expanded:
    graphs: List["gpb.GraphDef"]  # one per rank (one when ``identical``)
    identical: bool
    report: dict  # slices, buckets, collectives, bytes_per_step
    style: str = "replicate"  # "replicate" or "fully_shard"
    # fully_shard: the state tensors every rank holds a flat shard of (empty for replicate)
    sharded_state: List[ShardedState] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TrainResult:
    job_id: str
    losses: List[float]  # the global loss of every step this call ran
    # None: train(fetch_state=False), the final state left on the server (Client.fetch_state(job_id),
    # fxdp fetch)
    state: Optional[Mapping[str, torch.Tensor]]
    # resume=: the step of the checkpoint the job continued from (``losses`` are those of steps
    # first_step + 1, ...); 0 for a job that started from its initial state
    first_step: int = 0
    steps_per_s: float = 0.0  # over this call's steps, as their results came in
    # each step's named 0-d outputs (train_step's extra outputs: ``(loss, {"correct": ...})``),
    # as one device computes them, by step like ``losses``
    outputs: List[Dict[str, float]] = dataclasses.field(default_factory=list)
    # train(eval=...): each evaluation of the state while the job ran, in step order
    evals: List["evaluation.Evaluated"] = dataclasses.field(default_factory=list)
    # checkpoints=: the workers' checkpoint of the last step (its directory on their filesystem),
    # which is the final state: ``state`` reads it tensor by tensor when looked up
    # (fxdp.checkpoints.CheckpointState), nothing of it passed through the server or this client;
    # "" when the state was fetched
    checkpoint: str = ""


def _graph(g: Graphish) -> "gpb.GraphDef":
    return g.graph if isinstance(g, TracedStep) else g


def _train_inputs(step, seed, batches, data_path, steps, style, state, resume, initial_checkpoint):
    """What ``Client.train`` submits, its arguments checked: (the traced step with ``seed``, the
    wire style, the batch source, the data paths, the number of steps, the worker-checkpoint plan
    of ``initial_checkpoint`` (None: none), the state sent)."""
    step = train_job.traced_step(step)
    if seed is not None:
        step = train_job.with_seed(step, seed)
    if (batches is None) == (data_path is None):
        raise ValueError("train needs either batches or data_path")
    wire_style = _style(style)
    source, paths, steps = train_job.batch_source(batches, data_path, steps)
    plan = worker_checkpoints.plan_for_train(step, initial_checkpoint, state, resume)
    init = plan.sent if plan is not None else train_job.initial_state(step, state, resume)
    return step, wire_style, source, paths, steps, plan, init


def _add_policies(spec, step, init, plan, checkpoints, eval_step, eval_every, eval_data) -> None:
    """Adds to ``spec`` the initial checkpoint's plan, the workers' checkpoint policy and the
    evaluation policy (``eval_step`` None: none) of a ``Client.train``."""
    worker_checkpoints.add_to_spec(spec, plan)
    worker_checkpoints.add_policy(spec, checkpoints)
    if eval_step is not None:
        spec.eval.CopyFrom(
            evaluation.eval_policy(
                eval_step, {**step.initial_state(), **init}, eval_every, eval_data
            )
        )


class Client:
    """A connection to one fxdp-server (``address`` is ``host:port``; default ``$FXDP_SERVER``, else
    ``127.0.0.1:50051``, as for the ``fxdp`` CLI).

    Security (docs/security.md): ``tls_ca`` (a PEM file, default ``$FXDP_TLS_CA``) turns TLS on and
    names the CA the server's certificate must chain to; ``token`` or ``token_file`` (default
    ``$FXDP_TOKEN_FILE``) is a bearer token sent with every call (over TLS only); ``tls_cert`` and
    ``tls_key`` give a client certificate for mutual TLS; ``tls_server_name`` overrides the name the
    server's certificate is checked against. A call without valid credentials fails with
    ``ServerError`` code UNAUTHENTICATED, one on another identity's job with NOT_FOUND (as if
    it did not exist).

    ``timeout`` (seconds, default none) bounds every call (``analyze``, ``expand``, ``workers``,
    ``jobs``, ``job``, ``cancel``, fetching a final state); each of them also takes its own
    ``timeout=``. ``train`` takes ``timeout=`` for the whole job (a training run has no default
    limit). A call past its deadline fails with DEADLINE_EXCEEDED."""

    def __init__(
        self,
        address: Optional[str] = None,
        max_message_mb: int = 1024,
        *,
        tls_ca: Union[None, str, os.PathLike] = None,
        token: Optional[str] = None,
        token_file: Union[None, str, os.PathLike] = None,
        tls_cert: Union[None, str, os.PathLike] = None,
        tls_key: Union[None, str, os.PathLike] = None,
        tls_server_name: Optional[str] = None,
        timeout: Optional[float] = None,
    ):
        address = address or os.environ.get("FXDP_SERVER") or "127.0.0.1:50051"
        limit = max_message_mb * 1024 * 1024
        # the largest tensor piece a message carries either way, under the message limit
        self.chunk_bytes = min(CHUNK_BYTES, limit - MESSAGE_HEADROOM)
        options = [
            ("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit),
        ]
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout = timeout
        self.address = address
        creds = channel_credentials(tls_ca, token, token_file, tls_cert, tls_key)
        if creds is None:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._channel = grpc.secure_channel(address, creds, options=options)
        self._compile = cgrpc.CompileServiceStub(self._channel)
        self._jobs = jgrpc.JobServiceStub(self._channel)
        self._workers = wgrpc.WorkerServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _timeout(self, timeout: Optional[float]) -> Optional[float]:
        return self.timeout if timeout is None else timeout

    def _call(self, fn, *args, timeout: Optional[float] = None, **kw):
        try:
            return fn(*args, timeout=self._timeout(timeout), **kw)
        except grpc.RpcError as e:  # pragma: no cover - exercised through the tests' error cases
            raise server_error(e, self.address) from None

    def analyze(
        self,
        step: Graphish,
        world_size: int = 2,
        sync_batchnorm: bool = False,
        timeout: Optional[float] = None,
        style: Optional[str] = None,
        bucket_mb: float = 0.0,
    ) -> dict:
        """Placements of every node (the JSON of ``fxdp analyze --json``, as a dict). With ``style``
        (``"replicate"`` or ``"fully_shard"``, as ``fxdp analyze --style``): the state the style
        shards is ``S(0)`` with the reason, and ``"memory"`` says what each rank holds
        (``parameter_bytes``, ``gradient_bytes``, ``optimizer_state_bytes``, ``other_state_bytes``,
        ``largest_unit_bytes``, ``gathered_bytes``, ``largest_bucket_bytes``, ``total_bytes``: the
        figure the server checks against a worker's memory); ``bucket_mb`` caps units and buckets
        (0: 25 MiB)."""
        req = cpb.AnalyzeRequest(
            graph=_graph(step),
            world_size=world_size,
            include_json=True,
            sync_batchnorm=sync_batchnorm,
            bucket_cap_mb=bucket_mb,
        )
        if style is not None:
            req.style = _style(style)
        r = self._call(self._compile.Analyze, req, timeout=timeout)
        return json.loads(r.json)

    def expand(
        self,
        step: Graphish,
        world_size: int,
        bucket_mb: float = 25.0,
        first_bucket_mb: float = 1.0,
        sync_batchnorm: bool = False,
        style: str = "replicate",
        timeout: Optional[float] = None,
    ) -> Expanded:
        """The per-rank graphs and the expansion report (``fxdp expand``). ``sync_batchnorm``:
        batch norm normalises with the global batch's statistics (as ``SyncBatchNorm``; the
        report's ``batch_norm`` says ``"global"``) instead of each rank's (``"local"``, DDP's).
        ``style``: ``"replicate"`` (every rank holds the whole state, as DDP) or ``"fully_shard"``
        (each rank holds a flat 1/N shard of every parameter and its optimizer state, as FSDP;
        ``Expanded.sharded_state`` lists them)."""
        r = self._call(
            self._compile.Expand,
            cpb.ExpandRequest(
                graph=_graph(step),
                world_size=world_size,
                bucket_cap_mb=bucket_mb,
                first_bucket_mb=first_bucket_mb,
                sync_batchnorm=sync_batchnorm,
                style=_style(style),
            ),
            timeout=timeout,
        )
        sharded = [
            ShardedState(s.state_name, list(s.shape), FROM_WIRE[s.dtype], s.shard_numel)
            for s in r.sharded_state
        ]
        return Expanded(
            list(r.graphs),
            r.identical,
            json.loads(r.report_json),
            _STYLE_NAMES.get(r.style, str(r.style)),
            sharded,
        )

    def train(
        self,
        step: TracedStep,
        world_size: int,
        batches: Optional[Iterable[Batch]] = None,
        steps: Optional[int] = None,
        state: Optional[Mapping[str, torch.Tensor]] = None,
        bucket_mb: float = 25.0,
        collective_timeout_s: float = 10.0,
        name: str = "",
        on_step: Optional[Callable[[int, float], None]] = None,
        data_path: Union[None, str, os.PathLike, Sequence[Union[str, os.PathLike]]] = None,
        on_event: Optional[Callable[["jpb.JobEvent"], None]] = None,
        sync_batchnorm: bool = False,
        schedule=None,
        timeout: Optional[float] = None,
        style: str = "replicate",
        resume: Optional[str] = None,
        seed: Optional[int] = None,
        progress: bool = False,
        initial_checkpoint=None,
        eval: Optional[TracedStep] = None,  # noqa: A002 (the JobSpec field's name)
        eval_data: Union[None, str, os.PathLike, Sequence[Union[str, os.PathLike]]] = None,
        eval_every: int = 0,
        max_shapes: int = 0,
        checkpoints=None,
        fetch_state: bool = True,
    ) -> TrainResult:
        """Train on ``world_size`` of the server's workers; returns the per-step global losses and
        the final state.

        ``batches``: one global batch per step. A sequence (list, tuple) gives ``len(batches)``
        steps, or is cycled through for ``steps`` steps; any other iterable (a generator) is
        consumed lazily while the job runs, for ``steps`` steps or, without ``steps``, until it is
        exhausted. ``data_path``: instead of ``batches``, a safetensors file (or a list of them,
        step i using file i mod n) on the workers' filesystem, each holding one global batch,
        or a dataset directory (``fxdp.write_dataset``; docs/datasets.md: each worker reads only
        its rows of each step); ``steps`` is required then. ``on_step(step, loss)`` is called as each step's result
        arrives, ``on_event(event)`` for every JobEvent (QUEUED with its queue position, ...).
        ``sync_batchnorm``: batch norm with the global batch's statistics, so BatchNorm models
        train exactly like one device (default: each rank's, as DDP).

        ``style``: ``"replicate"`` (default; every rank holds the whole state, as DDP) or
        ``"fully_shard"`` (each rank holds a flat 1/N shard of every parameter and its optimizer
        state, as FSDP). Either way ``state`` goes in whole and ``TrainResult.state`` comes back
        whole: the server splits and reassembles the shards (unless the workers wrote the final
        state themselves: ``checkpoints``).

        ``schedule``: the hyper-parameters' values per step, anything
        ``fxdp.schedule.schedule_values`` accepts (a ``torch.optim.lr_scheduler`` on the traced
        optimizer, a callable ``step -> {name: value}``, a list of ``{name: value}`` per step);
        the number of steps must be known (``steps``, a sequence of batches, or ``data_path``).
        Names the schedule does not give keep the value they have in the state.

        ``timeout``: seconds the whole job may take (queueing, steps and the final state), else
        DEADLINE_EXCEEDED; default: no limit (the client's ``timeout`` still bounds fetching the
        final state).

        ``resume``: the id of a FAILED or CANCELLED job to continue from the state it kept (its
        last completed step's, or its last checkpoint; a server with ``--state-dir DIR``;
        docs/jobs.md). Pass the same step, world size,
        style, batches, steps and schedule as the first run (world size and style may differ
        when its workers wrote the checkpoint, ``checkpoints=``: they read it, resharded): the server starts a new job from the
        checkpoint's state (``state`` with ``resume`` is a ValueError), with the step counter and the schedule where
        they were, and says which step that is; ``batches`` and ``schedule`` are skipped up to it
        (a generator's first items are consumed and dropped). ``TrainResult.first_step`` is that
        step and ``losses`` those of the steps after it; the final state equals an uninterrupted
        run's. Another identity's job is NOT_FOUND (as an unknown one), one without a checkpoint
        FAILED_PRECONDITION, a different graph or world size INVALID_ARGUMENT naming the
        difference.

        ``TrainResult.outputs``: each step's named 0-d outputs, the extra outputs ``step``
        returns beside the loss (``(loss, {"correct": ...})``), reduced on the ranks as one
        device computes them (a mean over the batch weighted by each rank's rows, a sum summed).

        ``progress``: print a line per step to stderr: its loss, its named outputs, steps/s and samples/s (tokens/s
        for token ids) over the last steps (``fxdp.progress.Progress``);
        ``TrainResult.steps_per_s`` is the whole call's either way.

        ``seed``: the seed of the step's random ops (dropout...), recorded in the job's graph
        (default: the one ``trace_step`` recorded, ``step.seed()``). The same graph, state,
        batches and seed give bit-identical results on any number of ranks, equal to
        ``run_local(..., step=i, seed=seed)`` on one device (docs/randomness.md).

        A symbolic ``step`` (``trace_step(..., dynamic=True)``, or an ``@fxdp.compile`` step once
        called) runs every batch shape its guards allow in one job with one state: the server
        compiles each new shape once (milliseconds) and keeps the last ``max_shapes`` (default
        16, the traced example's included); each step's shape is ``JobEvent.shape``, the shapes
        compiled ``job(id).shapes``. Bound the shapes a loader yields (pad to a multiple:
        ``DataCollatorWithPadding(pad_to_multiple_of=64)``, or bucket by length). A batch that
        breaks a guard fails the job (INVALID_ARGUMENT naming the guard, the user's line and what
        to do), which keeps its last completed step's state (docs/shapes.md). With ``data_path`` a
        dataset directory (``fxdp.write_dataset``), each step runs its index entry's shape (the
        workers report them; files of another shape than the traced example's need a dataset).

        ``initial_checkpoint``: the job's state is read by the workers from a checkpoint on their
        filesystem (under their ``--data-root``): a Hugging Face ``save_pretrained`` directory,
        ``model.safetensors`` or ``model.safetensors.index.json``, each rank reading only what it
        holds. A path (the plan built from the step: ``fxdp.initial_checkpoint(step, path,
        state=state)``) or such a plan (for a step traced on ``meta``, a tied weight saved under
        its other name, or renamed tensors). The client sends only what the checkpoint lacks
        (hyper-parameters, constants, non-persistent buffers); ``TrainResult.state`` is whole
        (docs/checkpoints.md).

        ``eval``: an evaluation step (``fxdp.trace_eval``) the workers run against the job's
        current state after every ``eval_every``-th step and after the last (``eval_every`` 0:
        only after the last), over the evaluation batches ``eval_data`` on the workers (a dataset
        directory or safetensors files, as ``data_path``), each rank its rows of each batch; the
        state is left as it is. It reads only the training state (the server refuses another
        name, dtype or shape). ``TrainResult.evals``: each evaluation (``fxdp.evaluation.Evaluated``:
        the step, each metric summed over the batches as one device computes it per batch);
        ``on_event`` sees them as RUNNING events carrying ``eval`` (docs/evaluation.md).

        ``checkpoints``: the workers write checkpoints themselves, each rank its own part, into
        ``DIR/step-K/`` on their filesystem (under their ``--data-root``): ``{"dir": DIR, "every":
        K, "keep": N}`` (after every K steps, and after the last; the N newest complete ones
        kept; 0: all) or a ``fxdp.v1`` ``CheckpointPolicy``. ``job(id).checkpoint_path`` names the
        newest complete one, which ``initial_checkpoint=`` reads on any world size and style
        (docs/checkpoints.md). The checkpoint of the last step is the final state: the server
        does not collect it (``fetch_state`` and ``evaluate`` of the job are FAILED_PRECONDITION
        naming it), ``TrainResult.checkpoint`` names it and ``TrainResult.state`` reads it from
        the workers' filesystem one tensor at a time as it is looked up
        (``fxdp.checkpoints.CheckpointState``), so the state never passes through this
        process whole. Nor when the job fails or is cancelled: it keeps the newest checkpoint its
        workers completed, and the ``ServerError`` names its path and step and the completed steps
        after it, which are lost (``resume=`` the job, on any world size and style, or start
        from it with ``initial_checkpoint=``).

        ``fetch_state=False``: the final state is not fetched (``TrainResult.state`` is None); the
        server keeps it for a later ``fetch_state(job_id)``, ``fxdp fetch``, ``evaluate`` or
        ``resume=`` (as ``fxdp run`` without ``--out``). A job whose workers wrote
        the checkpoint of its last step still gets its lazy ``CheckpointState``."""
        step, wire_style, source, paths, steps, plan, init = _train_inputs(
            step, seed, batches, data_path, steps, style, state, resume, initial_checkpoint
        )
        spec = jpb.JobSpec(
            graph=step.graph,
            world_size=world_size,
            steps=steps or 0,
            num_state_tensors=len(init),
            data_paths=paths,
            bucket_cap_mb=bucket_mb,
            collective_timeout_s=collective_timeout_s,
            name=name,
            sync_batchnorm=sync_batchnorm,
            style=wire_style,
            resume_job=resume or "",
            max_shapes=max_shapes,
        )
        _add_policies(spec, step, init, plan, checkpoints, eval, eval_every, eval_data)
        per_step = train_job.schedule_per_step(spec, step, schedule, steps, paths)
        submission = train_job.Submission(
            spec, init, source, step.input_names(), per_step, self.chunk_bytes
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        shown = Progress(step.graph, steps or 0, out=sys.stderr if progress else None)

        def reported(s: int, loss: float, outputs: Dict[str, float], shape: str) -> None:
            if on_step is not None:
                on_step(s, loss)
            shown(s, loss, outputs, shape)

        job_id, losses, outputs = submission.run(
            self._jobs.Submit, timeout, self.address, on_event, reported
        )
        left = None if deadline is None else max(deadline - time.monotonic(), 1e-3)
        final, checkpoint = self._final_state(job_id, spec, init, left, fetch_state)
        evals = [evaluation.Evaluated.of(m) for m in submission.evals]
        return TrainResult(
            job_id, losses, final, submission.first_step, shown.overall, outputs, evals, checkpoint
        )

    def _final_state(self, job_id: str, spec, init, timeout: Optional[float], fetch: bool):
        """(the job's final state, the checkpoint holding it): a job whose workers wrote its last
        step's checkpoint has its state there, which the server did not collect (read from the
        workers' filesystem when looked up); any other's is fetched, whole (None: not ``fetch``)."""
        if spec.HasField("checkpoints"):
            info = self.job(job_id, timeout=timeout)
            if info.checkpoint_path and not info.has_state:
                path = info.checkpoint_path
                return worker_checkpoints.CheckpointState(path), path
        if not fetch:
            return None, ""
        final = OrderedDict(init.items())
        final.update(self.fetch_state(job_id, timeout=timeout))
        return final, ""

    def evaluate(
        self,
        step: TracedStep,
        job_id: str,
        world_size: int,
        batches: Optional[Iterable[Batch]] = None,
        data_path: Union[None, str, os.PathLike, Sequence[Union[str, os.PathLike]]] = None,
        steps: Optional[int] = None,
        **kwargs,
    ) -> TrainResult:
        """Runs the evaluation step ``step`` (``fxdp.trace_eval``) on ``world_size`` workers
        against the state job ``job_id`` kept (a SUCCEEDED job's final state, a FAILED or
        CANCELLED one's last completed step's), which never passes through this client: the
        server starts the job from it (JobSpec.resume_job with an evaluation graph; only the
        tensors the graph reads, checked by name, dtype and shape). One step per batch
        (``batches`` streamed, or ``data_path`` on the workers with ``steps``), as ``train``:
        ``losses`` and ``outputs`` are each batch's metrics as one device computes them, and
        ``state`` the graph's state, unchanged. ``kwargs`` are ``train``'s (``style``...); the
        job's own ``eval=`` is for evaluating while training (docs/evaluation.md)."""
        return self.train(
            step,
            world_size,
            batches=batches,
            data_path=data_path,
            steps=steps,
            resume=job_id,
            **kwargs,
        )

    def workers(self, timeout: Optional[float] = None) -> List[dict]:
        """The workers attached to the server (id, state, device, host, pid, job, step)."""
        from google.protobuf.json_format import MessageToDict

        r = self._call(self._workers.ListWorkers, wpb.ListWorkersRequest(), timeout=timeout)
        return [MessageToDict(w, preserving_proto_field_name=True) for w in r.workers]

    def jobs(self, timeout: Optional[float] = None) -> List["jpb.JobInfo"]:
        """The jobs this client may see (with authentication: its own; all for an admin)."""
        return list(self._call(self._jobs.ListJobs, jpb.ListJobsRequest(), timeout=timeout).jobs)

    def job(self, job_id: str, timeout: Optional[float] = None) -> "jpb.JobInfo":
        return self._call(self._jobs.GetJob, jpb.GetJobRequest(job_id=job_id), timeout=timeout)

    def cancel(
        self, job_id: str, reason: str = "", timeout: Optional[float] = None
    ) -> "jpb.JobInfo":
        return self._call(
            self._jobs.CancelJob,
            jpb.CancelJobRequest(job_id=job_id, reason=reason),
            timeout=timeout,
        )

    def fetch_state(
        self, job_id: str, timeout: Optional[float] = None
    ) -> "OrderedDict[str, torch.Tensor]":
        """The state a finished job kept (FetchState), as tensors: a SUCCEEDED job's final
        state, a FAILED or CANCELLED one's last completed step's (``job(id).checkpoint_step``)."""
        return self._call(
            lambda timeout: assemble(
                self._jobs.FetchState(
                    jpb.FetchJobStateRequest(job_id=job_id, chunk_bytes=self.chunk_bytes),
                    timeout=timeout,
                )
            ),
            timeout=timeout,
        )
