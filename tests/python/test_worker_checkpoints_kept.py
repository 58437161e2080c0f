"""A job whose workers write its checkpoints and that ends early (issue 27): cancelled after step 3
of 5 with a checkpoint every 2 steps, it keeps its work in the workers' checkpoint of step 2, which
its error, JobInfo and FetchState name with step 3 lost; the server collects no state (has_state
false, checkpoint_step 2, no state to fetch); resumed from that checkpoint (initial_checkpoint=) it
ends like an uninterrupted run. A job failing on a bad batch at step 4 (checkpoint every 3) waits
for the checkpoint due after step 3 and keeps that, not a collected state. And ``Client.train(fetch_state=False)``: the final state of a job
without worker checkpoints stays on the server, fetched later equal to what train would have
returned."""

from __future__ import annotations

import threading

import fxdp
import grpc
import pytest
import torch
from _util import ATOL, RTOL, local_server, traced_mlp_adamw
from fxdp.v1 import jobs_pb2 as jpb
from test_worker_checkpoints import batches

STEPS = 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    step = traced_mlp_adamw(batches(1)[0])
    with local_server(workers=2, extra_args=["--data-root", str(root)]) as (address, log):
        with fxdp.Client(address, timeout=60) as c:
            whole = c.train(step, 2, batches=batches(STEPS), style="fully_shard")
            yield c, step, root, whole


def held(n: int, gate: threading.Event):
    """The first n batches, then waits for `gate` (the job is cancelled meanwhile, so that it
    cannot have run step n + 1)."""
    yield from batches(STEPS)[:n]
    gate.wait(60)


def cancelled_at(c, step, n, **kw):
    """Trains on 2 ranks with the batches held after n, cancelled at step n: (the error, job id)."""
    seen, gate, threads = {}, threading.Event(), []

    def on_step(s, loss):
        if s == n:
            t = threading.Thread(target=lambda: c.cancel(seen["id"], "enough"))
            threads.append(t)
            t.start()

    try:
        with pytest.raises(fxdp.ServerError) as e:
            c.train(
                step,
                2,
                batches=held(n, gate),
                steps=STEPS,
                on_step=on_step,
                on_event=lambda ev: seen.setdefault("id", ev.job_id),
                **kw,
            )
    finally:
        gate.set()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "CancelJob did not return"
    return e.value, seen["id"]


def assert_close(got, want):
    assert sorted(got) == sorted(want)
    for n, t in want.items():
        torch.testing.assert_close(got[n], t, rtol=RTOL, atol=ATOL, msg=lambda m: f"{n}: {m}")


@pytest.mark.parametrize("style", ["fully_shard", "replicate"])
def test_a_cancelled_job_keeps_its_work_on_the_workers_and_resumes(setup, style):
    c, step, root, whole = setup
    ck = root / f"cancelled-{style}"
    policy = {"dir": str(ck), "every": 2}
    err, job = cancelled_at(c, step, 3, style=style, checkpoints=policy)
    assert err.code == grpc.StatusCode.CANCELLED, err
    path = str(ck / "step-2")
    assert f"its work is kept in the workers' checkpoint of step 2, '{path}' (step 3 of the 3 " in (
        str(err)
    ), err
    assert "completed is lost): start a job from it with initial_checkpoint" in str(err), err
    # No state was collected through the server: it names the workers' checkpoint, holds none.
    info = c.job(job)
    assert (info.steps_done, info.checkpoint_step, info.checkpoint_path) == (3, 2, path), info
    assert not info.has_state, info
    assert path in info.error, info.error
    with pytest.raises(fxdp.ServerError) as e:
        c.fetch_state(job)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert (
        f"CANCELLED and its work is kept in the checkpoint its workers wrote, {path} (step 2 "
        in (str(e.value))
    ), e.value
    # Resumed from the named checkpoint: steps 3 ... 5 end like the uninterrupted run.
    plan = fxdp.initial_checkpoint(step, path)
    r = c.train(step, 2, batches=batches(STEPS)[2:], style=style, initial_checkpoint=plan)
    torch.testing.assert_close(
        torch.tensor(list(info.losses[:2]) + r.losses),
        torch.tensor(whole.losses),
        rtol=RTOL,
        atol=ATOL,
    )
    assert_close(r.state, whole.state)


def test_train_without_fetching_leaves_the_final_state_on_the_server(setup):
    c, step, _, whole = setup
    r = c.train(step, 2, batches=batches(STEPS), style="fully_shard", fetch_state=False)
    assert r.state is None and r.checkpoint == ""
    torch.testing.assert_close(
        torch.tensor(r.losses), torch.tensor(whole.losses), rtol=RTOL, atol=ATOL
    )
    info = c.job(r.job_id)
    assert info.state == jpb.JOB_STATE_SUCCEEDED and info.has_state, info
    fetched = c.fetch_state(r.job_id)
    # FetchState gives what train would have returned (its initial-state-only tensors aside).
    assert set(fetched) <= set(whole.state)
    assert_close(fetched, {n: whole.state[n] for n in fetched})


def test_a_job_failing_on_bad_input_keeps_the_checkpoint_due_after_its_last_step(setup):
    c, step, root, whole = setup
    ck = root / "bad-input"
    data = batches(STEPS)
    data[3] = tuple(t[:5] for t in data[3])  # step 4's batch: 5 samples, not 6
    seen = {}
    with pytest.raises(fxdp.ServerError) as e:
        c.train(
            step,
            2,
            batches=data,
            style="fully_shard",
            checkpoints={"dir": str(ck), "every": 3},
            on_event=lambda ev: seen.setdefault("id", ev.job_id),
        )
    err, path = e.value, str(ck / "step-3")
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
    # The checkpoint due after step 3 (the last completed) is awaited, not collected.
    assert f"workers' checkpoint of step 3, '{path}' (it is the last completed step)" in str(err)
    info = c.job(seen["id"])
    assert (info.steps_done, info.checkpoint_step, info.checkpoint_path) == (3, 3, path), info
    assert not info.has_state, info
    r = c.train(
        step,
        2,
        batches=batches(STEPS)[3:],
        style="fully_shard",
        initial_checkpoint=fxdp.initial_checkpoint(step, path),
    )
    assert_close(r.state, whole.state)
