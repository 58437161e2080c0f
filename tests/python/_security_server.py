"""The TLS server the security tests run against: a real ``fxdp-server`` with TLS, client tokens, a
worker join token and mutual TLS (``--local-workers 2`` attached with the join token), certificates
made by ``scripts/dev_ca.sh`` (docs/security.md); fixtures ``pki``, ``other_pki``, ``server`` and
the clients and CLI calls of each identity. Used by test_security.py and test_security_attacks.py.
"""

from __future__ import annotations

import pathlib
import subprocess
import time

import fxdp
import grpc
import pytest
from _util import free_port, fxdp_binary, local_server, make_pki, traced
from fxdp import zoo

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL, OPTIM = "mlp", "adamw"
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("other_pki"))


def server_args(p: pathlib.Path):
    return [
        "--tls-cert",
        str(p / "server.pem"),
        "--tls-key",
        str(p / "server.key"),
        "--tls-ca",
        str(p / "ca.pem"),
        "--client-tokens",
        str(p / "client-tokens"),
        "--worker-token-file",
        str(p / "worker.token"),
    ]


@pytest.fixture(scope="module")
def health_port():
    return free_port()


@pytest.fixture(scope="module")
def server(pki, health_port):
    extra = [*server_args(pki), "--health-listen", f"127.0.0.1:{health_port}"]
    with local_server(workers=2, extra_args=extra) as (address, log):
        admin = client(address, pki, "admin")
        deadline = time.monotonic() + 30
        while sum(w.get("state") == "WORKER_STATE_IDLE" for w in admin.workers()) < 2:
            assert time.monotonic() < deadline, (admin.workers(), log)
            time.sleep(0.1)
        yield address, log


def client(address, p: pathlib.Path, who: str, **kw) -> fxdp.Client:
    return fxdp.Client(
        address, tls_ca=str(p / "ca.pem"), token_file=str(p / f"{who}.token"), timeout=30, **kw
    )


def code_of(fn) -> fxdp.ServerError:
    with pytest.raises(fxdp.ServerError) as e:
        fn()
    return e.value


def cli_as(address: str, pki, who: str, *args: str) -> subprocess.CompletedProcess:
    """`fxdp ARGS` against the TLS server at `address` with the CA and `who`'s token of `pki`."""
    return subprocess.run(
        [
            fxdp_binary("FXDP_BIN", "fxdp"),
            *args,
            "--server",
            address,
            "--tls-ca",
            str(pki / "ca.pem"),
            "--token-file",
            str(pki / f"{who}.token"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


def train_one(c: fxdp.Client, name: str):
    step = traced(MODEL, OPTIM)
    return c.train(step, world_size=1, batches=[zoo.get(MODEL).batch(0)], name=name)
