"""`fxdp run|jobs|job|cancel --server`: the CLI on fxdp-server's job service (proto/fxdp/v1/jobs.proto).

Starts ``fxdp-server --listen 127.0.0.1:0 --local-workers 2`` ($FXDP_SERVER_BIN, default
build/bin/fxdp-server; workers $FXDP_WORKER; the CLI is $FXDP_BIN, default build/bin/fxdp), exports the
zoo mlp/AdamW graph, state and batch (``python -m fxdp.zoo.export``) and checks:

* ``fxdp run --world-size 2 --steps 3 --out final.safetensors``: the printed losses and the final state
  equal single-device ``TracedStep.run_local`` on the same batch 3 times (rtol 1e-5, atol 1e-6);
* ``fxdp jobs --json`` lists the job SUCCEEDED, ``fxdp job ID`` shows it, an unknown id exits 1;
* ``fxdp run --data-on-workers FILE`` (the workers read the batch themselves) trains the same;
* a run submitted while both workers are busy prints "queued" (position, what it waits for),
  ``fxdp jobs`` / ``fxdp job`` show it QUEUED with that message, and it runs once the workers
  are free; ``fxdp cancel`` of a queued job ends its run with exit 1;
* ``fxdp cancel`` of a long job makes ``fxdp run`` exit 1 saying CANCELLED;
* an unreachable server exits 3; bad usage exits 2.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
import torch
from _util import ATOL, RTOL, fxdp_binary, local_server, traced
from safetensors.torch import load_file

MODEL, OPTIM = "mlp", "adamw"


@pytest.fixture(scope="module")
def server():
    with local_server() as (address, _):
        yield address


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("zoo")
    subprocess.run(
        [sys.executable, "-m", "fxdp.zoo.export", str(d), "--models", MODEL, "--optims", OPTIM],
        check=True,
        capture_output=True,
        text=True,
    )
    base = d / f"{MODEL}_{OPTIM}"
    return {
        "graph": f"{base}.pb",
        "state": f"{base}.safetensors",
        "data": f"{base}.batch.safetensors",
        "dir": d,
    }


def fxdp(*args, timeout=60):
    return subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), *args], capture_output=True, text=True, timeout=timeout
    )


def wait_idle(server, n=2, timeout=30.0):
    """Until `fxdp workers` lists n IDLE workers (they attach, and come back from a job, on
    their own schedule; a job submitted before that would be queued)."""
    deadline = time.monotonic() + timeout
    while True:
        r = fxdp("workers", "--server", server, "--json")
        if (
            r.returncode == 0
            and sum(w["state"] == "IDLE" for w in json.loads(r.stdout)["workers"]) >= n
        ):
            return
        assert (
            time.monotonic() < deadline
        ), f"{n} workers not IDLE within {timeout} s: {r.stdout} {r.stderr}"
        time.sleep(0.1)


def run_args(server, ex, steps, *extra):
    return [
        "run",
        ex["graph"],
        "--server",
        server,
        "--world-size",
        "2",
        "--state",
        ex["state"],
        "--data",
        ex["data"],
        "--steps",
        str(steps),
        "--timeout",
        "10",
        *extra,
    ]


def test_run_trains_like_one_device_and_is_listed(server, exported):
    wait_idle(server)
    out = exported["dir"] / "final.safetensors"
    r = fxdp(*run_args(server, exported, 3, "--out", str(out)))
    assert r.returncode == 0, r.stderr
    # From step 2 on, a line says the steps/s and samples/s (the batch's 12 samples) so far.
    steps = re.findall(
        r"^step \d+/3 loss (\S+) \([\d.]+ ms\)(?:  (\S+) steps/s  (\S+) samples/s)?$",
        r.stdout,
        re.M,
    )
    losses = [float(x) for x, _, _ in steps]
    assert len(losses) == 3 and steps[0][1] == "" and steps[2][1], r.stdout
    assert abs(float(steps[2][2]) / float(steps[2][1]) - 12) < 0.05, r.stdout
    m = re.search(r"^job (\S+) SUCCEEDED", r.stdout, re.M)
    assert m, r.stdout
    job_id = m.group(1)

    # Reference: run_local on the exported batch (the same batch every step).
    step = traced(MODEL, OPTIM)
    batch = load_file(exported["data"])
    state = step.initial_state()
    ref_losses = []
    for _ in range(3):
        state, loss = step.run_local(state, batch)
        ref_losses.append(float(loss))
    for got, want in zip(losses, ref_losses):
        # the text line has 6 significant digits
        assert abs(got - want) <= 1e-5 * abs(want) + 1e-6, (losses, ref_losses)

    final = load_file(str(out))
    assert set(final) == set(state)
    for k, want in state.items():
        assert final[k].dtype == want.dtype and final[k].shape == want.shape, k
        torch.testing.assert_close(final[k], want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{k}: {m}")

    # --json: full-precision losses, one object per line.
    wait_idle(server)
    r = fxdp(*run_args(server, exported, 3, "--json"))
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    stepped = [e for e in events if e["state"] == "RUNNING" and e["step"] > 0]
    assert [e["step"] for e in stepped] == [1, 2, 3]
    for e, want in zip(stepped, ref_losses):
        assert abs(e["loss"] - want) <= RTOL * abs(want) + ATOL, (e, want)
    assert events[-1]["state"] == "SUCCEEDED"

    r = fxdp("jobs", "--json", "--server", server)
    assert r.returncode == 0, r.stderr
    jobs = {j["job_id"]: j for j in json.loads(r.stdout)["jobs"]}
    j = jobs[job_id]
    assert (
        j["state"] == "SUCCEEDED"
        and j["steps_done"] == 3
        and j["steps"] == 3
        and j["world_size"] == 2
    )
    assert len(j["losses"]) == 3 and j["has_state"]

    r = fxdp("jobs", "--server", server)
    assert r.returncode == 0 and job_id in r.stdout and "SUCCEEDED" in r.stdout, r.stdout

    r = fxdp("job", job_id, "--server", server)
    assert r.returncode == 0, r.stderr
    assert job_id in r.stdout and "SUCCEEDED" in r.stdout and "3/3" in r.stdout, r.stdout
    r = fxdp("job", job_id, "--json", "--server", server)
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "SUCCEEDED"

    r = fxdp("job", "nope", "--server", server)
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr, r


def reference_losses(exported, steps):
    step = traced(MODEL, OPTIM)
    batch = load_file(exported["data"])
    state, losses = step.initial_state(), []
    for _ in range(steps):
        state, loss = step.run_local(state, batch)
        losses.append(float(loss))
    return losses


def json_events(stdout):
    return [json.loads(line) for line in stdout.splitlines()]


def test_run_with_data_on_workers(server, exported):
    wait_idle(server)
    args = run_args(server, exported, 3, "--json")
    i = args.index("--data")
    args[i : i + 2] = ["--data-on-workers", exported["data"]]
    r = fxdp(*args)
    assert r.returncode == 0, r.stderr
    events = json_events(r.stdout)
    got = [e["loss"] for e in events if e["state"] == "RUNNING" and e["step"] > 0]
    for g, want in zip(got, reference_losses(exported, 3), strict=True):
        assert abs(g - want) <= RTOL * abs(want) + ATOL, (got, want)
    r = fxdp("job", events[-1]["job_id"], "--server", server)
    assert (
        r.returncode == 0 and exported["data"] in r.stdout and "on the workers" in r.stdout
    ), r.stdout
    r = fxdp(
        "run",
        exported["graph"],
        "--state",
        exported["state"],
        "--data-on-workers",
        exported["data"],
    )
    assert r.returncode == 2 and "--data-on-workers needs --steps" in r.stderr, r
    r = fxdp("run", exported["graph"], "--state", exported["state"])
    assert r.returncode == 2 and "either --data or --data-on-workers" in r.stderr, r


def start_run(server, exported, steps, *extra):
    return subprocess.Popen(
        [fxdp_binary("FXDP_BIN", "fxdp"), *run_args(server, exported, steps, *extra)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_queued_run_waits_then_runs(server, exported):
    wait_idle(server)
    busy = start_run(server, exported, 3000, "--json")
    queued = cancelled = None
    try:
        for line in busy.stdout:
            e = json.loads(line)
            if e["step"] >= 2:
                busy_id = e["job_id"]
                break
        queued = start_run(server, exported, 2)
        first = queued.stdout.readline()
        m = re.fullmatch(
            r"job (\S+) queued: position 1, waiting for 2 idle workers; 2 registered, 0 idle\n",
            first,
        )
        assert m, first
        queued_id = m.group(1)
        cancelled = start_run(server, exported, 2, "--json")
        c = json.loads(cancelled.stdout.readline())
        assert (
            c["state"] == "QUEUED" and c["queue_position"] == 2 and "1 job ahead" in c["message"]
        ), c

        r = fxdp("jobs", "--server", server)
        row = next(l for l in r.stdout.splitlines() if l.startswith(queued_id))
        assert "QUEUED" in row and "waiting for 2 idle workers" in row, r.stdout
        r = fxdp("job", queued_id, "--server", server)
        assert re.search(
            r"^queue +position 1: waiting for 2 idle workers", r.stdout, re.M
        ), r.stdout
        r = fxdp("cancel", c["job_id"], "--server", server)
        assert (
            r.returncode == 0 and "CANCELLED" in r.stdout and "cancelled while queued" in r.stdout
        ), r
        rest, err = cancelled.communicate(timeout=30)
        assert cancelled.returncode == 1 and "CANCELLED" in err, (rest, err)

        assert fxdp("cancel", busy_id, "--server", server).returncode == 0
        out, err = queued.communicate(timeout=60)
        assert queued.returncode == 0, err
        lines = out.splitlines()
        # The busy job's workers come back one at a time: the queued job may first say
        # "... 2 registered, 1 idle" (a QUEUED update) before it runs.
        while lines and lines[0].startswith(
            f"job {queued_id} queued: position 1, waiting for 2 idle"
        ):
            lines.pop(0)
        assert lines and lines[0].startswith(f"job {queued_id} running on local-"), out
        assert [l.split(" loss")[0] for l in lines[1:3]] == ["step 1/2", "step 2/2"], lines
        assert lines[-1] == f"job {queued_id} SUCCEEDED (2 steps on 2 workers)", lines
    finally:
        for p in (busy, queued, cancelled):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_cancel_makes_run_exit_1(server, exported):
    wait_idle(server)
    proc = subprocess.Popen(
        [fxdp_binary("FXDP_BIN", "fxdp"), *run_args(server, exported, 3000, "--json")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        job_id = None
        for line in proc.stdout:
            e = json.loads(line)
            job_id = e["job_id"]
            if e["step"] >= 2:
                break
        assert job_id, proc.stderr.read()
        r = fxdp("cancel", job_id, "--server", server)
        assert r.returncode == 0 and "CANCELLED" in r.stdout, r
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, (rest, err)
    assert "CANCELLED" in err and job_id in err, err
    r = fxdp("job", job_id, "--json", "--server", server)
    assert json.loads(r.stdout)["state"] == "CANCELLED"


def test_unreachable_server_and_usage(exported):
    r = fxdp(*run_args("127.0.0.1:1", exported, 1))
    assert r.returncode == 3 and "unreachable" in r.stderr, r
    r = fxdp("jobs", "--server", "127.0.0.1:1")
    assert r.returncode == 3, r
    r = fxdp("run", exported["graph"], "--world-size", "2")
    assert r.returncode == 2 and "usage: fxdp run" in r.stderr, r
    # --state with --resume: a usage error naming both (a resumed job's state is its checkpoint's).
    r = fxdp(*run_args("127.0.0.1:1", exported, 1), "--resume", "job-1-abc")
    assert r.returncode == 2 and "--state and --resume exclude each other" in r.stderr, r
    for cmd in ("run", "jobs", "job", "cancel"):
        r = fxdp(cmd, "--help")
        assert r.returncode == 0 and f"usage: fxdp {cmd}" in r.stdout, r
    r = fxdp("--help")
    assert all(f"  {c} " in r.stdout for c in ("run", "jobs", "job", "cancel")), r.stdout
