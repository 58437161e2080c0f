"""Issue 25 against a real ``fxdp-server`` with TLS and tokens from ``scripts/dev_ca.sh``
(docs/security.md, "Checked attacks"):

* 8 threads on ONE channel, each call with alice's or bob's token, call at once: the server stays
  up and every answer is for its own caller, another's job NOT_FOUND (before:
  ``security_context.cc:197 assertion failed`` within seconds, or bob answered with alice's jobs);
  tests/security/call_auth_test.cc does the same in process;
* every fxdp.v1 method refuses a wrong token (each handler authenticates its call);
* a second ``fxdp-server`` on a port in use exits 1 naming it (before: both listened, SO_REUSEPORT,
  and the kernel split the connections between them).
"""

from __future__ import annotations

import subprocess
import threading
import time

import grpc
import pytest
from _security_server import client, server_args, train_one
from _util import free_port, fxdp_binary, local_server, make_pki
from fxdp.v1 import jobs_pb2 as jpb
from fxdp.v1 import jobs_pb2_grpc as jgrpc


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_eight_threads_on_one_connection_each_get_their_own_answers(pki):
    with local_server(workers=1, extra_args=server_args(pki)) as (address, log):
        admin = client(address, pki, "admin")
        deadline = time.monotonic() + 60
        while not any(w.get("state") == "WORKER_STATE_IDLE" for w in admin.workers()):
            assert time.monotonic() < deadline, log
            time.sleep(0.1)
        names = ("alice", "bob")
        ids = {who: train_one(client(address, pki, who), f"{who}'s job").job_id for who in names}
        tokens = {who: (pki / f"{who}.token").read_text().strip() for who in names}
        # ONE channel (one TLS connection), each call with its caller's token.
        channel = grpc.secure_channel(
            address,
            grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes()),
            options=[("grpc.use_local_subchannel_pool", 1)],
        )
        stub = jgrpc.JobServiceStub(channel)
        wrong, rounds = [], [0]
        until = time.monotonic() + 3

        def one_round(who: str, other: str):
            md = [("authorization", f"Bearer {tokens[who]}")]
            jobs = stub.ListJobs(jpb.ListJobsRequest(), metadata=md, timeout=30).jobs
            if [(j.job_id, j.owner) for j in jobs] != [(ids[who], who)]:
                wrong.append(f"{who}'s ListJobs: {[(j.job_id, j.owner) for j in jobs]}")
            if (
                stub.GetJob(jpb.GetJobRequest(job_id=ids[who]), metadata=md, timeout=30).owner
                != who
            ):
                wrong.append(f"{who}'s GetJob of its job: another owner")
            try:
                info = stub.GetJob(jpb.GetJobRequest(job_id=ids[other]), metadata=md, timeout=30)
                wrong.append(f"{who}'s GetJob of {other}'s job: {info.owner}")
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    wrong.append(f"{who}'s GetJob of {other}'s job: {e.code()} {e.details()}")

        def run(t: int):
            i = 0
            while time.monotonic() < until and not wrong:
                try:
                    one_round(names[(t + i) % 2], names[(t + i + 1) % 2])
                except grpc.RpcError as e:
                    wrong.append(f"{e.code()} {e.details()}")
                i += 1
                rounds[0] += 1

        threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        channel.close()
        assert not wrong, (wrong[:3], rounds[0], log[-20:])
        assert rounds[0] >= 8
        assert [j.job_id for j in client(address, pki, "alice").jobs()] == [
            ids["alice"]
        ]  # still up


def test_every_fxdp_method_refuses_a_wrong_token(pki):
    """A wrong token passes the auth processor (it cannot count failures: it sees no peer) and is
    refused by the handler's CallPrincipal: every method of every fxdp.v1 service must call it."""
    from fxdp.v1 import compile_pb2, worker_pb2

    raw = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)
    md = [("authorization", "Bearer not-a-token-the-server-knows")]
    with local_server(workers=0, extra_args=server_args(pki)) as (address, log):
        with grpc.secure_channel(
            address, grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
        ) as ch:
            methods = [
                m
                for mod in (compile_pb2, jpb, worker_pb2)
                for svc in mod.DESCRIPTOR.services_by_name.values()
                for m in svc.methods
            ]
            assert len(methods) == 9, [m.full_name for m in methods]
            for m in methods:
                path = f"/{m.containing_service.full_name}/{m.name}"
                kind = {
                    (False, False): ch.unary_unary,
                    (False, True): ch.unary_stream,
                    (True, True): ch.stream_stream,
                }[(m.client_streaming, m.server_streaming)]
                with pytest.raises(grpc.RpcError) as e:
                    call = kind(path, **raw)
                    arg = iter([]) if m.client_streaming else b""
                    out = call(arg, metadata=md, timeout=30)
                    if m.server_streaming:
                        list(out)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, (path, e.value)
                assert "invalid token" in e.value.details(), (path, e.value.details())


def test_a_second_server_on_a_port_in_use_fails_naming_it():
    port = free_port()
    args = ["--listen", f"127.0.0.1:{port}", "--local-workers", "0"]
    binary = fxdp_binary("FXDP_SERVER_BIN", "fxdp-server")
    first = subprocess.Popen(
        [binary, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout.readline() == f"listening on 127.0.0.1:{port}\n"
        r = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stdout)
        assert (
            f"fxdp-server: address 127.0.0.1:{port} is in use (another fxdp-server?)" in r.stderr
        ), r.stderr
    finally:
        first.terminate()
        first.communicate(timeout=15)
