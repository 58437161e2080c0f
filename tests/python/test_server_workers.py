"""fxdp-server's worker registry (WorkerService.Attach + ListWorkers) and ``--local-workers``.

Starts ``fxdp-server --listen 127.0.0.1:0 --local-workers 2`` ($FXDP_SERVER_BIN, default
build/bin/fxdp-server; its workers are $FXDP_WORKER, default build/bin/fxdp-worker) and reads the
registry through ``fxdp workers --server ... [--json]`` ($FXDP_BIN, default build/bin/fxdp):

* both local workers attach and are listed IDLE on cpu with their pids;
* a SIGKILLed worker is marked LOST (or replaced) within 5 s and the supervisor restarts it, so
  two IDLE workers are listed again;
* raw Python clients: one that registers and then sends bytes that are no WorkerMessage, one
  that registers and then goes silent (no heartbeats), are LOST within 5 s; a second attachment
  with an id in use gets ALREADY_EXISTS, a stream that does not start with Register gets
  INVALID_ARGUMENT; the server keeps serving throughout;
* ``fxdp workers`` exits 3 when no server listens;
* SIGTERM on the server stops its workers: no process is left behind.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import time

import grpc
import pytest
from _util import free_port, fxdp_binary
from fxdp.v1 import worker_pb2 as wpb
from fxdp.v1 import worker_pb2_grpc as wgrpc

ATTACH = "/fxdp.v1.WorkerService/Attach"


def workers(addr: str) -> list:
    p = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), "workers", "--server", addr, "--json"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["workers"]


def wait_for(pred, timeout: float, what: str, addr: str):
    deadline = time.monotonic() + timeout
    while True:
        ws = workers(addr)
        if pred(ws):
            return ws
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout} s; workers: {ws}")
        time.sleep(0.1)


def idle_local(ws) -> list:
    return [
        w
        for w in ws
        if w["state"] == "IDLE" and w["device"] == "cpu" and w["id"].startswith("local-")
    ]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def server():
    env = dict(os.environ)
    cmd = [
        fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"),
        "--listen",
        "127.0.0.1:0",
        "--local-workers",
        "2",
    ]
    if os.environ.get("FXDP_WORKER"):
        cmd += ["--worker-binary", fxdp_binary("FXDP_WORKER", "fxdp-worker")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    m = re.fullmatch(r"listening on (127\.0\.0\.1:\d+)\n", line)
    assert m, f"fxdp-server printed {line!r}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
    seen_pids = set()
    try:
        # Every test, run alone too, starts with both local workers attached.
        ws = wait_for(lambda ws: len(idle_local(ws)) == 2, 20, "2 IDLE local workers", m.group(1))
        seen_pids.update(w["pid"] for w in ws)
        yield proc, m.group(1), seen_pids
    finally:
        _stop(proc, seen_pids)


def _stop(proc, seen_pids) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        for pid in seen_pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


class RawClient:
    """An Attach stream driven by hand; messages are raw bytes (any bytes)."""

    def __init__(self, addr: str):
        self.channel = grpc.insecure_channel(addr)
        self.out: "queue.Queue" = queue.Queue()
        call = self.channel.stream_stream(
            ATTACH,
            request_serializer=lambda b: b,
            response_deserializer=wpb.ServerMessage.FromString,
        )
        self.responses = call(iter(self.out.get, None))

    def send(self, data: bytes) -> None:
        self.out.put(data)

    def register(self, worker_id: str) -> "wpb.ServerMessage":
        self.send(
            wpb.WorkerMessage(
                register_worker=wpb.Register(
                    protocol_version=wpb.WORKER_PROTOCOL_VERSION_2,
                    worker_id=worker_id,
                    hostname="raw",
                    pid=os.getpid(),
                    device="cpu",
                    capacity=1,
                )
            ).SerializeToString()
        )
        return next(self.responses)

    def close(self) -> None:
        self.out.put(None)
        self.responses.cancel()
        self.channel.close()


def test_local_workers_attach(server):
    _, addr, seen = server
    ws = wait_for(lambda ws: len(idle_local(ws)) == 2, 20, "2 IDLE local workers", addr)
    assert sorted(w["id"] for w in ws) == ["local-0", "local-1"]
    for w in ws:
        assert w["pid"] > 0 and alive(w["pid"]) and w["capacity"] == 1 and w["last_heartbeat_s"] < 3
        seen.add(w["pid"])
    table = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), "workers", "--server", addr],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "id",
        "state",
        "device",
        "host",
        "pid",
        "job",
        "step",
        "last",
        "heartbeat",
        "memory",
    ]
    assert any(l.startswith("local-0 ") and " IDLE " in l and str(ws[0]["pid"]) in l for l in lines)


def test_killed_worker_is_lost_and_restarted(server):
    _, addr, seen = server
    ws = wait_for(lambda ws: len(idle_local(ws)) == 2, 20, "2 IDLE local workers", addr)
    victim = ws[1]
    os.kill(victim["pid"], signal.SIGKILL)
    t0 = time.monotonic()
    wait_for(
        lambda ws: not any(w["pid"] == victim["pid"] and w["state"] != "LOST" for w in ws),
        5,
        f"worker {victim['id']} (pid {victim['pid']}) LOST",
        addr,
    )
    ws = wait_for(
        lambda ws: len(idle_local(ws)) == 2 and victim["pid"] not in [w["pid"] for w in ws],
        10,
        "a restarted worker",
        addr,
    )
    assert time.monotonic() - t0 < 12
    for w in ws:
        seen.add(w["pid"])
    assert {w["id"] for w in idle_local(ws)} == {"local-0", "local-1"}


def test_garbage_is_lost_and_server_keeps_serving(server):
    _, addr, _ = server
    c = RawClient(addr)
    try:
        r = c.register("raw-garbage")
        assert (
            r.registered.worker_id == "raw-garbage" and r.registered.heartbeat_interval_ms == 1000
        )
        assert any(w["id"] == "raw-garbage" and w["state"] == "IDLE" for w in workers(addr))
        c.send(b"")  # an empty WorkerMessage: ignored
        c.send(wpb.WorkerMessage(job_ended=wpb.JobEnded(job_id="nope")).SerializeToString())
        c.send(b"\xff\xff\xff\xff\x0f garbage")  # not a WorkerMessage: the stream ends
        wait_for(
            lambda ws: any(w["id"] == "raw-garbage" and w["state"] == "LOST" for w in ws),
            5,
            "raw-garbage LOST",
            addr,
        )
    finally:
        c.close()
    assert len(idle_local(workers(addr))) == 2


def test_silent_worker_is_lost(server):
    _, addr, _ = server
    c = RawClient(addr)
    try:
        c.register("raw-silent")
        t0 = time.monotonic()
        ws = wait_for(
            lambda ws: any(w["id"] == "raw-silent" and w["state"] == "LOST" for w in ws),
            5,
            "raw-silent LOST",
            addr,
        )
        assert time.monotonic() - t0 > 2.5  # 3 missed intervals of 1 s
        [w] = [w for w in ws if w["id"] == "raw-silent"]
        assert "heartbeat" in w["lost_reason"], w
        # Its stream was ended by the server.
        with pytest.raises(grpc.RpcError):
            next(c.responses)
    finally:
        c.close()
    assert len(idle_local(workers(addr))) == 2


def test_refused_attachments(server):
    _, addr, _ = server
    ch = grpc.insecure_channel(addr)
    stub = wgrpc.WorkerServiceStub(ch)
    reg = wpb.WorkerMessage(
        register_worker=wpb.Register(
            protocol_version=wpb.WORKER_PROTOCOL_VERSION_2,
            worker_id="local-0",
            hostname="raw",
            pid=1,
            device="cpu",
            capacity=1,
        )
    )
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Attach(iter([reg]), timeout=10))
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS, e.value
    hb = wpb.WorkerMessage(heartbeat=wpb.Heartbeat(state=wpb.WORKER_STATE_IDLE))
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Attach(iter([hb]), timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
    old = wpb.WorkerMessage(register_worker=wpb.Register(worker_id="raw-old"))
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Attach(iter([old]), timeout=10))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value
    ch.close()
    assert len(idle_local(workers(addr))) == 2


def test_unreachable_server_exits_3():
    p = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), "workers", "--server", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 3, (p.returncode, p.stderr)
    assert "fxdp workers: server 127.0.0.1:" in p.stderr


def test_every_subcommand_takes_the_server_from_fxdp_server(server):
    """No --server: $FXDP_SERVER, else 127.0.0.1:50051, for every subcommand that needs a server."""
    _, addr, _ = server
    fxdp = fxdp_binary("FXDP_BIN", "fxdp")
    env = {**os.environ, "FXDP_SERVER": addr}
    p = subprocess.run(
        [fxdp, "workers", "--json"], capture_output=True, text=True, timeout=20, env=env
    )
    assert p.returncode == 0, p.stderr
    assert "local-0" in [w["id"] for w in json.loads(p.stdout)["workers"]]
    p = subprocess.run([fxdp, "jobs"], capture_output=True, text=True, timeout=20, env=env)
    assert p.returncode == 0, p.stderr
    nowhere = f"127.0.0.1:{free_port()}"
    env["FXDP_SERVER"] = nowhere
    for cmd in (["workers"], ["jobs"], ["job", "j-1"], ["cancel", "j-1"]):
        p = subprocess.run([fxdp, *cmd], capture_output=True, text=True, timeout=30, env=env)
        assert p.returncode == 3 and f"server {nowhere}" in p.stderr, (cmd, p.returncode, p.stderr)
        h = subprocess.run([fxdp, *cmd, "--help"], capture_output=True, text=True, timeout=10)
        assert "(default $FXDP_SERVER, else 127.0.0.1:50051)" in h.stdout, (cmd, h.stdout)


def test_sigterm_stops_the_workers(server):
    proc, addr, seen = server
    for w in workers(addr):
        if w["id"].startswith("local-") and w["state"] != "LOST":
            seen.add(w["pid"])
    assert len(seen) >= 2
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        raise AssertionError("fxdp-server did not exit on SIGTERM")
    left = [pid for pid in seen if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)  # they hold the stderr pipe open
    err = proc.stderr.read()
    assert not left, f"workers left running: {left}\n{err}"
    assert rc == 0, err
    assert "stopped: exited with status 0" in err, err
