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

import re

import fxdp
import grpc
import torch
from _util import (
    ATOL,
    RTOL,
    ServerProcess,
    assert_same_run,
    batch_files,
    data_paths_requests,
    fetch,
    resumed_after_sigkill,
    running,
    traced,
    wait_for,
)
from fxdp import zoo
from fxdp.v1 import checkpoint_pb2 as ckpb
from fxdp.v1 import jobs_pb2 as jpb
from safetensors.torch import load_file, save_file
from test_server_jobs import LONG, requests

MODEL, OPTIM = "mlp", "adamw"


def test_jobs_survive_a_server_sigkill(tmp_path):
    state_dir = tmp_path / "state"
    data = tmp_path / "batch.safetensors"
    save_file(zoo.get(MODEL).named_batch(0), str(data))
    step = traced(MODEL, OPTIM)

    with ServerProcess("--state-dir", state_dir) as server:
        with fxdp.Client(server.address) as client:
            a = client.train(
                step, world_size=2, batches=[zoo.get(MODEL).named_batch(i) for i in range(2)]
            )
        jobs = server.jobs
        b_stream = jobs.Submit(
            requests(2, LONG, batches=[zoo.get(MODEL).named_batch(0)]), timeout=120
        )
        b = next(e for e in b_stream if e.step >= 1).job_id
        c_stream = jobs.Submit(requests(2, 2), timeout=120)
        c = next(c_stream)
        assert c.state == jpb.JOB_STATE_QUEUED and c.queue_position == 1, c
        d_stream = jobs.Submit(data_paths_requests(step, data, 3), timeout=120)
        d = next(d_stream)
        assert d.state == jpb.JOB_STATE_QUEUED and d.queue_position == 2, d
        server.kill()  # SIGKILL: nothing is flushed or closed
    assert (state_dir / "jobs.db").is_file()
    assert (state_dir / "states" / f"{a.job_id}.safetensors").is_file()

    with ServerProcess("--state-dir", state_dir) as server:
        jobs = server.jobs
        listed = [j.job_id for j in jobs.ListJobs(jpb.ListJobsRequest(), timeout=10).jobs]
        assert listed[:4] == [a.job_id, b, c.job_id, d.job_id], listed

        info = jobs.GetJob(jpb.GetJobRequest(job_id=a.job_id), timeout=10)
        assert (
            info.state == jpb.JOB_STATE_SUCCEEDED
            and info.has_state
            and list(info.losses) == a.losses
        )
        again = fetch(jobs, a.job_id)
        assert set(again) == set(a.state), (set(again), set(a.state))
        for k, v in again.items():
            assert torch.equal(v, a.state[k]), k

        info = jobs.GetJob(jpb.GetJobRequest(job_id=b), timeout=10)
        assert (
            info.state == jpb.JOB_STATE_FAILED
            and info.error_code == grpc.StatusCode.UNAVAILABLE.value[0]
        )
        assert "the server restarted while the job ran" in info.error, info.error
        assert info.steps_done >= 1

        info = jobs.GetJob(jpb.GetJobRequest(job_id=c.job_id), timeout=10)
        assert (
            info.state == jpb.JOB_STATE_FAILED
            and "its batches came over its Submit stream" in info.error
        )

        info = wait_for(jobs, d.job_id, lambda i: not running(i))
        assert info.state == jpb.JOB_STATE_SUCCEEDED, (info, "".join(server.log[-20:]))
        assert info.steps_done == 3 and len(info.losses) == 3
        d_state = fetch(jobs, d.job_id)

        with fxdp.Client(server.address) as client:
            e = client.train(step, world_size=2, data_path=data, steps=3)
        assert e.job_id not in listed
        assert int(e.job_id.split("-")[1]) > int(d.job_id.split("-")[1]), (e.job_id, d.job_id)
        assert_same_run(info.losses, d_state, e)
        # A FULLY_SHARD data_paths job: its recorded initial state is split into each rank's shards.
        with fxdp.Client(server.address) as client:
            f = client.train(step, world_size=2, data_path=data, steps=3, style="fully_shard")
        torch.testing.assert_close(
            torch.tensor(f.losses), torch.tensor(e.losses), rtol=RTOL, atol=ATOL
        )
        for k, v in e.state.items():
            torch.testing.assert_close(f.state[k], v, rtol=RTOL, atol=ATOL, msg=k)


def test_a_running_data_paths_job_resumes_from_its_checkpoint(tmp_path):
    """--checkpoint-every 5: a data_paths job killed mid-run (server SIGKILL) resumes after the restart
    from its last checkpoint (step counter, files and optimizer state where they were) and ends with
    exactly the final state and losses of an uninterrupted run."""
    state_dir = tmp_path / "state"
    files = batch_files(tmp_path, MODEL, 3)
    step = traced(MODEL, OPTIM)
    steps = 200

    with resumed_after_sigkill(
        state_dir, data_paths_requests(step, files, steps), 23, "--checkpoint-every", "5"
    ) as (server, job, info, killed_at):
        assert info.steps_done == steps and len(info.losses) == steps
        resumed = [line for line in server.log if "resumed from the checkpoint of step" in line]
        assert resumed, "".join(server.log)
        at = int(re.search(r"checkpoint of step (\d+)", resumed[0]).group(1))
        assert at % 5 == 0 and 0 < at <= killed_at + 5, (at, killed_at)
        final = fetch(server.jobs, job)
        with fxdp.Client(server.address) as client:
            plain = client.train(step, world_size=2, data_path=files, steps=steps)
        assert_same_run(info.losses, final, plain)


def test_a_running_data_paths_job_resumes_from_its_workers_checkpoint(tmp_path):
    """A data_paths job whose workers write its checkpoints (every 5 steps), killed mid-run with the
    server (SIGKILL): after the restart it goes on by itself from its workers' newest complete
    checkpoint (read by its new workers, every state tensor, at that step) and ends bit for bit like
    an uninterrupted run. Before, it was FAILED naming the checkpoint, for a resume by hand."""
    files = batch_files(tmp_path, MODEL, 3)
    step = traced(MODEL, OPTIM)
    steps, policy = 200, ckpb.CheckpointPolicy(dir=str(tmp_path / "c"), every=5, keep=2)
    requests = data_paths_requests(step, files, steps, checkpoints=policy)
    root = ("--data-root", str(tmp_path))
    with resumed_after_sigkill(tmp_path / "state", requests, 23, *root) as (server, job, info, at):
        line = next(x for x in server.log if "resumed from its workers' checkpoint of step" in x)
        k = int(re.search(r"checkpoint of step (\d+)", line).group(1))
        assert k % 5 == 0 and 0 < k <= at + 5, (k, at, line)
        assert f"'{tmp_path / 'c' / f'step-{k}'}'" in line, line
        assert info.steps_done == steps and len(info.losses) == steps, info
        assert info.checkpoint_step == steps, info  # its own checkpoints went on
        with fxdp.Client(server.address) as client:
            plain = client.train(step, world_size=2, data_path=files, steps=steps)
    # Its final state is its last checkpoint (REPLICATE: each tensor whole in one rank's file).
    final = {}
    for f in sorted((tmp_path / "c" / f"step-{steps}").glob("rank-*-of-2.safetensors")):
        final.update(load_file(str(f)))
    assert sorted(final) == sorted(plain.state)
    assert_same_run(info.losses, final, plain)
