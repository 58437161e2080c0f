"""``fxdp-server --state-dir DIR``: jobs survive a SIGKILL of the server (docs/jobs.md).

Starts ``fxdp-server --local-workers 2 --state-dir DIR`` and, on it: job A (zoo mlp/AdamW, 2 steps)
runs to SUCCEEDED; job B (streamed batches, thousands of steps) runs; job C (streamed batches) and
job D (batches from a data_paths file) wait QUEUED behind it. The server is killed with SIGKILL
and started again on the same DIR. Then:

* A is still listed SUCCEEDED and FetchState gives exactly the state it gave before;
* B, which was running, is FAILED (UNAVAILABLE) saying the server restarted;
* C is FAILED (UNAVAILABLE) saying its batches came over a stream that is gone;
* D runs without its client and SUCCEEDs; its final state equals that of the same job submitted
  afresh (E) bit for bit, and a FULLY_SHARD one (its recorded initial state split into each
  rank's shards) trains like it;
* new jobs get ids after the old ones; the job database and state files are under DIR.

With ``--checkpoint-every 5`` a data_paths job killed mid-run resumes from its last checkpoint
after the restart and ends bit for bit like an uninterrupted run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

import grpc
import torch
from safetensors.torch import save_file

import fxdp
from _util import ATOL, RTOL, fxdp_binary, traced
from fxdp import zoo
from fxdp.client import _assemble as assemble, _chunks as chunks
from fxdp.v1 import jobs_pb2 as jpb
from fxdp.v1 import jobs_pb2_grpc as jgrpc
from test_server_jobs import LONG, requests

MODEL, OPTIM = "mlp", "adamw"


def start_server(state_dir, *extra):
    """``fxdp-server --local-workers 2 --state-dir state_dir [extra]``: (process, address, log lines)."""
    cmd = [fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"), "--listen", "127.0.0.1:0", "--local-workers", "2",
           "--heartbeat-ms", "250", "--state-dir", str(state_dir), *extra]
    if os.environ.get("FXDP_WORKER"):
        cmd += ["--worker-binary", fxdp_binary("FXDP_WORKER", "fxdp-worker")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.fullmatch(r"listening on (127\.0\.0\.1:\d+)\n", line)
    assert m, f"fxdp-server printed {line!r}: {proc.stderr.read() if proc.poll() is not None else ''}"
    log: list = []
    threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
    return proc, m.group(1), log


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def data_paths_requests(step, paths, steps):
    """A data_paths job: the spec and the initial state; the workers read the batches."""
    state = step.initial_state()
    paths = [str(p) for p in (paths if isinstance(paths, list) else [paths])]
    yield jpb.SubmitJobRequest(spec=jpb.JobSpec(
        graph=step.graph, world_size=2, steps=steps, num_state_tensors=len(state), data_paths=paths,
        collective_timeout_s=10, name="from-files"))
    for k, v in state.items():
        for c in chunks(k, v, 1000):
            yield jpb.SubmitJobRequest(state=c)


def wait_for(jobs, job_id, pred, timeout=60.0, every=0.1):
    deadline = time.monotonic() + timeout
    while True:
        info = jobs.GetJob(jpb.GetJobRequest(job_id=job_id), timeout=10)
        if pred(info):
            return info
        assert time.monotonic() < deadline, info
        time.sleep(every)


def fetch(jobs, job_id):
    return assemble(jobs.FetchState(jpb.FetchJobStateRequest(job_id=job_id), timeout=30))


def test_jobs_survive_a_server_sigkill(tmp_path):
    state_dir = tmp_path / "state"
    data = tmp_path / "batch.safetensors"
    save_file(zoo.get(MODEL).named_batch(0), str(data))
    step = traced(MODEL, OPTIM)

    proc, address, log = start_server(state_dir)
    try:
        with fxdp.Client(address) as client:
            a = client.train(step, world_size=2, batches=[zoo.get(MODEL).named_batch(i) for i in range(2)])
        ch = grpc.insecure_channel(address)
        jobs = jgrpc.JobServiceStub(ch)
        b_stream = jobs.Submit(requests(2, LONG, batches=[zoo.get(MODEL).named_batch(0)]), timeout=120)
        b = next(e for e in b_stream if e.step >= 1).job_id
        c_stream = jobs.Submit(requests(2, 2), timeout=120)
        c = next(c_stream)
        assert c.state == jpb.JOB_STATE_QUEUED and c.queue_position == 1, c
        d_stream = jobs.Submit(data_paths_requests(step, data, 3), timeout=120)
        d = next(d_stream)
        assert d.state == jpb.JOB_STATE_QUEUED and d.queue_position == 2, d
        proc.kill()  # SIGKILL: nothing is flushed or closed
        proc.wait()
        ch.close()
    finally:
        if proc.poll() is None:
            stop(proc)
    assert (state_dir / "jobs.db").is_file()
    assert (state_dir / "states" / f"{a.job_id}.safetensors").is_file()

    proc, address, log = start_server(state_dir)
    try:
        ch = grpc.insecure_channel(address)
        jobs = jgrpc.JobServiceStub(ch)
        listed = [j.job_id for j in jobs.ListJobs(jpb.ListJobsRequest(), timeout=10).jobs]
        assert listed[:4] == [a.job_id, b, c.job_id, d.job_id], listed

        info = jobs.GetJob(jpb.GetJobRequest(job_id=a.job_id), timeout=10)
        assert info.state == jpb.JOB_STATE_SUCCEEDED and info.has_state and list(info.losses) == a.losses
        again = fetch(jobs, a.job_id)
        assert set(again) == set(a.state), (set(again), set(a.state))
        for k, v in again.items():
            assert torch.equal(v, a.state[k]), k

        info = jobs.GetJob(jpb.GetJobRequest(job_id=b), timeout=10)
        assert info.state == jpb.JOB_STATE_FAILED and info.error_code == grpc.StatusCode.UNAVAILABLE.value[0]
        assert "the server restarted while the job ran" in info.error, info.error
        assert info.steps_done >= 1

        info = jobs.GetJob(jpb.GetJobRequest(job_id=c.job_id), timeout=10)
        assert info.state == jpb.JOB_STATE_FAILED and "its batches came over its Submit stream" in info.error

        info = wait_for(jobs, d.job_id, lambda i: i.state not in (jpb.JOB_STATE_QUEUED, jpb.JOB_STATE_RUNNING))
        assert info.state == jpb.JOB_STATE_SUCCEEDED, (info, "".join(log[-20:]))
        assert info.steps_done == 3 and len(info.losses) == 3
        d_state = fetch(jobs, d.job_id)

        with fxdp.Client(address) as client:
            e = client.train(step, world_size=2, data_path=data, steps=3)
        assert e.job_id not in listed
        assert int(e.job_id.split("-")[1]) > int(d.job_id.split("-")[1]), (e.job_id, d.job_id)
        assert e.losses == list(info.losses)
        for k, v in d_state.items():
            assert torch.equal(v, e.state[k]), k
        # A FULLY_SHARD data_paths job: its recorded initial state is split into each rank's shards.
        with fxdp.Client(address) as client:
            f = client.train(step, world_size=2, data_path=data, steps=3, style="fully_shard")
        torch.testing.assert_close(torch.tensor(f.losses), torch.tensor(e.losses), rtol=RTOL, atol=ATOL)
        for k, v in e.state.items():
            torch.testing.assert_close(f.state[k], v, rtol=RTOL, atol=ATOL, msg=k)
        ch.close()
    finally:
        stop(proc)


def test_a_running_data_paths_job_resumes_from_its_checkpoint(tmp_path):
    """--checkpoint-every 5: a data_paths job killed mid-run (server SIGKILL) resumes after the restart
    from its last checkpoint (step counter, files and optimizer state where they were) and ends with
    exactly the final state and losses of an uninterrupted run."""
    state_dir = tmp_path / "state"
    files = [tmp_path / f"batch{i}.safetensors" for i in range(3)]
    for i, f in enumerate(files):
        save_file(zoo.get(MODEL).named_batch(i), str(f))
    step = traced(MODEL, OPTIM)
    steps = 200

    proc, address, log = start_server(state_dir, "--checkpoint-every", "5")
    try:
        ch = grpc.insecure_channel(address)
        jobs = jgrpc.JobServiceStub(ch)
        stream = jobs.Submit(data_paths_requests(step, files, steps), timeout=120)
        job = next(stream).job_id
        info = wait_for(jobs, job, lambda i: i.steps_done >= 23 or i.state not in (
            jpb.JOB_STATE_QUEUED, jpb.JOB_STATE_RUNNING), every=0.01)
        assert info.state == jpb.JOB_STATE_RUNNING, info
        proc.kill()
        proc.wait()
        ch.close()
    finally:
        if proc.poll() is None:
            stop(proc)
    killed_at = info.steps_done

    proc, address, log = start_server(state_dir, "--checkpoint-every", "5")
    try:
        ch = grpc.insecure_channel(address)
        jobs = jgrpc.JobServiceStub(ch)
        info = wait_for(jobs, job, lambda i: i.state not in (jpb.JOB_STATE_QUEUED, jpb.JOB_STATE_RUNNING))
        assert info.state == jpb.JOB_STATE_SUCCEEDED, (info.error, "".join(log[-20:]))
        assert info.steps_done == steps and len(info.losses) == steps
        resumed = [line for line in log if "resumed from the checkpoint of step" in line]
        assert resumed, "".join(log)
        at = int(re.search(r"checkpoint of step (\d+)", resumed[0]).group(1))
        assert at % 5 == 0 and 0 < at <= killed_at + 5, (at, killed_at)
        final = fetch(jobs, job)

        with fxdp.Client(address) as client:
            plain = client.train(step, world_size=2, data_path=files, steps=steps)
        assert list(info.losses) == plain.losses
        for k, v in final.items():
            assert torch.equal(v, plain.state[k]), k
        ch.close()
    finally:
        stop(proc)
