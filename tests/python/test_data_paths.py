"""JobSpec.data_paths are untrusted: the workers read them only under their --data-root
directories, open regular files only, bound what they read, and never echo a file's bytes.

Starts ``fxdp-server --local-workers 2 --data-root ROOT --data-root /dev`` (/dev so that
/dev/zero is inside a root and refused for being a device, not for where it is) and trains the
zoo mlp from files on the workers. Each bad path (a directory, a FIFO, /dev/zero, a file outside
the roots, a symlink out of the root, a truncated file, a text file) fails the job with a
``fxdp.ServerError`` naming the rank and the path, without a hang or a crashed worker; both
workers are IDLE afterwards (same pids: nothing restarted) and a good file still trains.
"""

from __future__ import annotations

import os
import struct
import time

import grpc
import pytest
from safetensors.torch import save_file

import fxdp
from _util import local_server, traced
from fxdp import zoo

MODEL, OPTIM = "mlp", "adamw"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    outside = tmp_path_factory.mktemp("outside")
    with local_server(extra_args=["--data-root", str(root), "--data-root", "/dev"]) as (address, log), \
            fxdp.Client(address) as c:
        yield c, root, outside, log


def idle_workers(client, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        ws = client.workers()
        if sum(w.get("state") == "WORKER_STATE_IDLE" for w in ws) >= 2:
            return ws
        assert time.monotonic() < deadline, ws
        time.sleep(0.1)


def test_bad_data_paths_fail_the_job_and_the_workers_stay(setup):
    client, root, outside, log = setup
    step = traced(MODEL, OPTIM)
    batch = zoo.get(MODEL).named_batch(0)
    save_file(batch, str(root / "good.safetensors"))
    save_file(batch, str(outside / "secret.safetensors"))
    (root / "dir").mkdir()
    os.mkfifo(root / "fifo")
    os.symlink(outside / "secret.safetensors", root / "escape")
    good = (root / "good.safetensors").read_bytes()
    (root / "truncated.safetensors").write_bytes(good[: len(good) // 2])
    (root / "passwd").write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    before = {w["worker_id"]: w.get("pid") for w in idle_workers(client)}

    cases = [  # (path, status, what the error says)
        (root / "dir", grpc.StatusCode.FAILED_PRECONDITION, "is a directory, not a regular file"),
        (root / "fifo", grpc.StatusCode.FAILED_PRECONDITION, "is a FIFO, not a regular file"),
        ("/dev/zero", grpc.StatusCode.FAILED_PRECONDITION, "is a character device, not a regular file"),
        (outside / "secret.safetensors", grpc.StatusCode.PERMISSION_DENIED,
         f"outside this worker's data roots (allowed: {root}, /dev)"),
        (root / "escape", grpc.StatusCode.PERMISSION_DENIED, "outside this worker's data roots"),
        (root / "truncated.safetensors", grpc.StatusCode.INVALID_ARGUMENT, "corrupt safetensors data"),
        (root / "passwd", grpc.StatusCode.INVALID_ARGUMENT, "not a safetensors file"),
        ("/etc/passwd", grpc.StatusCode.PERMISSION_DENIED, "outside this worker's data roots"),
    ]
    for path, code, what in cases:
        t0 = time.monotonic()
        with pytest.raises(fxdp.ServerError) as err:
            client.train(step, world_size=2, data_path=path, steps=1)
        msg = str(err.value)
        assert err.value.code == code, (path, msg)
        assert what in msg and str(path) in msg and "rank" in msg, (path, msg)
        assert "root:x" not in msg and str(struct.unpack("<Q", b"root:x:0")[0]) not in msg, msg
        assert time.monotonic() - t0 < 30, (path, "took", time.monotonic() - t0)
        after = {w["worker_id"]: w.get("pid") for w in idle_workers(client)}
        assert after == before, (path, "workers changed", before, after, "".join(log[-20:]))
    assert not any("terminate called" in line or "restart" in line for line in log), "".join(log)

    result = client.train(step, world_size=2, data_path=root / "good.safetensors", steps=2)
    assert len(result.losses) == 2


def test_help_documents_data_roots():
    import subprocess
    from _util import fxdp_binary
    server = subprocess.run([fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"), "--help"], capture_output=True,
                            text=True, check=True).stdout
    assert "--data-root DIR" in server and "$TMPDIR" in server
    worker = subprocess.run([fxdp_binary("FXDP_WORKER", "fxdp-worker"), "attach", "--help"],
                            capture_output=True, text=True, check=True).stdout
    assert "--data-root DIR" in worker and "--max-data-mb" in worker
