"""``resume=`` of a job whose workers wrote its checkpoints (issue 27): a job cancelled after step 3
with a checkpoint every 2 steps, FULLY_SHARD on 2 ranks, keeps its work in the workers' checkpoint
of step 2; ``Client.train(..., resume=JOB)`` runs it on 1 REPLICATE rank from that checkpoint (the
new job's workers read it, resharded), going on at step 3 with the schedule's value of step 3, and
ends like the uninterrupted run. A resume that is itself cancelled before its first checkpoint
keeps the checkpoint it started from and is resumed from it again. A job running when the server is
SIGKILLed is FAILED after the restart naming its workers' checkpoint, and resumed from it. The
server needs --state-dir
for the job records (the graph a resume is checked against), never for the state."""

from __future__ import annotations

import math
import threading

import fxdp
import grpc
import pytest
import torch
from _util import ATOL, RTOL, ServerProcess, local_server, traced_mlp_adamw
from fxdp.v1 import jobs_pb2 as jpb
from test_worker_checkpoints import batches
from test_worker_checkpoints_kept import STEPS, assert_close, cancelled_at, held

LR = "optim.group0.lr"


def schedule():
    """A learning rate that changes every step (a schedule started over changes the result)."""
    return [{LR: 1e-2 * (1.5 + math.cos(i))} for i in range(STEPS)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root, state = tmp_path_factory.mktemp("root"), tmp_path_factory.mktemp("state")
    step = traced_mlp_adamw(batches(1)[0])
    args = ["--data-root", str(root), "--state-dir", str(state)]
    with local_server(workers=2, extra_args=args) as (address, log):
        with fxdp.Client(address, timeout=60) as c:
            plain = c.train(
                step, 2, batches=batches(STEPS), schedule=schedule(), style="fully_shard"
            )
            yield c, step, root, plain, log


def assert_resumed_like(c, r, old, k, plain):
    """`r`, a resume of job `old` from step `k`, ends like the uninterrupted run `plain`."""
    assert r.first_step == k and r.job_id != old, (r.first_step, r.job_id)
    close = dict(rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(torch.tensor(r.losses), torch.tensor(plain.losses[k:]), **close)
    assert_close(r.state, plain.state)
    assert r.state[LR].item() == schedule()[-1][LR]  # the schedule went on
    info = c.job(r.job_id)
    assert info.resumed_from == old and info.state == jpb.JOB_STATE_SUCCEEDED, info
    assert info.steps_done == STEPS, info
    torch.testing.assert_close(torch.tensor(list(info.losses)), torch.tensor(plain.losses), **close)


def test_resumed_on_another_world_size_and_style_from_its_workers_checkpoint(setup):
    c, step, root, plain, log = setup
    path = str(root / "a" / "step-2")
    policy = {"dir": str(root / "a"), "every": 2}
    err, old = cancelled_at(
        c, step, 3, style="fully_shard", checkpoints=policy, schedule=schedule()
    )
    assert err.code == grpc.StatusCode.CANCELLED, err
    assert (
        f"'{path}' (step 3 of the 3 completed is lost): resume it (JobSpec.resume_job '{old}'"
        in (str(err))
    ), err
    r = c.train(step, 1, batches=batches(STEPS), schedule=schedule(), style="replicate", resume=old)
    assert_resumed_like(c, r, old, 2, plain)
    assert any(f"resuming {old} from its checkpoint of step 2" in line for line in log), log


def test_a_cancelled_resume_keeps_the_checkpoint_it_started_from(setup):
    c, step, root, plain, _ = setup
    path = str(root / "b" / "step-2")
    policy = {"dir": str(root / "b"), "every": 2}
    _, old = cancelled_at(c, step, 3, checkpoints=policy, schedule=schedule())
    # Resumed at step 2 and cancelled at step 3, before its own first checkpoint (step 4).
    policy = {"dir": str(root / "b2"), "every": 2}
    err, mid = cancelled_at(c, step, 3, checkpoints=policy, schedule=schedule(), resume=old)
    assert f"workers' checkpoint of step 2, '{path}' (step 3 of the 3 completed is lost)" in str(
        err
    ), err
    info = c.job(mid)
    assert (info.resumed_from, info.checkpoint_step, info.checkpoint_path) == (old, 2, path), info
    assert not info.has_state, info
    r = c.train(step, 2, batches=batches(STEPS), schedule=schedule(), resume=mid)
    assert_resumed_like(c, r, mid, 2, plain)


def test_a_job_running_at_a_server_restart_resumes_from_its_workers_checkpoint(setup, tmp_path):
    _, step, root, plain, _ = setup
    args = ["--data-root", str(root), "--state-dir", str(tmp_path / "state")]
    policy = {"dir": str(root / "c"), "every": 2}
    seen, gate = {}, threading.Event()
    with ServerProcess(*args) as server, fxdp.Client(server.address, timeout=60) as c:

        def on_step(s, loss):
            if s == 3:
                server.kill()  # SIGKILL: nothing is flushed or closed
                gate.set()

        with pytest.raises(fxdp.ServerError):
            c.train(
                step,
                2,
                batches=held(3, gate),
                steps=STEPS,
                checkpoints=policy,
                schedule=schedule(),
                on_step=on_step,
                on_event=lambda ev: seen.setdefault("id", ev.job_id),
            )
    job, path = seen["id"], str(root / "c" / "step-2")
    with ServerProcess(*args) as server, fxdp.Client(server.address, timeout=60) as c:
        info = c.job(job)
        assert info.state == jpb.JOB_STATE_FAILED, info
        assert (info.checkpoint_step, info.checkpoint_path) == (2, path), info
        assert f"resume it from its workers' checkpoint of step 2, '{path}'" in info.error, info
    # Ended before this restart, it still names that checkpoint, and resumes from it.
    with ServerProcess(*args) as server, fxdp.Client(server.address, timeout=60) as c:
        info = c.job(job)
        assert (info.checkpoint_step, info.checkpoint_path) == (2, path), info
        r = c.train(step, 1, batches=batches(STEPS), schedule=schedule(), resume=job)
        assert_resumed_like(c, r, job, 2, plain)
