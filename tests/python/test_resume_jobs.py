"""Resuming a FAILED streamed job from its last checkpoint (docs/jobs.md, "Resuming a failed job").

``fxdp-server --local-workers 2 --state-dir DIR --checkpoint-every 2`` checkpoints jobs whose batches
the client streams, as it does data_paths jobs. On it (zoo mlp/AdamW, a learning rate that changes
every step):

* a job whose worker is SIGKILLed mid-run FAILs (UNAVAILABLE) keeping its last checkpoint
  (``JobInfo.checkpoint_step``); ``fxdp.Client.train(..., resume=JOB)`` with the same arguments
  runs a new job (``resumed_from`` naming the old one) from that step: its losses are the
  uninterrupted run's from the checkpoint on, its final state (lr included) equals the
  uninterrupted run's bit for bit, and its record's losses are the whole run's;
* a job running when the server is SIGKILLed is FAILED after the restart with its checkpoint
  kept, and resumed on the new server the same way ends like the uninterrupted run (REPLICATE and
  FULLY_SHARD, whose checkpoint is gathered from the ranks' shards);
* refused resumes, each naming what is wrong: an unknown job (NOT_FOUND), a SUCCEEDED job and a
  job that failed before its first checkpoint (FAILED_PRECONDITION), another world size, another
  graph (the optimizer state it lacks), state sent along (INVALID_ARGUMENT); with authentication
  another identity's job is NOT_FOUND (like an unknown one).
"""

from __future__ import annotations

import math
import os
import re
import signal
import threading
import time

import fxdp
import grpc
import pytest
import torch
from _util import ServerProcess, traced
from fxdp import zoo
from fxdp.v1 import jobs_pb2 as jpb

MODEL, OPTIM = "mlp", "adamw"
STEPS = 80
LR = "optim.group0.lr"


def batches():
    return [zoo.get(MODEL).named_batch(i) for i in range(STEPS)]


def held_batches(n: int, killed: threading.Event):
    """batches() as a generator that sends n and holds the rest until `killed` is set: a job
    killed from on_step at a step < n cannot have run to its end first (~5 ms a step, while the
    test process may be descheduled longer on a loaded machine)."""
    for i, b in enumerate(batches()):
        if i == n:
            assert killed.wait(60), f"nothing was killed after {n} steps"
        yield b


def schedule():
    """A learning rate that changes every step (a misplaced schedule changes the result)."""
    return [{LR: 1e-3 * (1.5 + math.cos(i / 7))} for i in range(STEPS)]


def wait_idle(client, n=2, timeout=30.0):
    deadline = time.monotonic() + timeout
    while sum(w.get("state") == "WORKER_STATE_IDLE" for w in client.workers()) < n:
        assert time.monotonic() < deadline, client.workers()
        time.sleep(0.05)


def code_of(fn) -> fxdp.ServerError:
    with pytest.raises(fxdp.ServerError) as e:
        fn()
    return e.value


def test_state_with_resume_is_a_value_error():
    """A resumed job's state is its checkpoint's: ``state=`` with ``resume=`` is refused before
    anything is sent (no server at 127.0.0.1:1)."""
    step = traced(MODEL, OPTIM)
    client = fxdp.Client("127.0.0.1:1")
    with pytest.raises(ValueError, match="state= and resume= exclude each other"):
        client.train(
            step, world_size=2, batches=batches(), state=step.initial_state(), resume="job-1-abc"
        )


def assert_resumed_like(r, plain, old_id, k, client):
    """`r` (a resume of `old_id` from step `k`) ends like the uninterrupted run `plain`."""
    assert r.job_id != old_id and r.first_step == k, (r.job_id, r.first_step, k)
    assert r.losses == plain.losses[k:]
    assert set(r.state) == set(plain.state)
    for name, v in plain.state.items():
        assert torch.equal(r.state[name], v), name
    assert r.state[LR].item() == schedule()[-1][LR]  # the schedule went on (a float64 value)
    info = client.job(r.job_id)
    assert info.resumed_from == old_id and info.state == jpb.JOB_STATE_SUCCEEDED
    assert list(info.losses) == plain.losses and info.steps_done == STEPS
    assert info.checkpoint_step == 0  # a job that succeeded keeps none


def _lose_a_worker_mid_job(client, step, tmp_path):
    """SIGKILL a worker once step 7's loss is in: the job fails naming the lost rank; its
    JobInfo, with the checkpoint of an even step on disk."""
    wait_idle(client)
    victim = int(client.workers()[0]["pid"])
    seen, killed = {}, threading.Event()

    def on_step(s, loss):
        if s == 7:
            os.kill(victim, signal.SIGKILL)
            killed.set()

    err = code_of(
        lambda: client.train(
            step,
            world_size=2,
            batches=held_batches(9, killed),
            steps=STEPS,
            schedule=schedule(),
            on_step=on_step,
            on_event=lambda e: seen.setdefault("id", e.job_id),
        )
    )
    assert err.code == grpc.StatusCode.UNAVAILABLE and "was lost" in str(err), err
    old = client.job(seen["id"])
    assert old.state == jpb.JOB_STATE_FAILED, old
    k = old.checkpoint_step
    assert k >= 2 and k % 2 == 0 and k <= old.steps_done < STEPS, old
    assert os.path.isfile(tmp_path / "state" / "states" / f"{old.job_id}.checkpoint.safetensors")
    return old


def _bad_resumes_are_refused(server, client, step, plain, old):
    """Each names what is wrong: an unknown job, a SUCCEEDED one, another world size, another
    graph, a job without a checkpoint, a resume that sends state."""
    e = code_of(lambda: client.train(step, world_size=2, batches=batches(), resume="job-999-abc"))
    assert e.code == grpc.StatusCode.NOT_FOUND and "job-999-abc" in str(e), e
    e = code_of(lambda: client.train(step, world_size=2, batches=batches(), resume=plain.job_id))
    assert e.code == grpc.StatusCode.FAILED_PRECONDITION, e
    assert "is SUCCEEDED: only a FAILED or CANCELLED job can be resumed" in str(e), e
    e = code_of(lambda: client.train(step, world_size=1, batches=batches(), resume=old.job_id))
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT, e
    assert "world_size is 1, the job ran on 2" in str(e), e
    e = code_of(
        lambda: client.train(
            traced(MODEL, "sgd"), world_size=2, batches=batches(), resume=old.job_id
        )
    )
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT and "the graph differs" in str(e), e
    assert "'optim.fc1.bias.exp_avg'" in str(e) and "is not in the new graph" in str(e), e
    # A job that failed at step 1 (a batch of the wrong shape), before its first checkpoint.
    bad, seen = [{"x": torch.zeros(3, 1), "target": torch.zeros(3, 1)}], {}
    e = code_of(
        lambda: client.train(
            step,
            world_size=2,
            batches=bad,
            on_event=lambda ev: seen.__setitem__("bad", ev.job_id),
        )
    )
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT, e
    e = code_of(lambda: client.train(step, world_size=2, batches=batches(), resume=seen["bad"]))
    assert e.code == grpc.StatusCode.FAILED_PRECONDITION and "has no checkpoint" in str(e), e
    # A resume sends no state.
    from fxdp.wire_tensors import chunks

    w = step.initial_state()["fc1.bias"]
    reqs = iter(
        [
            jpb.SubmitJobRequest(
                spec=jpb.JobSpec(
                    graph=step.graph,
                    world_size=2,
                    steps=STEPS,
                    num_state_tensors=1,
                    resume_job=old.job_id,
                )
            ),
            *[jpb.SubmitJobRequest(state=c) for c in chunks("fc1.bias", w)],
        ]
    )
    with pytest.raises(grpc.RpcError) as rpc:
        list(server.jobs.Submit(reqs, timeout=30))
    assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, rpc.value
    assert "num_state_tensors must be 0" in rpc.value.details(), rpc.value.details()


def _one_resume_at_a_time(client, step, old):
    """While a resume waits for its first batch, another is refused naming it; once it is
    cancelled, the job can be resumed again."""
    gate, held = threading.Event(), {}

    def gated():
        for i, b in enumerate(batches()):
            if i >= old.checkpoint_step:
                gate.wait(30)
            yield b

    def first():
        try:
            client.train(
                step,
                world_size=2,
                batches=gated(),
                steps=STEPS,
                resume=old.job_id,
                on_event=lambda ev: held.setdefault("id", ev.job_id),
            )
        except fxdp.ServerError as err:
            held["error"] = err

    t = threading.Thread(target=first)
    t.start()
    deadline = time.monotonic() + 30
    while "id" not in held:
        assert time.monotonic() < deadline and t.is_alive(), held
        time.sleep(0.02)
    e = code_of(lambda: client.train(step, world_size=2, batches=batches(), resume=old.job_id))
    assert e.code == grpc.StatusCode.FAILED_PRECONDITION, e
    assert f"job '{old.job_id}' is being resumed already by job '{held['id']}'" in str(e), e
    client.cancel(held["id"])
    gate.set()
    t.join(30)
    assert not t.is_alive() and held["error"].code == grpc.StatusCode.CANCELLED, held


def test_a_streamed_job_resumes_after_a_lost_worker(tmp_path):
    step = traced(MODEL, OPTIM)
    with (
        ServerProcess("--state-dir", tmp_path / "state", "--checkpoint-every", "2") as server,
        fxdp.Client(server.address, timeout=60) as client,
    ):
        plain = client.train(step, world_size=2, batches=batches(), schedule=schedule())
        assert len(plain.losses) == STEPS
        old = _lose_a_worker_mid_job(client, step, tmp_path)
        k = old.checkpoint_step
        _bad_resumes_are_refused(server, client, step, plain, old)
        # The resume: the same arguments plus resume=.
        wait_idle(client)  # the supervisor restarted the killed worker
        _one_resume_at_a_time(client, step, old)
        wait_idle(client)
        r = client.train(
            step, world_size=2, batches=batches(), schedule=schedule(), resume=old.job_id
        )
        assert_resumed_like(r, plain, old.job_id, k, client)
        # It succeeded: the job is done; another resume names the job that completed it.
        e = code_of(lambda: client.train(step, world_size=2, batches=batches(), resume=old.job_id))
        assert e.code == grpc.StatusCode.FAILED_PRECONDITION, e
        assert (
            f"job '{old.job_id}' was resumed already: job '{r.job_id}' resumed it and SUCCEEDED"
            in str(e)
        ), e
        assert client.job(old.job_id).state == jpb.JOB_STATE_FAILED  # the old job stays as it ended
    assert any(
        f"resuming {old.job_id} from its checkpoint of step {k}" in line for line in server.log
    ), "".join(server.log)


@pytest.mark.parametrize("style", ["replicate", "fully_shard"])
def test_a_streamed_job_resumes_after_a_server_restart(tmp_path, style):
    """A running streamed job is FAILED by the restart, its checkpoint kept; resumed from a generator
    on the new server, it ends like the uninterrupted run. FULLY_SHARD: the checkpoint is gathered
    from every rank's shards and split again for the resumed job."""
    step = traced(MODEL, OPTIM)
    state_dir = tmp_path / "state"
    with (
        ServerProcess("--state-dir", state_dir, "--checkpoint-every", "2") as server,
        fxdp.Client(server.address, timeout=60) as client,
    ):
        plain = client.train(
            step, world_size=2, batches=batches(), schedule=schedule(), style=style
        )
        wait_idle(client)
        seen, killed = {}, threading.Event()

        def on_step(s, loss):
            if s == 9:
                server.kill()  # SIGKILL: nothing is flushed or closed
                killed.set()

        with pytest.raises(fxdp.ServerError):
            client.train(
                step,
                world_size=2,
                batches=held_batches(11, killed),
                steps=STEPS,
                schedule=schedule(),
                on_step=on_step,
                on_event=lambda e: seen.setdefault("id", e.job_id),
                style=style,
            )
    job = seen["id"]

    with (
        ServerProcess("--state-dir", state_dir, "--checkpoint-every", "2") as server,
        fxdp.Client(server.address, timeout=60) as client,
    ):
        old = client.job(job)
        assert (
            old.state == jpb.JOB_STATE_FAILED
            and old.error_code == grpc.StatusCode.UNAVAILABLE.value[0]
        )
        k = old.checkpoint_step
        assert k >= 2 and k % 2 == 0, old
        assert (
            f"resume it from its checkpoint of step {k} (fxdp run --resume {job}, or fxdp.Client.train(resume=...))"
            in old.error
        ), old.error
        wait_idle(client)
        # A generator: its first k batches are consumed and dropped.
        r = client.train(
            step,
            world_size=2,
            batches=iter(batches()),
            steps=STEPS,
            schedule=schedule(),
            resume=job,
            style=style,
        )
        assert_resumed_like(r, plain, job, k, client)


def test_only_its_owner_or_an_admin_may_resume_a_job(tmp_path):
    """With authentication (docs/security.md) a resume of another identity's job is NOT_FOUND like an
    unknown job (as GetJob/CancelJob/FetchState: ids cannot be probed) and audit-logged; its owner and
    an admin get past that check."""
    from _security_server import client as as_identity
    from _security_server import server_args
    from _util import local_server, make_pki

    pki = make_pki(tmp_path / "pki")
    extra = [*server_args(pki), "--state-dir", str(tmp_path / "state"), "--checkpoint-every", "2"]
    step = traced(MODEL, OPTIM)
    with local_server(workers=2, extra_args=extra) as (address, log):
        alice, bob, admin = (as_identity(address, pki, who) for who in ("alice", "bob", "admin"))
        done = alice.train(step, world_size=2, batches=batches()[:2])
        e = code_of(lambda: bob.train(step, world_size=2, batches=batches(), resume=done.job_id))
        assert e.code == grpc.StatusCode.NOT_FOUND and f"no job '{done.job_id}'" in str(e), e
        line = (
            rf'audit event="resume" identity="bob" peer="[^"]*" job="{done.job_id}" result="denied"'
        )
        deadline = time.monotonic() + 10  # the server's stderr is read by a thread
        while not re.search(line, "".join(log)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert re.search(line, "".join(log)), log[-20:]
        for who in (alice, admin):  # allowed to try: the job did not fail
            e = code_of(
                lambda: who.train(step, world_size=2, batches=batches(), resume=done.job_id)
            )
            assert e.code == grpc.StatusCode.FAILED_PRECONDITION and "is SUCCEEDED" in str(e), e


def _cli_files(tmp_path):
    """The traced step, its initial state, 4 batch files (as ``--data`` arguments) and the
    learning-rate schedule, written for ``fxdp run``."""
    import json

    from safetensors.torch import save_file

    step = traced(MODEL, OPTIM)
    (tmp_path / "g.pb").write_bytes(step.graph.SerializeToString())
    save_file(dict(step.initial_state()), str(tmp_path / "s.safetensors"))
    data = []
    for i in range(4):
        save_file(zoo.get(MODEL).named_batch(i), str(tmp_path / f"b{i}.safetensors"))
        data += ["--data", str(tmp_path / f"b{i}.safetensors")]
    (tmp_path / "lr.json").write_text(json.dumps({LR: [d[LR] for d in schedule()]}))
    return data


def _fxdp_run(tmp_path, data, address, *args):
    """``fxdp run`` of the step in tmp_path on 2 ranks for STEPS steps, events as JSON lines."""
    from _util import fxdp_binary

    return [
        fxdp_binary("FXDP_BIN", "fxdp"),
        "run",
        str(tmp_path / "g.pb"),
        "--world-size",
        "2",
        "--steps",
        str(STEPS),
        *data,
        "--schedule",
        str(tmp_path / "lr.json"),
        "--json",
        "--server",
        address,
        *args,
    ]


def _cli(argv, timeout=120):
    import subprocess

    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def _events(stdout):
    import json

    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _cli_losses(evs):
    return [e["loss"] for e in evs if e.get("state") == "RUNNING" and "loss" in e]


def _run_and_kill_a_worker_at_step_7(client, argv):
    """Starts ``argv`` (an ``fxdp run --json``), SIGKILLs a worker once step 7 is printed; the
    run exits 1 saying so. Returns the job's id and its checkpoint's step."""
    import json
    import subprocess

    wait_idle(client)
    victim = int(client.workers()[0]["pid"])
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        ev = json.loads(line)
        if ev.get("state") == "RUNNING" and ev.get("step", 0) >= 7:
            job = ev["job_id"]
            os.kill(victim, signal.SIGKILL)
            break
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1 and "was lost" in err, (p.returncode, err)
    k = client.job(job).checkpoint_step
    assert k >= 2 and k % 2 == 0, client.job(job)
    wait_idle(client)
    return job, k


def _assert_fxdp_job_shows_the_link(address, job, resumed, k):
    from _util import fxdp_binary

    fxdp_cli = fxdp_binary("FXDP_BIN", "fxdp")
    shown = _cli([fxdp_cli, "job", resumed, "--server", address], timeout=30)
    assert f"resumes    {job}" in shown.stdout, shown.stdout
    shown = _cli([fxdp_cli, "job", job, "--server", address], timeout=30)
    assert (
        f"checkpoint step {k} (fxdp run ... --resume {job} continues from it)" in shown.stdout
    ), shown.stdout


def test_fxdp_run_resume_continues_a_job_whose_worker_was_lost(tmp_path):
    """The CLI: ``fxdp run --json`` streams batches from 4 ``--data`` files with a ``--schedule``
    file; a worker is SIGKILLed once step 7 is printed, the run exits 1; ``fxdp run --resume JOB``
    (same arguments, no ``--state``) says where it continues, prints the uninterrupted run's
    losses from there and writes its final state, equal bit for bit; ``fxdp job`` shows the link."""
    from _util import fxdp_binary
    from safetensors.torch import load_file

    data = _cli_files(tmp_path)
    state = str(tmp_path / "s.safetensors")
    with ServerProcess("--state-dir", tmp_path / "state", "--checkpoint-every", "2") as server:
        address = server.address
        plain = _cli(
            _fxdp_run(
                tmp_path,
                data,
                address,
                "--state",
                state,
                "--out",
                str(tmp_path / "plain.safetensors"),
            )
        )
        assert plain.returncode == 0, plain.stderr
        plain_losses = _cli_losses(_events(plain.stdout))
        assert len(plain_losses) == STEPS
        with fxdp.Client(address, timeout=60) as client:
            job, k = _run_and_kill_a_worker_at_step_7(
                client, _fxdp_run(tmp_path, data, address, "--state", state)
            )

        r = _cli(
            _fxdp_run(
                tmp_path,
                data,
                address,
                "--resume",
                job,
                "--out",
                str(tmp_path / "resumed.safetensors"),
            )
        )
        assert r.returncode == 0, r.stderr
        evs = _events(r.stdout)
        assert evs[0]["first_step"] == k and evs[0]["job_id"] != job, evs[0]
        assert _cli_losses(evs) == plain_losses[k:]
        assert [e["step"] for e in evs if "loss" in e] == list(range(k + 1, STEPS + 1))
        a = load_file(str(tmp_path / "plain.safetensors"))
        b = load_file(str(tmp_path / "resumed.safetensors"))
        assert set(a) == set(b)
        for name, v in a.items():
            assert torch.equal(b[name], v), name
        _assert_fxdp_job_shows_the_link(address, job, evs[0]["job_id"], k)
        # Without --state or --resume: a usage error.
        bad = _cli(
            [
                fxdp_binary("FXDP_BIN", "fxdp"),
                "run",
                str(tmp_path / "g.pb"),
                *data,
                "--server",
                address,
            ],
            timeout=30,
        )
        assert (
            bad.returncode == 2
            and "--state is required (unless --resume or --initial-checkpoint)" in bad.stderr
        ), bad.stderr
