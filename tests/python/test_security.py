"""TLS, identities, ownership and the audit log, against a real ``fxdp-server`` with TLS, client
tokens, a worker join token and mutual TLS (``--local-workers 2`` attached with the join token), and
real ``fxdp-worker attach`` processes, all with certificates made by ``scripts/dev_ca.sh``
(docs/security.md): calls without or with a wrong token are UNAUTHENTICATED, a client with the wrong
CA cannot connect, a client sees and acts on its own jobs only (NOT_FOUND otherwise; an
admin sees all; ownership survives a restart under ``--state-dir``), workers attach only with the join token or a worker certificate, a hostname with a
newline cannot inject a log line, and a non-loopback ``--listen`` without TLS needs ``--insecure``."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import _security_server as tls
import fxdp
import grpc
import pytest
from _security_server import (
    MODEL,
    OPTIM,
    PERMISSION_DENIED,
    UNAUTHENTICATED,
    cli_as,
    client,
    code_of,
    server_args,
    train_one,
)
from _util import free_port, fxdp_binary, local_server, traced, wait_log
from fxdp import zoo
from fxdp.v1 import jobs_pb2 as jpb
from fxdp.v1 import worker_pb2 as wpb
from fxdp.v1 import worker_pb2_grpc as wgrpc

# The TLS server's fixtures (_security_server.py).
health_port = tls.health_port
other_pki = tls.other_pki
pki = tls.pki
server = tls.server


def test_calls_without_or_with_a_wrong_token_are_unauthenticated(server, pki):
    address, log = server
    bare = fxdp.Client(address, tls_ca=str(pki / "ca.pem"), timeout=10)
    e = code_of(bare.jobs)
    assert e.code == UNAUTHENTICATED and "requires credentials" in str(e)
    wrong = fxdp.Client(
        address, tls_ca=str(pki / "ca.pem"), token="not-a-token-the-server-knows", timeout=10
    )
    for call in (
        wrong.jobs,
        wrong.workers,
        lambda: wrong.job("job-1"),
        lambda: wrong.analyze(traced(MODEL, OPTIM)),
    ):
        e = code_of(call)
        assert e.code == UNAUTHENTICATED and "invalid token" in str(e), e
    # The token is never logged.
    assert "not-a-token-the-server-knows" not in "".join(log)
    # The workers' join token is no client credential.
    e = code_of(client(address, pki, "worker").jobs)
    assert e.code == PERMISSION_DENIED and "may only attach" in str(e)
    # A plain-text channel to a TLS server does not get through at all.
    e = code_of(fxdp.Client(address, timeout=5).jobs)
    assert e.code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(ValueError, match="needs TLS"):
        fxdp.Client(address, token_file=str(pki / "alice.token"), tls_ca="")


def test_health_checks_in_plain_text_on_their_own_port_only(server, pki, health_port):
    raw = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)
    # On the TLS port, health checks need no credentials (load balancers, probes); nothing else.
    with grpc.secure_channel(
        server[0], grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
    ) as ch:
        assert ch.unary_unary("/grpc.health.v1.Health/Check", **raw)(b"", timeout=10) == b"\x08\x01"
        with pytest.raises(grpc.RpcError) as e:
            ch.stream_stream(
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", **raw
            )(iter([b""]), timeout=10).next()
        assert e.value.code() == UNAUTHENTICATED
    with grpc.insecure_channel(f"127.0.0.1:{health_port}") as ch:
        assert (
            ch.unary_unary("/grpc.health.v1.Health/Check", **raw)(b"", timeout=10) == b"\x08\x01"
        )  # SERVING
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary("/fxdp.v1.JobService/ListJobs", **raw)(b"", timeout=10)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_tls_client_with_the_wrong_ca_fails(server, other_pki):
    address, _ = server
    c = fxdp.Client(
        address,
        tls_ca=str(other_pki / "ca.pem"),
        token_file=str(other_pki / "alice.token"),
        timeout=10,
    )
    e = code_of(c.jobs)
    assert e.code == grpc.StatusCode.UNAVAILABLE and "CERTIFICATE_VERIFY_FAILED" in str(e), e
    # The CLI says the same, naming the server and the flag to check.
    r = cli_as(address, other_pki, "alice", "jobs")
    assert r.returncode == 3 and "unreachable" in r.stderr and "--tls-ca" in r.stderr, r.stderr


def test_cli_uses_tls_and_a_token_from_flags_or_environment(server, pki):
    address, _ = server
    fxdp_cli = fxdp_binary("FXDP_BIN", "fxdp")
    r = cli_as(address, pki, "alice", "workers")
    assert r.returncode == 0 and "local-0" in r.stdout, r.stderr
    env = dict(
        os.environ,
        FXDP_SERVER=address,
        FXDP_TLS_CA=str(pki / "ca.pem"),
        FXDP_TOKEN_FILE=str(pki / "bob.token"),
    )
    r = subprocess.run([fxdp_cli, "jobs"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    env.pop("FXDP_TOKEN_FILE")
    r = subprocess.run([fxdp_cli, "jobs"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr, r.stderr


def test_jobs_belong_to_their_submitter(server, pki):
    address, log = server
    alice, bob, admin = (client(address, pki, w) for w in ("alice", "bob", "admin"))
    # Client certificates are identities too: CN=alice is alice.
    alice_cert = fxdp.Client(
        address,
        tls_ca=str(pki / "ca.pem"),
        tls_cert=str(pki / "client.pem"),
        tls_key=str(pki / "client.key"),
        timeout=30,
    )
    mine = train_one(alice, "alice's job")
    theirs = train_one(bob, "bob's job")
    # Another identity's job is NOT_FOUND like a job that does not exist (ids cannot be probed).
    for call in (
        lambda: bob.job(mine.job_id),
        lambda: bob.cancel(mine.job_id),
        lambda: bob.fetch_state(mine.job_id),
    ):
        e = code_of(call)
        assert e.code == grpc.StatusCode.NOT_FOUND and f"no job '{mine.job_id}'" in str(e), e
    assert alice.job(mine.job_id).name == "alice's job"
    assert set(alice.fetch_state(mine.job_id)) == set(mine.state)
    assert alice_cert.job(mine.job_id).owner == "alice"
    r = cli_as(address, pki, "alice", "job", mine.job_id, "--json")
    assert r.returncode == 0 and '"owner": "alice"' in r.stdout, r.stderr
    r = cli_as(address, pki, "bob", "cancel", mine.job_id)
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr, r.stderr
    assert [j.job_id for j in alice.jobs()] == [mine.job_id]
    assert [j.job_id for j in bob.jobs()] == [theirs.job_id]
    # An admin (token or O=fxdp:admins certificate) sees and may act on every job.
    admin_cert = fxdp.Client(
        address,
        tls_ca=str(pki / "ca.pem"),
        tls_cert=str(pki / "admin.pem"),
        tls_key=str(pki / "admin.key"),
        timeout=30,
    )
    for a in (admin, admin_cert):
        assert {mine.job_id, theirs.job_id} <= {j.job_id for j in a.jobs()}
        assert a.job(theirs.job_id).owner == "bob"
        assert set(a.fetch_state(mine.job_id)) == set(mine.state)
    assert admin.cancel(mine.job_id).state == jpb.JOB_STATE_SUCCEEDED  # finished: left as it is
    # The audit log names who did what (denials too: GetJob's only when denied).
    job = mine.job_id
    wait_log(
        log,
        [
            rf'audit event="submit" identity="alice" .*job="{job}"',
            rf'audit event="fetch" identity="root \(admin\)" .*job="{job}"',
            rf'audit event="cancel" identity="root \(admin\)" .*job="{job}"',
        ]
        + [
            rf'audit event="{event}" identity="bob" .*job="{job}" result="denied"'
            for event in ("get", "cancel", "fetch")
        ],
    )


def test_ownership_survives_a_server_restart(pki, tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    extra = [*server_args(pki), "--state-dir", str(state_dir)]
    with local_server(workers=1, extra_args=extra) as (address, log):
        alice = client(address, pki, "alice")
        job = train_one(alice, "kept")
    with local_server(workers=1, extra_args=extra) as (address, log):
        alice, bob = client(address, pki, "alice"), client(address, pki, "bob")
        assert alice.job(job.job_id).owner == "alice"
        assert set(alice.fetch_state(job.job_id)) == set(job.state)
        assert bob.jobs() == []
        assert code_of(lambda: bob.fetch_state(job.job_id)).code == grpc.StatusCode.NOT_FOUND


def attach(pki, address, *creds, worker_id):
    return subprocess.Popen(
        [
            fxdp_binary("FXDP_WORKER", "fxdp-worker"),
            "attach",
            "--server",
            address,
            "--worker-id",
            worker_id,
            "--threads",
            "1",
            "--heartbeat-ms",
            "250",
            *creds,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(proc) -> str:
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def wait_listed(admin, worker_id, timeout=20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(
            w["worker_id"] == worker_id and w.get("state") != "WORKER_STATE_LOST"
            for w in admin.workers()
        ):
            return True
        time.sleep(0.1)
    return False


def test_workers_attach_only_with_the_join_token_or_a_worker_certificate(
    server, pki, other_pki, tmp_path
):
    address, _ = server
    admin = client(address, pki, "admin")
    ca = ["--tls-ca", str(pki / "ca.pem")]
    good = {
        "by-token": [*ca, "--token-file", str(pki / "worker.token")],
        "by-cert": [
            *ca,
            "--tls-cert",
            str(pki / "worker.pem"),
            "--tls-key",
            str(pki / "worker.key"),
        ],
    }
    bad = {
        "no-creds": (ca, "UNAUTHENTICATED"),
        "wrong-token": ([*ca, "--token-file", str(other_pki / "worker.token")], "UNAUTHENTICATED"),
        "client-token": ([*ca, "--token-file", str(pki / "alice.token")], "PERMISSION_DENIED"),
        "client-cert": (
            [*ca, "--tls-cert", str(pki / "client.pem"), "--tls-key", str(pki / "client.key")],
            "PERMISSION_DENIED",
        ),
        "other-ca-cert": (
            [
                *ca,
                "--tls-cert",
                str(other_pki / "worker.pem"),
                "--tls-key",
                str(other_pki / "worker.key"),
            ],
            "cannot attach",
        ),
    }
    procs = {w: attach(pki, address, *a, worker_id=w) for w, a in good.items()}
    procs.update({w: attach(pki, address, *a, worker_id=w) for w, (a, _) in bad.items()})
    try:
        for w in good:
            assert wait_listed(admin, w), admin.workers()
        time.sleep(1.0)  # the refused ones have tried by now (and retried)
        listed = {w["worker_id"] for w in admin.workers()}
        assert not listed & set(bad), listed
    finally:
        logs = {w: stop(p) for w, p in procs.items()}
    for w, (_, why) in bad.items():
        assert "cannot attach" in logs[w] and why in logs[w], (w, logs[w])
        assert "attached to" not in logs[w], logs[w]
    # A worker without a CA cannot send its token at all: a usage error at once.
    r = subprocess.run(
        [
            fxdp_binary("FXDP_WORKER", "fxdp-worker"),
            "attach",
            "--server",
            address,
            "--token-file",
            str(pki / "worker.token"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "--token-file needs --tls-ca" in r.stderr, r.stderr


def test_a_hostname_with_a_newline_cannot_inject_a_log_line(server, pki):
    address, log = server
    creds = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes()),
        grpc.access_token_call_credentials((pki / "worker.token").read_text().strip()),
    )
    forged = 'fxdp-server: audit event="cancel" identity="root (admin)" job="job-1"'
    with grpc.secure_channel(address, creds) as ch:
        # A hostname with a newline is refused outright (Register is validated: docs/robustness.md).
        reg = wpb.WorkerMessage(
            register_worker=wpb.Register(
                protocol_version=wpb.WORKER_PROTOCOL_VERSION_2,
                worker_id="evil",
                hostname="evil\n" + forged,
                device="cpu",
                capacity=1,
            )
        )
        with pytest.raises(grpc.RpcError) as e:
            list(wgrpc.WorkerServiceStub(ch).Attach(iter([reg]), timeout=10))
        assert (
            e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            and "Register.hostname" in e.value.details()
        )
        # A worker id may hold quotes and backslashes: the audit line escapes them.
        reg = wpb.WorkerMessage(
            register_worker=wpb.Register(
                protocol_version=wpb.WORKER_PROTOCOL_VERSION_2,
                worker_id='evil"x=\\1',
                hostname="evil",
                device="cpu",
                capacity=1,
            )
        )
        stream = wgrpc.WorkerServiceStub(ch).Attach(iter([reg]), timeout=10)
        first = next(stream)
        assert first.WhichOneof("msg") == "registered"
        stream.cancel()
    deadline = time.monotonic() + 10
    while not any('worker="evil' in line and "worker_join" in line for line in log):
        assert time.monotonic() < deadline, log
        time.sleep(0.05)
    lines = "".join(log).splitlines()
    assert not any(line.startswith(forged) for line in lines), lines
    join = [line for line in lines if "worker_join" in line and 'worker="evil' in line]
    assert join == [
        f'fxdp-server: audit event="worker_join" identity="worker (worker)" '
        f'peer="{join[0].split("peer=")[1].split(chr(34))[1]}" worker="evil\\"x=\\\\1" '
        f'hostname="evil" device="cpu"'
    ], join


def start_server(*args):
    return subprocess.Popen(
        [fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_non_loopback_listen_needs_tls_or_insecure(pki, tmp_path):
    port = free_port()
    r = subprocess.run(
        [fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"), "--listen", f"0.0.0.0:{port}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2, r
    assert (
        f"--listen 0.0.0.0:{port} is not a loopback address" in r.stderr
        and "--insecure" in r.stderr
    ), r.stderr
    for args in (["--insecure"], server_args(pki)):
        p = start_server("--listen", f"0.0.0.0:{free_port()}", *args)
        try:
            line = p.stdout.readline()
            assert line.startswith("listening on 0.0.0.0:"), (
                line,
                p.stderr.read() if p.poll() is not None else "",
            )
        finally:
            p.terminate()
            _, err = p.communicate(timeout=15)
        assert p.returncode == 0, err
        if args == ["--insecure"]:
            assert "--insecure: anyone who can reach this address has full access" in err, err
    # A join token every user may read is served, with a warning naming it.
    loose = tmp_path / "worker.token"
    loose.write_text((pki / "worker.token").read_text())
    loose.chmod(0o644)
    args = [a if a != str(pki / "worker.token") else str(loose) for a in server_args(pki)]
    p = start_server("--listen", "127.0.0.1:0", *args)
    assert p.stdout.readline().startswith("listening on 127.0.0.1:")
    p.terminate()
    _, err = p.communicate(timeout=15)
    assert (
        f"warning: --worker-token-file '{loose}' is readable or writable by every user" in err
    ), err
    # Tokens without TLS are refused: they would cross the network in the clear.
    r = subprocess.run(
        [
            fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"),
            "--listen",
            "127.0.0.1:0",
            "--client-tokens",
            str(pki / "client-tokens"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "need TLS" in r.stderr, r.stderr


def test_client_timeout_bounds_every_call(server, pki):
    address, _ = server
    c = client(address, pki, "alice")
    assert c.timeout == 30

    def slow_batches():  # a job that cannot end within the call's timeout on any machine
        yield zoo.get(MODEL).batch(0)
        time.sleep(2)
        yield zoo.get(MODEL).batch(0)

    t0 = time.monotonic()
    e = code_of(
        lambda: c.train(traced(MODEL, OPTIM), world_size=1, batches=slow_batches(), timeout=0.05)
    )
    assert e.code == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t0 < 2, e
    # A server that accepts the connection and never answers (the TLS handshake hangs): every call
    # ends at the client's timeout.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        hung = fxdp.Client(
            f"127.0.0.1:{silent.getsockname()[1]}",
            tls_ca=str(pki / "ca.pem"),
            token_file=str(pki / "alice.token"),
            timeout=0.5,
        )
        for call in (
            hung.jobs,
            hung.workers,
            lambda: hung.job("job-1"),
            lambda: hung.fetch_state("job-1"),
        ):
            t0 = time.monotonic()
            e = code_of(call)
            assert e.code == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t0 < 5, e
    with pytest.raises(ValueError, match="timeout"):
        fxdp.Client(address, timeout=0)
