"""``fxdp-worker attach``: the worker side of the worker protocol (proto/fxdp/v1/worker.proto).

A small gRPC server written here (grpcio, the generated ``fxdp.v1.worker_pb2``) plays the fxdp
server's part for real ``fxdp-worker attach`` processes on 127.0.0.1 (ephemeral ports):

* two workers register (device, capacity, versions, pid) and heartbeat; the server assigns them a
  2-rank job of an expanded zoo graph (mlp/AdamW, transformer/Adam; ``fxdp expand --world-size 2``), streams the initial
  state in small chunks, then for 3 steps each rank's balanced slice of the global batch; both
  ranks report the global loss (equal to single-device ``TracedStep.run_local``) and their local
  losses; the final state, fetched in small chunks, is bit-identical on both ranks and equals
  ``run_local`` after 3 steps (rtol 1e-5, atol 1e-6); the workers end the job and are IDLE;
* one of two ranks is killed (SIGKILL) mid-job: the survivor's next step fails with JobFailed
  naming the lost rank well within the collective timeout, the survivor is IDLE again and runs a
  1-rank job, which CancelJob then ends;
* a malformed AssignJob (a graph that does not verify, a rank outside the world, state missing an
  entry, a peer that never shows up, a second job while busy) yields JobFailed with a clear
  message, and the worker stays attached and IDLE;
* Batch.hyperparameters are written into the state before the step (SGD with lr and weight decay
  fed per step equals the same steps by hand), and a name that is not a hyper-parameter fails the
  job naming it;
* the server going away: the worker reattaches to a new server on the same address; Shutdown
  and SIGTERM make it exit with status 0.

Binaries: $FXDP_WORKER (default build/bin/fxdp-worker), $FXDP_BIN (build/bin/fxdp).
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
import torch
from _util import ATOL, RTOL, free_port, local_steps
from _worker_protocol import (
    Lab,
    assert_float_close,
    assign,
    batch_dims,
    fetch_state,
    idle,
    send_batch,
    shard,
)
from fxdp import zoo
from fxdp.v1 import graph_pb2 as gpb
from fxdp.v1 import worker_pb2 as wpb
from fxdp.wire_tensors import chunks


@pytest.fixture
def lab(tmp_path):
    lab = Lab(tmp_path)
    yield lab
    lab.close()


# --------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("model,optim", [("mlp", "adamw"), ("transformer", "adam")])
def test_two_ranks_train_like_one_device(lab, model, optim):
    world, steps = 2, 3
    step, _, expanded = lab.graphs(model, optim, world)
    graphs = [expanded[r % len(expanded)] for r in range(world)]
    server = lab.server()
    procs = [lab.start_worker(server.port, f"w{r}") for r in range(world)]
    conns = server.accept(world)
    for p in procs:
        reg = conns[p.worker_id].register
        assert reg.protocol_version == wpb.WORKER_PROTOCOL_VERSION_2
        assert reg.pid == p.pid and reg.device == "cpu" and reg.capacity == 1 and reg.threads == 1
        assert reg.memory_bytes > 0 and reg.hostname and reg.fxdp_version
        assert reg.torch_version == torch.__version__.split("+")[0]
        assert reg.busy_with_job_id == ""
        conns[p.worker_id].wait_heartbeat(idle)
    ranks = [conns["w0"], conns["w1"]]

    state0 = step.initial_state()
    port = free_port()
    t0 = time.monotonic()
    for r, c in enumerate(ranks):
        assign(c, "dp", graphs[r], state0, rank=r, world=world, port=port, steps=steps)
    for r, c in enumerate(ranks):
        s = c.recv("job_started")
        assert (s.job_id, s.rank, s.world_size, s.device) == (
            "dp",
            r,
            world,
            "cpu",
        ) and s.num_ops > 0
        assert c.wait_heartbeat(lambda h: h.state == wpb.WORKER_STATE_BUSY).job_id == "dp"

    ref_state, ref_losses = local_steps(step, model, steps)
    dims = batch_dims(graphs[0])
    e = zoo.get(model)
    for i in range(steps):
        batch = e.named_batch(i)
        for r, c in enumerate(ranks):
            send_batch(c, "dp", i + 1, shard(batch, dims, r, world))
        results = [c.recv("step_result") for c in ranks]
        for r, res in enumerate(results):
            assert (res.job_id, res.rank, res.step) == ("dp", r, i + 1)
            assert res.step_ms > 0 and res.collectives >= 2 and res.comm_bytes > 0
            assert 0 <= res.comm_wait_ms <= res.step_ms
        assert results[0].loss == results[1].loss, "ranks disagree on the global loss"
        assert_float_close(results[0].loss, ref_losses[i])
        # The global loss from the two equal-sized shards' local losses: MSE is a mean over the rows
        # (the ranks' mean), cross-entropy a mean over the counted targets (each rank's share: the sum).
        local = results[0].local_loss + results[1].local_loss
        assert_float_close(local / 2 if model == "mlp" else local, results[0].loss)
        assert results[0].local_loss != results[1].local_loss

    finals = [fetch_state(c, "dp", chunk_bytes=1000, end_job=True) for c in ranks]
    for r, c in enumerate(ranks):
        ended = c.recv("job_ended")
        assert (ended.job_id, ended.rank, ended.cancelled, ended.steps_done) == (
            "dp",
            r,
            False,
            steps,
        )
        c.wait_heartbeat(idle)
    elapsed = time.monotonic() - t0
    assert set(finals[0]) == set(ref_state), "the fetched state has other entries than run_local's"
    for k, want in ref_state.items():
        assert finals[0][k].dtype == want.dtype and finals[0][k].shape == want.shape, k
        assert torch.equal(finals[0][k], finals[1][k]), f"rank 1 differs from rank 0 on {k}"
        torch.testing.assert_close(
            finals[0][k], want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{k}: {m}"
        )

    for r in range(world):
        log = lab.log(f"w{r}")
        assert f"[job dp rank {r} step 3/3] " in log and f"[worker w{r}] attached to" in log, log
    nbytes = sum(t.numel() * t.element_size() for t in ref_state.values())
    print(
        f"\n2-rank attach job ({model}, {optim}, {len(ref_state)} state tensors, {nbytes} bytes): "
        f"setup + 3 steps + fetch in {elapsed:.2f} s"
    )


def test_killed_rank_fails_the_job_and_the_survivor_is_reusable(lab):
    model, optim, world, timeout_s = "mlp", "sgd", 2, 10.0
    step, expanded, procs, ranks = lab.two_rank_job("k", "doomed", model, optim, timeout_s)
    _, single, _ = lab.graphs(model, optim, world)
    dims = batch_dims(expanded[0])
    batch = zoo.get(model).named_batch(0)
    for r, c in enumerate(ranks):
        send_batch(c, "doomed", 1, shard(batch, dims, r, world))
    for c in ranks:
        c.recv("step_result")

    procs["k1"].send_signal(signal.SIGKILL)
    procs["k1"].wait(timeout=10)
    assert ranks[1].closed.wait(5), "the server did not see the killed worker's stream end"
    t0 = time.monotonic()
    send_batch(ranks[0], "doomed", 2, shard(zoo.get(model).named_batch(1), dims, 0, world))
    failed = ranks[0].recv("job_failed", timeout=timeout_s + 5)
    elapsed = time.monotonic() - t0
    assert elapsed < timeout_s, f"the survivor took {elapsed:.1f} s to fail"
    assert (failed.job_id, failed.rank, failed.step) == ("doomed", 0, 2)
    assert failed.code in (14, 4), failed  # UNAVAILABLE (peer gone) or DEADLINE_EXCEEDED
    assert "job doomed rank 0 step 2/3" in failed.error and "rank 1" in failed.error, failed.error
    assert "all_reduce" in failed.error, failed.error
    ranks[0].wait_heartbeat(idle)

    # Still attached and reusable: a 1-rank job of the single-device graph, then CancelJob.
    assign(ranks[0], "solo", single, step.initial_state(), steps=0)
    ranks[0].recv("job_started")
    send_batch(ranks[0], "solo", 1, dict(batch))
    res = ranks[0].recv("step_result")
    _, ref_losses = local_steps(step, model, 1)
    assert_float_close(res.loss, ref_losses[0])
    assert res.local_loss == res.loss and res.collectives == 0
    ranks[0].send(cancel_job=wpb.CancelJob(job_id="solo", reason="test over"))
    ended = ranks[0].recv("job_ended")
    assert (ended.job_id, ended.cancelled, ended.steps_done) == ("solo", True, 1)
    ranks[0].wait_heartbeat(idle)
    log = lab.log("k0")
    assert "[job doomed rank 0 step 2/3] failed:" in log, log
    print(f"\nsurvivor reported the lost rank after {elapsed:.2f} s")


def _expect_failure(conn, job_id, code, *words, rank=0):
    """The worker's JobFailed for `job_id`: its rank, gRPC code and words; then it is idle."""
    f = conn.recv("job_failed")
    assert f.job_id == job_id and f.rank == rank and f.code == code, f
    for w in words:
        assert w in f.error, f"{w!r} not in {f.error!r}"
    conn.wait_heartbeat(idle)
    return f


def _jobs_refused_before_their_first_step(conn, single, state):
    """A bad graph, a rank outside the world, a missing or short state, a rendezvous nobody joins:
    each fails clearly and the worker stays attached."""
    # A graph that does not verify: an argument refers to its own node.
    bad = gpb.GraphDef()
    bad.CopyFrom(single)
    idx, node = next(
        (i, n)
        for i, n in enumerate(bad.nodes)
        if n.kind == gpb.CALL_FUNCTION and any(a.HasField("ref") for a in n.args)
    )
    next(a for a in node.args if a.HasField("ref")).ref.node = idx
    assign(conn, "badgraph", bad, state)
    _expect_failure(
        conn, "badgraph", 3, "job badgraph rank 0 step 0/3", "does not decode or verify", node.name
    )

    # A rank outside the world.
    assign(conn, "badrank", single, state, rank=2, world=2, port=free_port())
    _expect_failure(conn, "badrank", 3, "rank 2 is not in [0, world_size 2)", rank=-1)

    # State without one of the entries the graph reads.
    missing = next(iter(state))
    assign(conn, "nostate", single, {k: v for k, v in state.items() if k != missing})
    _expect_failure(conn, "nostate", 5, "initial state", missing)

    # State that announces more tensors than it sends.
    assign(conn, "short", single, state, num_state=len(state) + 1)
    _expect_failure(
        conn,
        "short",
        3,
        f"got {len(state)} tensors, AssignJob.num_state_tensors says {len(state) + 1}",
    )

    # A 2-rank job whose other rank never shows up: the rendezvous times out naming it.
    t0 = time.monotonic()
    assign(conn, "alone", single, state, rank=0, world=2, port=free_port(), timeout_s=1.0)
    _expect_failure(
        conn,
        "alone",
        14,
        "job alone rank 0 step 0/3",
        "Gloo rendezvous failed",
        "no word from rank 1",
    )
    assert time.monotonic() - t0 < 10


def test_bad_jobs_fail_clearly_and_the_worker_stays_attached(lab):
    model, optim = "mlp", "sgd"
    step, single, _ = lab.graphs(model, optim, 2)
    state = step.initial_state()
    server = lab.server()
    proc = lab.start_worker(server.port, "b0")
    conn = server.accept(1)["b0"]

    _jobs_refused_before_their_first_step(conn, single, state)

    # A good job; a second AssignJob while it runs is refused, the first goes on.
    assign(conn, "good", single, state, steps=2)
    conn.recv("job_started")
    assign(conn, "second", single, state)
    expect_failure_busy = conn.recv("job_failed")
    assert (
        expect_failure_busy.job_id == "second" and expect_failure_busy.code == 8
    ), expect_failure_busy
    assert "busy with job 'good'" in expect_failure_busy.error
    batch = zoo.get(model).named_batch(0)
    send_batch(conn, "good", 1, dict(batch))
    assert conn.recv("step_result").step == 1
    # A batch for the wrong step fails the job, naming the step.
    send_batch(conn, "good", 3, dict(batch))
    _expect_failure(conn, "good", 3, "job good rank 0 step 3/2", "expected step 2")

    # A bad batch: a tensor of the wrong shape.
    assign(conn, "badbatch", single, state)
    conn.recv("job_started")
    send_batch(conn, "badbatch", 1, {k: v[:, :1] if v.dim() > 1 else v for k, v in batch.items()})
    _expect_failure(conn, "badbatch", 3, "job badbatch rank 0 step 1/3")

    # Messages for a job the worker does not hold are ignored.
    conn.send(batch=wpb.Batch(job_id="nosuchjob", step=1))
    conn.send(fetch_state=wpb.FetchState(job_id="nosuchjob"))
    assert proc.poll() is None
    conn.wait_heartbeat(idle)

    # Shutdown: exit status 0.
    conn.send(shutdown=wpb.Shutdown(reason="test over"))
    assert proc.wait(timeout=10) == 0
    assert conn.closed.wait(5)
    log = lab.log("b0")
    assert "shutting down (the server asked: test over)" in log, log
    assert "ignoring a batch for job 'nosuchjob'" in log, log


def test_reattaches_after_the_server_goes_away_and_exits_on_sigterm(lab):
    model, optim = "mlp", "sgd"
    step, single, _ = lab.graphs(model, optim, 2)
    server = lab.server()
    port = server.port
    proc = lab.start_worker(port, "r0")
    conn = server.accept(1)["r0"]
    conn.wait_heartbeat(idle)
    # A job in progress when the server goes away is abandoned.
    assign(conn, "orphan", single, step.initial_state(), steps=0)
    conn.recv("job_started")
    server.stop()
    t0 = time.monotonic()
    server2 = lab.server(port)
    conn2 = server2.accept(1, timeout=15)["r0"]
    assert conn2.register.pid == proc.pid
    conn2.wait_heartbeat(idle)
    print(f"\nreattached after {time.monotonic() - t0:.2f} s")
    assign(conn2, "after", single, step.initial_state())
    conn2.recv("job_started")
    send_batch(conn2, "after", 1, dict(zoo.get(model).named_batch(0)))
    conn2.recv("step_result")
    # SIGTERM mid-job: the job is reported cancelled, the worker exits 0.
    proc.send_signal(signal.SIGTERM)
    f = conn2.recv("job_failed", timeout=10)
    assert f.job_id == "after" and f.code == 1 and "shutting down (SIGTERM)" in f.error, f
    assert proc.wait(timeout=10) == 0
    log = lab.log("r0")
    assert (
        "[job orphan rank 0 step 0] abandoning the job: its server connection is gone" in log
    ), log
    assert "lost the server connection" in log, log


def test_hung_rank_times_out_and_heartbeats_tell_which_worker_hangs(lab):
    model, optim, world, timeout_s = "mlp", "sgd", 2, 2.0
    step, expanded, procs, ranks = lab.two_rank_job("h", "hang", model, optim, timeout_s)
    dims = batch_dims(expanded[0])
    e = zoo.get(model)
    for r, c in enumerate(ranks):
        send_batch(c, "hang", 1, shard(e.named_batch(0), dims, r, world))
    for c in ranks:
        c.recv("step_result")

    procs["h1"].send_signal(signal.SIGSTOP)
    try:
        time.sleep(0.3)
        stopped_at = ranks[1].heartbeats
        t0 = time.monotonic()
        for r, c in enumerate(ranks):
            send_batch(c, "hang", 2, shard(e.named_batch(1), dims, r, world))
        # Rank 0 blocks in its collective but keeps heartbeating (BUSY, in a step, 1 step done);
        # the stopped worker sends nothing: that is how a server tells which worker hangs.
        h = ranks[0].wait_heartbeat(lambda h: h.in_step and h.step == 1 and h.job_id == "hang")
        assert h.state == wpb.WORKER_STATE_BUSY
        failed = ranks[0].recv("job_failed", timeout=timeout_s + 10)
        elapsed = time.monotonic() - t0
        assert ranks[1].heartbeats == stopped_at, "a stopped worker sent heartbeats"
    finally:
        procs["h1"].send_signal(signal.SIGCONT)
    assert failed.code == 4 and (failed.job_id, failed.rank, failed.step) == ("hang", 0, 2), failed
    assert "job hang rank 0 step 2/3" in failed.error and "timed out" in failed.error, failed.error
    # Gloo's timeout does not say which peer it waited for: the heartbeats above do.
    assert timeout_s * 0.9 <= elapsed < timeout_s + 5, elapsed
    ranks[0].wait_heartbeat(idle)
    # Resumed, rank 1 runs its queued step 2, whose collective cannot complete either.
    f1 = ranks[1].recv("job_failed", timeout=timeout_s + 10)
    assert (f1.job_id, f1.rank, f1.step) == ("hang", 1, 2) and f1.code in (4, 14), f1
    ranks[1].wait_heartbeat(idle)
    print(f"\nhung peer: the other rank failed after {elapsed:.2f} s (timeout {timeout_s} s)")


def test_batch_hyperparameters_are_applied_before_the_step(lab):
    """Batch.hyperparameters (tests/testdata/mlp_sgd_hyper.txt: SGD with lr and weight decay as
    HYPERPARAMETER placeholders) are written into the state before the step; a step without values
    keeps the last ones; a name that is not a hyper-parameter fails the job naming it."""
    import pathlib

    g = lab.tmp / "hyper.pb"
    r = subprocess.run(
        [
            lab.fxdp,
            "graph",
            "parse",
            str(pathlib.Path(__file__).resolve().parents[1] / "testdata" / "mlp_sgd_hyper.txt"),
            str(g),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    graph = gpb.GraphDef()
    graph.ParseFromString(g.read_bytes())
    torch.manual_seed(0)
    w, b = torch.randn(3, 4), torch.randn(3)
    state = {
        "fc.weight": w,
        "fc.bias": b,
        "optim.group0.lr": torch.tensor(0.1),
        "optim.group0.weight_decay": torch.tensor(0.0),
    }
    batch = {"input.0": torch.randn(8, 4), "input.1": torch.randn(8, 3)}
    server = lab.server()
    lab.start_worker(server.port, "h0")
    conn = server.accept(1)["h0"]

    assign(conn, "hp", graph, state, steps=3)
    conn.recv("job_started")
    values = [
        wpb.HyperparameterValue(name="optim.group0.lr", value=0.5),
        wpb.HyperparameterValue(name="optim.group0.weight_decay", value=0.25),
    ]
    conn.send(
        batch=wpb.Batch(
            job_id="hp",
            step=1,
            tensors=[c for k, t in batch.items() for c in chunks(k, t, 64)],
            hyperparameters=values,
        )
    )
    assert conn.recv("step_result").step == 1
    send_batch(conn, "hp", 2, batch)  # no values: lr 0.5 and weight decay 0.25 stay
    assert conn.recv("step_result").step == 2
    got = fetch_state(conn, "hp")
    x, y = batch["input.0"], batch["input.1"]
    for _ in range(2):
        d = (torch.addmm(b, x, w.t()) - y) * 2.0 / 24.0
        w, b = w - 0.5 * (d.t() @ x + 0.25 * w), b - 0.5 * (d.sum(0) + 0.25 * b)
    torch.testing.assert_close(got["fc.weight"], w, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(got["fc.bias"], b, rtol=RTOL, atol=ATOL)
    assert got["optim.group0.lr"].dtype == torch.float32 and got["optim.group0.lr"].item() == 0.5

    conn.send(
        batch=wpb.Batch(
            job_id="hp",
            step=3,
            tensors=[c for k, t in batch.items() for c in chunks(k, t, 1 << 20)],
            hyperparameters=[wpb.HyperparameterValue(name="fc.bias", value=1.0)],
        )
    )
    f = conn.recv("job_failed")
    assert f.job_id == "hp" and f.code == 3 and f.step == 3, f
    assert f.error.startswith("job hp rank 0 step 3/3"), f.error
    assert (
        "hyper-parameter values: 'fc.bias' is not a hyper-parameter of the graph (it is the state of "
        "placeholder 'b'; its hyper-parameters: optim.group0.lr, optim.group0.weight_decay)"
    ) in f.error, f.error
    conn.wait_heartbeat(idle)
