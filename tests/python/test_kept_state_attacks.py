"""Attacks on what an ended job keeps (issue 26, docs/jobs.md "What an ended job keeps"), on a real
``fxdp-server`` with two real workers (zoo mlp/AdamW), beyond test_kept_state.py:

* a cancel at a step that is also a --checkpoint-every step (two state requests for the same step
  in flight), then a chain of resumes each cancelled again (4, then 7, then to 10), FULLY_SHARD,
  a dropout MLP with a learning rate that changes every step: the chain's losses and final state
  are the uninterrupted run's bit for bit (no step, draw or schedule entry replayed or skipped);
* two cancels of the same job at once, and FetchState racing them: both cancels return, the
  fetch gives the state after step 4 or a precise status, never another step's state.
"""

from __future__ import annotations

import os
import signal
import threading

import fxdp
import grpc
import torch
import torch.nn.functional as F
from _util import ServerProcess, local_steps, traced
from test_kept_state import MODEL, OPTIM, STEPS, assert_state_close, batches, cancel_at
from test_randomness import DropMLP
from test_resume_jobs import wait_idle

LR = "optim.group0.lr"


def drop_step():
    """A dropout MLP (SGD with momentum), its 10 batches and a schedule changing every step."""
    torch.manual_seed(0)
    model = DropMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    data = [
        {"x": torch.randn(8, 6, generator=g), "y": torch.randn(8, 2, generator=g)}
        for _ in range(STEPS)
    ]
    step = fxdp.trace(model, opt, F.mse_loss, (data[0]["x"], data[0]["y"]), input_names=("x", "y"))
    assert step.random_nodes()
    return step, data, [{LR: 0.01 * (1 + i)} for i in range(STEPS)]


def cancelled_at(client, step, n, **kw):
    """cancel_at, whose job keeps the state after step n -> the job id."""
    err, job = cancel_at(client, step, n, **kw)
    assert err.code == grpc.StatusCode.CANCELLED, err
    assert f"its state after step {n} is kept" in str(err), err
    return job


def test_cancels_at_checkpoint_steps_and_a_chain_of_resumes(tmp_path):
    step, data, sched = drop_step()
    args = ("--state-dir", tmp_path / "state", "--checkpoint-every", 2)
    with ServerProcess(*args) as server, fxdp.Client(server.address, timeout=60) as client:
        kw = dict(world_size=2, style="fully_shard", schedule=sched)
        plain = client.train(step, batches=data, **kw)
        kw.pop("world_size")
        a = cancelled_at(client, step, 4, data=data, **kw)
        assert (client.job(a).checkpoint_step, client.job(a).steps_done) == (4, 4)
        b = cancelled_at(client, step, 7, resume=a, data=data, **kw)
        info = client.job(b)
        assert (info.checkpoint_step, info.steps_done, info.has_state) == (7, 7, True), info
        assert list(info.losses) == plain.losses[:7], (list(info.losses), plain.losses)
        r = client.train(step, batches=data, resume=b, world_size=2, **kw)
        assert r.first_step == 7 and r.losses == plain.losses[7:], (r.losses, plain.losses)
        for k, v in plain.state.items():
            assert torch.equal(r.state[k], v), k
        assert r.state[LR].item() == sched[-1][LR]  # fed as the double it is


def test_two_cancels_and_a_fetch_at_once(tmp_path):
    step = traced(MODEL, OPTIM)
    fetched = {}

    def fetch_now(job):
        def go():
            try:
                fetched["state"] = client.fetch_state(job)
            except fxdp.ServerError as e:
                fetched["error"] = e

        t = threading.Thread(target=go)
        t.start()
        fetched["thread"] = t

    with ServerProcess() as server, fxdp.Client(server.address, timeout=60) as client:
        job = cancelled_at(client, step, 4, cancels=2, on_cancel=fetch_now)
        fetched["thread"].join(60)
        ref4 = local_steps(step, MODEL, 4)[0]
        if "state" in fetched:
            assert_state_close(fetched["state"], ref4)
        else:
            assert fetched["error"].code == grpc.StatusCode.FAILED_PRECONDITION, fetched["error"]
        assert_state_close(client.fetch_state(job), ref4)
        info = client.job(job)
        assert (info.steps_done, info.checkpoint_step, info.has_state) == (4, 4, True), info


def test_the_workers_serve_the_next_job_after_keep_state_s_expires(tmp_path):
    """--keep-state-s 0.001: the ranks cannot give their state in time (or, rarely, just do); the
    error says which, and the same two workers then run the next job to the exact result (no
    state chunk of the cancelled job is taken for the next one's, nothing hangs)."""
    step = traced(MODEL, OPTIM)
    with (
        ServerProcess("--keep-state-s", "0.001") as server,
        fxdp.Client(server.address, timeout=60) as client,
    ):
        err, job = cancel_at(client, step, 4)
        assert err.code == grpc.StatusCode.CANCELLED, err
        info = client.job(job)
        if "its state after step 4 is kept" not in str(err):
            assert (
                "no state is kept (the ranks did not give their state after step 4 within 0.001 s "
                "(fxdp-server --keep-state-s)" in str(err)
            ), err
            assert (info.steps_done, info.has_state) == (4, False), info
        for style in ("fully_shard", "replicate"):
            r = client.train(step, world_size=2, batches=batches(), style=style)
            assert_state_close(r.state, local_steps(step, MODEL, STEPS)[0])


def test_a_rank_killed_during_the_cancel_keeps_an_exact_state(tmp_path):
    """A worker SIGKILLed as the job is cancelled at step 5 (--checkpoint-every 2): whichever state
    the job keeps (step 5's if it was collected first, else the checkpoint of step 4), it is
    exactly that many steps, and the job resumes from it to the uninterrupted result."""
    step = traced(MODEL, OPTIM)
    args = ("--state-dir", tmp_path / "state", "--checkpoint-every", 2)
    with ServerProcess(*args) as server, fxdp.Client(server.address, timeout=60) as client:
        wait_idle(client)
        victim = int(client.workers()[0]["pid"])
        err, job = cancel_at(client, step, 5, on_cancel=lambda _: os.kill(victim, signal.SIGKILL))
        info = client.job(job)
        k = info.checkpoint_step
        assert k in (4, 5) and info.has_state and f"step {k}" in str(err), (k, err)
        assert_state_close(client.fetch_state(job), local_steps(step, MODEL, k)[0])
        r = client.train(step, world_size=2, batches=batches(), style="fully_shard", resume=job)
        assert r.first_step == k and len(r.losses) == STEPS - k, (r.first_step, r.losses)
        assert_state_close(r.state, local_steps(step, MODEL, STEPS)[0])


def test_a_cancel_while_the_final_state_is_collected_keeps_it(tmp_path):
    """A cancel after the last step's loss, while the ranks send their final state (48 MiB of a
    2048x2048 AdamW layer, FULLY_SHARD: it takes a while): the job either succeeds (the cancel
    came too late) or is CANCELLED keeping the state after its last step, never ends without it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2048, 2048)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [{"x": torch.randn(4, 2048), "y": torch.randn(4, 2048)} for _ in range(3)]
    step = fxdp.trace(model, opt, F.mse_loss, (data[0]["x"], data[0]["y"]), input_names=("x", "y"))
    with ServerProcess() as server, fxdp.Client(server.address, timeout=60) as client:
        kw = dict(world_size=2, steps=len(data), style="fully_shard")
        plain = client.train(step, batches=data, **kw).state  # what it must keep, bit for bit
        seen, threads = {}, []

        def on_step(s, loss):
            if s == len(data):
                threads.append(threading.Thread(target=lambda: client.cancel(seen["id"], "late")))
                threads[-1].start()

        try:
            r = client.train(
                step,
                batches=data,
                **kw,
                on_step=on_step,
                on_event=lambda e: seen.setdefault("id", e.job_id),
            )
            state = r.state
        except fxdp.ServerError as err:
            assert err.code == grpc.StatusCode.CANCELLED, err
            assert f"its state after step {len(data)} is kept" in str(err), err
            info = client.job(seen["id"])
            assert (info.steps_done, info.checkpoint_step, info.has_state) == (3, 3, True), info
            state = client.fetch_state(seen["id"])
        for t in threads:
            t.join(60)
        assert set(state) == set(plain)
        for k, v in plain.items():
            assert torch.equal(state[k], v), k


def test_a_rank_lost_while_the_final_state_is_collected_says_what_is_kept(tmp_path):
    """A worker SIGKILLed after the last step's loss (4 steps, --checkpoint-every 2), while the ranks
    send their final state: the job FAILs (or succeeded first) and its error says that the
    checkpoint of step 2 is kept, which fetches as exactly 2 steps."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2048, 2048)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [{"x": torch.randn(4, 2048), "y": torch.randn(4, 2048)} for _ in range(4)]
    step = fxdp.trace(model, opt, F.mse_loss, (data[0]["x"], data[0]["y"]), input_names=("x", "y"))
    args = ("--state-dir", tmp_path / "state", "--checkpoint-every", 2)
    with ServerProcess(*args) as server, fxdp.Client(server.address, timeout=60) as client:
        kw = dict(world_size=2, steps=len(data), style="fully_shard")
        wait_idle(client)
        victim = int(client.workers()[0]["pid"])
        seen = {}

        def on_step(s, loss):
            if s == len(data):
                os.kill(victim, signal.SIGKILL)

        try:
            client.train(
                step,
                batches=data,
                **kw,
                on_step=on_step,
                on_event=lambda e: seen.setdefault("id", e.job_id),
            )
            return  # the state came first
        except fxdp.ServerError as err:
            assert err.code == grpc.StatusCode.UNAVAILABLE, err
            assert "its checkpoint of step 2 is kept, not its last step's" in str(err), err
        info = client.job(seen["id"])
        assert (info.steps_done, info.checkpoint_step, info.has_state) == (4, 2, True), info
        want = step.initial_state()
        for b in data[:2]:
            want, _ = step.run_local(want, b)
        got = client.fetch_state(seen["id"])
        for k, v in want.items():
            torch.testing.assert_close(
                got[k], v, rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}"
            )
