"""What a job that ends before its last step keeps (issue 26, docs/jobs.md "What an ended job
keeps"), on a real ``fxdp-server`` with two real workers (zoo mlp/AdamW):

* a job cancelled at step 4 of 10 (its client holding step 5's batch back) is CANCELLED with the
  state after step 4 kept: ``JobInfo.steps_done`` and ``checkpoint_step`` are 4, ``has_state``;
  ``Client.fetch_state`` gives the state of 4 ``run_local`` steps; with ``--state-dir``
  ``train(resume=JOB)`` runs steps 5 ... 10 and ends like 10 ``run_local`` steps (REPLICATE, and
  FULLY_SHARD, whose state is gathered from every rank's shards);
* a job failing on a partial last batch at step 3 keeps step 2's state (in memory, without
  ``--state-dir``): its error names the input, both shapes and what to do, its steps_done agrees
  with it, and the state (``Client.fetch_state``, ``fxdp fetch``) equals 2 ``run_local`` steps.
"""

from __future__ import annotations

import subprocess
import threading

import fxdp
import grpc
import pytest
import torch
from _util import ATOL, RTOL, ServerProcess, fxdp_binary, local_steps, traced
from fxdp import zoo

MODEL, OPTIM = "mlp", "adamw"
STEPS = 10


def batches():
    return [zoo.get(MODEL).named_batch(i) for i in range(STEPS)]


def held(n: int, gate: threading.Event, data=None):
    """batches() (or `data`) as a generator that sends n, then waits for `gate` (the job is
    cancelled meanwhile, so that it cannot have run step n + 1)."""
    for i, b in enumerate(batches() if data is None else data):
        if i == n:
            gate.wait(60)
            return
        yield b


def assert_state_close(got, want):
    assert set(got) == set(want), set(got) ^ set(want)
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, rtol=RTOL, atol=ATOL, msg=lambda m: f"{k}: {m}")


def server_error(fn) -> fxdp.ServerError:
    with pytest.raises(fxdp.ServerError) as e:
        fn()
    return e.value


def cancel_at(client, step, n, *, cancels=1, on_cancel=None, data=None, resume=None, **kw):
    """Trains `step` on 2 ranks with the batches held after n, cancelling (`cancels` times at once,
    from other threads: CancelJob waits for the job's end) at step n -> (the error, the job id)."""
    seen, gate = {}, threading.Event()
    threads = []

    def on_step(s, loss):
        if s == n:
            for _ in range(cancels):
                t = threading.Thread(target=lambda: client.cancel(seen["id"], "enough"))
                threads.append(t)
                t.start()
            if on_cancel is not None:
                on_cancel(seen["id"])

    try:
        err = server_error(
            lambda: client.train(
                step,
                world_size=2,
                batches=held(n, gate, data),
                steps=STEPS,
                **{"style": "fully_shard", **kw},
                on_step=on_step,
                resume=resume,
                on_event=lambda e: seen.setdefault("id", e.job_id),
            )
        )
    finally:
        gate.set()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a CancelJob did not return"
    return err, seen["id"]


@pytest.mark.parametrize("style", ["replicate", "fully_shard"])
def test_a_cancelled_job_keeps_its_last_steps_state_and_resumes(tmp_path, style):
    step = traced(MODEL, OPTIM)
    with (
        ServerProcess("--state-dir", tmp_path / "state") as server,
        fxdp.Client(server.address, timeout=60) as client,
    ):
        err, job = cancel_at(client, step, 4, style=style)
        assert err.code == grpc.StatusCode.CANCELLED, err
        assert f"its state after step 4 is kept (fxdp fetch {job}, or continue it" in str(err), err
        info = client.job(job)
        assert (info.steps_done, info.checkpoint_step, info.has_state) == (4, 4, True), info
        ref4, losses4 = local_steps(step, MODEL, 4)
        assert_state_close(client.fetch_state(job), ref4)
        torch.testing.assert_close(
            torch.tensor(list(info.losses)), torch.tensor([float(x) for x in losses4])
        )

        r = client.train(step, world_size=2, batches=batches(), style=style, resume=job)
        assert r.first_step == 4 and len(r.losses) == STEPS - 4, (r.first_step, r.losses)
        ref, _ = local_steps(step, MODEL, STEPS)
        assert_state_close(r.state, ref)


def test_a_bad_batch_at_step_3_keeps_step_2s_state(tmp_path):
    step = traced(MODEL, OPTIM)
    data = batches()[:4]
    data[2] = {k: v[:5] for k, v in data[2].items()}  # a partial last batch of 5 samples, not 12
    with ServerProcess() as server, fxdp.Client(server.address, timeout=60) as client:
        seen = {}
        err = server_error(
            lambda: client.train(
                step, world_size=2, batches=data, on_event=lambda e: seen.setdefault("id", e.job_id)
            )
        )
        job = seen["id"]
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
        assert "step 3's batch: input 'x' is f32[5, 10], the graph expects f32[12, 10]" in str(err)
        assert (
            "a partial last batch (5 of 12 samples): drop it (DataLoader(..., drop_last=True))"
            in str(err)
        )
        assert "or trace with symbolic sizes (fxdp.trace_step(..., dynamic=True))" in str(err), err
        assert f"its state after step 2 is kept (fxdp fetch {job})" in str(err), err
        info = client.job(job)
        assert (info.steps_done, info.checkpoint_step, info.has_state) == (2, 2, True), info
        ref2 = local_steps(step, MODEL, 2)[0]
        assert_state_close(client.fetch_state(job), ref2)
        out = tmp_path / "kept.safetensors"  # `fxdp fetch`: the same state as a file
        cmd = [fxdp_binary("FXDP_BIN", "fxdp"), "fetch", job, "--out", str(out)]
        r = subprocess.run(
            [*cmd, "--server", server.address], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0 and f"wrote {out}" in r.stderr, r.stderr
        from safetensors.torch import load_file

        assert_state_close(load_file(out), ref2)
        # No --state-dir: no record to resume it from, but its state was fetched.
        e = server_error(lambda: client.train(step, world_size=2, batches=data, resume=job))
        assert e.code == grpc.StatusCode.FAILED_PRECONDITION and "keeps no job records" in str(e)
