"""Checked attacks on a real TLS ``fxdp-server`` (docs/security.md, "Checked attacks"): no string a
client or worker sends can inject a server log line, unauthenticated streams cost the server no
thread, and wrong tokens are rate limited per connection. The server: _security_server.py.
"""

from __future__ import annotations

import re
import time

import _security_server as tls
import grpc
import pytest
from _security_server import (
    MODEL,
    OPTIM,
    UNAUTHENTICATED,
    client,
    server_args,
    train_one,
)
from _util import local_server, traced
from fxdp.v1 import jobs_pb2 as jpb
from fxdp.v1 import worker_pb2 as wpb
from fxdp.v1 import worker_pb2_grpc as wgrpc

# ---- Checked attacks (docs/security.md): every string a client or worker sends, and silent streams ----

FORGED = 'fxdp-server: audit event="cancel" identity="root (admin)" job="FORGED"'

# The TLS server's fixtures (_security_server.py).
health_port = tls.health_port
pki = tls.pki
server = tls.server


def _worker_channel(address, pki):
    return grpc.secure_channel(
        address,
        grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes()),
            grpc.access_token_call_credentials((pki / "worker.token").read_text().strip()),
        ),
    )


def _client_channel(address, pki, who="alice"):
    return grpc.secure_channel(
        address,
        grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes()),
            grpc.access_token_call_credentials((pki / f"{who}.token").read_text().strip()),
        ),
    )


def _forged_lines(log) -> list:
    return [line for line in "".join(log).splitlines() if line.startswith(FORGED)]


def test_no_string_a_client_or_worker_sends_can_inject_a_server_log_line(server, pki):
    """A newline followed by a forged audit line in a job name, a cancel reason, a job id, a node
    name (echoed in an error), a worker id, a device and the version strings: those the server
    logs are there, escaped (checked), and no log line starts with the forged text."""
    from fxdp.v1 import jobs_pb2_grpc as jgrpc

    address, log = server
    alice = client(address, pki, "alice")
    evil = "\n" + FORGED
    named = train_one(alice, "name" + evil)
    step = traced(MODEL, OPTIM)
    with _client_channel(address, pki) as ch:
        jobs = jgrpc.JobServiceStub(ch)
        jobs.CancelJob(
            jpb.CancelJobRequest(job_id=named.job_id, reason="reason" + evil), timeout=10
        )
        for call in (
            lambda: jobs.GetJob(jpb.GetJobRequest(job_id="job-id" + evil), timeout=10),
            lambda: list(
                jobs.FetchState(jpb.FetchJobStateRequest(job_id="job-id" + evil), timeout=10)
            ),
            lambda: jobs.CancelJob(jpb.CancelJobRequest(job_id="job-id" + evil), timeout=10),
        ):
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.NOT_FOUND, e.value
        bad = step.graph.__class__()
        bad.CopyFrom(step.graph)
        bad.nodes[4].name = "node" + evil
        bad.nodes[5].name = bad.nodes[4].name  # a duplicate node name: an error naming it
        spec = jpb.JobSpec(graph=bad, world_size=1, steps=1, num_state_tensors=0, name="bad graph")
        with pytest.raises(grpc.RpcError) as e:
            list(jobs.Submit(iter([jpb.SubmitJobRequest(spec=spec)]), timeout=30))
        assert (
            e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "node\n" in e.value.details()
        ), e.value
    # Worker strings: refused (INVALID_ARGUMENT) or logged escaped; `want` lists what an accepted
    # one leaves in the log.
    want = ['name="name\\n', 'job="job-id\\n']
    with _worker_channel(address, pki) as ch:
        attach_stub = wgrpc.WorkerServiceStub(ch)
        for i, (fields, logged) in enumerate(
            [
                (dict(worker_id="wid" + evil), []),
                (dict(device="cpu" + evil), ['device="cpu\\n', "device cpu\\x0a"]),
                (dict(fxdp_version="v" + evil, torch_version="t" + evil), ["(fxdp v\\x0a"]),
            ]
        ):
            fields.setdefault("worker_id", f"inject-{i}")
            reg = wpb.WorkerMessage(
                register_worker=wpb.Register(
                    protocol_version=wpb.WORKER_PROTOCOL_VERSION_2,
                    hostname="h",
                    capacity=1,
                    **fields,
                )
            )
            stream = attach_stub.Attach(iter([reg]), timeout=10)
            try:
                if next(stream).WhichOneof("msg") == "registered":
                    want += logged
                for _ in stream:
                    pass
            except grpc.RpcError as e:
                assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.CANCELLED), e
    text = "".join(log)
    deadline = time.monotonic() + 10
    while not all(w in text for w in want):  # every value reached the log, escaped
        assert time.monotonic() < deadline, ([w for w in want if w not in text], text[-3000:])
        time.sleep(0.1)
        text = "".join(log)
    assert _forged_lines(log) == [], _forged_lines(log)


def test_a_data_path_with_a_newline_cannot_inject_a_log_line(server, pki):
    address, log = server
    alice = client(address, pki, "alice")
    with _client_channel(address, pki) as ch:
        from fxdp.v1 import jobs_pb2_grpc as jgrpc
        from fxdp.wire_tensors import chunks as _chunks

        step = traced(MODEL, OPTIM)
        state = step.initial_state()
        spec = jpb.JobSpec(
            graph=step.graph,
            world_size=1,
            steps=1,
            num_state_tensors=len(state),
            name="paths",
            data_paths=["/nonexistent\n" + FORGED],
        )
        reqs = [jpb.SubmitJobRequest(spec=spec)] + [
            jpb.SubmitJobRequest(state=c) for k, v in state.items() for c in _chunks(k, v)
        ]
        with pytest.raises(grpc.RpcError) as e:
            list(jgrpc.JobServiceStub(ch).Submit(iter(reqs), timeout=30))
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value
    assert alice.jobs()
    time.sleep(0.5)
    assert _forged_lines(log) == [], _forged_lines(log)


def _server_pid(admin) -> int:
    """The server's pid: the parent of its --local-workers."""
    pid = next(
        w["pid"]
        for w in admin.workers()
        if w["worker_id"].startswith("local-") and w.get("state") == "WORKER_STATE_IDLE"
    )
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M).group(1))


def test_unauthenticated_streams_cost_the_server_no_thread(server, pki):
    """300 Submit and 300 Attach streams without credentials, left open and silent, are refused
    UNAUTHENTICATED before any handler runs: the server's thread count does not grow (without
    authentication each one held a server thread: 19 -> 2,021 threads with 2,000 streams)."""
    import queue

    address, _ = server
    admin = client(address, pki, "admin")
    pid = _server_pid(admin)
    before = _threads(pid)
    raw = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with grpc.secure_channel(
        address, grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
    ) as ch:
        calls = [
            ch.stream_stream(m, **raw)(iter(queue.Queue().get, None), timeout=30)
            for m in ("/fxdp.v1.JobService/Submit", "/fxdp.v1.WorkerService/Attach")
            for _ in range(300)
        ]
        deadline = time.monotonic() + 20
        while any(c.running() for c in calls):
            assert time.monotonic() < deadline, sum(c.running() for c in calls)
            time.sleep(0.1)
        assert {c.code() for c in calls} == {UNAUTHENTICATED}, {c.code() for c in calls}
        during = _threads(pid)
        for c in calls:
            c.cancel()
    assert during <= before + 8, (before, during)
    assert admin.jobs() is not None


def test_wrong_tokens_are_rate_limited_per_connection(pki):
    """After --max-auth-failures wrong tokens on one connection, its calls with a token (a right one
    too: a blocked guesser must not learn when it guessed right) are RESOURCE_EXHAUSTED for
    --auth-block-s, audit-logged once; other connections go on."""
    extra = [*server_args(pki), "--max-auth-failures", "3", "--auth-block-s", "2"]
    with local_server(workers=0, extra_args=extra) as (address, log):
        ca = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
        alice = (pki / "alice.token").read_text().strip()
        raw = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)

        def connection():  # its own TCP + TLS connection (no shared subchannel)
            return grpc.secure_channel(address, ca, options=[("grpc.use_local_subchannel_pool", 1)])

        def list_jobs(ch, token):
            return ch.unary_unary("/fxdp.v1.JobService/ListJobs", **raw)(
                b"", metadata=[("authorization", f"Bearer {token}")], timeout=10
            )

        def code(ch, token):
            with pytest.raises(grpc.RpcError) as e:
                list_jobs(ch, token)
            return e.value

        guesser, other = connection(), connection()
        for i in range(3):
            assert code(guesser, f"guess-{i:012d}").code() == UNAUTHENTICATED
        blocked = code(guesser, alice)
        assert blocked.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, blocked
        assert "too many wrong tokens on this connection (3 within 60 s)" in blocked.details()
        assert "--max-auth-failures" in blocked.details()
        assert code(guesser, "guess-again-000000").code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        list_jobs(other, alice)  # another connection is not blocked
        time.sleep(2.2)
        list_jobs(guesser, alice)  # the block is over
        time.sleep(0.2)
        lines = [x for x in log if 'audit event="auth_blocked"' in x]
        assert len(lines) == 1, lines
        assert 'failures="3"' in lines[0] and "guess" not in "".join(log)
        # New connections, after a blocked one closed, never inherit its block (they could when the
        # key was a memory address, which the allocator hands out again).
        for i in range(3):
            assert code(guesser, f"guess-{i:012d}").code() == UNAUTHENTICATED
        assert code(guesser, alice).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        guesser.close()
        time.sleep(0.3)
        for _ in range(20):
            with connection() as fresh:
                list_jobs(fresh, alice)
        other.close()
