"""One job, batches of several shapes, on real workers (issue 26, docs/shapes.md step 6): a small
network traced once with ``dynamic=True`` is expanded by ``fxdp expand --shape`` at batch sizes 6,
5 and 3 (5 and 3 split unevenly over 2 ranks), and

* two real ``fxdp-worker attach`` processes run one job whose programs the test server loads with
  LoadGraph (``max_graphs=1``: each new shape evicts the last), each Batch naming its program:
  every step's loss and the final state equal ``run_local`` over the same batches, one state
  shared by the programs (AdamW's moments carry over from shape to shape);
* ``fxdp-worker run`` with one ``--graph`` per shape runs batch files of different sizes and a
  dataset directory whose steps differ in size, each step with the graph expanded for its shape;
* what is wrong is refused naming it: more programs than ``max_graphs``, a duplicate graph id, a
  Batch naming a program never loaded, an eviction of one not held, a program whose state differs,
  graph metadata that differs, ``max_graphs`` past the worker's bound; data of a shape no
  ``--graph`` takes; an expanded graph that does not record its shapes among several.

Binaries: $FXDP_WORKER (default build/bin/fxdp-worker), $FXDP_BIN (build/bin/fxdp)."""

from __future__ import annotations

import copy
import subprocess

import fxdp
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _util import ATOL, RTOL, expand_json, free_port, fxdp_binary, run_worker_ranks
from _worker_protocol import (
    Lab,
    assert_float_close,
    assign,
    batch_dims,
    fetch_state,
    send_batch,
    shard,
)
from fxdp.v1 import graph_pb2 as gpb
from fxdp.v1 import worker_pb2 as wpb

SIZES = [6, 5, 3]
INVALID_ARGUMENT = 3


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def train_step(model, opt, batch):
    loss = F.mse_loss(model(batch["x"]), batch["y"])
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def batch_of(b: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(b, 4, generator=g), "y": torch.randn(b, 3, generator=g)}


def shape_args(b: int):
    return ["--shape", f"x={b}x4", "--shape", f"y={b}x3"]


class Shapes:
    """The symbolic trace, saved, and its expansions per (batch size, world size)."""

    def __init__(self, d):
        self.d = d
        self.fxdp = fxdp_binary("FXDP_BIN", "fxdp")
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
        self.step = fxdp.trace_step(train_step, model, opt, batch_of(6, 0), dynamic=True)
        self.step.save(d / "g.pb")
        self.step.to_safetensors(d / "s.safetensors")
        self._paths = {}

    def path(self, b: int, world: int) -> str:
        """The rank graph path `fxdp-worker run --graph` takes ('{rank}' in it when uneven)."""
        if (b, world) not in self._paths:
            out = self.d / f"x{b}_w{world}" / "x.pb"
            out.parent.mkdir()
            _, self._paths[b, world] = expand_json(
                self.fxdp, str(self.d / "g.pb"), world, out, *shape_args(b)
            )
        return self._paths[b, world]

    def rank_graph(self, b: int, world: int, rank: int) -> "gpb.GraphDef":
        g = gpb.GraphDef()
        with open(self.path(b, world).format(rank=rank), "rb") as f:
            g.ParseFromString(f.read())
        return g

    def local(self, batches):
        """run_local over `batches` from the initial state: (losses, final state)."""
        state, losses = self.step.initial_state(), []
        for b in batches:
            state, loss = self.step.run_local(state, copy.deepcopy(b))
            losses.append(float(loss))
        return losses, state


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return Shapes(tmp_path_factory.mktemp("shapes"))


@pytest.fixture
def lab(tmp_path):
    lab = Lab(tmp_path)
    yield lab
    lab.close()


def assert_state_close(got, want) -> None:
    for name, t in want.items():
        torch.testing.assert_close(
            got[name], t, rtol=RTOL, atol=ATOL, msg=lambda m, n=name: f"{n}: {m}"
        )


# --------------------------------------------------------------------------------------------
# fxdp-worker attach: LoadGraph, Batch.graph_id, StepResult.graph_id


def test_one_attached_job_runs_every_shape_like_one_device(lab, shapes):
    world, order = 2, [6, 5, 3, 5, 6]
    batches = [batch_of(b, 10 + i) for i, b in enumerate(order)]
    want_losses, want_state = shapes.local(batches)
    server = lab.server()
    for r in range(world):
        lab.start_worker(server.port, f"s{r}")
    conns = server.accept(world)
    ranks = [conns["s0"], conns["s1"]]
    port, job = free_port(), "shapes"
    for r, c in enumerate(ranks):
        assign(
            c,
            job,
            shapes.rank_graph(6, world, r),
            shapes.step.initial_state(),
            rank=r,
            world=world,
            port=port,
            steps=len(order),
            max_graphs=1,
        )
    for c in ranks:
        c.recv("job_started")
    dims = batch_dims(shapes.rank_graph(6, world, 0))
    held, next_id = {6: 0}, 1  # batch size -> graph_id; at most one LoadGraph program at once
    for i, (b, batch) in enumerate(zip(order, batches)):
        if b not in held:
            evict = next((g for s, g in held.items() if g != 0), 0)
            for r, c in enumerate(ranks):
                c.send(
                    load_graph=wpb.LoadGraph(
                        job_id=job,
                        graph_id=next_id,
                        evict_graph_id=evict,
                        graph=shapes.rank_graph(b, world, r),
                    )
                )
            held = {s: g for s, g in held.items() if g != evict}
            held[b], next_id = next_id, next_id + 1
        for r, c in enumerate(ranks):
            send_batch(c, job, i + 1, shard(batch, dims, r, world), graph_id=held[b])
        for c in ranks:
            res = c.recv("step_result")
            assert (res.step, res.graph_id) == (i + 1, held[b])
            assert_float_close(res.loss, want_losses[i])
    for c in ranks:
        assert_state_close(fetch_state(c, job, end_job=True), want_state)
        c.recv("job_ended")
    for w in ("s0", "s1"):
        log = lab.log(w)
        assert "loaded graph 2: " in log and "(evicted graph 1)" in log, log[-2000:]


def failed_job(conn, job: str, graph, state, *, max_graphs=1, messages=()) -> "wpb.JobFailed":
    """A 1-rank job of `graph` given `messages` (ServerMessage fields, their job_id set here)
    after its start: its JobFailed (the worker frees the job before sending it)."""
    assign(conn, job, graph, state, steps=3, max_graphs=max_graphs)
    conn.recv("job_started")
    for m in messages:
        for v in m.values():
            v.job_id = job
        conn.send(**m)
    return conn.recv("job_failed")


def assign_only(conn, job: str, graph, state, *, max_graphs: int) -> None:
    """A 1-rank AssignJob alone: its initial state never follows."""
    conn.send(
        assign_job=wpb.AssignJob(
            job_id=job,
            rank=0,
            world_size=1,
            graph=graph,
            num_state_tensors=len(state),
            max_graphs=max_graphs,
        )
    )


def _refused_load_cases(lab, shapes, g5, g3) -> list:
    """(AssignJob.max_graphs, the messages after the initial state, the error naming it) for each
    LoadGraph or Batch a job refuses: too many programs, an id held or unknown, graph 0, a graph
    whose state or seed differs from graph 0's."""
    load = lambda i, g, evict=0: {  # noqa: E731
        "load_graph": wpb.LoadGraph(graph_id=i, graph=g, evict_graph_id=evict)
    }
    batch5 = lambda gid: {"batch": wpb.Batch(step=1, graph_id=gid)}  # noqa: E731
    reseeded = copy.deepcopy(g5)
    reseeded.metadata.add(key="fxdp.seed", value="7")
    torch.manual_seed(0)
    model = Net()
    sgd = fxdp.trace_step(
        train_step, model, torch.optim.SGD(model.parameters(), lr=0.1), batch_of(5, 0)
    )
    sgd.save(lab.tmp / "sgd.pb")
    _, sgd_path = expand_json(shapes.fxdp, str(lab.tmp / "sgd.pb"), 1, lab.tmp / "sgd1.pb")
    sgd_graph = gpb.GraphDef()
    sgd_graph.ParseFromString(open(sgd_path, "rb").read())
    cases = [
        (
            0,
            [load(1, g5)],
            "LoadGraph graph_id 1: the job would hold 1 programs besides graph 0, "
            "more than AssignJob.max_graphs 0 (it holds 0 and evicts none)",
        ),
        (
            2,
            [load(1, g5), load(1, g3)],
            "LoadGraph graph_id 1: the worker already holds program 1 "
            "for the job (it holds 0, 1): graph ids are unique per job",
        ),
        (
            1,
            [load(1, g5), load(2, g3)],
            "more than AssignJob.max_graphs 1 (it holds 0, 1 and " "evicts none)",
        ),
        (
            1,
            [load(1, g5, evict=3)],
            "LoadGraph graph_id 1: evict_graph_id 3 is not a program "
            "this worker holds for the job (it holds 0)",
        ),
        (
            1,
            [load(0, g5)],
            "graph_id 0 names AssignJob.graph; a LoadGraph's graph_id is at least 1",
        ),
        (
            1,
            [batch5(4)],
            "batch for step 1: graph_id 4 is not a program this worker holds for the "
            "job (it holds 0): a LoadGraph must come before the first Batch naming it",
        ),
        (
            1,
            [load(1, sgd_graph)],
            "LoadGraph graph_id 1: its placeholders differ from graph 0's, "
            "which share the job's state: 'optim.",
        ),
        (
            1,
            [load(1, reseeded)],
            "LoadGraph graph_id 1: its metadata fxdp.seed is '7', graph 0's "
            "(absent): every program of a job shares it",
        ),
    ]
    return cases


def test_what_a_job_cannot_load_or_run_is_refused_naming_it(lab, shapes):
    g6, g5, g3 = (shapes.rank_graph(b, 1, 0) for b in SIZES)
    state = shapes.step.initial_state()
    cases = _refused_load_cases(lab, shapes, g5, g3)
    server = lab.server()
    lab.start_worker(server.port, "r0")
    conn = server.accept(1)["r0"]
    for i, (max_graphs, messages, error) in enumerate(cases):
        f = failed_job(conn, f"j{i}", g6, state, max_graphs=max_graphs, messages=messages)
        assert f.code == INVALID_ARGUMENT, f
        assert error in f.error, f"case {i}: {f.error}"
        assert f.step == 1, f  # the step the program was for
    assign_only(conn, "big", g6, state, max_graphs=65)
    f = conn.recv("job_failed")
    assert f.code == INVALID_ARGUMENT
    assert "max_graphs 65 is more than this worker keeps (64 programs besides graph 0)" in f.error
    # A LoadGraph before the initial state is complete (the state never comes).
    assign_only(conn, "early", g6, state, max_graphs=1)
    conn.send(load_graph=wpb.LoadGraph(job_id="early", graph_id=1, graph=g5))
    f = conn.recv("job_failed")
    assert (f.code, f.step) == (INVALID_ARGUMENT, 0)
    assert "LoadGraph graph_id 1: sent before the initial state was complete" in f.error, f


# --------------------------------------------------------------------------------------------
# fxdp-worker run: one --graph per shape


def write_batches(d, batches):
    from safetensors.torch import save_file

    paths = []
    for i, b in enumerate(batches):
        p = d / f"b{i}.safetensors"
        save_file({k: v.contiguous() for k, v in b.items()}, str(p))
        paths.append(str(p))
    return paths


@pytest.mark.parametrize("data", ["files", "dataset"])
def test_run_picks_the_graph_of_each_steps_shape(tmp_path, shapes, data):
    order = [6, 5, 3, 6] if data == "dataset" else [5, 6, 3]
    batches = [batch_of(b, 20 + i) for i, b in enumerate(order)]
    want_losses, want_state = shapes.local(batches)
    if data == "dataset":
        paths = [str(tmp_path / "ds")]
        fxdp.write_dataset(paths[0], batches, step=shapes.step)
    else:
        paths = write_batches(tmp_path, batches)
    res = run_worker_ranks(
        fxdp_binary("FXDP_WORKER", "fxdp-worker"),
        [shapes.path(b, 2) for b in SIZES],
        str(shapes.d / "s.safetensors"),
        paths,
        2,
        len(order),
        tmp_path,
        f"shapes-{data}",
    )
    for got, want in zip(res["losses"], want_losses):
        assert got == pytest.approx(want, rel=1e-5)
    for final in res["finals"]:
        assert_state_close(final, want_state)


def test_run_refuses_data_no_graph_takes_and_graphs_without_shapes(tmp_path, shapes):
    state = str(shapes.d / "s.safetensors")
    worker = fxdp_binary("FXDP_WORKER", "fxdp-worker")
    singles = []
    for b in SIZES[:2]:  # single-device graphs: their own inputs are their shapes
        p = tmp_path / f"g{b}.pb"
        shapes.step.instantiate(batch_of(b, 0)).save(p)
        singles.append(str(p))
    paths = write_batches(tmp_path, [batch_of(6, 1), batch_of(4, 2)])
    r = subprocess.run(
        [
            worker,
            "run",
            "--graph",
            singles[0],
            "--graph",
            singles[1],
            "--state",
            state,
            "--data",
            paths[0],
            "--data",
            paths[1],
            "--steps",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1, r.stderr
    assert (
        f"--data {paths[1]} holds x=4x4, y=4x3; no --graph was expanded for that shape "
        f"({singles[0]}: x=6x4, y=6x3; {singles[1]}: x=5x4, y=5x3)"
    ) in r.stderr, r.stderr
    # An expanded graph without the record of its global shapes cannot be told apart.
    old = shapes.rank_graph(6, 1, 0)
    kept = [m for m in old.metadata if m.key != "fxdp.input_shapes"]
    assert len(kept) == len(old.metadata) - 1
    del old.metadata[:]
    old.metadata.extend(kept)
    (tmp_path / "old.pb").write_bytes(old.SerializeToString())
    r = subprocess.run(
        [
            worker,
            "run",
            "--graph",
            str(tmp_path / "old.pb"),
            "--graph",
            shapes.path(5, 1),
            "--state",
            state,
            "--data",
            paths[0],
            "--steps",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1, r.stderr
    assert "does not record the global input shapes it was expanded for" in r.stderr, r.stderr
