"""Issue 17's attacks on a real ``fxdp-server`` process, each refused with a status that names
what is wrong (docs/robustness.md):

* bytes that are not a valid request to a unary or server-streaming method (JobService,
  WorkerService, CompileService), sent through a generic gRPC call: INVALID_ARGUMENT naming the
  method, never INTERNAL;
* a worker registering absurd values (capacity 2^31-1, memory 2^63-1, threads -5, ``cuda:999``, a
  newline in its hostname that used to write a fake line into the server's log): INVALID_ARGUMENT
  naming the field and the value; the log gets no injected line;
* the address a job's ranks rendezvous at is the server's view of the worker's connection
  (``WorkerInfo.address``), not the hostname the worker declared.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading

import grpc
import pytest
from _util import fxdp_binary
from fxdp.v1 import worker_pb2 as wpb
from fxdp.v1 import worker_pb2_grpc as wgrpc

GARBAGE = b"\xff\xff\xff\xff\x0f not a protobuf message"


class Server:
    def __init__(self, tmp_path, *args):
        self.log_path = tmp_path / "server.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"), "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        line = self.proc.stdout.readline()
        m = re.fullmatch(r"listening on (127\.0\.0\.1:\d+)\n", line)
        assert m, (line, self.log_text())
        self.addr = m.group(1)
        self.channel = grpc.insecure_channel(self.addr)

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def stop(self) -> None:
        self.channel.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("robustness"))
    yield s
    s.stop()


@pytest.mark.parametrize(
    "method,streaming",
    [
        ("/fxdp.v1.JobService/GetJob", False),
        ("/fxdp.v1.JobService/ListJobs", False),
        ("/fxdp.v1.JobService/CancelJob", False),
        ("/fxdp.v1.JobService/FetchState", True),
        ("/fxdp.v1.WorkerService/ListWorkers", False),
        ("/fxdp.v1.CompileService/Analyze", False),
        ("/fxdp.v1.CompileService/Expand", False),
    ],
)
def test_garbage_requests_are_invalid_argument(server, method, streaming):
    make = server.channel.unary_stream if streaming else server.channel.unary_unary
    call = make(method)  # no serializers: raw bytes in and out
    with pytest.raises(grpc.RpcError) as e:
        r = call(GARBAGE, timeout=10)
        if streaming:
            list(r)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.value.code(), e.value.details())
    assert method.rsplit("/", 1)[1] in e.value.details(), e.value.details()
    # A valid empty request still works (the interceptor only rewrites parse failures).
    if method.endswith("ListJobs") or method.endswith("ListWorkers"):
        call(b"", timeout=10)


def attach_status(server, reg: wpb.Register) -> grpc.RpcError:
    stub = wgrpc.WorkerServiceStub(server.channel)
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Attach(iter([wpb.WorkerMessage(register_worker=reg)]), timeout=10))
    return e.value


def good_register(worker_id: str, **kw) -> wpb.Register:
    fields = dict(
        protocol_version=wpb.WORKER_PROTOCOL_VERSION_2,
        worker_id=worker_id,
        hostname="node-1",
        pid=os.getpid(),
        device="cpu",
        capacity=1,
        threads=1,
    )
    fields.update(kw)
    return wpb.Register(**fields)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("capacity", 2**31 - 1, "Register.capacity must be in [1, 64], got 2147483647"),
        (
            "memory_bytes",
            2**63 - 1,
            "Register.memory_bytes must be in [0, 1125899906842624] (0: unknown), "
            "got 9223372036854775807",
        ),
        ("threads", -5, "Register.threads must be in [0, 4096] (0: unknown), got -5"),
        (
            "device",
            "cuda:999",
            "Register.device must be cpu or cuda:N with 0 <= N < 128, got 'cuda:999'",
        ),
        (
            "hostname",
            "evil\nfxdp-server: worker admin attached",
            "Register.hostname must be 1 to 253 "
            "letters, digits, '-', '.' or '_', got 'evil\\nfxdp-server: worker admin attached'",
        ),
    ],
)
def test_absurd_registrations_are_refused(server, field, value, message):
    e = attach_status(server, good_register(f"absurd-{field}", **{field: value}))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
    assert message in e.details(), e.details()
    log = server.log_text()
    assert "refused: " + message in log  # escaped: one line
    # No line of the log starts with the injected text.
    assert not any(
        line.startswith("fxdp-server: worker admin attached") for line in log.splitlines()
    )
    ws = wgrpc.WorkerServiceStub(server.channel).ListWorkers(wpb.ListWorkersRequest(), timeout=10)
    assert f"absurd-{field}" not in [w.worker_id for w in ws.workers]


def test_rendezvous_address_is_the_peer_not_the_declared_hostname(server):
    """A worker that declares another host's name is listed (and would be rendezvoused with) at
    the address its connection comes from."""
    stub = wgrpc.WorkerServiceStub(server.channel)
    out: list = []
    reg = good_register("liar", hostname="victim.example.com")
    done = threading.Event()

    def messages():
        yield wpb.WorkerMessage(register_worker=reg)
        done.wait(10)

    call = stub.Attach(messages(), timeout=20)
    first = next(call)
    assert first.registered.worker_id == "liar"
    ws = {w.worker_id: w for w in stub.ListWorkers(wpb.ListWorkersRequest(), timeout=10).workers}
    out.append(ws["liar"])
    done.set()
    call.cancel()
    assert out[0].hostname == "victim.example.com" and out[0].address == "127.0.0.1", out[0]


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def mlp_graph_bytes(tmp_path) -> bytes:
    out = tmp_path / "mlp_sgd.pb"
    p = subprocess.run(
        [
            fxdp_binary("FXDP_BIN", "fxdp"),
            "graph",
            "parse",
            str(ROOT / "tests" / "testdata" / "mlp_sgd.txt"),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr
    return out.read_bytes()


def test_graph_node_and_byte_limits(tmp_path):
    """A request over --max-graph-nodes / --max-graph-mb is RESOURCE_EXHAUSTED naming the limit,
    checked before the graph is parsed (Analyze, Expand) or decoded (a job's spec)."""
    from fxdp.v1 import compile_pb2 as cpb
    from fxdp.v1 import compile_pb2_grpc as cgrpc
    from fxdp.v1 import graph_pb2 as gpb
    from fxdp.v1 import jobs_pb2 as jpb
    from fxdp.v1 import jobs_pb2_grpc as jgrpc

    s = Server(tmp_path, "--max-graph-nodes", "10", "--max-graph-mb", "1")
    try:
        graph = gpb.GraphDef.FromString(mlp_graph_bytes(tmp_path))
        n = len(graph.nodes)
        assert n > 10
        stub = cgrpc.CompileServiceStub(s.channel)
        for rpc, req in (
            ("Analyze", cpb.AnalyzeRequest(graph=graph, world_size=2)),
            ("Expand", cpb.ExpandRequest(graph=graph, world_size=2)),
        ):
            with pytest.raises(grpc.RpcError) as e:
                getattr(stub, rpc)(req, timeout=30)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
            assert (
                f"the {rpc} request's graph has {n} nodes, over this server's limit of 10 "
                "(fxdp-server --max-graph-nodes)"
            ) in e.value.details(), e.value.details()
        big = gpb.GraphDef()
        big.CopyFrom(graph)
        del big.nodes[8:]
        big.metadata.add(key="padding", value="x" * (2 << 20))
        with pytest.raises(grpc.RpcError) as e:
            stub.Analyze(cpb.AnalyzeRequest(graph=big, world_size=2), timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
        assert "over this server's limit of 1 MiB (fxdp-server --max-graph-mb)" in e.value.details()
        # A job's spec goes through the same limits.
        jobs = jgrpc.JobServiceStub(s.channel)
        with pytest.raises(grpc.RpcError) as e:
            list(
                jobs.Submit(
                    iter(
                        [jpb.SubmitJobRequest(spec=jpb.JobSpec(graph=graph, world_size=1, steps=1))]
                    ),
                    timeout=30,
                )
            )
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
        assert "over this server's limit of 10 (fxdp-server --max-graph-nodes)" in e.value.details()
    finally:
        s.stop()


def test_attach_stream_cap_and_register_deadline(tmp_path):
    """Silent Attach streams are capped (--max-worker-streams) and closed when they do not
    register in time (--register-deadline-s); then a real registration works again."""
    import time

    s = Server(tmp_path, "--max-worker-streams", "2", "--register-deadline-s", "1")
    try:
        stub = wgrpc.WorkerServiceStub(s.channel)
        silent = []
        never = threading.Event()

        def nothing():
            never.wait(30)
            return
            yield  # a generator that sends nothing

        t0 = time.monotonic()
        for _ in range(2):
            silent.append(stub.Attach(nothing(), timeout=30))
        time.sleep(0.3)  # both are in their handlers
        e = attach_status(s, good_register("third"))
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.code(), e.details())
        assert "at most 2 Attach streams at once (fxdp-server --max-worker-streams)" in e.details()
        for call in silent:  # ended by the server after ~1 s
            with pytest.raises(grpc.RpcError):
                next(call)
        assert time.monotonic() - t0 < 5
        # The handler logs once its Read returns, just after the client saw the end.
        while "no register_worker within 1 s, closed" not in s.log_text():
            assert time.monotonic() - t0 < 5, s.log_text()
            time.sleep(0.05)
        done = threading.Event()

        def register():
            yield wpb.WorkerMessage(register_worker=good_register("after"))
            done.wait(10)

        call = stub.Attach(register(), timeout=20)
        assert next(call).registered.worker_id == "after"
        done.set()
        call.cancel()
        never.set()
    finally:
        s.stop()


def test_submit_stream_cap(tmp_path):
    """Half-open Submit streams each held a job thread; more than --max-submit-streams at once
    are RESOURCE_EXHAUSTED before a thread starts."""
    import time

    from fxdp.v1 import jobs_pb2 as jpb
    from fxdp.v1 import jobs_pb2_grpc as jgrpc

    s = Server(tmp_path, "--max-submit-streams", "1")
    try:
        jobs = jgrpc.JobServiceStub(s.channel)
        hold = threading.Event()

        def nothing():
            hold.wait(30)
            return
            yield

        first = jobs.Submit(nothing(), timeout=30)
        time.sleep(0.5)  # in its handler, waiting for a spec
        assert not first.done()
        with pytest.raises(grpc.RpcError) as e:
            list(
                jobs.Submit(
                    iter([jpb.SubmitJobRequest(spec=jpb.JobSpec(world_size=1))]), timeout=10
                )
            )
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (
            e.value.code(),
            e.value.details(),
        )
        assert (
            "at most 1 Submit streams at once (fxdp-server --max-submit-streams)"
            in e.value.details()
        )
        hold.set()
        first.cancel()
        # The slot is free again: a spec without a graph is refused for what it is.
        deadline = time.monotonic() + 5
        while True:
            with pytest.raises(grpc.RpcError) as e:
                list(
                    jobs.Submit(
                        iter([jpb.SubmitJobRequest(spec=jpb.JobSpec(world_size=1))]), timeout=10
                    )
                )
            if e.value.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (
            e.value.code(),
            e.value.details(),
        )
    finally:
        s.stop()
