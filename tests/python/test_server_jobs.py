"""fxdp-server's job service (proto/fxdp/v1/jobs.proto): Submit (a request stream: spec, state
chunks, per-step global batches), GetJob, ListJobs, CancelJob, FetchState, the FIFO job queue.

Starts ``fxdp-server --listen 127.0.0.1:0 --local-workers 2`` ($FXDP_SERVER_BIN, default
build/bin/fxdp-server; its workers are $FXDP_WORKER, default build/bin/fxdp-worker) and drives it
with the generated Python stubs:

* a traced zoo mlp/AdamW job on 2 workers, state and batches streamed in small chunks: the
  per-step global losses and the fetched final state equal single-device ``run_local`` (rtol 1e-5,
  atol 1e-6); GetJob and ListJobs report it SUCCEEDED;
* an uneven batch along dim 1 (seq-first model, 7 samples on 2 ranks: 4 + 3) sliced by the server
  trains like one device;
* two world-size-2 jobs submitted at once: one waits QUEUED (saying for what), then both succeed
  with correct losses; strict FIFO: a 1-rank job queued behind a 2-rank one does not overtake it
  although a worker is idle; a job larger than the registered workers is FAILED_PRECONDITION;
* CancelJob of a queued job, a client that goes away while queued, CancelJob of a running job;
* SIGKILL of one worker mid-job fails the job within 10 s naming the rank, and a job queued behind
  it then runs on the survivor and the restarted worker;
* malformed submissions are INVALID_ARGUMENT naming the field, node, step or tensor; garbage bytes
  do not hurt the server;
* a second server with --max-queued-jobs 1 --max-state-mb 0 --max-finished-jobs 2: a full queue is
  RESOURCE_EXHAUSTED, FetchState of an evicted state FAILED_PRECONDITION, old jobs are forgotten,
  each naming its flag.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import fxdp
import grpc
import pytest
import torch
from _util import ATOL, RTOL, fetch, local_server, local_steps, traced
from fxdp import zoo
from fxdp.v1 import compile_pb2 as cpb
from fxdp.v1 import compile_pb2_grpc as cgrpc
from fxdp.v1 import graph_pb2 as gpb
from fxdp.v1 import jobs_pb2 as jpb
from fxdp.v1 import jobs_pb2_grpc as jgrpc
from fxdp.v1 import worker_pb2 as wpb
from fxdp.v1 import worker_pb2_grpc as wgrpc
from fxdp.wire_tensors import chunks

MODEL, OPTIM = "mlp", "adamw"
LONG = 3000  # steps of a job that runs until it is cancelled


def requests(
    world: int,
    steps: int,
    *,
    step: fxdp.TracedStep = None,
    batches=None,
    state=None,
    num_state=None,
):
    """The Submit stream: the spec, the state in 1000-byte chunks, each step's global batch in
    100-byte chunks (zoo mlp batches unless given), every step closed by an empty StepBatch."""
    step = step or traced(MODEL, OPTIM)
    state = step.initial_state() if state is None else state
    if batches is None:
        batches = [zoo.get(MODEL).named_batch(i) for i in range(steps)]
    yield jpb.SubmitJobRequest(
        spec=jpb.JobSpec(
            graph=step.graph,
            world_size=world,
            steps=steps,
            num_state_tensors=len(state) if num_state is None else num_state,
            collective_timeout_s=10,
            name="test",
        )
    )
    for k, v in state.items():
        for c in chunks(k, v, 1000):
            yield jpb.SubmitJobRequest(state=c)
    for i in range(steps):
        for name, t in batches[i % len(batches)].items():
            for c in chunks(name, t, 100):
                yield jpb.SubmitJobRequest(batch=jpb.StepBatch(step=i + 1, tensors=[c], more=True))
        yield jpb.SubmitJobRequest(batch=jpb.StepBatch(step=i + 1))


@pytest.fixture(scope="module")
def server():
    with local_server() as (address, _):
        ch = grpc.insecure_channel(address)
        yield jgrpc.JobServiceStub(ch), wgrpc.WorkerServiceStub(ch), address
        ch.close()


def wait_idle(workers_stub, ids=None, n=2, timeout=30.0) -> list:
    deadline = time.monotonic() + timeout
    while True:
        ws = workers_stub.ListWorkers(wpb.ListWorkersRequest()).workers
        idle = [w for w in ws if w.state == wpb.WORKER_STATE_IDLE]
        if (ids is None and len(idle) >= n) or (
            ids is not None and set(ids) <= {w.worker_id for w in idle}
        ):
            return list(ws)
        if time.monotonic() > deadline:
            raise AssertionError(f"workers not IDLE within {timeout} s: {ws}")
        time.sleep(0.1)


def start_long_job(jobs, world=2):
    """A job of LONG steps, returned once it runs its second step: (stream, job id, workers)."""
    stream = jobs.Submit(
        requests(world, LONG, batches=[zoo.get(MODEL).named_batch(0)]), timeout=120
    )
    for e in stream:
        if e.step >= 2:
            return stream, e.job_id, list(e.workers)
    raise AssertionError("the long job ended early")


def first_event(stream, want=jpb.JOB_STATE_QUEUED):
    e = next(stream)
    assert e.state == want, e
    return e


def drain(stream) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        for _ in stream:
            pass
    return ei.value


def check_losses(events, steps):
    stepped = [e for e in events if e.step > 0 and e.state == jpb.JOB_STATE_RUNNING]
    assert [e.step for e in stepped] == list(range(1, steps + 1)), events
    _, ref = local_steps(traced(MODEL, OPTIM), MODEL, steps)
    for e, want in zip(stepped, ref):
        assert abs(e.loss - float(want)) <= RTOL * abs(float(want)) + ATOL, (e.loss, float(want))
    return stepped


def test_two_worker_job_trains_like_one_device(server):
    jobs, workers, _ = server
    wait_idle(workers)
    steps = 3
    t0 = time.monotonic()
    events = list(jobs.Submit(requests(2, steps), timeout=60))
    elapsed = time.monotonic() - t0
    assert [events[0].state, events[1].state, events[-1].state] == [
        jpb.JOB_STATE_QUEUED,
        jpb.JOB_STATE_RUNNING,
        jpb.JOB_STATE_SUCCEEDED,
    ], events
    assert (
        events[0].queue_position == 0 and events[1].step == 0 and len(set(events[1].workers)) == 2
    )
    job_id = events[0].job_id
    for e in check_losses(events, steps):
        assert len(e.local_losses) == 2 and e.step_ms > 0
        # equal halves: the global loss is the mean of the local ones
        assert abs(sum(e.local_losses) / 2 - e.loss) <= 1e-5 * abs(e.loss) + 1e-6

    ref_state, _ = local_steps(traced(MODEL, OPTIM), MODEL, steps)
    final = fetch(jobs, job_id, chunk_bytes=1000)
    assert set(final) == set(ref_state)
    for k, want in ref_state.items():
        assert final[k].dtype == want.dtype and final[k].shape == want.shape, k
        torch.testing.assert_close(final[k], want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{k}: {m}")

    info = jobs.GetJob(jpb.GetJobRequest(job_id=job_id))
    assert info.state == jpb.JOB_STATE_SUCCEEDED and info.steps_done == steps and info.has_state
    assert len(info.losses) == steps and info.world_size == 2 and info.name == "test"
    assert info.submitted_unix_ms <= info.started_unix_ms <= info.ended_unix_ms
    listed = {j.job_id: j for j in jobs.ListJobs(jpb.ListJobsRequest()).jobs}
    assert listed[job_id].state == jpb.JOB_STATE_SUCCEEDED
    with pytest.raises(grpc.RpcError) as ei:
        jobs.GetJob(jpb.GetJobRequest(job_id="nope"))
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    print(f"\n2-worker job ({MODEL}/{OPTIM}, {steps} steps) via fxdp-server in {elapsed:.2f} s")


def test_uneven_batch_along_dim_1_is_sliced_by_the_server(server):
    jobs, workers, _ = server
    e = zoo.get("seqfirst")
    gen = torch.Generator().manual_seed(5)
    batches = [
        {"x": torch.randn(5, 7, 10, generator=gen), "target": torch.randn(5, 7, 4, generator=gen)}
        for _ in range(3)
    ]
    model = e.model(0)
    step = fxdp.trace(
        model,
        zoo.make_optimizer("adam", model),
        e.loss_fn,
        tuple(batches[0].values()),
        batch_dim=1,
        input_names=e.input_names,
        loss_reduction=e.loss_reduction,
    )
    state, losses = step.initial_state(), []
    for b in batches:
        state, loss = step.run_local(state, b)
        losses.append(float(loss))
    wait_idle(workers)
    events = list(jobs.Submit(requests(2, 3, step=step, batches=batches), timeout=60))
    assert events[-1].state == jpb.JOB_STATE_SUCCEEDED, events[-1]
    got = [ev.loss for ev in events if ev.step > 0 and ev.state == jpb.JOB_STATE_RUNNING]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(losses), rtol=RTOL, atol=ATOL)
    final = fetch(jobs, events[0].job_id)
    for k, want in state.items():
        torch.testing.assert_close(final[k], want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{k}: {m}")


def test_two_jobs_at_once_one_waits_queued(server):
    jobs, workers, _ = server
    wait_idle(workers)
    results = {}

    def run(tag):
        results[tag] = list(jobs.Submit(requests(2, 3), timeout=120))

    threads = [threading.Thread(target=run, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    infos = sorted(
        (jobs.GetJob(jpb.GetJobRequest(job_id=ev[0].job_id)) for ev in results.values()),
        key=lambda i: i.started_unix_ms,
    )
    for events in results.values():
        assert (
            events[0].state == jpb.JOB_STATE_QUEUED and events[-1].state == jpb.JOB_STATE_SUCCEEDED
        ), events
        check_losses(events, 3)
    # The second ran only after the first ended; it said what it waited for.
    first, second = infos
    assert second.started_unix_ms >= first.ended_unix_ms, infos
    waited = results["a"] if results["a"][0].job_id == second.job_id else results["b"]
    queued = [ev for ev in waited if ev.state == jpb.JOB_STATE_QUEUED]
    assert any("waiting for 2 idle workers; 2 registered" in ev.message for ev in queued), queued


def test_strict_fifo_and_more_ranks_than_workers(server):
    jobs, workers, _ = server
    wait_idle(workers)
    # More ranks than workers exist: FAILED_PRECONDITION naming both numbers (at once, or after
    # --queue-grace-s while the server is young), never a queue blocked for good.
    big = jobs.Submit(requests(3, 1), timeout=120)
    err = drain(big)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err
    assert "JobSpec.world_size 3 exceeds the 2 workers registered" in err.details(), err

    long_stream, long_id, _ = start_long_job(jobs, world=1)  # one worker busy, one idle

    # b (2 ranks) queues first; c (1 rank) behind it must not take the idle worker.
    b = jobs.Submit(requests(2, 2), timeout=120)
    eb = first_event(b)
    c = jobs.Submit(requests(1, 2), timeout=120)
    ec = first_event(c)
    assert (eb.queue_position, ec.queue_position) == (1, 2), (eb, ec)
    assert "1 job ahead" in ec.message, ec
    time.sleep(1.0)
    listed = {j.job_id: j for j in jobs.ListJobs(jpb.ListJobsRequest()).jobs}
    assert listed[ec.job_id].state == jpb.JOB_STATE_QUEUED and listed[ec.job_id].queue_position == 2
    jobs.CancelJob(jpb.CancelJobRequest(job_id=long_id))
    assert drain(long_stream).code() == grpc.StatusCode.CANCELLED
    events_b, events_c = list(b), list(c)
    assert events_b[-1].state == events_c[-1].state == jpb.JOB_STATE_SUCCEEDED, (
        events_b[-1],
        events_c[-1],
    )
    ib, ic = (jobs.GetJob(jpb.GetJobRequest(job_id=x.job_id)) for x in (eb, ec))
    assert ib.started_unix_ms <= ic.started_unix_ms, (ib, ic)


def test_cancel_queued_and_client_gone(server):
    jobs, workers, _ = server
    wait_idle(workers)
    long_stream, long_id, _ = start_long_job(jobs)
    queued = jobs.Submit(requests(2, 1), timeout=120)
    e = first_event(queued)
    assert e.queue_position == 1, e
    info = jobs.CancelJob(jpb.CancelJobRequest(job_id=e.job_id, reason="test"))
    assert info.state == jpb.JOB_STATE_CANCELLED and "test" in info.error, info
    err = drain(queued)
    assert err.code() == grpc.StatusCode.CANCELLED and e.job_id in err.details(), err

    gone = jobs.Submit(requests(2, 1), timeout=120)
    g = first_event(gone)
    gone.cancel()  # the client goes away while its job is queued
    deadline = time.monotonic() + 5
    while jobs.GetJob(jpb.GetJobRequest(job_id=g.job_id)).state != jpb.JOB_STATE_CANCELLED:
        assert time.monotonic() < deadline, jobs.GetJob(jpb.GetJobRequest(job_id=g.job_id))
        time.sleep(0.05)
    assert "went away" in jobs.GetJob(jpb.GetJobRequest(job_id=g.job_id)).error

    # CancelJob of the running job.
    info = jobs.CancelJob(jpb.CancelJobRequest(job_id=long_id, reason="test"))
    assert info.state == jpb.JOB_STATE_CANCELLED and "test" in info.error, info
    assert drain(long_stream).code() == grpc.StatusCode.CANCELLED
    # It keeps the state of its last completed step (issue 26).
    info = jobs.GetJob(jpb.GetJobRequest(job_id=long_id))
    assert info.has_state and info.checkpoint_step == info.steps_done > 0, info
    assert f"its state after step {info.steps_done} is kept" in info.error, info
    assert list(jobs.FetchState(jpb.FetchJobStateRequest(job_id=long_id)))[-1].last
    wait_idle(workers, timeout=10)


def test_killed_worker_fails_the_job_and_the_queue_goes_on(server):
    jobs, workers, _ = server
    wait_idle(workers)
    stream, job_id, ranks = start_long_job(jobs)
    behind = jobs.Submit(requests(2, 3), timeout=120)
    first_event(behind)
    pid = {w.worker_id: w.pid for w in workers.ListWorkers(wpb.ListWorkersRequest()).workers}[
        ranks[1]
    ]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    err = drain(stream)
    took = time.monotonic() - t0
    assert took < 10, took
    print(f"\nkilled rank 1: the job failed in {took:.2f} s: {err.details()}")
    assert err.code() == grpc.StatusCode.UNAVAILABLE, err
    assert f"rank 1 (worker {ranks[1]})" in err.details(), err.details()
    info = jobs.GetJob(jpb.GetJobRequest(job_id=job_id))
    assert (
        info.state == jpb.JOB_STATE_FAILED
        and "rank 1" in info.error
        and 2 <= info.steps_done < LONG
    )
    # The survivor and the restarted worker take the queued job.
    events = list(behind)
    assert events[-1].state == jpb.JOB_STATE_SUCCEEDED, events[-1]
    assert ranks[0] in events[-1].workers
    check_losses(events, 3)


def submit_error(jobs, reqs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        list(jobs.Submit(iter(reqs), timeout=60))
    return ei.value


def _bad_spec_submissions(good: list, step) -> list:
    """(requests, what the INVALID_ARGUMENT names) for Submits whose JobSpec is wrong: `good` is a
    valid Submit, `step` its traced step."""
    spec = good[0].spec

    def with_spec(**kw):
        s = jpb.JobSpec()
        s.CopyFrom(spec)
        for k, v in kw.items():
            if k == "graph":
                s.graph.CopyFrom(v)
            else:
                setattr(s, k, v)
        return [jpb.SubmitJobRequest(spec=s)]

    cases = [
        (good[1:2], "must carry the JobSpec"),
        (with_spec(world_size=0), "JobSpec.world_size must be >= 1, got 0"),
        (with_spec(steps=-1), "JobSpec.steps must be >= 0"),
        (with_spec(collective_timeout_s=float("nan")), "JobSpec.collective_timeout_s"),
        ([jpb.SubmitJobRequest(spec=jpb.JobSpec(world_size=2))], "JobSpec.graph is missing"),
    ]
    bad = gpb.GraphDef()
    bad.CopyFrom(step.graph)
    bad.nodes[5].name = bad.nodes[4].name  # a duplicate node name
    cases.append((with_spec(graph=bad), bad.nodes[4].name))
    paths = jpb.JobSpec()
    paths.CopyFrom(spec)
    paths.data_paths.append("")
    cases.append(([jpb.SubmitJobRequest(spec=paths)], "JobSpec.data_paths[0] is empty"))
    return cases


def _bad_stream_submissions(state: dict) -> list:
    """(requests, what the INVALID_ARGUMENT names) for Submits whose stream goes wrong once the job
    runs (a batch, its end, the initial state): the error names the step and tensor."""
    e = zoo.get(MODEL)
    wrong = dict(e.named_batch(0), x=torch.zeros(12, 9))
    odd_name = dict(e.named_batch(0), y=torch.zeros(12, 5))
    cases = [
        (
            requests(2, 1, batches=[wrong]),
            "step 1's batch: input 'x' is f32[12, 9], the graph expects f32[12, 10]",
        ),
        (
            requests(2, 1, batches=[odd_name]),
            "step 1's batch: tensor 'y' is not an INPUT of the graph",
        ),
        (
            requests(2, 1, batches=[{"x": e.named_batch(0)["x"]}]),
            "step 1's batch lacks input 'target'",
        ),
        (list(requests(2, 2))[:-3], "the client ended the stream in the middle of step 2's batch"),
        (
            [r for r in requests(2, 2) if not r.HasField("batch") or r.batch.step == 1],
            "after the batches of 1 of 2 steps",
        ),
        (
            [r for r in requests(2, 1, state=state) if r.HasField("spec") or r.HasField("state")][
                :-1
            ],
            "initial-state tensors (JobSpec.num_state_tensors)",
        ),
    ]
    return cases


def test_malformed_submissions(server):
    jobs, workers, _ = server
    step = traced(MODEL, OPTIM)
    good = list(requests(2, 1))
    spec = good[0].spec
    for reqs, want in _bad_spec_submissions(good, step):
        err = submit_error(jobs, reqs)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and want in err.details(), (want, err)
    # More ranks than the batch has samples: the expansion's error (a Submit for 13 ranks on these
    # 2 workers is refused before its graph is expanded once the server is up --queue-grace-s).
    with grpc.insecure_channel(server[2]) as ch:
        with pytest.raises(grpc.RpcError) as ei:
            cgrpc.CompileServiceStub(ch).Expand(
                cpb.ExpandRequest(graph=spec.graph, world_size=13), timeout=60
            )
    assert (
        ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        and "larger than the batch" in ei.value.details()
    )

    # Errors in the stream once the job runs: INVALID_ARGUMENT naming the step and tensor.
    state = step.initial_state()
    for reqs, want in _bad_stream_submissions(state):
        wait_idle(workers)
        err = submit_error(jobs, list(reqs))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and want in err.details(), (want, err)
    # One state tensor fewer than the graph reads: refused before any is read.
    wait_idle(workers)
    err = submit_error(jobs, list(requests(2, 1, num_state=len(state) - 1)))
    want = f"JobSpec.num_state_tensors is {len(state) - 1}, the graph declares {len(state)} state tensors"
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and want in err.details(), err
    wait_idle(workers, timeout=10)


def test_garbage_does_not_hurt_the_server(server):
    jobs, workers, address = server
    ch = grpc.insecure_channel(address)
    submit = ch.stream_stream(
        "/fxdp.v1.JobService/Submit",
        request_serializer=lambda b: b,
        response_deserializer=jpb.JobEvent.FromString,
    )
    for payload in (
        b"\xff\xff\xff\xff\x0f garbage",
        b"",
        jpb.SubmitJobRequest(batch=jpb.StepBatch(step=1)).SerializeToString(),
    ):
        with pytest.raises(grpc.RpcError) as ei:
            list(submit(iter([payload]), timeout=10))
        assert ei.value.code() in (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.INTERNAL,
        ), ei.value
    ch.close()
    assert len(wait_idle(workers)) >= 2
    events = list(jobs.Submit(requests(2, 1), timeout=60))
    assert events[-1].state == jpb.JOB_STATE_SUCCEEDED, events[-1]


@pytest.fixture(scope="module")
def limited():
    args = ("--max-queued-jobs", "1", "--max-state-mb", "0", "--max-finished-jobs", "2")
    with local_server(extra_args=args) as (address, _):
        ch = grpc.insecure_channel(address)
        yield jgrpc.JobServiceStub(ch), wgrpc.WorkerServiceStub(ch)
        ch.close()


def test_limits_name_their_flags(limited):
    jobs, workers = limited
    wait_idle(workers)
    done = list(jobs.Submit(requests(2, 1), timeout=60))
    assert done[-1].state == jpb.JOB_STATE_SUCCEEDED, done[-1]
    first_id = done[0].job_id
    info = jobs.GetJob(jpb.GetJobRequest(job_id=first_id))
    assert not info.has_state and info.state_evicted, info
    with pytest.raises(grpc.RpcError) as ei:
        list(jobs.FetchState(jpb.FetchJobStateRequest(job_id=first_id)))
    assert (
        ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "evicted" in ei.value.details()
    )
    assert "--max-state-mb" in ei.value.details(), ei.value.details()

    wait_idle(workers)
    long_stream, long_id, _ = start_long_job(jobs)
    queued = jobs.Submit(requests(2, 1), timeout=60)
    q = first_event(queued)
    err = submit_error(jobs, list(requests(2, 1)))
    assert (
        err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        and "--max-queued-jobs is 1" in err.details()
    ), err
    jobs.CancelJob(jpb.CancelJobRequest(job_id=q.job_id))
    info = jobs.CancelJob(jpb.CancelJobRequest(job_id=long_id))
    # Its last step's state does not fit --max-state-mb 0: not kept, and said so.
    assert "is larger than this server keeps (fxdp-server --max-state-mb 0)" in info.error, info
    assert not info.has_state, info
    drain(queued), drain(long_stream)
    # Three jobs finished; the first is forgotten.
    with pytest.raises(grpc.RpcError) as ei:
        jobs.GetJob(jpb.GetJobRequest(job_id=first_id))
    assert (
        ei.value.code() == grpc.StatusCode.NOT_FOUND and "--max-finished-jobs" in ei.value.details()
    )
    assert {j.job_id for j in jobs.ListJobs(jpb.ListJobsRequest()).jobs} == {q.job_id, long_id}
