"""The fxdp server's part of the worker protocol (proto/fxdp/v1/worker.proto), played by a small
grpcio server for real ``fxdp-worker attach`` processes (tests/python/test_worker_attach.py): a
worker's Attach stream seen from the server (Conn), the server (FakeServer), AssignJob with its
state, batches and FetchState as the server sends them, and a Lab that starts workers and expands
zoo graphs."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from concurrent import futures
from typing import Dict, List, Optional

import grpc
import torch
from _util import ATOL, RTOL, balanced_slices, free_port, fxdp_binary, traced
from fxdp.v1 import graph_pb2 as gpb
from fxdp.v1 import worker_pb2 as wpb
from fxdp.v1 import worker_pb2_grpc as wgrpc
from fxdp.wire_tensors import assemble, chunks

HEARTBEAT_MS = 200
WAIT_S = 30  # generous bound for anything a worker is asked to do here

# --------------------------------------------------------------------------------------------
# The server's side


class Conn:
    """One worker's Attach stream, seen from the server."""

    def __init__(self, register: "wpb.Register"):
        self.register = register
        self.out: "queue.Queue[Optional[wpb.ServerMessage]]" = queue.Queue()
        self.inbox: "queue.Queue[wpb.WorkerMessage]" = queue.Queue()
        self.heartbeat: Optional["wpb.Heartbeat"] = None
        self.heartbeats = 0
        self.closed = threading.Event()
        self._hb = threading.Condition()

    def send(self, **fields) -> None:
        self.out.put(wpb.ServerMessage(**fields))

    def end(self) -> None:
        self.out.put(None)

    def on_heartbeat(self, h) -> None:
        with self._hb:
            self.heartbeat, self.heartbeats = h, self.heartbeats + 1
            self._hb.notify_all()

    def wait_heartbeat(self, pred, timeout=WAIT_S) -> "wpb.Heartbeat":
        with self._hb:
            ok = self._hb.wait_for(
                lambda: self.heartbeat is not None and pred(self.heartbeat), timeout
            )
            assert ok, f"{self.register.worker_id}: no matching heartbeat within {timeout} s (last: {self.heartbeat})"
            return self.heartbeat

    def recv(self, kind: str, timeout=WAIT_S) -> "wpb.WorkerMessage":
        """The next non-heartbeat message, which must be `kind` (a WorkerMessage oneof name)."""
        try:
            m = self.inbox.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"{self.register.worker_id}: no {kind} within {timeout} s"
            ) from None
        got = m.WhichOneof("msg")
        assert got == kind, f"{self.register.worker_id}: expected {kind}, got {got}: {m}"
        return getattr(m, kind)


class FakeServer(wgrpc.WorkerServiceServicer):
    """The fxdp server's part of the worker protocol, just enough for these tests."""

    def __init__(self, port: int = 0):
        self.conns: "queue.Queue[Conn]" = queue.Queue()
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=16),
            options=[
                ("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20),
            ],
        )
        wgrpc.add_WorkerServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        assert self.port, "could not bind the test server"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0)

    def Attach(self, request_iterator, context):
        first = next(request_iterator)
        assert first.WhichOneof("msg") == "register_worker", first
        conn = Conn(first.register_worker)
        context.add_callback(conn.closed.set)
        context.add_callback(conn.end)  # unblocks the response loop below when the RPC ends

        def read():
            try:
                for m in request_iterator:
                    if m.WhichOneof("msg") == "heartbeat":
                        conn.on_heartbeat(m.heartbeat)
                    else:
                        conn.inbox.put(m)
            except grpc.RpcError:
                pass
            finally:
                conn.closed.set()
                conn.end()

        threading.Thread(target=read, daemon=True).start()
        self.conns.put(conn)
        yield wpb.ServerMessage(
            registered=wpb.Registered(
                worker_id=conn.register.worker_id, heartbeat_interval_ms=HEARTBEAT_MS
            )
        )
        while True:
            m = conn.out.get()
            if m is None:
                return
            yield m

    def accept(self, n: int, timeout=WAIT_S) -> Dict[str, Conn]:
        """The next n registrations, by worker id."""
        out = {}
        deadline = time.monotonic() + timeout
        while len(out) < n:
            try:
                c = self.conns.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"only {len(out)} of {n} workers registered within {timeout} s"
                ) from None
            out[c.register.worker_id] = c
        return out


def assign(
    conn: Conn,
    job_id: str,
    graph: "gpb.GraphDef",
    state: Dict[str, torch.Tensor],
    *,
    rank=0,
    world=1,
    port=0,
    timeout_s=30.0,
    steps=3,
    chunk_bytes=777,
    num_state=None,
    max_graphs=0,
) -> None:
    conn.send(
        assign_job=wpb.AssignJob(
            job_id=job_id,
            rank=rank,
            world_size=world,
            rendezvous_host="127.0.0.1",
            rendezvous_port=port,
            collective_timeout_s=timeout_s,
            device="cpu",
            steps=steps,
            graph=graph,
            num_state_tensors=len(state) if num_state is None else num_state,
            max_graphs=max_graphs,
        )
    )
    msgs = [
        wpb.StateChunk(job_id=job_id, tensor=c)
        for name, t in state.items()
        for c in chunks(name, t, chunk_bytes)
    ]
    if not msgs:
        msgs = [wpb.StateChunk(job_id=job_id)]
    msgs[-1].last = True
    for m in msgs:
        conn.send(state_chunk=m)


def send_batch(
    conn: Conn,
    job_id: str,
    step: int,
    tensors: Dict[str, torch.Tensor],
    chunk_bytes=1 << 20,
    graph_id=0,
) -> None:
    pieces = [c for name, t in tensors.items() for c in chunks(name, t, chunk_bytes)]
    # Two messages per step when there is more than one chunk: exercises `more`.
    half = len(pieces) // 2
    if half:
        conn.send(
            batch=wpb.Batch(
                job_id=job_id, step=step, tensors=pieces[:half], more=True, graph_id=graph_id
            )
        )
    conn.send(batch=wpb.Batch(job_id=job_id, step=step, tensors=pieces[half:], graph_id=graph_id))


def fetch_state(
    conn: Conn, job_id: str, chunk_bytes=1000, end_job=False
) -> Dict[str, torch.Tensor]:
    """The worker's state through FetchState: chunks of at most ``chunk_bytes``, each checked
    against the chunk protocol (fxdp.wire_tensors.assemble), the last one ending a tensor."""
    conn.send(fetch_state=wpb.FetchState(job_id=job_id, chunk_bytes=chunk_bytes, end_job=end_job))

    def stream():
        while True:
            c = conn.recv("state_chunk")
            assert c.job_id == job_id
            assert len(c.tensor.data) <= chunk_bytes
            yield c
            if c.last:
                return

    return dict(assemble(stream()))


def batch_dims(graph: "gpb.GraphDef") -> Dict[str, int]:
    return {
        n.placeholder.state_name: n.placeholder.batch_dim
        for n in graph.nodes
        if n.kind == gpb.PLACEHOLDER and n.placeholder.role == gpb.INPUT
    }


def shard(
    batch: Dict[str, torch.Tensor], dims: Dict[str, int], rank: int, world: int
) -> Dict[str, torch.Tensor]:
    out = {}
    for name, t in batch.items():
        d = dims[name]
        if d < 0:
            out[name] = t
            continue
        start, size = balanced_slices(t.shape[d], world)[rank]
        out[name] = t.narrow(d, start, size).contiguous()
    return out


# --------------------------------------------------------------------------------------------
# Fixtures


class Lab:
    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.worker = fxdp_binary("FXDP_WORKER", "fxdp-worker")
        self.fxdp = fxdp_binary("FXDP_BIN", "fxdp")
        self.procs: List[subprocess.Popen] = []
        self.servers: List[FakeServer] = []
        self._graphs = {}

    def server(self, port: int = 0) -> FakeServer:
        s = FakeServer(port)
        self.servers.append(s)
        return s

    def start_worker(self, server_port: int, worker_id: str) -> subprocess.Popen:
        err = open(self.tmp / f"{worker_id}.err", "w")
        p = subprocess.Popen(
            [
                self.worker,
                "attach",
                "--server",
                f"127.0.0.1:{server_port}",
                "--worker-id",
                worker_id,
                "--threads",
                "1",
                "--heartbeat-ms",
                "5000",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        err.close()
        p.worker_id = worker_id
        self.procs.append(p)
        return p

    def log(self, worker_id: str) -> str:
        return (self.tmp / f"{worker_id}.err").read_text()

    def graphs(self, model: str, optim: str, world: int):
        """(traced step, the single-device GraphDef, the rank-0 expanded GraphDef for `world`)."""
        key = (model, optim, world)
        if key not in self._graphs:
            step = traced(model, optim)
            g = self.tmp / f"{model}_{optim}.pb"
            step.save(str(g))
            x = self.tmp / f"{model}_{optim}.x{world}.pb"
            r = subprocess.run(
                [self.fxdp, "expand", str(g), "--world-size", str(world), "-o", str(x)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.returncode == 0, r.stderr
            xs = [x]
            if not x.exists():  # uneven split: one file per rank
                xs = [self.tmp / f"{model}_{optim}.x{world}.rank{r}.pb" for r in range(world)]
            single, expanded = gpb.GraphDef(), []
            single.ParseFromString(g.read_bytes())
            for p in xs:
                e = gpb.GraphDef()
                e.ParseFromString(p.read_bytes())
                expanded.append(e)
            self._graphs[key] = (step, single, expanded)
        return self._graphs[key]

    def two_rank_job(self, prefix: str, job_id: str, model: str, optim: str, timeout_s: float):
        """Workers ``{prefix}0`` and ``{prefix}1`` on a new server, assigned ranks 0 and 1 of a
        3-step job ``job_id`` of the rank-0 expanded graph and started: (the traced step, the
        expanded graphs, the processes by worker id, the two ranks' connections)."""
        step, _, expanded = self.graphs(model, optim, 2)
        server = self.server()
        procs = {
            p.worker_id: p
            for p in (self.start_worker(server.port, f"{prefix}{r}") for r in range(2))
        }
        conns = server.accept(2)
        ranks = [conns[f"{prefix}0"], conns[f"{prefix}1"]]
        port = free_port()
        for r, c in enumerate(ranks):
            assign(
                c,
                job_id,
                expanded[0],
                step.initial_state(),
                rank=r,
                world=2,
                port=port,
                timeout_s=timeout_s,
                steps=3,
            )
        for c in ranks:
            c.recv("job_started")
        return step, expanded, procs, ranks

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for s in self.servers:
            s.stop()


def assert_float_close(got: float, want) -> None:
    torch.testing.assert_close(
        torch.tensor(got, dtype=torch.float64),
        torch.as_tensor(want).to(torch.float64),
        rtol=RTOL,
        atol=ATOL,
    )


def idle(h) -> bool:
    return h.state == wpb.WORKER_STATE_IDLE
