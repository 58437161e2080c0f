"""Shared helpers for the fxdp Python tests."""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Tuple, Union

import fxdp
import grpc
import pytest
import torch
from fxdp import zoo
from fxdp.dp_oracle import balanced_slices  # noqa: F401 (the oracle's split, used by the tests)
from fxdp.v1 import graph_pb2 as pb
from fxdp.v1 import jobs_pb2 as jpb
from fxdp.v1 import jobs_pb2_grpc as jgrpc
from fxdp.wire_tensors import assemble as _assemble
from fxdp.wire_tensors import chunks as _chunks

sys.path.append(str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
from launch_util import clean_env, free_port  # noqa: E402,F401 (one copy, with the benchmarks')

MODELS = list(zoo.MODELS)
OPTIMS = list(zoo.OPTIMIZERS)
RTOL, ATOL = 1e-5, 1e-6

# A graph that cannot run: 6 token indices per sample, gradients for 5 (the expansion's shape
# check must refuse it; test_expand_zoo, test_server_compile).
INCONSISTENT = """graph format=1 producer="test" torch="2.13.0+cpu" {
  %w: f32[7, 3] rg = placeholder() {role=PARAMETER, state="w"}
  %gr: f32[4, 5, 3] = placeholder() {role=INPUT, state="g", batch_dim=0}
  %idx: i64[4, 6] = placeholder() {role=INPUT, state="idx", batch_dim=0}
  %ge: f32[7, 3] = aten::embedding_dense_backward(%gr, %idx, 7, -1, false) {grad_of="w"}
  %output = output([%ge]) {specs=[OTHER]}
}
"""


@functools.lru_cache(maxsize=None)
def traced(
    model: str, optim: str, overrides: Tuple[Tuple[str, object], ...] = ()
) -> fxdp.TracedStep:
    """Trace a zoo entry (cached: tracing leaves model and optimizer untouched)."""
    step, _, _ = zoo.trace_entry(model, optim, **dict(overrides))
    return step


def prepare_zoo_step(d, model: str, optim: str, steps: int) -> dict:
    """Zoo `model` x `optim` traced into folder `d`: the graph (g.pb), its state (s.safetensors),
    one batch file per step (b<i>.safetensors), the batches, and the one-device reference
    (run_local's final state and losses on them)."""
    from safetensors.torch import save_file

    step, e = traced(model, optim), zoo.get(model)
    p = {
        "dir": d,
        "step": step,
        "graph": str(d / "g.pb"),
        "state": str(d / "s.safetensors"),
        "batches": [e.batch(i) for i in range(steps)],
        "data": [],
    }
    step.save(p["graph"])
    step.to_safetensors(p["state"])
    for i in range(steps):
        path = str(d / f"b{i}.safetensors")
        save_file({k: v.contiguous() for k, v in e.named_batch(i).items()}, path)
        p["data"].append(path)
    state, losses = step.initial_state(), []
    for b in p["batches"]:
        state, loss = step.run_local(state, b)
        losses.append(float(loss))
    p["ref_state"], p["ref_losses"] = state, losses
    return p


def expand_json(fxdp_cli: str, graph: str, world: int, out, *args: str) -> Tuple[dict, str]:
    """`fxdp expand GRAPH --world-size N ARGS -o OUT --json`: its report, and the graph path a
    rank runs ('{rank}' in it when the split is uneven and each rank has its own graph)."""
    import json
    import pathlib

    out = pathlib.Path(out)
    r = subprocess.run(
        [fxdp_cli, "expand", graph, "--world-size", str(world), *args, "-o", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    uneven = len({s["size"] for s in report["slices"]}) > 1
    return report, str(out.with_name(f"{out.stem}.rank{{rank}}{out.suffix}")) if uneven else str(
        out
    )


def eager_steps(model_name: str, optim: str, steps: int, overrides=(), warmup: int = 0):
    """Train the zoo entry eagerly; returns (model, optimizer, losses)."""
    e = zoo.get(model_name)
    model = e.model(0)
    opt = zoo.make_optimizer(optim, model, **dict(overrides))
    losses = []
    for i in range(warmup + steps):
        b = e.batch(i)
        opt.zero_grad()
        loss = e.loss_fn(model(*b[:-1]), b[-1])
        loss.backward()
        opt.step()
        if i >= warmup:
            losses.append(loss.detach())
    return model, opt, losses


def one_device(step: fxdp.TracedStep, batches):
    """run_local over `batches` (step i + 1 for batch i: the key of its random draws, as the
    ranks'): the final state and the losses."""
    state, losses = step.initial_state(), []
    for i, b in enumerate(batches, 1):
        state, loss = step.run_local(state, b, step=i)
        losses.append(float(loss))
    return state, losses


def local_steps(step: fxdp.TracedStep, model_name: str, steps: int, start: int = 0, state=None):
    e = zoo.get(model_name)
    state = step.initial_state() if state is None else state
    losses = []
    for i in range(start, start + steps):
        state, loss = step.run_local(state, e.batch(i))
        losses.append(loss)
    return state, losses


def assert_state_matches(state: Dict[str, torch.Tensor], model, opt, check_optimizer=True):
    pname = {id(p): n for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        torch.testing.assert_close(
            state[n], p.detach(), rtol=RTOL, atol=ATOL, msg=lambda m: f"{n}: {m}"
        )
    for n, b in model.named_buffers():
        torch.testing.assert_close(state[n], b, rtol=RTOL, atol=ATOL, msg=lambda m: f"{n}: {m}")
    if not check_optimizer:
        return
    seen = set()
    for p, st in opt.state.items():
        for k, v in st.items():
            if v is None:
                continue
            key = f"optim.{pname[id(p)]}.{k}"
            seen.add(key)
            torch.testing.assert_close(
                state[key].to(torch.as_tensor(v).device),
                torch.as_tensor(v),
                rtol=RTOL,
                atol=ATOL,
                check_dtype=True,
                msg=lambda m: f"{key}: {m}",
            )
    from fxdp.optimizers import optimizer_hyperparameters

    hyper = set(optimizer_hyperparameters(opt))  # fed per step, not state the step updates
    traced_opt = {k for k in state if k.startswith("optim.") and k not in hyper}
    assert (
        traced_opt == seen
    ), f"optimizer state names differ: traced-only {traced_opt - seen}, eager-only {seen - traced_opt}"


def mse_step(model, opt, batch):
    """The tests' plain training step over ``(x, y)`` batches: MSE loss, backward, optimizer step."""
    x, y = batch
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def traced_mlp_adamw(example, hidden: int = 33) -> fxdp.TracedStep:
    """A 10-``hidden``-1 MLP (ReLU, seed 0) with AdamW (lr 1e-2) traced with mse_step on
    ``example``: the checkpoint tests' job."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(10, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return fxdp.trace_step(mse_step, model, opt, example)


def placeholders(g: "pb.GraphDef"):
    return [n for n in g.nodes if n.kind == pb.PLACEHOLDER]


def output_node(g: "pb.GraphDef"):
    outs = [n for n in g.nodes if n.kind == pb.OUTPUT]
    assert len(outs) == 1
    return outs[0]


def target_str(n: "pb.Node") -> str:
    return n.target.name + ("." + n.target.overload if n.target.overload else "")


def fxdp_binary(env: str, name: str) -> str:
    """$env, else <repo>/build/bin/<name>; fails (does not skip) when it is missing."""
    import os
    import pathlib

    path = os.environ.get(env) or str(
        pathlib.Path(__file__).resolve().parents[2] / "build" / "bin" / name
    )
    assert os.path.isfile(path) and os.access(
        path, os.X_OK
    ), f"{name} not found at {path}: build it first (make test builds it) or set {env}"
    return path


class ServerProcess:
    """A real ``fxdp-server --listen 127.0.0.1:0 --local-workers N --heartbeat-ms MS [args]``
    ($FXDP_SERVER_BIN; its workers are $FXDP_WORKER when set), started at once: ``address``,
    ``log`` (its stderr lines, drained so the server never blocks on them), ``jobs`` (a JobService
    stub on a channel of its own). ``kill()``: SIGKILL, nothing flushed or closed (a crash);
    ``stop()`` (and leaving ``with``): SIGTERM, then SIGKILL after 15 s; both close the channel.
    Heartbeats every 1 s (a worker is lost after 3 s of silence): a killed worker's stream ends at
    once, and at 250 ms a loaded machine stalling a worker for 0.75 s failed a job as "lost"."""

    def __init__(self, *args, workers: int = 2, heartbeat_ms: int = 1000):
        cmd = [
            fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"),
            "--listen",
            "127.0.0.1:0",
            "--local-workers",
            str(workers),
            "--heartbeat-ms",
            str(heartbeat_ms),
            *map(str, args),
        ]
        if os.environ.get("FXDP_WORKER"):
            cmd += ["--worker-binary", fxdp_binary("FXDP_WORKER", "fxdp-worker")]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._channel, self._jobs = None, None
        try:
            line = self.proc.stdout.readline()
            m = re.fullmatch(r"listening on (127\.0\.0\.1:\d+)\n", line)
            assert m, f"fxdp-server printed {line!r}: {self.proc.stderr.read() if self.proc.poll() is not None else ''}"
        except BaseException:
            self.stop()
            raise
        self.address = m.group(1)
        self.log: list = []
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()

    @property
    def jobs(self) -> jgrpc.JobServiceStub:
        if self._jobs is None:
            self._channel = grpc.insecure_channel(self.address)
            self._jobs = jgrpc.JobServiceStub(self._channel)
        return self._jobs

    def _close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel, self._jobs = None, None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._close()

    def stop(self) -> None:
        self._close()
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def local_server(workers: int = 2, heartbeat_ms: int = 1000, extra_args=()):
    """A ServerProcess (``fxdp-server --local-workers N [extra_args]``): yields ``(address, log)``;
    stopped on exit."""
    with ServerProcess(*extra_args, workers=workers, heartbeat_ms=heartbeat_ms) as server:
        yield server.address, server.log


@contextlib.contextmanager
def idle_client(workers: int = 2):
    """An fxdp.Client on a local_server whose ``workers`` workers are all IDLE (waited up to 30 s)."""
    with local_server(workers=workers) as (address, _), fxdp.Client(address) as c:
        deadline = time.monotonic() + 30
        while sum(w.get("state") == "WORKER_STATE_IDLE" for w in c.workers()) < workers:
            assert time.monotonic() < deadline, c.workers()
            time.sleep(0.1)
        yield c


def make_pki(d):
    """Certificates and tokens made by scripts/dev_ca.sh into the folder ``d`` (returned)."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    subprocess.run(
        ["sh", str(root / "scripts" / "dev_ca.sh"), str(d)], check=True, capture_output=True
    )
    return d


# ---- durable jobs (fxdp-server --state-dir: test_durable_jobs, test_fully_shard_jobs) -------------
def running(info) -> bool:
    """Whether the job (a JobInfo) has not ended."""
    return info.state in (jpb.JOB_STATE_QUEUED, jpb.JOB_STATE_RUNNING)


def wait_log(log, patterns: List[str], timeout: float = 30.0) -> str:
    """The server's log text once every regex of ``patterns`` is in it (a reader thread fills
    ``log`` as the server writes, so a line may arrive after the call that caused it returned)."""
    deadline = time.monotonic() + timeout
    while True:
        text = "".join(log)
        missing = [p for p in patterns if not re.search(p, text)]
        if not missing:
            return text
        assert time.monotonic() < deadline, f"not in the server log: {missing}\n{text}"
        time.sleep(0.05)


def wait_for(jobs, job_id, pred, timeout=60.0, every=0.1):
    """GetJob every `every` s until `pred(info)` holds; that info (fails after `timeout` s)."""
    deadline = time.monotonic() + timeout
    while True:
        info = jobs.GetJob(jpb.GetJobRequest(job_id=job_id), timeout=10)
        if pred(info):
            return info
        assert time.monotonic() < deadline, info
        time.sleep(every)


def fetch(jobs, job_id, chunk_bytes: int = 0) -> Dict[str, torch.Tensor]:
    """The job's final state (FetchState, in `chunk_bytes` chunks; 0: the server's size), whole
    tensors by name."""
    return _assemble(
        jobs.FetchState(
            jpb.FetchJobStateRequest(job_id=job_id, chunk_bytes=chunk_bytes), timeout=30
        )
    )


def batch_files(d, model: str, n: int) -> list:
    """The zoo model's batches 0..n-1 as d/batch<i>.safetensors (data_paths files); their paths."""
    from safetensors.torch import save_file

    files = [d / f"batch{i}.safetensors" for i in range(n)]
    for i, f in enumerate(files):
        save_file(zoo.get(model).named_batch(i), str(f))
    return files


def data_paths_requests(step: fxdp.TracedStep, paths, steps: int, **spec):
    """A data_paths job on 2 workers (the workers read the batches): the spec (`spec`: more JobSpec
    fields) and the initial state in 1000-byte chunks."""
    state = step.initial_state()
    paths = [str(p) for p in (paths if isinstance(paths, list) else [paths])]
    yield jpb.SubmitJobRequest(
        spec=jpb.JobSpec(
            graph=step.graph,
            world_size=2,
            steps=steps,
            num_state_tensors=len(state),
            data_paths=paths,
            collective_timeout_s=10,
            name="from-files",
            **spec,
        )
    )
    for k, v in state.items():
        for c in _chunks(k, v, 1000):
            yield jpb.SubmitJobRequest(state=c)


def assert_same_run(losses, state: Dict[str, torch.Tensor], want) -> None:
    """`losses` and `state` are bit for bit those of `want` (a JobResult)."""
    assert list(losses) == want.losses
    for k, v in state.items():
        assert torch.equal(v, want.state[k]), k


@contextlib.contextmanager
def resumed_after_sigkill(state_dir, requests, kill_after: int, *server_args):
    """Submits `requests` (a job that runs without its client) to ``fxdp-server --state-dir
    state_dir [server_args]``, SIGKILLs the server once the job has done `kill_after` steps, starts
    it again on the same directory and waits for the job to end there: yields ``(server, job_id,
    info, killed_at)``, the job SUCCEEDED in `info` and `killed_at` its steps done when killed."""
    with ServerProcess("--state-dir", state_dir, *server_args) as server:
        stream = server.jobs.Submit(requests, timeout=120)  # held until the kill
        job = next(stream).job_id
        info = wait_for(
            server.jobs, job, lambda i: i.steps_done >= kill_after or not running(i), every=0.01
        )
        assert (
            info.state == jpb.JOB_STATE_RUNNING
        ), f"the job ended before it could be killed after {kill_after} steps (give it more steps): {info}"
        server.kill()
    killed_at = info.steps_done
    with ServerProcess("--state-dir", state_dir, *server_args) as server:
        info = wait_for(server.jobs, job, lambda i: not running(i))
        assert info.state == jpb.JOB_STATE_SUCCEEDED, (info.error, "".join(server.log[-20:]))
        yield server, job, info, killed_at


# ---- fxdp-worker processes (test_worker_dist, test_real_models) ----------------------------------
STEP_LINE = re.compile(r"^step (\d+)/(\d+) loss (\S+) \(([\d.]+) ms\)((?: \S+=\S+)*)$")


def losses_of(stdout: str) -> List[float]:
    out = []
    for line in stdout.splitlines():
        m = STEP_LINE.match(line)
        assert m, f"unexpected stdout line {line!r}"
        out.append(float(m.group(3)))
    return out


def outputs_of(stdout: str) -> List[Dict[str, float]]:
    """Each step line's named outputs (`` correct=5 accuracy=0.625`` after the time)."""
    return [
        {k: float(v) for k, v in (kv.split("=", 1) for kv in m.group(5).split())}
        for m in map(STEP_LINE.match, stdout.splitlines())
    ]


def assert_log_lines(stderr: str, job: str, rank: int, steps: int) -> None:
    prefix = re.compile(rf"^\[job {re.escape(job)} rank {rank} step (\d+)/{steps}\] ")
    lines = stderr.splitlines()
    assert lines, f"rank {rank} logged nothing"
    for line in lines:
        m = prefix.match(line)
        assert (
            m and 0 <= int(m.group(1)) <= steps
        ), f"rank {rank}: log line without job/rank/step: {line!r}"


def wait_all(procs, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        for proc in procs:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        pytest.fail(f"processes still running after {timeout_s} s (a hang)")


def run_dp_oracle(paths: List[str], state: str, data: str, out_dir, *extra: str) -> List[dict]:
    """fxdp.dp_oracle: PyTorch (torch.fx) runs the expanded graphs (rank r: paths[r]) on
    len(paths) Gloo processes from `state` on the batches torch.save'd in `data`; with `extra` =
    (model, optimizer) each rank then also trains the zoo model under eager DDP. Each rank's
    result (out<r>.pt in `out_dir`: state, losses, ddp); its log is log<r>."""
    import sys

    world, port, procs = len(paths), free_port(), []
    for r in range(world):
        with open(out_dir / f"log{r}", "w") as log:
            cmd = [sys.executable, "-m", "fxdp.dp_oracle", str(r), str(world), str(port)]
            procs.append(
                subprocess.Popen(
                    [*cmd, paths[r], state, data, str(out_dir / f"out{r}.pt"), *extra],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=clean_env(OMP_NUM_THREADS=1),
                )
            )
    wait_all(procs, 180)
    for r, proc in enumerate(procs):
        assert proc.returncode == 0, (out_dir / f"log{r}").read_text()
    return [torch.load(out_dir / f"out{r}.pt") for r in range(world)]


def spawn_ranks(args: List[str], world: int, d) -> list:
    """`world` processes of `args` as ranks of one job on 127.0.0.1 (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, a free MASTER_PORT), rank r writing stdout/stderr to d/out<r> and d/err<r>."""
    port = free_port()
    procs = []
    for rank in range(world):
        with open(d / f"out{rank}", "w") as out, open(d / f"err{rank}", "w") as err:
            procs.append(
                subprocess.Popen(
                    args,
                    stdout=out,
                    stderr=err,
                    env=clean_env(
                        RANK=rank,
                        WORLD_SIZE=world,
                        LOCAL_RANK=rank,
                        MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=port,
                    ),
                )
            )
    return procs


def run_ranks(args: List[str], world: int, d, timeout_s: float = 120) -> List[Tuple[str, str]]:
    """spawn_ranks(args, world, d) run to their end: each rank's (stdout, stderr), every rank having
    exited 0 (a rank still running after `timeout_s` is a hang: all are killed)."""
    procs = spawn_ranks(args, world, d)
    wait_all(procs, timeout_s)
    outs = [((d / f"out{r}").read_text(), (d / f"err{r}").read_text()) for r in range(world)]
    for r, proc in enumerate(procs):
        assert (
            proc.returncode == 0
        ), f"rank {r} exited with {proc.returncode}:\n{outs[r][1][-3000:]}"
    return outs


def run_worker_ranks(
    worker: str,
    graph: Union[str, List[str]],
    state: str,
    data: List[str],
    world: int,
    steps: int,
    d,
    job: str,
    timeout_s: int = 60,
) -> dict:
    """`world` real ``fxdp-worker run`` processes (RANK/WORLD_SIZE on 127.0.0.1, one batch file per
    step) writing ``final{rank}.safetensors`` under `d`: every rank exits 0 and logs with job, rank
    and step, only rank 0 prints steps; returns {"finals": [state per rank], "losses": [...],
    "outputs": [{name: value} per step]}. A list of graphs is one --graph each (one per batch
    shape)."""
    from safetensors.torch import load_file

    args = [worker, "run"]
    for g in [graph] if isinstance(graph, str) else graph:
        args += ["--graph", g]
    args += [
        "--state",
        state,
        "--steps",
        str(steps),
        "--out",
        str(d / "final{rank}.safetensors"),
        "--timeout",
        str(timeout_s),
        "--job",
        job,
    ]
    for path in data:
        args += ["--data", path]
    outs, errs = zip(*run_ranks(args, world, d, timeout_s + 30))
    for r in range(world):
        assert_log_lines(errs[r], job, r, steps)
    assert all(o == "" for o in outs[1:]), "only rank 0 prints steps"
    losses = losses_of(outs[0])
    assert len(losses) == steps
    return {
        "finals": [load_file(str(d / f"final{r}.safetensors")) for r in range(world)],
        "losses": losses,
        "outputs": outputs_of(outs[0]),
    }
