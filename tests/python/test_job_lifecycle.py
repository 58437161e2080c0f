"""A job's resources are released however it ends (issue 25, item 6).

A real ``fxdp-server`` with two ``fxdp-worker attach`` processes started here: "good" runs under a
low open-file limit; "bad" has ``--memory-limit 2MiB``, so its rank fails inside its first step
(RESOURCE_EXHAUSTED: the step's 4 MiB activation does not fit) in every job, while the other rank
reaches that step's gradient all-reduce and waits there for a peer that will never come. The job
must end, and that rank be IDLE again, long before the job's collective_timeout_s (300 s: a test
that waited for it would not finish), and every job, however it ended, must give back its threads
and file descriptors (counted in /proc), so that the worker under the low limit still trains job
30. Before the fix a rank whose step failed left its communicator behind (Gloo threads, pair
sockets, store), with its connections open: its peer waited out the whole timeout, BUSY, and
20 such jobs took a worker from 19 to 87 threads and 40 to 278 descriptors; one under
``ulimit -n 256`` failed every job after about 23.
"""

from __future__ import annotations

import os
import resource
import subprocess
import time

import fxdp
import grpc
import pytest
import torch
from _util import ServerProcess, fxdp_binary, mse_step
from fxdp.v1 import jobs_pb2 as jpb

TIMEOUT_S = 300.0  # the jobs' collective_timeout_s: far longer than this test may take
NOFILE = 128  # "good"'s open-file limit: a few jobs' worth of leaked descriptors


def wide_step(batch: int):
    """x[batch, 16] -> Linear(16, 4096) -> ReLU -> Linear(4096, 1), SGD: 0.5 MiB of parameters,
    16 KiB of activation per sample."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    b = (torch.randn(batch, 16), torch.randn(batch, 1))
    return fxdp.trace_step(mse_step, model, opt, b), b


def attach(address: str, worker_id: str, log, *args, nofile: int = 0) -> subprocess.Popen:
    def limit():
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    cmd = [
        fxdp_binary("FXDP_WORKER", "fxdp-worker"),
        "attach",
        "--server",
        address,
        "--worker-id",
        worker_id,
        "--threads",
        "1",
        *args,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, preexec_fn=limit)


def idle(client, ids, timeout=120.0):
    """Waits until the workers `ids` are attached and IDLE; their ListWorkers entries."""
    deadline = time.monotonic() + timeout
    while True:
        ws = {w["worker_id"]: w for w in client.workers()}
        if all(ws.get(i, {}).get("state") == "WORKER_STATE_IDLE" for i in ids):
            return ws
        assert time.monotonic() < deadline, ws
        time.sleep(0.05)


def usage(pid: int):
    """(threads, open file descriptors) of process `pid`."""
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


def settled(pid: int, limit, timeout=60.0):
    """Waits until process `pid` holds at most `limit` (threads, descriptors); its usage. (A rank
    whose own step failed reports the failure before it tears its communicator down, so it can
    be IDLE a moment before its threads are gone.)"""
    deadline = time.monotonic() + timeout
    while True:
        now = usage(pid)
        if (now[0] <= limit[0] and now[1] <= limit[1]) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("lifecycle") / "workers.log"
    with ServerProcess(workers=0) as server, open(log_path, "w") as log:
        procs = {
            "good": attach(server.address, "good", log, nofile=NOFILE),
            "bad": attach(server.address, "bad", log, "--memory-limit", "2MiB"),
        }
        try:
            with fxdp.Client(server.address) as client:
                idle(client, procs)
                yield client, procs, log_path
        finally:
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def test_failed_jobs_free_their_ranks_at_once_and_leak_nothing(cluster):
    client, procs, log = cluster
    step, batch = wide_step(512)  # 256 samples per rank: a 4 MiB activation
    # gRPC's thread pools and torch's first use make a few threads and descriptors that stay.
    slack = (3, 4)
    baseline = {w: usage(p.pid) for w, p in procs.items()}
    for job in range(1, 30):
        with pytest.raises(fxdp.ServerError) as err:
            client.train(step, world_size=2, batches=[batch], collective_timeout_s=TIMEOUT_S)
        msg = str(err.value)
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, (job, msg)
        assert "(worker bad) failed at step 1" in msg and "--memory-limit" in msg, (job, msg)
        # The other rank was cancelled out of its all-reduce: IDLE now, not after TIMEOUT_S.
        idle(client, procs)
        if job == 20:
            for w, p in procs.items():
                limit = (baseline[w][0] + slack[0], baseline[w][1] + slack[1])
                threads, fds = settled(p.pid, limit)
                assert threads <= limit[0] and fds <= limit[1], (
                    f"worker {w}: {threads} threads and {fds} descriptors after 20 failed jobs, "
                    f"{baseline[w][0]} and {baseline[w][1]} before them: the jobs leaked them\n"
                    + open(log).read()[-3000:]
                )
    # Job 30 trains on both workers ("good" under its NOFILE limit) and equals one device.
    small, b = wide_step(4)
    result = client.train(small, world_size=2, batches=[b], collective_timeout_s=TIMEOUT_S)
    _, want = small.run_local(small.initial_state(), b)
    assert result.losses == [pytest.approx(want.item(), rel=1e-5)]
    assert all(p.poll() is None for p in procs.values())


def test_collective_timeout_is_capped(cluster):
    """JobSpec.collective_timeout_s above --max-collective-timeout-s (default 600) is refused
    before anything runs, naming the value and the cap."""
    client, procs, log = cluster
    step, batch = wide_step(4)
    with pytest.raises(fxdp.ServerError) as err:
        client.train(step, world_size=2, batches=[batch], collective_timeout_s=365 * 86400.0)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, str(err.value)
    assert "collective_timeout_s 31536000 s" in str(err.value), str(err.value)
    assert "600 s (fxdp-server --max-collective-timeout-s)" in str(err.value), str(err.value)
    assert not [j for j in client.jobs() if j.state == jpb.JOB_STATE_QUEUED]
