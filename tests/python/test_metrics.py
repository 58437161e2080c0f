"""``fxdp-server --metrics-port PORT``: Prometheus text metrics over plain HTTP/1.1 on the --listen
host (issue 26, docs/jobs.md "Metrics"), scraped from a real server with two real workers:

* after a 3-step job, ``GET /metrics`` is 200 (``text/plain; version=0.0.4``) with the jobs by
  state (1 succeeded), the workers by state (2 idle), 3 steps and their summed time, the bytes read
  from the client and moved by the collectives; a job failing on a bad batch at step 2 is counted
  failed, with its kept state;
* the responder is bounded: another method is 405, another path 404, a request line that is not
  HTTP 400, a request head over 8 KiB 431, a client that sends nothing is answered 408 (after the
  server's 2 s), and a scrape after each still works;
* without the flag nothing listens; a port out of range is a usage error (exit 2).
"""

from __future__ import annotations

import re
import socket
import subprocess
import time

import fxdp
import pytest
from _util import ServerProcess, fxdp_binary, traced
from fxdp import zoo

MODEL, OPTIM = "mlp", "adamw"


def metrics_port(server: ServerProcess) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in list(server.log):
            m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line)
            if m:
                return int(m.group(1))
        time.sleep(0.05)
    raise AssertionError("".join(server.log))


def http(port: int, request: bytes) -> tuple:
    """(status line, headers, body) of one request on a new connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        if request:
            s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    return lines[0], {k.lower(): v for k, v in (x.split(": ", 1) for x in lines[1:])}, body.decode()


def scrape(port: int) -> dict:
    status, headers, body = http(port, b"GET /metrics HTTP/1.1\r\nHost: fxdp\r\n\r\n")
    assert status == "HTTP/1.1 200 OK", (status, body)
    assert headers["content-type"].startswith("text/plain; version=0.0.4"), headers
    assert int(headers["content-length"]) == len(body.encode())
    values = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_metrics_count_jobs_steps_bytes_and_workers():
    step = traced(MODEL, OPTIM)
    batches = [zoo.get(MODEL).named_batch(i) for i in range(3)]
    with (
        ServerProcess("--metrics-port", "0") as server,
        fxdp.Client(server.address, timeout=60) as client,
    ):
        port = metrics_port(server)
        before = scrape(port)
        assert before["fxdp_steps_total"] == 0 and before['fxdp_jobs{state="running"}'] == 0
        client.train(step, world_size=2, batches=batches)
        m = scrape(port)
        assert m['fxdp_jobs{state="succeeded"}'] == 1, m
        assert m["fxdp_steps_total"] == 3 and m["fxdp_step_seconds_count"] == 3, m
        assert m["fxdp_step_seconds_sum"] > 0 and m["fxdp_client_bytes_total"] > 0, m
        assert m["fxdp_collective_bytes_total"] > 0 and m["fxdp_kept_states_total"] == 0, m
        bad = [batches[0], {k: v[:5] for k, v in batches[1].items()}]
        with pytest.raises(fxdp.ServerError, match="its state after step 1 is kept"):
            client.train(step, world_size=2, batches=bad)
        m = scrape(port)
        assert m['fxdp_jobs{state="failed"}'] == 1 and m["fxdp_kept_states_total"] == 1, m
        assert m["fxdp_steps_total"] == 4, m
        deadline = time.monotonic() + 30
        while scrape(port)['fxdp_workers{state="idle"}'] != 2:
            assert time.monotonic() < deadline, scrape(port)
            time.sleep(0.05)

        # Bounded: each bad request gets its answer, and the next scrape works.
        cases = [
            (b"POST /metrics HTTP/1.1\r\n\r\n", "HTTP/1.1 405 Method Not Allowed"),
            (b"GET /secrets HTTP/1.1\r\n\r\n", "HTTP/1.1 404 Not Found"),
            (b"hello\r\n\r\n", "HTTP/1.1 400 Bad Request"),
            (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", "HTTP/1.1 431"),
            (b"", "HTTP/1.1 408 Request Timeout"),  # sends nothing
        ]
        for request, want in cases:
            status, headers, _ = http(port, request)
            assert status.startswith(want), (request[:30], status)
            assert headers["connection"] == "close"
            assert scrape(port)["fxdp_steps_total"] == 4


def test_metrics_are_opt_in_and_the_port_is_checked():
    with ServerProcess() as server:
        # stderr in order: its security line comes after where the metrics line would be.
        deadline = time.monotonic() + 30
        while not any("security:" in line for line in server.log):
            assert time.monotonic() < deadline, server.log
            time.sleep(0.05)
        assert not any("metrics on" in line for line in server.log), server.log
    r = subprocess.run(
        [fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"), "--metrics-port", "70000"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "--metrics-port" in r.stderr, r.stderr


def test_train_and_fxdp_run_show_steps_and_samples_per_second(tmp_path, capfd):
    """``Client.train(progress=True)`` prints each step's loss, steps/s and samples/s (the samples
    are the batch dim's 12); ``fxdp run --json`` carries the same rates on each step's event;
    a batch of token ids counts tokens (zoo transformer: 6 x 7)."""
    from fxdp.progress import batch_counts
    from fxdp.v1 import graph_pb2 as gpb

    assert batch_counts(traced("transformer", "sgd").graph) == (6, 42)
    assert batch_counts(gpb.GraphDef()) == (0, 0)
    step = traced(MODEL, OPTIM)
    batches = [zoo.get(MODEL).named_batch(i) for i in range(4)]
    with ServerProcess() as server, fxdp.Client(server.address, timeout=60) as client:
        r = client.train(step, world_size=2, batches=batches, progress=True)
        lines = [x for x in capfd.readouterr().err.splitlines() if x.startswith("step ")]
        assert len(lines) == 4 and lines[0].startswith("step 1/4  loss "), lines
        m = re.fullmatch(r"step 4/4  loss \S+  (\S+) steps/s  (\S+) samples/s", lines[-1])
        assert m, lines
        assert abs(float(m.group(2)) / float(m.group(1)) - 12) < 0.05, lines[-1]
        assert r.steps_per_s > 0, r.steps_per_s

        graph, state = tmp_path / "g.pb", tmp_path / "s.safetensors"
        step.save(str(graph))
        step.to_safetensors(str(state))
        from safetensors.torch import save_file

        data = []
        for i, b in enumerate(batches):
            data += ["--data", str(tmp_path / f"b{i}.safetensors")]
            save_file({k: v.contiguous() for k, v in b.items()}, data[-1])
        out = subprocess.run(
            [fxdp_binary("FXDP_BIN", "fxdp"), "run", str(graph), "--world-size", "2"]
            + ["--state", str(state), *data, "--steps", "4", "--json", "--server", server.address],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        import json

        events = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
        rated = [e for e in events if "steps_per_s" in e]
        assert [e["step"] for e in rated] == [2, 3, 4], events
        for e in rated:
            assert e["samples_per_s"] == pytest.approx(12 * e["steps_per_s"]), e
