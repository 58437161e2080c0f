"""fxdp-server's job service (proto/fxdp/v1/jobs.proto): Submit, GetJob, ListJobs, CancelJob, FetchState.

Starts ``fxdp-server --listen 127.0.0.1:0 --local-workers 2`` ($FXDP_SERVER, default
build/bin/fxdp-server; its workers are $FXDP_WORKER, default build/bin/fxdp-worker) and drives it
with the generated Python stubs:

* a job asking for 3 workers when 2 exist is refused (RESOURCE_EXHAUSTED, saying how many are idle);
* a traced zoo mlp/AdamW job on 2 workers for 3 inline global batches: the per-step global losses
  and the fetched final state equal single-device ``TracedStep.run_local`` (rtol 1e-5, atol 1e-6);
  GetJob and ListJobs report it SUCCEEDED;
* CancelJob ends a long job (CANCELLED) and both workers are IDLE again;
* SIGKILL of one worker mid-job fails the job within 10 s naming the rank, and the other worker
  is IDLE again.
"""

from __future__ import annotations

import os
import signal
import time

import grpc
import pytest
import torch

from _util import ATOL, RTOL, local_steps, traced, local_server
from fxdp import zoo
from fxdp.v1 import graph_pb2 as gpb
from fxdp.v1 import jobs_pb2 as jpb
from fxdp.v1 import jobs_pb2_grpc as jgrpc
from fxdp.v1 import worker_pb2 as wpb
from fxdp.v1 import worker_pb2_grpc as wgrpc

TO_WIRE = {torch.float32: gpb.FLOAT32, torch.float64: gpb.FLOAT64, torch.int64: gpb.INT64,
           torch.int32: gpb.INT32, torch.bool: gpb.BOOL, torch.float16: gpb.FLOAT16,
           torch.bfloat16: gpb.BFLOAT16, torch.uint8: gpb.UINT8, torch.int8: gpb.INT8, torch.int16: gpb.INT16}
FROM_WIRE = {v: k for k, v in TO_WIRE.items()}
MODEL, OPTIM = "mlp", "adamw"


def chunk(name: str, t: torch.Tensor) -> "wpb.TensorChunk":
    t = t.detach().contiguous()
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return wpb.TensorChunk(name=name, dtype=TO_WIRE[t.dtype], shape=list(t.shape), offset=0, data=data)


def assemble(chunks) -> dict:
    out, bufs, metas = {}, {}, {}
    for c in chunks:
        if not c.HasField("tensor"):
            continue
        t = c.tensor
        buf = bufs.setdefault(t.name, bytearray())
        assert t.offset == len(buf), (t.name, t.offset, len(buf))
        buf += t.data
        metas[t.name] = (FROM_WIRE[t.dtype], tuple(t.shape))
    for name, buf in bufs.items():
        dtype, shape = metas[name]
        out[name] = torch.frombuffer(buf, dtype=dtype).reshape(shape).clone() if len(buf) else torch.empty(shape, dtype=dtype)
    return out


def request(world: int, steps: int) -> "jpb.SubmitJobRequest":
    step = traced(MODEL, OPTIM)
    e = zoo.get(MODEL)
    return jpb.SubmitJobRequest(
        graph=step.graph, world_size=world, steps=steps, collective_timeout_s=10, name="test",
        initial_state=[chunk(k, v) for k, v in step.initial_state().items()],
        batches=[jpb.StepBatch(tensors=[chunk(k, v) for k, v in e.named_batch(i).items()]) for i in range(steps)])


@pytest.fixture(scope="module")
def server():
    with local_server() as (address, log):
        ch = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 256 << 20),
                                                     ("grpc.max_send_message_length", 256 << 20)])
        yield jgrpc.JobServiceStub(ch), wgrpc.WorkerServiceStub(ch), log
        ch.close()


def wait_idle(workers_stub, ids=None, n=2, timeout=30.0) -> list:
    deadline = time.monotonic() + timeout
    while True:
        ws = workers_stub.ListWorkers(wpb.ListWorkersRequest()).workers
        idle = [w for w in ws if w.state == wpb.WORKER_STATE_IDLE]
        if (ids is None and len(idle) >= n) or (ids is not None and set(ids) <= {w.worker_id for w in idle}):
            return list(ws)
        if time.monotonic() > deadline:
            raise AssertionError(f"workers not IDLE within {timeout} s: {ws}")
        time.sleep(0.1)


def test_more_workers_than_exist_is_refused(server):
    jobs, workers, _ = server
    wait_idle(workers)
    with pytest.raises(grpc.RpcError) as ei:
        list(jobs.Submit(request(3, 1), timeout=30))
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "needs 3 idle workers" in ei.value.details() and "only 2 are idle" in ei.value.details(), ei.value.details()


def test_two_worker_job_trains_like_one_device(server):
    jobs, workers, log = server
    wait_idle(workers)
    steps = 3
    t0 = time.monotonic()
    events = list(jobs.Submit(request(2, steps), timeout=60))
    elapsed = time.monotonic() - t0
    states = [e.state for e in events]
    assert states[0] == jpb.JOB_STATE_QUEUED and states[-1] == jpb.JOB_STATE_SUCCEEDED, events
    job_id = events[0].job_id
    stepped = [e for e in events if e.step > 0 and e.state == jpb.JOB_STATE_RUNNING]
    assert [e.step for e in stepped] == [1, 2, 3]
    assert len(set(events[-1].workers)) == 2
    ref_state, ref_losses = local_steps(traced(MODEL, OPTIM), MODEL, steps)
    for e, want in zip(stepped, ref_losses):
        torch.testing.assert_close(torch.tensor(e.loss, dtype=torch.float64), want.to(torch.float64), rtol=RTOL, atol=ATOL)
        assert len(e.local_losses) == 2 and e.step_ms > 0
        # equal halves: the global loss is the mean of the local ones
        assert abs(sum(e.local_losses) / 2 - e.loss) <= 1e-5 * abs(e.loss) + 1e-6

    final = assemble(jobs.FetchState(jpb.FetchJobStateRequest(job_id=job_id, chunk_bytes=1000), timeout=30))
    assert set(final) == set(ref_state)
    for k, want in ref_state.items():
        assert final[k].dtype == want.dtype and final[k].shape == want.shape, k
        torch.testing.assert_close(final[k], want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{k}: {m}")

    info = jobs.GetJob(jpb.GetJobRequest(job_id=job_id))
    assert info.state == jpb.JOB_STATE_SUCCEEDED and info.steps_done == steps and info.has_state
    assert len(info.losses) == steps and info.world_size == 2 and info.name == "test"
    listed = {j.job_id: j for j in jobs.ListJobs(jpb.ListJobsRequest()).jobs}
    assert listed[job_id].state == jpb.JOB_STATE_SUCCEEDED
    with pytest.raises(grpc.RpcError) as ei:
        jobs.GetJob(jpb.GetJobRequest(job_id="nope"))
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    print(f"\n2-worker job ({MODEL}/{OPTIM}, {steps} steps) via fxdp-server in {elapsed:.2f} s")


def test_cancel_job(server):
    jobs, workers, _ = server
    wait_idle(workers)
    stream = jobs.Submit(request(2, 3000), timeout=60)
    job_id = None
    for e in stream:
        job_id = e.job_id
        if e.step >= 2:
            break
    info = jobs.CancelJob(jpb.CancelJobRequest(job_id=job_id, reason="test"))
    assert info.state == jpb.JOB_STATE_CANCELLED and "test" in info.error, info
    with pytest.raises(grpc.RpcError) as ei:
        for _ in stream:
            pass
    assert ei.value.code() == grpc.StatusCode.CANCELLED
    with pytest.raises(grpc.RpcError) as ei:
        list(jobs.FetchState(jpb.FetchJobStateRequest(job_id=job_id)))
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    wait_idle(workers, timeout=10)


def test_killed_worker_fails_the_job_naming_the_rank(server):
    jobs, workers, log = server
    ws = wait_idle(workers)
    stream = jobs.Submit(request(2, 3000), timeout=60)
    job_id, ranks = None, None
    for e in stream:
        job_id = e.job_id
        if e.step >= 2:
            ranks = list(e.workers)
            break
    pid = {w.worker_id: w.pid for w in workers.ListWorkers(wpb.ListWorkersRequest()).workers}[ranks[1]]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(grpc.RpcError) as ei:
        for _ in stream:
            pass
    took = time.monotonic() - t0
    assert took < 10, took
    print(f"\nkilled rank 1: the job failed in {took:.2f} s: {ei.value.details()}")
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE, ei.value
    assert f"rank 1 (worker {ranks[1]})" in ei.value.details(), ei.value.details()
    info = jobs.GetJob(jpb.GetJobRequest(job_id=job_id))
    assert info.state == jpb.JOB_STATE_FAILED and "rank 1" in info.error and 2 <= info.steps_done < 3000
    wait_idle(workers, ids=[ranks[0]], timeout=10)
