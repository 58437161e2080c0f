"""JobSpec.data_paths are untrusted: the workers read them only under their --data-root
directories, open regular files only, bound what they read, and never echo a file's bytes.

Starts ``fxdp-server --local-workers 2 --data-root ROOT --data-root /dev`` (/dev so that
/dev/zero is inside a root and refused for being a device, not for where it is) and trains the
zoo mlp from files on the workers. Each bad path (a directory without a dataset index, a FIFO, /dev/zero, a file outside
the roots, a symlink out of the root, a truncated file, a text file) fails the job with a
``fxdp.ServerError`` naming the rank and the path, without a hang or a crashed worker; both
workers are IDLE afterwards (same pids: nothing restarted) and a good file still trains.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import time

import fxdp
import grpc
import pytest
from _util import local_server, traced
from fxdp import zoo
from fxdp.v1 import worker_pb2 as wpb
from safetensors.torch import save_file
from test_worker_attach import idle, lab  # noqa: F401  (lab: the fixture)

MODEL, OPTIM = "mlp", "adamw"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    outside = tmp_path_factory.mktemp("outside")
    with (
        local_server(extra_args=["--data-root", str(root), "--data-root", "/dev"]) as (
            address,
            log,
        ),
        fxdp.Client(address) as c,
    ):
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
        # A directory is a dataset directory (docs/datasets.md): this one has no index.
        (root / "dir", grpc.StatusCode.FAILED_PRECONDITION, "dir/index.json' does not exist"),
        (root / "fifo", grpc.StatusCode.FAILED_PRECONDITION, "is a FIFO, not a regular file"),
        (
            "/dev/zero",
            grpc.StatusCode.FAILED_PRECONDITION,
            "is a character device, not a regular file",
        ),
        (
            outside / "secret.safetensors",
            grpc.StatusCode.PERMISSION_DENIED,
            f"outside this worker's data roots (allowed: {root}, /dev)",
        ),
        (root / "escape", grpc.StatusCode.PERMISSION_DENIED, "goes through a symbolic link"),
        (
            root / "truncated.safetensors",
            grpc.StatusCode.INVALID_ARGUMENT,
            "corrupt safetensors data",
        ),
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


SECRET = b"SECRET-PASSWORD-hunter2"


def _with_length(header: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def test_errors_never_carry_a_files_bytes(setup):
    """Issue 25.9: whatever a data file holds that is not well-formed safetensors, no byte of it
    reaches the job's error, the client's message or the server's and workers' log (before:
    nlohmann's "last read: '<the file's text>'", and the length field "header length 16,961")."""
    client, root, _, log = setup
    step = traced(MODEL, OPTIM)
    files = {
        "string": _with_length(b'"' + SECRET),
        "key": _with_length(b'{"' + SECRET + b'": 3}'),
        "dtype": _with_length(
            b'{"x": {"dtype": "' + SECRET + b'", "shape": [1], "data_offsets": [0, 4]}}', b"abcd"
        ),
        "shape": _with_length(
            b'{"x": {"dtype": "F32", "shape": ["' + SECRET + b'"], "data_offsets": [0, 4]}}',
            b"abcd",
        ),
        "metadata": _with_length(b'{"__metadata__": {"' + SECRET + b'": 1}}'),
        "trailing": _with_length(
            b'{"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}} ' + SECRET, b"abcd"
        ),
        "length": b"AB\0\0\0\0\0\0" + SECRET,
    }
    for name, data in files.items():
        (root / f"secret-{name}").write_bytes(data)
        with pytest.raises(fxdp.ServerError) as err:
            client.train(step, world_size=2, data_path=root / f"secret-{name}", steps=1)
        msg = str(err.value)
        assert err.value.code in (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.FAILED_PRECONDITION,
        ), (name, msg)
        assert f"secret-{name}" in msg, msg
        for leak in ("SECRET", "hunter2", "16961", "16,961", "last read"):
            assert leak not in msg, (name, msg)
        idle_workers(client)
    text = "".join(log)
    assert "secret-length" in text and "SECRET" not in text and "16,961" not in text


def _sparse_with_unused(path, batch, unused_bytes: int) -> None:
    """A safetensors file with `batch` and an unused U8 tensor of `unused_bytes` that is a hole."""
    names = {"torch.float32": "F32", "torch.int64": "I64"}
    header, blobs, off = {}, [], 0
    for k in sorted(batch):
        b = batch[k].contiguous().numpy().tobytes()
        header[k] = {
            "dtype": names[str(batch[k].dtype)],
            "shape": list(batch[k].shape),
            "data_offsets": [off, off + len(b)],
        }
        blobs.append(b)
        off += len(b)
    header["unused"] = {
        "dtype": "U8",
        "shape": [unused_bytes],
        "data_offsets": [off, off + unused_bytes],
    }
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        f.truncate(8 + len(h) + off + unused_bytes)


def _read_chars(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def test_unused_tensors_are_never_read(setup):
    """Issue 25.10: a data file declaring an unused 10 GiB tensor (a hole: the file is sparse) trains
    and its workers read about what the graph's inputs need, not the 10 GiB (counted by the
    kernel: /proc/PID/io rchar, every byte a worker read from files and sockets during the job;
    before, the whole file was read, against the workers' --max-data-mb)."""
    client, root, _, _ = setup
    step = traced(MODEL, OPTIM)
    batch = dict(zoo.get(MODEL).named_batch(0))
    _sparse_with_unused(root / "sparse.safetensors", batch, 10 << 30)
    pids = [w["pid"] for w in idle_workers(client)]
    before = {pid: _read_chars(pid) for pid in pids}
    result = client.train(step, world_size=2, data_path=root / "sparse.safetensors", steps=2)
    assert len(result.losses) == 2
    read = {pid: _read_chars(pid) - before[pid] for pid in pids}
    print("bytes the workers read during the job (rchar):", read)
    assert all(n < 256 << 20 for n in read.values()), read


def test_the_server_state_dir_is_never_data(tmp_path):
    """Issue 25.3: with --state-dir under a data root, bob named alice's final state file
    (state/states/<job>.safetensors) as his data and fetched her weights. Now the server refuses
    such a path at Submit (PERMISSION_DENIED naming it: directly, through a link, through '..');
    its --local-workers get the state dir and the key and token files as --data-exclude (and
    --max-data-mb from the server's flag), so they refuse it too when they open it."""
    from _security_server import PERMISSION_DENIED, code_of, server_args
    from _security_server import client as tls_client
    from _util import make_pki

    pki = make_pki(tmp_path / "pki")
    root = tmp_path / "root"
    root.mkdir()
    state = root / "state"
    extra = [*server_args(pki), "--data-root", str(root), "--state-dir", str(state)]
    with local_server(workers=2, extra_args=extra) as (address, log):
        alice, bob, admin = (tls_client(address, pki, who) for who in ("alice", "bob", "admin"))
        step = traced(MODEL, OPTIM)
        hers = alice.train(step, world_size=2, batches=[zoo.get(MODEL).named_batch(0)])
        stolen = state / "states" / f"{hers.job_id}.safetensors"
        assert stolen.is_file()
        os.symlink(state, root / "via")
        (root / "x").mkdir()
        for path in (
            stolen,
            root / "via" / "states" / stolen.name,
            f"{root}/x/../state/states/{stolen.name}",
        ):
            e = code_of(lambda: bob.train(step, world_size=2, data_path=path, steps=1))
            assert (
                e.code == PERMISSION_DENIED and str(path) in str(e) and "state directory" in str(e)
            ), e
        # A NUL ends the path for the kernel where the checks would look past it.
        e = code_of(
            lambda: bob.train(step, world_size=2, data_path=f"{stolen}\0/../../../x", steps=1)
        )
        assert e.code == grpc.StatusCode.INVALID_ARGUMENT and "contains a NUL byte" in str(e), e
        for job in bob.jobs():  # whatever bob has, none holds a byte of alice's state
            assert job["state"] != "JOB_STATE_SUCCEEDED", job
        for w in admin.workers():
            args = open(f"/proc/{w['pid']}/cmdline").read().split("\0")
            excluded = {args[i + 1] for i, a in enumerate(args) if a == "--data-exclude"}
            assert (
                str(state.resolve()) in excluded
                and str((pki / "worker.token").resolve()) in excluded
            ), args
            assert args[args.index("--max-data-mb") + 1] == "4096", args


def test_a_worker_refuses_excluded_paths_it_is_sent(lab, tmp_path):  # noqa: F811
    """The worker's own check (what holds for a path a server did not refuse, or a link swapped in
    after Submit): a data path under `fxdp-worker attach --data-exclude` fails the job
    PERMISSION_DENIED naming it; the worker stays attached."""
    from safetensors.torch import save_file

    step, single, _ = lab.graphs(MODEL, "sgd", 1)
    data = tmp_path / "data"
    (data / "state").mkdir(parents=True)
    save_file(dict(zoo.get(MODEL).named_batch(0)), str(data / "state" / "b.safetensors"))
    server = lab.server()
    proc = subprocess.Popen(
        [
            lab.worker,
            "attach",
            "--server",
            f"127.0.0.1:{server.port}",
            "--worker-id",
            "x0",
            "--threads",
            "1",
            "--heartbeat-ms",
            "5000",
            "--data-root",
            str(data),
            "--data-exclude",
            str(data / "state"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    lab.procs.append(proc)
    conn = server.accept(1)["x0"]
    path = str(data / "state" / "b.safetensors")
    conn.send(
        assign_job=wpb.AssignJob(
            job_id="x",
            rank=0,
            world_size=1,
            device="cpu",
            steps=1,
            graph=single,
            num_state_tensors=len(step.initial_state()),
            data_paths=[path],
        )
    )
    f = conn.recv("job_failed")
    assert (
        f.code == 7 and path in f.error and "never reads data from" in f.error
    ), f  # PERMISSION_DENIED
    assert proc.poll() is None
    conn.wait_heartbeat(idle)


def test_a_worker_never_reads_its_own_key(tmp_path):
    """A worker started apart (no --data-exclude given) with its key under its data root: a job
    naming the key fails PERMISSION_DENIED naming it (before: the worker read it, and only its
    not being safetensors stopped the job). The server does not know that path: the worker's own
    --tls-key and --token-file are excluded by the worker itself."""
    from _security_server import PERMISSION_DENIED, code_of, server_args
    from _security_server import client as tls_client
    from _util import make_pki
    from test_security import attach
    from test_security import stop as stop_worker

    pki = make_pki(tmp_path / "pki")
    with local_server(workers=0, extra_args=server_args(pki)) as (address, log):
        worker = attach(
            pki,
            address,
            "--tls-ca",
            str(pki / "ca.pem"),
            "--tls-cert",
            str(pki / "worker.pem"),
            "--tls-key",
            str(pki / "worker.key"),
            "--data-root",
            str(pki),
            worker_id="apart",
        )
        try:
            bob = tls_client(address, pki, "bob")
            e = code_of(
                lambda: bob.train(
                    traced(MODEL, OPTIM), world_size=1, data_path=pki / "worker.key", steps=1
                )
            )
            assert e.code == PERMISSION_DENIED and f"{pki / 'worker.key'}' is in" in str(e), e
            assert "PRIVATE KEY" not in str(e) and "PRIVATE KEY" not in "".join(log)
        finally:
            stop_worker(worker)


def test_help_documents_data_roots():
    import subprocess

    from _util import fxdp_binary

    server = subprocess.run(
        [fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"), "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--data-root DIR" in server and "$TMPDIR" in server
    worker = subprocess.run(
        [fxdp_binary("FXDP_WORKER", "fxdp-worker"), "attach", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert (
        "--data-root DIR" in worker
        and "--max-data-mb" in worker
        and "--data-exclude PATH" in worker
    )
    assert "--max-data-mb N" in server
