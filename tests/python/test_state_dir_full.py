"""``fxdp-server --state-dir DIR`` on a full filesystem (issue 25, item 7): a job is SUCCEEDED only
once its final state and its record are durable; otherwise it FAILS naming the file, the system's
reason and the bytes, its state stays fetchable while the server runs, and after a restart no job
the client was told SUCCEEDED is missing.

DIR is a real 2 MiB tmpfs (``mount -t tmpfs``: the test needs root, as CI has; it skips
otherwise). Job A's final state (2 MiB of weights) does not fit: A fails RESOURCE_EXHAUSTED with
``state not saved: DIR/states/A.safetensors: No space left on device (needed N bytes)``, and
FetchState still gives its state, equal to one device's. Job B (small) SUCCEEDS. With the disk
then filled up, job C is refused or fails, never SUCCEEDED. After a restart on DIR, B is
SUCCEEDED with the same state, A is FAILED with its error. Before the fix A was reported
SUCCEEDED with no state written, and it was gone after the restart.
"""

from __future__ import annotations

import os
import subprocess

import fxdp
import grpc
import pytest
import torch
from _util import ATOL, RTOL, ServerProcess, fetch, mse_step, traced
from fxdp import zoo
from fxdp.v1 import jobs_pb2 as jpb

SIZE = 2 << 20  # the tmpfs


@pytest.fixture
def full_disk(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(d)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def big_step():
    """A linear layer with 2 MiB of weights (SGD: no optimizer state): its final state does not fit."""
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 512)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = (torch.randn(4, 1024), torch.randn(4, 512))
    return fxdp.trace_step(mse_step, model, opt, batch), batch


def test_a_job_is_succeeded_only_once_its_state_and_record_are_on_disk(full_disk):
    step, batch = big_step()
    want, _ = step.run_local(step.initial_state(), batch)
    small = traced("mlp", "adamw")
    e = zoo.get("mlp")
    with ServerProcess("--state-dir", full_disk) as server, fxdp.Client(server.address) as client:
        with pytest.raises(fxdp.ServerError) as err:
            client.train(step, world_size=2, batches=[batch])
        msg = str(err.value)
        a = next(j for j in client.jobs() if j.world_size == 2).job_id
        path = full_disk / "states" / f"{a}.safetensors"
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, msg
        assert f"state not saved: {path}: No space left on device (needed " in msg, msg
        assert "kept in memory for FetchState until the server restarts" in msg, msg
        info = client.job(a)
        assert info.state == jpb.JOB_STATE_FAILED and info.has_state, info
        got = fetch(server.jobs, a)  # the work is not lost while the server runs
        assert {"weight", "bias"} <= got.keys() <= want.keys(), got.keys()
        for k, v in got.items():  # 2 ranks equal one device
            torch.testing.assert_close(v, want[k], rtol=RTOL, atol=ATOL, msg=lambda m: f"{k}: {m}")
        assert not path.exists() and not list((full_disk / "states").iterdir())  # no partial file

        b = client.train(small, world_size=2, batches=[e.batch(0)])
        assert client.job(b.job_id).state == jpb.JOB_STATE_SUCCEEDED

        fd = os.open(
            full_disk / "filler", os.O_WRONLY | os.O_CREAT
        )  # the disk full to the last byte
        try:
            while os.write(fd, b"\0" * 4096) > 0:
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        with pytest.raises(fxdp.ServerError) as err:
            client.train(small, world_size=2, batches=[e.batch(0)])
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, str(err.value)
        assert "No space left on device" in str(err.value) or "database or disk is full" in str(
            err.value
        ), str(err.value)
        succeeded = {j.job_id for j in client.jobs() if j.state == jpb.JOB_STATE_SUCCEEDED}
        assert succeeded == {b.job_id}, succeeded
    (full_disk / "filler").unlink()

    with ServerProcess("--state-dir", full_disk) as server, fxdp.Client(server.address) as client:
        after = {j.job_id: j for j in client.jobs()}
        assert {j for j, i in after.items() if i.state == jpb.JOB_STATE_SUCCEEDED} == {
            b.job_id
        }, after
        assert (
            after[a].state == jpb.JOB_STATE_FAILED and "state not saved" in after[a].error
        ), after[a]
        assert not after[a].has_state, after[a]
        assert all(torch.equal(v, b.state[k]) for k, v in fetch(server.jobs, b.job_id).items())
